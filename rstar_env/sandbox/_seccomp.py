"""The syscall filter every ``local`` worker installs before it takes user code (seccomp-bpf, through libseccomp).

Everything is allowed except the calls below, which fail with ``EPERM`` (Python raises ``OSError``; ``ctypes``
sees -1), so ordinary code gets an error it can handle, never a crash. They are the ones container runtimes
refuse by default (Docker's profile), because they are the usual first step of a kernel exploit or a way out of
the worker's namespaces, or a channel to other episodes:

* namespaces: ``unshare`` and ``clone`` with any namespace flag, ``clone`` with ``CLONE_PARENT`` (the child
  would belong to the zygote, not the worker), ``setns``; ``clone3`` fails with ``ENOSYS`` instead, so the C
  library falls back to ``clone``, whose flags the filter can read;
* mounts: ``mount``, ``umount2``, ``pivot_root``, ``chroot`` and the new mount API (``fsopen``, ``fsmount``,
  ``move_mount``, ``open_tree``, ``fspick``, ``fsconfig``, ``mount_setattr``);
* kernel keyrings: ``keyctl``, ``add_key``, ``request_key`` (a keyring outlives the worker and is shared by uid);
* ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register``, and Linux AIO's ``io_setup`` and ``io_submit``
  (their requests carry ``RWF_NOWAIT`` in memory the filter cannot read);
* other processes' memory: ``ptrace``, ``process_vm_readv``, ``process_vm_writev``, ``pidfd_getfd``, ``kcmp``;
* ``bpf``, ``perf_event_open``, ``userfaultfd``;
* the kernel and the machine: ``kexec_load``, ``kexec_file_load``, ``init_module``, ``finit_module``,
  ``delete_module``, ``reboot``, ``swapon``, ``swapoff``, ``acct``, ``quotactl``, ``syslog``, ``iopl``,
  ``ioperm``, ``open_by_handle_at``, ``lookup_dcookie``, ``uselib``, ``personality`` (it can turn off address
  space randomisation);
* notifications about files, which concurrent workers would see on the files they share (the interpreter, the
  standard library): ``inotify_init``, ``inotify_init1``, ``inotify_add_watch``, ``fanotify_init``,
  ``fanotify_mark``, and ``fcntl`` with ``F_NOTIFY`` (dnotify) or ``F_SETLEASE``;
* the page cache of those shared files, which tells which pages another episode read (Gruss et al., "Page Cache
  Attacks", CCS 2019): ``mincore`` and ``cachestat`` are refused, and ``preadv2`` and ``pwritev2`` with
  ``RWF_NOWAIT`` in their flags (the sixth argument) fail with ``EOPNOTSUPP``, the kernel's own answer for a file
  that cannot be read without blocking: code that tries a non-blocking read and falls back to a blocking one (as
  asyncio-style readers do) keeps working. What is left is timing: a read of a cold page takes longer than one of
  a cached page (``rstar-env bench sandbox --workload pagecache`` measures it; docs/security.md has the figure).

``sysinfo`` is handed to the zygote, which answers with the worker's own numbers (see :mod:`._sysinfo`): the
host's free memory, load and process count would tell one episode of another's activity.

File locks are a channel on shared files too (one worker holds a lock on ``__future__.py``, another tests it), but
ordinary code needs them to succeed (``sqlite3`` locks its database): ``flock`` and ``fcntl``'s ``F_SETLK``,
``F_SETLKW``, ``F_OFD_SETLK`` and ``F_OFD_SETLKW`` return success without taking a lock. No sandboxed process
then holds a lock anywhere, so testing one (``F_GETLK``, a non-blocking ``flock``) always finds the file free;
the price is that a worker's own processes do not exclude each other through locks (two processes writing one
SQLite file at once could corrupt it; one process is safe, SQLite also locks within a process).

System calls of another architecture (32-bit calls from a 64-bit process) kill the process: the filter could
not read their numbers.

``pyseccomp`` (a ctypes binding of libseccomp) is imported lazily; without it or without ``libseccomp.so.2``,
:func:`build` raises and the pool names the missing filter in its warning. Loaded by the zygote without
``rstar_env`` (see :mod:`._spawn`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os

from . import _sysinfo

CLONE_NEWTIME = 0x00000080  # unshare only: in clone's flags these bits are the exit signal
CLONE_PARENT = 0x00008000
CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
NAMESPACE_FLAGS = (
    CLONE_NEWNS,
    CLONE_NEWCGROUP,
    CLONE_NEWUTS,
    CLONE_NEWIPC,
    CLONE_NEWUSER,
    CLONE_NEWPID,
    CLONE_NEWNET,
)

REFUSED = (
    "setns",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "keyctl",
    "add_key",
    "request_key",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "iopl",
    "ioperm",
    "open_by_handle_at",
    "lookup_dcookie",
    "uselib",
    "personality",
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    "fanotify_init",
    "fanotify_mark",
    "io_setup",
    "io_submit",
    "mincore",
)
"""Refused outright with ``EPERM`` (names this architecture lacks are skipped)."""

F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW = 6, 7, 37, 38
F_SETLEASE, F_NOTIFY = 1024, 1026
LOCK_COMMANDS = (F_SETLK, F_SETLKW, F_OFD_SETLK, F_OFD_SETLKW)
"""``fcntl`` commands that take a lock: they succeed without taking it (see the module docstring)."""
REFUSED_FCNTL = (F_SETLEASE, F_NOTIFY)
RWF_NOWAIT = 0x00000008
NOWAIT_CALLS = ("preadv2", "pwritev2")
"""Calls whose ``flags`` (argument 5: fd, iov, iovcnt, pos_low, pos_high, flags) may ask for ``RWF_NOWAIT``, which
fails with ``EAGAIN`` on a page that is not cached: a probe of the page cache without changing it."""
CACHESTAT = 451
"""``cachestat`` (Linux 6.5): by number, since older libseccomp releases do not know its name (its number is the
same on every architecture, from the unified syscall table)."""
"""``fcntl`` commands refused with ``EPERM``: a lease or a directory notification tells of other workers' opens."""


def build(answer_sysinfo: bool = True) -> CompiledFilter:
    """The filter, built once in the zygote (each worker loads it with ``.load()``). ``answer_sysinfo``: hand
    ``sysinfo`` to the zygote (see :mod:`._sysinfo`), so the filter needs a listener. Raises ImportError or
    OSError (pyseccomp or libseccomp missing) or RuntimeError with the cause."""
    import pyseccomp as seccomp  # libseccomp is found when the module is imported

    refuse = seccomp.ERRNO(errno.EPERM)
    rules = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    notifies = answer_sysinfo and _sysinfo.SYSINFO_NR is not None
    if notifies:
        rules.add_rule(seccomp.NOTIFY, "sysinfo")
    for name in REFUSED:
        try:
            rules.add_rule(refuse, name)
        except (ValueError, OSError, RuntimeError):
            continue  # no such call on this architecture (iopl on arm64): nothing to refuse
    for flag in (*NAMESPACE_FLAGS, CLONE_PARENT):
        rules.add_rule(refuse, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    for flag in (*NAMESPACE_FLAGS, CLONE_NEWTIME):
        rules.add_rule(refuse, "unshare", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    # Locks succeed without being taken ("errno 0" skips the call and returns 0): no worker ever holds one.
    pretend = seccomp.ERRNO(0)
    rules.add_rule(pretend, "flock")
    for name in ("fcntl", "fcntl64"):  # fcntl64: 32-bit architectures only
        try:
            for command in LOCK_COMMANDS:
                rules.add_rule(pretend, name, seccomp.Arg(1, seccomp.EQ, command))
            for command in REFUSED_FCNTL:
                rules.add_rule(refuse, name, seccomp.Arg(1, seccomp.EQ, command))
        except (ValueError, OSError, RuntimeError):
            continue
    # A non-blocking read tells whether a page of a shared file is cached: refused, with the kernel's own errno
    # for "this file cannot do that", so that callers fall back to a blocking read.
    unsupported = seccomp.ERRNO(errno.EOPNOTSUPP)
    for name in NOWAIT_CALLS:
        rules.add_rule(unsupported, name, seccomp.Arg(5, seccomp.MASKED_EQ, RWF_NOWAIT, RWF_NOWAIT))
    with contextlib.suppress(ValueError, OSError, RuntimeError):
        rules.add_rule(refuse, CACHESTAT)  # a libseccomp too old to know the number: the kernel lacks it too
    # clone3 passes its flags in memory the filter cannot read: ENOSYS makes the C library fall back to clone.
    rules.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    # Compiled once here; each worker loads the program with one prctl (libseccomp would recompile it per load).
    fd = os.memfd_create("seccomp-bpf", os.MFD_CLOEXEC)
    with os.fdopen(fd, "w+b") as exported:
        rules.export_bpf(exported)
        exported.seek(0)
        return CompiledFilter(exported.read(), notifies=notifies)


class _SockFprog(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_void_p))


PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_BPF_INSTRUCTION_BYTES = 8


class CompiledFilter:
    """A BPF program ready to load; built in the zygote, loaded (inherited memory) in each forked worker."""

    def __init__(self, program: bytes, notifies: bool = False) -> None:
        if not program or len(program) % _BPF_INSTRUCTION_BYTES:
            raise RuntimeError(f"libseccomp exported a malformed program ({len(program)} bytes)")
        self.notifies = notifies
        """It hands calls to a supervisor: :meth:`load` returns the listener to give it."""
        self._buffer = ctypes.create_string_buffer(program, len(program))
        self._prog = _SockFprog(len(program) // _BPF_INSTRUCTION_BYTES, ctypes.addressof(self._buffer))
        self._libc = ctypes.CDLL(None, use_errno=True)

    def load(self) -> int | None:
        """Install the filter on the calling thread (and what it starts); the listener's descriptor if it
        :attr:`notifies` (the caller passes it on and closes it: whoever holds it answers the calls), else None.
        Raises OSError if the kernel refuses."""
        args = (ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0))
        if self._libc.prctl(PR_SET_NO_NEW_PRIVS, ctypes.c_ulong(1), *args) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if self.notifies:
            return _sysinfo.load_with_listener(self._libc, self._prog)
        if self._libc.prctl(PR_SET_SECCOMP, ctypes.c_ulong(SECCOMP_MODE_FILTER), ctypes.byref(self._prog), 0, 0):
            errno_ = ctypes.get_errno()
            raise OSError(errno_, f"prctl(PR_SET_SECCOMP): {os.strerror(errno_)}")
        return None


def describe_missing(exc: BaseException) -> str:
    """The warning's words for a filter that cannot be had, with the fix."""
    return (
        f"no syscall filter ({type(exc).__name__}: {exc}): sandboxed code may create user namespaces, use io_uring, "
        "kernel keyrings and ptrace; install the `pyseccomp` package and the system's libseccomp (`libseccomp2`)"
    )
