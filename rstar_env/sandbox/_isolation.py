"""Namespaces around the whole pool: which wrapper the zygote is started under, and what is missing.

Preference order for ``isolation="auto"``:

1. **bubblewrap** (``bwrap``): new PID, network (unless ``network=True``), IPC and UTS namespaces; the host root
   bound read-only, fresh ``/proc`` and ``/dev``, only the pool's own directory writable; the zygote is PID 1.
2. **unshare** (util-linux): new PID and network namespaces with a fresh ``/proc`` (the zygote is PID 1), but
   the host filesystem as the pool's user sees it.
3. **none**: the zygote is a plain subreaper process.

Isolation wraps the zygote once (one namespace for the pool), never each call: per-call namespaces would cost
milliseconds per call. Whatever cannot be had is named in a single warning.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass

logger = logging.getLogger("rstar_env.sandbox")

ISOLATION_MODES = ("auto", "bwrap", "unshare", "none")
SHM_BYTES = 256 << 20
"""Size of the pool's own ``/dev/shm`` under bubblewrap."""


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

    def command(self, writable: str) -> list[str]:
        """The wrapper's command-line prefix; ``writable`` is the one host directory the pool may write."""
        if self.kind == "bwrap":
            return _bwrap_prefix(self.network, writable)
        if self.kind == "unshare":
            return _unshare_prefix(self.network)
        return []


def _bwrap_prefix(network: bool, writable: str) -> list[str]:
    prefix = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--as-pid-1"]
    prefix += ["--unshare-ipc", "--unshare-uts"]
    if not network:
        prefix.append("--unshare-net")
    prefix += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--bind", writable, writable]
    # A small shared-memory tmpfs, for multiprocessing's semaphores; the zygote empties a worker's files there.
    prefix += ["--perms", "1777", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]
    return [*prefix, "--"]


def _unshare_prefix(network: bool) -> list[str]:
    prefix = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
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
    probe_dir = tempfile.mkdtemp(prefix="rstar-probe-")
    try:
        prefix = _bwrap_prefix(network, probe_dir) if kind == "bwrap" else _unshare_prefix(network)
        done = subprocess.run([*prefix, "true"], capture_output=True, text=True, timeout=10, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{kind} failed: {exc}"
    finally:
        os.rmdir(probe_dir)
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
            raise SandboxError(f"isolation='bwrap' is unavailable: {why}")
        reasons.append(why)
    if mode in ("auto", "unshare"):
        why = _works("unshare", network)
        if why is None:
            missing = (f"read-only filesystem ({reasons[0]}; install the `bubblewrap` package)",) if reasons else ()
            return Isolation("unshare", network, True, False, missing)
        if mode == "unshare":
            raise SandboxError(f"isolation='unshare' is unavailable: {why}")
        reasons.append(why)
    cause = "; ".join(reasons) or "isolation='none' was asked for"
    missing = ("PID namespace", "read-only filesystem")
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
