"""Resource limits and privilege drop, applied inside a fresh worker before any user code runs.

Stdlib only: the zygote and the worker load this module without ``rstar_env``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
from dataclasses import asdict, dataclass
from typing import Any

from . import _proctree

MIB = 1 << 20

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


def drop_privileges(uid: int) -> None:
    """Become ``uid`` (and gid ``uid``, no supplementary groups), keeping only CAP_DAC_READ_SEARCH.

    Used when the pool runs as root. The private uid makes RLIMIT_NPROC count this worker's processes only, keeps
    the code from signalling the zygote or the caller, and denies writes to files it does not own. Read and search
    access is kept (also across ``exec``, as an ambient capability) because interpreters commonly live under a
    private home (``/root/.pyenv``) that an unknown uid could not even import from. ``no_new_privs`` stops set-uid
    binaries from handing root back. Raises OSError where the process may not change uid.
    """
    libc = _proctree._libc
    last_cap = _last_cap()
    for cap in range(last_cap + 1):  # needs CAP_SETPCAP, which the setuid below takes away
        if cap != CAP_DAC_READ_SEARCH:
            with contextlib.suppress(OSError):
                _proctree.prctl(PR_CAPBSET_DROP, cap)
    _proctree.prctl(_proctree.PR_SET_KEEPCAPS, 1)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    keep = 1 << CAP_DAC_READ_SEARCH
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)(_CapData(keep, keep, keep), _CapData(0, 0, 0))
    if libc.capset(ctypes.byref(header), data) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"capset: {os.strerror(errno)}")
    _proctree.prctl(_proctree.PR_CAP_AMBIENT, _proctree.PR_CAP_AMBIENT_RAISE, CAP_DAC_READ_SEARCH)
    _proctree.prctl(PR_SET_NO_NEW_PRIVS, 1)
    # A uid change leaves the process non-dumpable, which hides its own /proc/self/fd from it; restore the norm.
    _proctree.prctl(PR_SET_DUMPABLE, 1)


def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 40


def can_drop_privileges() -> bool:
    """True when this process may change uid (root, or holding CAP_SETUID in its namespace)."""
    return os.geteuid() == 0
