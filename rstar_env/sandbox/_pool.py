"""The caller's handle on the zygote: start it inside its namespaces, ask it for workers, heal it when it dies.

Thread-safe: any number of sandbox threads call :meth:`ZygotePool.spawn` at once. A call is one datagram on the
dispatch socket carrying a fresh channel; the worker that takes it hands the channel to the zygote, which then
forwards the call's requests and alone reports its end (see :mod:`._zygote`). Output never passes through the
zygote: the worker writes it on pipes the caller reads.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import select
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from . import SandboxError, _cgroup, _client, _hugepages, _isolation, _limits, _protocol, _spawn

logger = logging.getLogger("rstar_env.sandbox")

UID_RANGE = 1 << 16
"""Private uids per pool (when running as root); a pool's range starts at a random multiple of this."""


def random_uid_base() -> int:
    """A random uid range in [2**30, 2**31): far from real users, and unlikely to collide with another pool."""
    return (1 << 30) + secrets.randbelow((1 << 30) // UID_RANGE) * UID_RANGE


class LocalWorker(_client.Worker):
    """A worker forked by the zygote; its exit status arrives on its channel from the zygote."""

    def __init__(self, pool: ZygotePool, call: int, chan: socket.socket) -> None:
        self.pool, self.call, self.chan = pool, call, chan
        self.started = False
        self.pid: int | None = None
        """Its pid as the zygote sees it (from ``started``)."""
        self.cgroup_memory: str | None = None
        """Its cgroup's memory usage file, once found (:meth:`ZygotePool.held_mb`)."""

    def note(self, message: dict[str, Any]) -> None:
        if message.get("op") == "started" and isinstance(message.get("pid"), int):
            self.pid = message["pid"]
        super().note(message)

    def kill(self) -> None:
        self.pool.kill(self.call)

    def returncode(self, exit_message: dict[str, Any] | None) -> int | None:
        status = (exit_message or {}).get("status")
        return os.waitstatus_to_exitcode(status) if isinstance(status, int) else None

    def close(self) -> None:
        self.chan.close()


class _Zygote:
    """One running zygote process (the wrapper's Popen), its control socket and the dispatch socket."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        control: socket.socket,
        dispatch: socket.socket,
        base_dir: str,
        info: dict[str, Any],
        cgroup: _cgroup.PoolCgroup | None = None,
    ) -> None:
        self.proc, self.control, self.dispatch, self.base_dir, self.info = proc, control, dispatch, base_dir, info
        self.cgroup = cgroup
        self.control_lock = threading.Lock()
        self.broken = False
        # A forked child inherits this object (and may drop or close it); only the process that started the zygote
        # may stop it, kill its workers and remove its cgroup and folder.
        self.owner = os.getpid()
        # The wrapper (unshare, bwrap) outlives the zygote for a moment and holds copies of our sockets, so
        # neither its exit status nor a closed socket says in time that the zygote died; a pidfd does.
        self.pid = _find_zygote(proc.pid, info.get("pid"))
        self.pidfd: int | None = None
        if self.pid is not None:
            with contextlib.suppress(OSError):
                self.pidfd = os.pidfd_open(self.pid)

    def alive(self) -> bool:
        if self.broken or self.proc.poll() is not None:
            return False
        if self.pid is not None and _exiting(self.pid):
            # Dying, but not dead yet: its PID namespace ends only once every process in it has, and a frozen
            # session (cgroup v1) dies only once thawed, which _stop does.
            return False
        return self.pidfd is None or not select.select([self.pidfd], [], [], 0)[0]

    def close(self) -> None:
        for sock in (self.dispatch, self.control):
            with contextlib.suppress(OSError):
                sock.close()
        if self.pidfd is not None:
            with contextlib.suppress(OSError):
                os.close(self.pidfd)
            self.pidfd = None

    def request_worker(self, call: int, session: bool, chan: socket.socket) -> None:
        """Queue a call for the next idle worker (datagrams need no lock: each is sent whole)."""
        _protocol.send_datagram(self.dispatch, {"call": call, "session": session}, [chan.fileno()])

    def send_control(self, message: dict[str, Any]) -> None:
        with self.control_lock:
            _protocol.send_message(self.control, message)


PF_EXITING = 0x4


def _exiting(pid: int) -> bool:
    """Whether ``pid`` is gone or has begun to exit (the kernel's ``PF_EXITING`` flag, in ``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return bool(int(fields[6]) & PF_EXITING)
    except (OSError, ValueError, IndexError):
        return True


def _nspids(pid: int) -> list[int]:
    """``pid``'s pid in each PID namespace it is in, the host's first (``NSpid`` of ``/proc/<pid>/status``)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return [int(p) for p in next(line for line in f if line.startswith("NSpid:")).split()[1:]]
    except (OSError, StopIteration, ValueError):
        return []


def _find_zygote(wrapper: int, inner_pid: int | None) -> int | None:
    """Host pid of the zygote: the wrapper itself or the process below it whose innermost pid it reported."""
    from . import _proctree

    for pid in [wrapper, *_proctree.descendants(wrapper)]:
        nspids = _nspids(pid)
        if nspids and nspids[-1] == inner_pid:
            return pid
    return None


def _stop(zygote: _Zygote) -> None:
    """Close both sockets (idle workers and the zygote see end of stream and exit), then make sure of it.

    In a forked child (a copy of the pool that a ``fork`` made, dropped or closed there) it only closes the child's
    copies of the sockets: the parent's pool keeps running.
    """
    zygote.close()
    if os.getpid() != zygote.owner:
        if zygote.cgroup is not None:
            zygote.cgroup.close_fds()
        return
    if zygote.cgroup is not None:
        # A session frozen between calls (cgroup v1) can die only once thawed, and the zygote's exit waits for it
        # when the zygote died without ending it. Thawed, a session stays stopped until it is killed.
        zygote.cgroup.thaw()
    try:
        zygote.proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        zygote.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            zygote.proc.wait(timeout=2)
    if zygote.cgroup is not None:
        zygote.cgroup.remove()  # kills anything left in it: no worker outlives its pool
    shutil.rmtree(zygote.base_dir, ignore_errors=True)


BASE_DIR_PREFIX = "rstar-sandbox-"


def reap_stale_dirs(tmp: str | None = None) -> list[str]:
    """Remove the folders of pools whose process is gone (killed without ``close()``); returns them.

    A pool's folder is named ``rstar-sandbox-<pid>-<random>``; an older, unnumbered one is removed only when it is
    empty and untouched for a day.
    """
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        entries = list(os.scandir(tmp))
    except OSError:
        return removed
    for entry in entries:
        if not entry.name.startswith(BASE_DIR_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        owner = entry.name[len(BASE_DIR_PREFIX) :].split("-", 1)[0]
        if owner.isdigit():
            try:
                os.kill(int(owner), 0)
                continue
            except ProcessLookupError:
                pass
            except OSError:
                continue  # alive, under another uid
        else:
            try:
                if os.listdir(entry.path) or entry.stat().st_mtime > time.time() - 86400:
                    continue
            except OSError:
                continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed.append(entry.path)
    return removed


class ZygotePool:
    """Starts (and restarts) the zygote lazily; hands out :class:`LocalWorker` objects."""

    def __init__(
        self,
        *,
        preload: Sequence[str],
        warmup: str | None,
        limits: _limits.Limits,
        env: Mapping[str, str] | None,
        isolation: str,
        network: bool,
        python: str | None,
        start_timeout_s: float,
        spares: int = 2,
        pool_memory_mb: int | None = None,
        pid_namespace: bool = True,
    ) -> None:
        self.preload = list(preload)
        self.warmup = warmup
        self.limits = limits
        self.extra_env = dict(env or {})
        self.isolation_mode = isolation
        self.network = network
        self.python = python
        self.start_timeout_s = start_timeout_s
        self.spares = spares
        self.pool_memory_mb = pool_memory_mb
        self.pid_namespace = pid_namespace
        self.isolation: _isolation.Isolation | None = None
        self.restarts = 0
        self._zygote: _Zygote | None = None
        self._lock = threading.Lock()
        self._calls = itertools.count(1)
        self._closed = False
        self._uid_base = random_uid_base() if _limits.can_drop_privileges() else None
        self._finalizer: weakref.finalize | None = None

    # ---------------------------------------------------------------------------------------------- lifecycle

    def start(self) -> _Zygote:
        """The live zygote, starting (or restarting) it if needed."""
        zygote = self._zygote
        if zygote is not None and zygote.alive():
            return zygote
        with self._lock:
            if self._closed:
                raise SandboxError("the local sandbox is closed")
            zygote = self._zygote
            if zygote is not None and zygote.alive():
                return zygote
            if zygote is not None:
                self.restarts += 1
                logger.warning("local sandbox: the zygote died (status %s); restarting it", zygote.proc.poll())
                self._retire(zygote)
            self._zygote = self._launch()
            return self._zygote

    def after_fork_in_child(self) -> None:
        """In a forked child: the copied lock may be held by a parent's thread, and the zygote is the parent's.
        Drop the child's copies of its sockets (it keeps running for the parent); the child's first call starts a
        zygote of its own."""
        self._lock = threading.Lock()
        zygote, self._zygote = self._zygote, None
        if zygote is not None:
            self._retire(zygote)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            zygote, self._zygote = self._zygote, None
        if zygote is not None:
            self._retire(zygote)

    def _retire(self, zygote: _Zygote) -> None:
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        _stop(zygote)

    def _launch(self) -> _Zygote:
        reap_stale_dirs()
        base_dir = tempfile.mkdtemp(prefix=f"{BASE_DIR_PREFIX}{os.getpid()}-")
        # Workers may enter their own directory (random name) but not list the others.
        os.chmod(base_dir, 0o711)
        if self.isolation is None:
            self.isolation = _isolation.choose_isolation(self.isolation_mode, network=self.network)
        cgroup: _cgroup.PoolCgroup | None = None
        cgroup_missing = None
        try:
            cgroup = _cgroup.PoolCgroup.create(self.pool_memory_mb)
        except OSError as exc:
            cgroup_missing = str(exc)
        env = self.isolation.environment(_spawn.clean_env(self.extra_env), self.python)
        ours, theirs = socket.socketpair()
        dispatch, dispatch_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        config = {
            "dispatch_fd": dispatch_theirs.fileno(),
            "preload": self.preload,
            "warmup": self.warmup,
            "limits": self.limits.to_dict(),
            "env": env,
            "base_dir": self.isolation.pool_dir(base_dir),
            "uid_base": self._uid_base,
            "uid_count": UID_RANGE,
            "spares": self.spares,
            "pid_namespace": self.pid_namespace,
            "huge_page_bytes": _hugepages.huge_page_size(),
            "network": self.network,
            "tmp_binds": _isolation.tmp_paths(_isolation.visible_paths(self.python)),
            "cgroup": cgroup.config() if cgroup is not None else None,
            "cgroup_missing": cgroup_missing,
            # Without bubblewrap: hide private homes but for the interpreter in them, once in the unshare
            # fallback's mount namespace, or in each worker's own one (isolation="none": the zygote has none).
            "expose_paths": [] if self.isolation.kind == "bwrap" else list(_isolation.visible_paths(self.python)),
            "expose_in": "zygote" if self.isolation.kind == "unshare" else "worker",
            # World-writable directories a worker can leave files in (only /dev/shm under a read-only root).
            "shared_dirs": ["/dev/shm"] if self.isolation.readonly_root else ["/dev/shm", "/tmp", "/var/tmp"],
        }
        package_dir = self.isolation.package_dir(_spawn.PACKAGE_DIR)
        # Under bubblewrap the zygote gets copies of its modules, read from these (closed once it started).
        package_fds: dict[str, int] = {}
        if self.isolation.kind == "bwrap":
            for module in _spawn.SANDBOX_MODULES:
                path = os.path.join(_spawn.PACKAGE_DIR, f"{module}.py")
                package_fds[f"{module}.py"] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        prefix = self.isolation.command(python=self.python, package_fds=package_fds)
        # The configuration goes on the control socket, not the command line: workers can read that.
        argv = [*prefix, *_spawn.python_argv("_zygote", "main", theirs.fileno(), None, self.python, package_dir)]
        # The zygote's own output goes to an unnamed file: read only to explain a failed start.
        with tempfile.TemporaryFile(prefix="rstar-zygote-", suffix=".log") as log:
            try:
                proc = subprocess.Popen(
                    argv,
                    pass_fds=[
                        theirs.fileno(),
                        dispatch_theirs.fileno(),
                        *(cgroup.fds.values() if cgroup else ()),
                        *package_fds.values(),
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    env=env,
                    cwd=base_dir,
                    start_new_session=True,  # keep terminal signals (Ctrl-C) away from the pool
                )
            except OSError as exc:
                shutil.rmtree(base_dir, ignore_errors=True)
                if cgroup is not None:
                    cgroup.remove()
                raise SandboxError(f"cannot start the sandbox zygote: {exc}") from exc
            finally:
                theirs.close()
                dispatch_theirs.close()
                for fd in package_fds.values():
                    os.close(fd)
            try:
                ours.settimeout(self.start_timeout_s)
                _protocol.send_message(ours, config)
                received = _protocol.recv_message(ours)
                ours.settimeout(None)
            except (OSError, _protocol.ProtocolError):
                received = None
            if received is None or received[0].get("op") != "ready":
                proc.kill()
                proc.wait()
                ours.close()
                dispatch.close()
                log.seek(0)
                detail = log.read()[-4000:].decode(errors="replace").strip()
                shutil.rmtree(base_dir, ignore_errors=True)
                if cgroup is not None:
                    cgroup.remove()
                raise SandboxError(
                    f"the sandbox zygote failed to start: {detail or 'no output'}; to run without the sandbox's "
                    f"namespaces, pass {_isolation.ISOLATION_NONE_ADVICE}"
                )
        info = received[0]
        for skipped in info.get("skipped", []):
            logger.debug("local sandbox: not preloaded: %s", skipped)
        missing = list(self.isolation.missing) if self.isolation_mode == "auto" else []
        if info.get("private_network"):  # each worker has its own, even where the pool has none
            missing = [m for m in missing if not m.startswith("network namespace")]
        missing += info.get("notes", [])
        if missing:
            # One warning naming everything this machine lacks.
            _isolation.warn_once("rstar_env local sandbox, what this machine lacks: " + "; ".join(missing))
        zygote = _Zygote(proc, ours, dispatch, base_dir, info, cgroup)
        self._finalizer = weakref.finalize(self, _stop, zygote)
        return zygote

    # ---------------------------------------------------------------------------------------------- workers

    def spawn(self, *, session: bool) -> LocalWorker:
        """Ask the zygote for a worker (restarting a dead zygote once). Admission (room in the pool's memory) is
        the caller's: :mod:`._admission`."""
        for _attempt in range(2):
            zygote = self.start()
            ours, theirs = socket.socketpair()
            call = next(self._calls)
            try:
                zygote.request_worker(call, session, theirs)
            except OSError:
                ours.close()
                zygote.broken = True  # every reader of the dispatch socket is gone: restart it
                continue
            finally:
                theirs.close()
            return LocalWorker(self, call, ours)
        raise SandboxError("the sandbox zygote keeps dying")

    def held_mb(self, worker: LocalWorker) -> int | None:
        """MiB a worker's cgroup holds (memory, its ``/tmp`` and ``/dev/shm`` files included); None where the pool
        has no cgroup or the worker's cannot be found. Read between a session's calls, when it is frozen."""
        if worker.cgroup_memory is None:
            worker.cgroup_memory = self._find_memory_file(worker)
        if worker.cgroup_memory is None:
            return None
        try:
            with open(worker.cgroup_memory) as f:
                return -(-int(f.read()) // _cgroup.MIB)
        except (OSError, ValueError):
            return None

    def _find_memory_file(self, worker: LocalWorker) -> str | None:
        """The memory usage file of the worker's cgroup: the one whose process has the worker's pid in the
        zygote's PID namespace (the zygote names its workers' cgroups; the caller finds them by their members)."""
        zygote = self._zygote
        cgroup = zygote.cgroup if zygote is not None else None
        if worker.pid is None or cgroup is None or zygote is None or zygote.pid is None:
            return None
        hierarchy, usage = ("memory", "memory.usage_in_bytes") if cgroup.version == 1 else ("unified", "memory.current")
        pool_dir = cgroup.paths.get(hierarchy)
        level = len(_nspids(zygote.pid)) - 1  # the zygote's namespace, counted from the host's
        if pool_dir is None or level < 0:
            return None
        with contextlib.suppress(OSError):
            for entry in os.scandir(pool_dir):
                if not entry.is_dir(follow_symlinks=False):
                    continue
                with contextlib.suppress(OSError, ValueError):
                    with open(os.path.join(entry.path, "cgroup.procs")) as f:
                        members = [int(p) for p in f.read().split()]
                    for pid in members:
                        nspids = _nspids(pid)
                        if len(nspids) > level and nspids[level] == worker.pid:
                            return os.path.join(entry.path, usage)
        return None

    def kill(self, call: int) -> None:
        zygote = self._zygote
        if zygote is None:
            return
        with contextlib.suppress(OSError):
            zygote.send_control({"op": "kill", "call": call})

    # ---------------------------------------------------------------------------------------------- introspection

    def processes(self) -> list[int]:
        """Host pids of the pool: the wrapper, the zygote and every worker below it (for tests and benchmarks)."""
        from . import _proctree

        zygote = self._zygote
        if zygote is None or not zygote.alive():
            return []
        return [zygote.proc.pid, *_proctree.descendants(zygote.proc.pid)]

    def resting_size(self) -> int:
        """How many processes :meth:`processes` lists when the pool is idle: wrapper, zygote, idle spares."""
        zygote = self._zygote
        return (len({zygote.proc.pid, zygote.pid}) if zygote is not None else 0) + self.spares

    def zygote_pid(self) -> int | None:
        """Host pid of the zygote process itself (not its wrapper), if running."""
        zygote = self._zygote
        return zygote.pid if zygote is not None and zygote.alive() else None

    @property
    def info(self) -> dict[str, Any]:
        """The zygote's ready message: what it preloaded, whether workers get private uids."""
        zygote = self._zygote
        return dict(zygote.info) if zygote is not None else {}
