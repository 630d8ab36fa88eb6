"""Namespaces around the whole pool: which wrapper the zygote is started under, and what is missing.

Preference order for ``isolation="auto"``:

1. **bubblewrap** (``bwrap``): new PID, network (unless ``network=True``), IPC, UTS and mount namespaces. The
   filesystem is built from an allowlist (:func:`visible_paths`): the system directories (``/usr``, ``/lib*``,
   ``/bin``, ``/sbin``), a few files of ``/etc`` the loader and libc read, and the interpreter's install
   locations (prefixes and site-packages folders), all read-only at their own paths; a minimal ``/dev``, a fresh
   ``/proc``, an empty ``/tmp``, and copies of the sandbox's own modules at :data:`PACKAGE_MOUNT`. No host
   ``/tmp``, ``/home``, ``/root`` (beyond the interpreter), script folder, working directory, ``PYTHONPATH``
   entry, project checkout or ``/etc/shadow``; nor their names: only the interpreter's folders are bound (so
   named in ``/proc/self/mountinfo``), and the environment keeps only the ``PATH`` entries the sandbox has. The
   zygote is PID 1.
2. **unshare** (util-linux): new PID, IPC, mount and network namespaces with a fresh ``/proc`` (the zygote is
   PID 1), but the host filesystem as the worker's uid sees it, except that a private directory holding the
   interpreter (``/root``) is covered, with only the interpreter bound back (:func:`._limits.expose_interpreter`).
3. **none**: the zygote is a plain subreaper process.

On top of the pool's namespaces, every worker (one call, or one session) is PID 1 of its own PID namespace
(:mod:`._pidns`; under ``none`` only where the pool runs as root), gets its own IPC and network namespaces and its
own empty ``/tmp``, ``/dev/shm``, ``/dev/pts`` and ``/proc`` view (:func:`._limits.private_namespaces`), a cgroup
(:mod:`._cgroup`) and a syscall filter (:mod:`._seccomp`), set up in the spare before it takes a call, so they
cost nothing on a call's latency. Whatever cannot be had is named in a single warning. The user-facing account
is ``docs/security.md``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

logger = logging.getLogger("rstar_env.sandbox")

ISOLATION_MODES = ("auto", "bwrap", "unshare", "none")
SHM_BYTES = 64 << 20
"""Size of the pool's own ``/dev/shm`` under bubblewrap (each worker mounts its own over it)."""
PACKAGE_MOUNT = "/run/rstar-sandbox"
"""Where copies of the sandbox's own modules are under bubblewrap (not their folder bound at its path: that names
the project checkout, in the path and in ``/proc/self/mountinfo``)."""
POOL_DIR = "/tmp/rstar-pool"
"""The zygote's folder under bubblewrap, in the pool's own ``/tmp`` (workers without a private ``/tmp`` work
there); elsewhere, the pool's host folder."""
PATH_VARS = ("PATH", "PYTHONPATH")
PREFIX_VARS = ("VIRTUAL_ENV", "CONDA_PREFIX")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/alternatives",
    "/etc/nsswitch.conf",
    "/etc/passwd",
    "/etc/group",
    "/etc/mime.types",
)
"""What sandboxed code sees of ``/etc``: what the loader, libc and the standard library read. Not shadow."""
NETWORK_ETC_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/ssl", "/etc/ca-certificates", "/etc/gai.conf")
"""Added with ``network=True``: name resolution and TLS certificates."""


@dataclass(frozen=True)
class Isolation:
    """A wrapper command for the zygote and what it provides."""

    kind: str
    """``bwrap``, ``unshare`` or ``none``."""
    network: bool
    """Whether sandboxed code may use the network (``network=True`` was asked for, or nothing can stop it)."""
    pid_namespace: bool
    readonly_root: bool
    missing: tuple[str, ...] = ()
    """Human-readable gaps, e.g. "read-only filesystem (bubblewrap is not installed)"."""

    def command(self, python: str | None = None, package_fds: Mapping[str, int] | None = None) -> list[str]:
        """The wrapper's command-line prefix. ``package_fds``: ``{file name: readable fd}`` of the sandbox's
        modules, copied into the view at :data:`PACKAGE_MOUNT` by bubblewrap (pass the fds to it)."""
        if self.kind == "none":
            return []
        if self.kind == "bwrap":
            return _bwrap_prefix(self.network, visible_paths(python), package_fds or {})
        return _unshare_prefix(self.network)

    def package_dir(self, host_dir: str) -> str:
        """Where the zygote finds the sandbox's modules (``host_dir`` on the host)."""
        return PACKAGE_MOUNT if self.kind == "bwrap" else host_dir

    def pool_dir(self, host_dir: str) -> str:
        """The zygote's folder as it sees it (:data:`POOL_DIR` under bubblewrap; ``host_dir`` elsewhere)."""
        return POOL_DIR if self.kind == "bwrap" else host_dir

    def environment(self, env: Mapping[str, str], python: str | None = None) -> dict[str, str]:
        """``env`` as the sandbox gets it: under bubblewrap, ``PATH`` and ``PYTHONPATH`` keep only the folders its
        view holds, and ``VIRTUAL_ENV`` and ``CONDA_PREFIX`` are kept only if it holds them (a host folder such
        as ``~/.cargo/bin`` or a checkout on ``PYTHONPATH`` is of no use inside, and would name the host)."""
        if self.kind != "bwrap":
            return dict(env)
        seen = (*SYSTEM_DIRS, *visible_paths(python))

        def visible(path: str) -> bool:
            path = os.path.normpath(path)
            return os.path.isabs(path) and any(path == d or path.startswith(d + os.sep) for d in seen)

        kept = dict(env)
        for name in PATH_VARS:
            if name in kept:
                entries = [p for p in kept[name].split(os.pathsep) if p and visible(p)]
                kept[name] = os.pathsep.join(entries)
                if not entries:
                    del kept[name]
        for name in PREFIX_VARS:
            if name in kept and not visible(kept[name]):
                del kept[name]
        kept.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        return kept


ISOLATION_NONE_ADVICE = (
    "isolation='none' (in a YAML config: `tools: [{name: python, options: {sandbox_options: {isolation: none}}}]`)"
)
"""How to run without the wrapper, in both the forms users write it."""


@functools.cache
def visible_paths(python: str | None = None) -> tuple[str, ...]:
    """What the sandbox's view holds of the interpreter: the install locations, and nothing else.

    * its prefixes (``sys.prefix``, ``sys.base_prefix``, ``sys.exec_prefix``): the interpreter, the standard
      library and, for a virtual environment, ``pyvenv.cfg`` and the base interpreter it points to;
    * its site-packages folders (``site.getsitepackages()`` and the user site): the installed packages;
    * the folder of the interpreter's executable once its links are followed (outside the prefixes for some
      installs).

    Never ``sys.path[0]`` (the caller's script folder), the working directory, ``PYTHONPATH`` entries or a
    project checkout put on the path by an editable install: user data lives there, and the model's code needs
    none of it. Paths under ``/tmp`` are kept (:func:`tmp_paths` binds them back over each private ``/tmp``).
    Asks ``python`` itself when given.
    """
    query = (
        "import json, os, site, sys\n"
        "user = site.getusersitepackages() if site.ENABLE_USER_SITE else ''\n"
        "print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,"
        " os.path.dirname(os.path.realpath(sys.executable)), *site.getsitepackages(), user]))"
    )
    if python is None:
        import site

        user = site.getusersitepackages() if site.ENABLE_USER_SITE else ""
        exe_dir = os.path.dirname(os.path.realpath(sys.executable))
        prefixes = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, exe_dir]
        candidates = [*prefixes, *site.getsitepackages(), user]
    else:
        try:
            done = subprocess.run([python, "-c", query], capture_output=True, text=True, timeout=60, check=True)
            candidates = json.loads(done.stdout)
        except (OSError, subprocess.SubprocessError, ValueError) as exc:
            from . import SandboxError

            raise SandboxError(f"cannot ask {python} for its install locations: {exc}") from exc
    found: list[str] = []
    for path in candidates:
        if not path or not os.path.isabs(path) or not os.path.isdir(path):
            continue
        path = os.path.normpath(path)
        if path == os.sep:
            continue  # binding the root would show the whole host
        if any(path == kept or path.startswith(kept + os.sep) for kept in found):
            continue
        found = [kept for kept in found if not kept.startswith(path + os.sep)] + [path]
    return tuple(found)


def tmp_paths(paths: tuple[str, ...]) -> list[str]:
    """The ones of ``paths`` under ``/tmp``: each worker's private ``/tmp`` would hide them, so they are bound
    back over it, read-only (a virtual environment made with ``python -m venv /tmp/venv`` works)."""
    return [p for p in paths if _under_tmp(p)]


def _under_tmp(path: str) -> bool:
    return path == "/tmp" or path.startswith("/tmp/")


def _bwrap_prefix(
    network: bool, interpreter_paths: tuple[str, ...] = (), package_fds: Mapping[str, int] | None = None
) -> list[str]:
    # By its full path: the environment it is started with keeps only the sandbox's own PATH entries.
    bwrap = shutil.which("bwrap") or "bwrap"
    prefix = [bwrap, "--die-with-parent", "--new-session", "--unshare-pid", "--as-pid-1", "--chdir", "/"]
    prefix += ["--unshare-ipc", "--unshare-uts"]
    if not network:
        prefix.append("--unshare-net")
    # The new root is an empty tmpfs: only what is bound below exists.
    for path in SYSTEM_DIRS:
        if os.path.islink(path):
            prefix += ["--symlink", os.readlink(path), path]  # merged /usr: /lib -> usr/lib
        elif os.path.isdir(path):
            prefix += ["--ro-bind", path, path]
    # bwrap makes missing parents mode 0700; any uid must traverse them (no capability needed to read or import).
    prefix += ["--perms", "0755", "--dir", "/etc", "--perms", "0755", "--dir", os.path.dirname(PACKAGE_MOUNT)]
    for path in ETC_FILES + (NETWORK_ETC_FILES if network else ()):
        prefix += ["--ro-bind-try", path, path]
    made: set[str] = {"/etc", os.path.dirname(PACKAGE_MOUNT)}

    def bind(path: str) -> list[str]:
        args = []
        parents = []
        parent = os.path.dirname(path)
        while parent not in ("/", "") and parent not in made:
            parents.append(parent)
            parent = os.path.dirname(parent)
        for directory in reversed(parents):
            args += ["--perms", "0755", "--dir", directory]
            made.add(directory)
        return [*args, "--ro-bind", path, path]

    under_tmp = tmp_paths(interpreter_paths)
    for path in interpreter_paths:
        if path in under_tmp or any(path == d or path.startswith(d + os.sep) for d in SYSTEM_DIRS):
            continue
        prefix += bind(path)
    if package_fds:
        # Copies, not a bind of the package's folder: a bind names its host path in /proc/self/mountinfo.
        prefix += ["--perms", "0755", "--dir", PACKAGE_MOUNT]
        for name, fd in sorted(package_fds.items()):
            prefix += ["--perms", "0444", "--file", str(fd), f"{PACKAGE_MOUNT}/{name}"]
    prefix += ["--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
    made.add("/tmp")
    for path in under_tmp:  # over the empty /tmp (bwrap applies its options in order)
        prefix += bind(path)
    # A small shared-memory tmpfs, for multiprocessing's semaphores; each worker mounts its own over it.
    prefix += ["--perms", "1777", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]
    return [*prefix, "--"]


def _unshare_prefix(network: bool) -> list[str]:
    prefix = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--mount"]
    if not network:
        prefix.append("--net")
    if os.geteuid() != 0:
        prefix.append("--map-root-user")  # a user namespace is what lets an unprivileged user do the rest
    return prefix


@functools.cache
def _works(kind: str, network: bool) -> str | None:
    """Run ``true`` under the wrapper once per process; None if it works, else the reason it does not."""
    if shutil.which(kind) is None:
        return f"{kind} is not installed"
    try:
        prefix = _bwrap_prefix(network) if kind == "bwrap" else _unshare_prefix(network)
        done = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{kind} failed: {exc}"
    if done.returncode != 0:
        return f"{kind} failed: {done.stderr.strip() or f'exit status {done.returncode}'}"
    return None


def choose_isolation(mode: str, *, network: bool) -> Isolation:
    """The strongest available wrapper for ``mode`` (see the module docstring)."""
    if mode not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {ISOLATION_MODES}, got {mode!r}")
    from . import SandboxError

    reasons: list[str] = []
    if mode in ("auto", "bwrap"):
        why = _works("bwrap", network)
        if why is None:
            return Isolation("bwrap", network, True, True)
        if mode == "bwrap":
            raise SandboxError(f"isolation='bwrap' is unavailable: {why}; or pass {ISOLATION_NONE_ADVICE}")
        reasons.append(why)
    if mode in ("auto", "unshare"):
        why = _works("unshare", network)
        if why is None:
            why_not = f"{reasons[0]}; install the `bubblewrap` package" if reasons else "isolation='unshare'"
            missing = (
                f"a filesystem built from an allowlist: sandboxed code can read every world-readable host file "
                f"(/home, the project checkout); its /tmp and /dev/shm are its own, and private directories that "
                f"hold the interpreter (such as /root) show only the interpreter ({why_not})",
            )
            return Isolation("unshare", network, True, False, missing)
        if mode == "unshare":
            raise SandboxError(f"isolation='unshare' is unavailable: {why}; or pass {ISOLATION_NONE_ADVICE}")
        reasons.append(why)
    cause = "; ".join(reasons) or "isolation='none' was asked for"
    missing = (
        "a PID namespace around the pool",
        "a filesystem built from an allowlist (code can read every host file its uid may)",
    )
    if not network:
        missing = ("network namespace (sandboxed code can reach the network)", *missing)
    return Isolation("none", True, False, False, tuple(f"{m} ({cause})" for m in missing))


_warned: set[str] = set()


def warn_once(message: str) -> None:
    """Emit ``message`` as a RuntimeWarning and a log warning, once per process."""
    if message in _warned:
        return
    _warned.add(message)
    logger.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=3)
