"""Resource limits and privilege drop, applied inside a fresh worker before any user code runs.

Stdlib only: the zygote and the worker load this module without ``rstar_env``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import resource
import socket
import struct
from dataclasses import asdict, dataclass
from typing import Any

from . import _proctree

MIB = 1 << 20
MAX_PTYS = 16
"""Pseudo-terminals a worker may hold at once, in its own ``/dev/pts`` (see :func:`private_namespaces`)."""

PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
CAP_DAC_READ_SEARCH = 2
_CAP_VERSION_3 = 0x20080522


@dataclass(frozen=True)
class Limits:
    """Per-worker ``setrlimit`` values; None leaves a limit as inherited.

    ``memory_mb`` is address space (RLIMIT_AS): an allocation beyond it raises MemoryError in Python.
    ``max_processes`` is RLIMIT_NPROC; the kernel enforces it per uid and never for root, which is why a pool
    running as root gives every worker a private uid. ``max_file_mb`` bounds any single file written.
    """

    memory_mb: int | None = 2048
    max_processes: int | None = 64
    max_files: int | None = 256
    max_file_mb: int | None = 64
    tmp_mb: int = 256
    """Size of the worker's private ``/tmp`` (and working directory) and of its ``/dev/shm``: memory-backed. Each
    is cut to half of ``memory_mb`` (:attr:`tmpfs_mb`)."""

    @property
    def tmpfs_mb(self) -> int:
        """The size each of ``/tmp`` and ``/dev/shm`` is mounted with: ``tmp_mb``, but the two together never more
        than ``memory_mb``, so what a worker can park in files fits its own budget even where no cgroup counts it
        (a session's reservation of the pool is ``memory_mb``)."""
        if self.memory_mb is None:
            return self.tmp_mb
        return max(1, min(self.tmp_mb, self.memory_mb // 2))

    def apply(self) -> None:
        """Set the limits on the calling process (soft = hard, so user code cannot raise them back)."""
        _set(resource.RLIMIT_CORE, 0)
        if self.memory_mb is not None:
            _set(resource.RLIMIT_AS, self.memory_mb * MIB)
        if self.max_processes is not None:
            _set(resource.RLIMIT_NPROC, self.max_processes)
        if self.max_files is not None:
            _set(resource.RLIMIT_NOFILE, self.max_files)
        if self.max_file_mb is not None:
            _set(resource.RLIMIT_FSIZE, self.max_file_mb * MIB)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _set(kind: int, value: int) -> None:
    _soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY and os.geteuid() != 0:
        value = min(value, hard)  # an unprivileged process cannot raise its hard limit
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(kind, (value, value))


def set_cpu_budget(cpu_s: float, *, final: bool) -> None:
    """Allow ``cpu_s`` more seconds of CPU from now (RLIMIT_CPU counts the whole life of the process).

    A backstop behind the wall-clock kill: SIGXCPU at the soft limit. ``final`` (a one-call worker) also sets the
    hard limit, which SIGKILLs; a session worker keeps its hard limit, because a lowered hard limit can never be
    raised again for the next call.
    """
    times = os.times()
    used = times.user + times.system
    soft = int(used + cpu_s) + 1
    _soft, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if final:
        hard = soft + 1 if hard == resource.RLIM_INFINITY else min(hard, soft + 1)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32))


def drop_privileges(uid: int | None, *, keep_read_search: bool = False) -> None:
    """Drop every capability (and become ``uid``, gid ``uid``, no supplementary groups, when given); no_new_privs.

    A private uid (the pool runs as root) makes RLIMIT_NPROC count this worker's processes only, keeps the code
    from signalling the zygote, the caller or other workers, and denies access to files it does not own.
    ``keep_read_search`` keeps CAP_DAC_READ_SEARCH (also across ``exec``, as an ambient capability): only for the
    fallbacks without bubblewrap where the interpreter lives under a private home (``/root/.pyenv``) that an
    unknown uid could not import from; it lets the code read any file, so the pool's warning says so. Under
    bubblewrap the interpreter is bound where any uid can read it, and nothing is kept. ``no_new_privs`` stops
    set-uid binaries from handing root back. Raises OSError where the process may not change uid.
    """
    libc = _proctree._libc
    keep = (1 << CAP_DAC_READ_SEARCH) if keep_read_search else 0
    for cap in range(_last_cap() + 1):  # needs CAP_SETPCAP, which the setuid below takes away
        if not keep >> cap & 1:
            with contextlib.suppress(OSError):
                _proctree.prctl(PR_CAPBSET_DROP, cap)
    if uid is not None:
        _proctree.prctl(_proctree.PR_SET_KEEPCAPS, 1)
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)(_CapData(keep, keep, keep), _CapData(0, 0, 0))
    if libc.capset(ctypes.byref(header), data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capset: {os.strerror(errno)}")
    with contextlib.suppress(OSError):
        _proctree.prctl(_proctree.PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)
    if keep_read_search:
        _proctree.prctl(_proctree.PR_CAP_AMBIENT, _proctree.PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH)
    _proctree.prctl(PR_SET_NO_NEW_PRIVS, 1)
    # A uid change leaves the process non-dumpable, which hides its own /proc/self/fd from it; restore the norm.
    _proctree.prctl(PR_SET_DUMPABLE, 1)


MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
PR_CAP_AMBIENT_CLEAR_ALL = 4


def _mount(source: str, target: str, fstype: str | None, flags: int, data: str | None) -> None:
    libc = _proctree._libc
    args = [v.encode() if v is not None else None for v in (source, target, fstype)]
    if libc.mount(*args, ctypes.c_ulong(flags), data.encode() if data is not None else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def private_namespaces(
    tmp_mb: int,
    *,
    network: bool = True,
    tmp_binds: list[str] | tuple[str, ...] = (),
    max_ptys: int | None = MAX_PTYS,
) -> None:
    """Give this process (and what it starts) its own IPC namespace (and, with ``network=False``, its own
    network namespace with only a loopback interface) and its own, empty ``/tmp``, ``/dev/shm``, ``/dev/pts`` and
    ``/proc`` view. Needs CAP_SYS_ADMIN; call before :func:`drop_privileges`. Raises OSError if it cannot.

    Everything here dies with the last process of the worker: SysV segments, message queues, sockets bound on
    loopback or in the abstract namespace, pseudo-terminals, and files in ``/tmp`` or ``/dev/shm`` cannot outlive
    the call or reach another one. ``/proc`` is mounted with ``hidepid=invisible``, so the code sees only
    processes of its own uid (its own, with a private uid). ``/dev/pts`` is a new devpts instance holding at most
    ``max_ptys`` terminals (None: keep the shared one); ``/dev/ptmx`` (bubblewrap's link to ``pts/ptmx``, or the
    host's device node, which the kernel resolves through the ``pts`` beside it) then opens there. ``tmp_binds``:
    folders under ``/tmp`` (an interpreter installed there) bound back, read-only, over the new ``/tmp``.
    """
    libc = _proctree._libc
    flags = CLONE_NEWNS | CLONE_NEWIPC | (0 if network else CLONE_NEWNET)
    if libc.unshare(flags) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare: {os.strerror(errno)}")
    if not network:
        _loopback_up()
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)  # nothing mounted here propagates back to the pool
    options = f"size={tmp_mb}m,mode=1777"
    _tmpfs_binding_back("/tmp", options, tmp_binds)
    if os.path.isdir("/dev/shm"):
        _mount("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, options)
    if max_ptys is not None and os.path.isdir("/dev/pts"):
        pts_options = f"newinstance,ptmxmode=0666,mode=0620,max={max_ptys}"
        _mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, pts_options)
    try:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=invisible")
    except OSError:
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")  # kernels before 5.8


SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def _loopback_up() -> None:
    # A new network namespace has its loopback down: code that serves on 127.0.0.1 (a multiprocessing manager)
    # would fail. Up, it reaches only this worker's own sockets.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


def can_drop_privileges() -> bool:
    """True when this process may change uid (root, or holding CAP_SETUID in its namespace)."""
    return os.geteuid() == 0


def expose_interpreter(paths: list[str] | tuple[str, ...]) -> list[str]:
    """In a mount namespace of our own: cover each private directory (one other users cannot enter, such as
    ``/root``) that holds one of ``paths`` with an empty tmpfs, and bind just ``paths`` back, read-only.

    Then workers need no capability to import from an interpreter under ``/root/.pyenv``, and see nothing else of
    that home (``.gitconfig``, ``.npmrc``). For the ``unshare`` fallback; bubblewrap builds its own view. Returns
    the directories covered. Raises OSError if it cannot.
    """
    _mount("none", "/", None, MS_REC | MS_PRIVATE, None)
    covers: dict[str, list[str]] = {}
    for path in paths:
        parts = os.path.normpath(path).split(os.sep)[1:]
        for depth in range(1, len(parts)):
            ancestor = os.sep + os.path.join(*parts[:depth])
            if not os.stat(ancestor).st_mode & 0o001:  # others may not enter it
                covers.setdefault(ancestor, []).append(path)
                break
    for private, inside in covers.items():
        _tmpfs_binding_back(private, "mode=0755,size=1m", inside)
    return list(covers)


def _tmpfs_binding_back(target: str, options: str, paths: list[str] | tuple[str, ...]) -> None:
    """Mount a fresh tmpfs over ``target`` and bind ``paths`` (folders under it) back, read-only. The paths are
    opened before the tmpfs hides them, and bound from those handles."""
    handles = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in paths}
    try:
        _mount("tmpfs", target, "tmpfs", MS_NOSUID | MS_NODEV, options)
        for path, fd in handles.items():
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC, None)
            _mount("none", path, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
    finally:
        for fd in handles.values():
            os.close(fd)
