"""One memory, process and CPU budget per worker, over its whole process tree: a cgroup per worker.

Layout, created only below the cgroup the pool's own process is in (never elsewhere)::

    <the caller's cgroup>/rstar-sandbox-<pid>-<hex>/     the pool: memory.limit = pool_memory_mb
                                                w<hex>/  one worker: memory = memory_mb, pids = max_processes

On cgroup v1 (separate ``memory``, ``pids`` and ``cpuacct`` hierarchies, and ``freezer`` where it is mounted) this
layout exists in each; on cgroup v2 it is one directory, used only where the caller's cgroup already delegates
the ``memory`` and ``pids`` controllers to its children. The pool (the caller's process) creates its directory
and passes the zygote an open descriptor per hierarchy, so the zygote needs no view of ``/sys`` inside its
namespaces; each spare creates and enters its own worker cgroup right after it is forked, before anything else.
The empty cgroup of a dead worker is kept for a later spare (its limits stay set; CPU time is counted from a
base), which spares a ``mkdir`` and an ``rmdir`` per call.

The memory controller counts what the whole tree holds: anonymous memory, page cache, memfds, POSIX and SysV
shared memory and the worker's tmpfs pages. Beyond the budget the kernel's OOM killer ends a process of that
worker, never the trainer. A worker is killed as a whole cgroup (every process in it, including children made
with ``CLONE_PARENT``, double forks and daemons), and its cgroup removed once it is empty.

A session is frozen between its calls (:meth:`WorkerCgroups.freeze`: the v1 ``freezer`` controller, or v2's
``cgroup.freeze``): a stopped process can be resumed by a signal it arranged itself (a timer sending SIGCONT), a
frozen one cannot. A v1-frozen process cannot die either, so every kill here thaws the cgroup after its SIGKILLs
(the process dies on waking, before it runs any code of its own).

Each worker then makes a cgroup namespace of its own (:func:`unshare_namespace`), rooted at its cgroup: its
``/proc/self/cgroup`` reads ``/`` in every hierarchy, not the host's path and the pool creator's pid.

Stdlib only: the zygote loads this module without ``rstar_env``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import signal
import time
from dataclasses import dataclass

ROOT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("memory", "pids", "cpuacct")
V1_OPTIONAL = ("freezer",)
"""Used where mounted: without it, sessions cannot be frozen between calls (see :mod:`._zygote`)."""
POOL_PREFIX = "rstar-sandbox-"
MIB = 1 << 20
CLONE_NEWCGROUP = 0x02000000


def unshare_namespace() -> None:
    """Make a cgroup namespace rooted at the cgroups this process is in now (call once it is in its worker's
    cgroup, while it still holds ``CAP_SYS_ADMIN``). Raises OSError if the kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWCGROUP) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWCGROUP): {os.strerror(errno)}")


def _own_paths() -> dict[str, str]:
    """``{controller or "": path}`` from ``/proc/self/cgroup`` ("" is the v2 hierarchy)."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _id, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _write(dir_fd: int, name: str, value: str) -> None:
    fd = os.open(name, os.O_WRONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def _read(dir_fd: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 1 << 20).decode()
    finally:
        os.close(fd)


def machine_memory_mb() -> int:
    """Memory this process may use: the machine's, or less if its own cgroup is limited."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // MIB
    with contextlib.suppress(OSError, ValueError, KeyError):
        own = _own_paths()
        if "memory" in own:
            where = f"{ROOT}/memory{own['memory']}/memory.limit_in_bytes"
        else:
            where = f"{ROOT}{own['']}/memory.max"
        with open(os.path.normpath(where)) as f:
            limit = f.read()
        if limit.strip() != "max":
            total = min(total, int(limit) // MIB)
    return total


def default_pool_memory_mb() -> int:
    """Half of what this process may use: the rest stays for the trainer, the model and the OS."""
    return max(256, machine_memory_mb() // 2)


@dataclass
class PoolCgroup:
    """The pool's cgroup, in each hierarchy (host side)."""

    version: int
    paths: dict[str, str]
    """``{hierarchy: absolute path of the pool's directory}``; hierarchy is a v1 controller or ``unified``."""
    fds: dict[str, int]

    @classmethod
    def create(cls, pool_memory_mb: int | None) -> PoolCgroup:
        """Make the pool's cgroup below this process's own; raises OSError saying why it cannot."""
        own = _own_paths()
        name = f"{POOL_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        if all(c in own for c in V1_CONTROLLERS):
            found = [*V1_CONTROLLERS, *(c for c in V1_OPTIONAL if c in own and os.path.isdir(f"{ROOT}/{c}"))]
            parents = {c: os.path.normpath(f"{ROOT}/{c}{own[c]}") for c in found}
            version = 1
        elif "" in own and os.path.exists(f"{ROOT}/cgroup.controllers"):
            parents = {"unified": os.path.normpath(f"{ROOT}{own['']}")}
            version = 2
        else:
            raise OSError("no cgroup v1 memory, pids and cpuacct controllers nor a cgroup v2 hierarchy is mounted")
        if version == 2:
            with open(os.path.join(parents["unified"], "cgroup.subtree_control")) as f:
                delegated = f.read().split()
            if not {"memory", "pids"} <= set(delegated):
                raise OSError(
                    f"the cgroup v2 group {own['']} does not delegate the memory and pids controllers to its children"
                )
        # The freezer first: a frozen process of a dead pool dies only once thawed.
        for _hierarchy, parent in sorted(parents.items(), key=lambda item: item[0] != "freezer"):
            reap_stale(parent)
        pool = cls(version, {}, {})
        try:
            for hierarchy, parent in parents.items():
                path = os.path.join(parent, name)
                try:
                    os.mkdir(path, 0o755)
                except OSError:
                    if hierarchy in V1_OPTIONAL:
                        continue  # the zygote names what is missing
                    raise
                pool.paths[hierarchy] = path
                pool.fds[hierarchy] = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            if version == 2:
                _write(pool.fds["unified"], "cgroup.subtree_control", "+memory +pids")
                with contextlib.suppress(OSError):
                    _write(pool.fds["unified"], "cgroup.subtree_control", "+cpu")
            memory = pool.fds.get("memory" if version == 1 else "unified")
            if pool_memory_mb is not None and memory is not None:
                _write(memory, "memory.limit_in_bytes" if version == 1 else "memory.max", str(pool_memory_mb * MIB))
        except OSError:
            pool.remove()
            raise
        return pool

    def config(self) -> dict[str, object]:
        """What the zygote needs (the descriptors must be passed to it)."""
        return {"version": self.version, "fds": dict(self.fds)}

    def close_fds(self) -> None:
        """Close this process's descriptors of the pool's cgroups (the cgroups stay)."""
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = {}

    def thaw(self) -> None:
        """Thaw every worker's cgroup (see :meth:`WorkerCgroups.freeze`)."""
        for hierarchy in ("freezer", "unified"):
            with contextlib.suppress(OSError):
                for entry in os.scandir(self.paths[hierarchy]) if hierarchy in self.paths else ():
                    if entry.is_dir(follow_symlinks=False):
                        _thaw(entry.path)

    def remove(self) -> None:
        """Kill whatever is left in the pool's cgroup, remove it (and its workers' cgroups), close the fds."""
        self.thaw()
        self.close_fds()
        for path in self.paths.values():
            _remove_tree(path)
        self.paths = {}


def _procs(path: str) -> list[int]:
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(p) for p in f.read().split()]
    except (OSError, ValueError):
        return []


def _thaw(path: str) -> None:
    """Thaw the cgroup at ``path`` if it is frozen (a frozen v1 process dies only once thawed)."""
    for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
        with contextlib.suppress(OSError), open(os.path.join(path, name), "w") as f:
            f.write(value)


def _remove_tree(path: str) -> None:
    """Kill every process in the cgroup at ``path`` and below, then remove the directories, deepest first."""
    try:
        children = [e.path for e in os.scandir(path) if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for child in children:
        _remove_tree(child)
    for attempt in range(100):
        pids = _procs(path)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if attempt == 0:
            _thaw(path)  # after the SIGKILLs: a frozen session dies on waking
        time.sleep(0.01)
    for _ in range(50):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)  # dying processes leave the cgroup a moment after SIGKILL


def reap_stale(parent: str) -> None:
    """Remove the cgroups of pools whose process is gone (killed without ``close()``) below ``parent``."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(parent):
            if entry.name.startswith(POOL_PREFIX) and not _owner_alive(entry.name):
                _remove_tree(entry.path)


def _owner_alive(name: str) -> bool:
    """Whether the process named in ``rstar-sandbox-<pid>-...`` lives (unknown names count as alive)."""
    try:
        pid = int(name[len(POOL_PREFIX) :].split("-", 1)[0])
    except ValueError:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class WorkerCgroups:
    """Zygote side: a cgroup per worker below the pool's, through the descriptors the pool passed."""

    def __init__(self, config: dict[str, object], memory_mb: int | None, max_processes: int | None) -> None:
        self.version = int(config["version"])  # type: ignore[call-overload]
        self.fds: dict[str, int] = {k: int(v) for k, v in dict(config["fds"]).items()}  # type: ignore[call-overload]
        self.memory_mb, self.max_processes = memory_mb, max_processes
        any_fd = next(iter(self.fds.values()))
        self.procs_fd = self.fds.get("pids" if self.version == 1 else "unified", any_fd)
        self.cpu_fd = self.fds.get("cpuacct" if self.version == 1 else "unified")
        self.freezer_fd = self.fds.get("freezer" if self.version == 1 else "unified")
        """None where no freezer is mounted (v1); :meth:`freeze` raises OSError where it does not work."""

    def enter(self, name: str) -> None:
        """In a fresh spare, before anything else: create its cgroup, set its budget, move itself in."""
        pid = str(os.getpid())
        for hierarchy, fd in self.fds.items():
            os.mkdir(name, 0o755, dir_fd=fd)
            if hierarchy in ("memory", "unified") and self.memory_mb is not None:
                limit = str(self.memory_mb * MIB)
                if self.version == 1:
                    _write(fd, f"{name}/memory.limit_in_bytes", limit)
                    with contextlib.suppress(OSError):  # swap accounting is optional
                        _write(fd, f"{name}/memory.memsw.limit_in_bytes", limit)
                else:
                    _write(fd, f"{name}/memory.max", limit)
                    with contextlib.suppress(OSError):
                        _write(fd, f"{name}/memory.swap.max", "0")
            if hierarchy in ("pids", "unified") and self.max_processes is not None:
                _write(fd, f"{name}/pids.max", str(self.max_processes))
            _write(fd, f"{name}/cgroup.procs", pid)

    def attach(self, name: str) -> None:
        """In a fresh spare: move itself into the existing (empty, reused) cgroup ``name``."""
        pid = str(os.getpid())
        for fd in self.fds.values():
            _write(fd, f"{name}/cgroup.procs", pid)

    def exists(self) -> bool:
        """Whether the pool's cgroup is there in every hierarchy (a worker's: :meth:`pids` is not None)."""
        try:
            for fd in self.fds.values():
                os.stat("cgroup.procs", dir_fd=fd)
        except OSError:
            return False
        return True

    def pids(self, name: str) -> list[int] | None:
        """The processes in the worker's cgroup; None if it cannot be read (it is gone)."""
        try:
            return [int(p) for p in _read(self.procs_fd, f"{name}/cgroup.procs").split()]
        except (OSError, ValueError):
            return None

    def kill(self, name: str, *, spare: int | None = None) -> bool:
        """SIGKILL every process of the worker's cgroup but ``spare`` (a stopped session worker), until none is
        left: a process that forks meanwhile is caught on the next pass, and ``pids.max`` bounds the passes.
        True once it is seen empty (but for ``spare``), False if it cannot be read or does not empty."""
        if spare is None and self.version == 2:
            with contextlib.suppress(OSError):
                _write(self.procs_fd, f"{name}/cgroup.kill", "1")
        for attempt in range(1000):
            found = self.pids(name)
            if found is None:
                return False
            pids = [p for p in found if p != spare and p != 0]
            if not pids:
                return True
            for pid in pids:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            if attempt == 0 and spare is None and self.freezer_fd is not None:
                with contextlib.suppress(OSError):
                    self.thaw(name)  # after the SIGKILLs: a frozen session dies on waking, running nothing
            if attempt >= 10:
                time.sleep(0.001)  # killed processes still exiting: do not spin on them
        return False

    def freeze(self, name: str) -> None:
        """Freeze every process of the worker's cgroup: none runs, whatever signal it gets, until :meth:`thaw`.

        Asynchronous on v1 (``FREEZING`` until each process is caught; a stopped one is at once). Raises OSError
        where there is no freezer."""
        if self.freezer_fd is None:
            raise OSError("the freezer controller is not mounted")
        if self.version == 1:
            _write(self.freezer_fd, f"{name}/freezer.state", "FROZEN")
        else:
            _write(self.freezer_fd, f"{name}/cgroup.freeze", "1")

    def thaw(self, name: str) -> None:
        """Undo :meth:`freeze`."""
        if self.freezer_fd is None:
            raise OSError("the freezer controller is not mounted")
        if self.version == 1:
            _write(self.freezer_fd, f"{name}/freezer.state", "THAWED")
        else:
            _write(self.freezer_fd, f"{name}/cgroup.freeze", "0")

    def cpu_s(self, name: str) -> float | None:
        """CPU seconds used by every process that was ever in the worker's cgroup."""
        if self.cpu_fd is None:
            return None
        try:
            if self.version == 1:
                return int(_read(self.cpu_fd, f"{name}/cpuacct.usage")) / 1e9
            for line in _read(self.cpu_fd, f"{name}/cpu.stat").splitlines():
                key, value = line.split()
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def remove(self, name: str) -> bool:
        """Remove the worker's cgroups (call once its processes are dead); False if one is still busy."""
        done = True
        for fd in self.fds.values():
            try:
                os.rmdir(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError:
                done = False
        return done

    def close_fds(self) -> None:
        """In a worker: it must keep no handle on the pool's cgroups."""
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
