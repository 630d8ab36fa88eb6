"""``sysinfo(2)`` answered for the kernel: a worker's own numbers, not the host's (seccomp user notification).

``sysinfo`` returns the host's load, free memory and number of processes, machine-wide counters that move with
every other worker's activity: a channel between concurrent episodes (glibc asks it for
``sysconf(_SC_PHYS_PAGES)`` and ``_SC_AVPHYS_PAGES``, psutil for ``virtual_memory()``). A seccomp filter can
refuse a call but not rewrite its answer, and refused, glibc's ``sysconf`` returns garbage. So the worker's filter
hands ``sysinfo`` to a supervisor (``SECCOMP_RET_USER_NOTIF``): the worker sends the filter's listener to the
zygote, and the zygote's event loop, which no worker can reach, answers each call with :func:`answer`: the same
constants as the worker's ``/proc`` (:mod:`._procview`): memory total and free are its budget, load 0, one process,
uptime as at pool start. The caller's buffer is written through ``/proc/PID/mem`` after the notification is
checked to be still pending (so the pid is still the caller's), and a bad buffer gets ``EFAULT``, as from the
kernel. Other calls never reach the supervisor.

Stdlib only: the zygote loads this module without ``rstar_env``.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import platform
import re
import select

SECCOMP_RET_USER_NOTIF = 0x7FC00000
SYSINFO_NR = {"x86_64": 99, "aarch64": 116}.get(platform.machine())
"""``sysinfo``'s number on this architecture (None where it is not known: the filter then leaves it alone)."""
SECCOMP_NR = {"x86_64": 317, "aarch64": 277}.get(platform.machine())
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_NEW_LISTENER = 1 << 3


class _SeccompData(ctypes.Structure):
    _fields_ = (
        ("nr", ctypes.c_int),
        ("arch", ctypes.c_uint32),
        ("instruction_pointer", ctypes.c_uint64),
        ("args", ctypes.c_uint64 * 6),
    )


class _Notif(ctypes.Structure):
    _fields_ = (("id", ctypes.c_uint64), ("pid", ctypes.c_uint32), ("flags", ctypes.c_uint32), ("data", _SeccompData))


class _NotifResp(ctypes.Structure):
    _fields_ = (("id", ctypes.c_uint64), ("val", ctypes.c_int64), ("error", ctypes.c_int32), ("flags", ctypes.c_uint32))


class Sysinfo(ctypes.Structure):
    """``struct sysinfo`` as this platform lays it out (``man 2 sysinfo``)."""

    _fields_ = (
        ("uptime", ctypes.c_long),
        ("loads", ctypes.c_ulong * 3),
        ("totalram", ctypes.c_ulong),
        ("freeram", ctypes.c_ulong),
        ("sharedram", ctypes.c_ulong),
        ("bufferram", ctypes.c_ulong),
        ("totalswap", ctypes.c_ulong),
        ("freeswap", ctypes.c_ulong),
        ("procs", ctypes.c_ushort),
        ("pad", ctypes.c_ushort),
        ("totalhigh", ctypes.c_ulong),
        ("freehigh", ctypes.c_ulong),
        ("mem_unit", ctypes.c_uint),
        ("_f", ctypes.c_char * max(0, 20 - 2 * ctypes.sizeof(ctypes.c_long) - ctypes.sizeof(ctypes.c_int))),
    )


def _iowr(number: int, size: int) -> int:
    return (3 << 30) | (size << 16) | (ord("!") << 8) | number


NOTIF_RECV = _iowr(0, ctypes.sizeof(_Notif))
NOTIF_SEND = _iowr(1, ctypes.sizeof(_NotifResp))
NOTIF_ID_VALID = (1 << 30) | (8 << 16) | (ord("!") << 8) | 2


def answer(proc_files: dict[str, bytes], memory_bytes: int) -> bytes:
    """The worker's ``struct sysinfo``: what its ``/proc`` says (``proc_files`` from :func:`._procview.render`),
    ``memory_bytes`` where that has no ``meminfo``."""
    total = memory_bytes
    found = re.search(rb"^MemTotal:\s+(\d+) kB", proc_files.get("meminfo", b""), re.M)
    if found:
        total = int(found.group(1)) << 10
    uptime = proc_files.get("uptime", b"0").split()
    info = Sysinfo(uptime=int(float(uptime[0])) if uptime else 0, totalram=total, freeram=total, procs=1, mem_unit=1)
    return bytes(info)


class Supervisor:
    """Answers the ``sysinfo`` calls of the workers whose listeners it is given (one per worker)."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply

    def handle(self, listener: int) -> bool:
        """Answer the call pending on ``listener`` (readable). False once the listener is dead: every process
        under its filter has exited; close it."""
        poller = select.poll()
        poller.register(listener, select.POLLIN)
        events = sum(e for _, e in poller.poll(0))
        if not events & select.POLLIN:
            # Receiving now would block until the next call: none is pending. A hang-up: no process is left under
            # the filter.
            return not events & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
        notif = _Notif()  # zeroed, as the kernel requires
        try:
            fcntl.ioctl(listener, NOTIF_RECV, notif)
        except OSError as exc:
            # ENOENT: the caller was killed after it was announced; the listener lives on.
            return exc.errno in (errno.EINTR, errno.ENOENT)
        response = _NotifResp(id=notif.id)
        if notif.data.nr != SYSINFO_NR:
            response.error = -errno.ENOSYS  # not ours to answer: the filter sends nothing else
        else:
            response.error = -self._write(listener, notif)
        try:
            fcntl.ioctl(listener, NOTIF_SEND, response)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the caller died meanwhile
                return False
        return True

    def _write(self, listener: int, notif: _Notif) -> int:
        """Write the answer into the caller's buffer; 0, or the errno for the caller."""
        try:
            mem = os.open(f"/proc/{notif.pid}/mem", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return errno.ESRCH
        try:
            # Still pending: the pid we opened is the caller's, not a reused one.
            fcntl.ioctl(listener, NOTIF_ID_VALID, ctypes.c_uint64(notif.id))
            address = notif.data.args[0]
            if not address:
                return errno.EFAULT
            if os.pwrite(mem, self.reply, address) != len(self.reply):
                return errno.EFAULT
        except OSError as exc:
            return errno.EFAULT if exc.errno in (errno.EFAULT, errno.EIO) else errno.ESRCH
        finally:
            os.close(mem)
        return 0


def load_with_listener(libc: ctypes.CDLL, program: ctypes.Structure) -> int:
    """Install a filter (a ``struct sock_fprog``) on the calling thread with a new listener; its descriptor.
    Raises OSError if the kernel refuses (before Linux 5.0, or another filter of the thread has a listener)."""
    if SECCOMP_NR is None:
        raise OSError(errno.ENOSYS, f"seccomp's number on {platform.machine()} is not known here")
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(
        ctypes.c_long(SECCOMP_NR),
        ctypes.c_ulong(SECCOMP_SET_MODE_FILTER),
        ctypes.c_ulong(SECCOMP_FILTER_FLAG_NEW_LISTENER),
        ctypes.byref(program),
    )
    if fd < 0:
        error = ctypes.get_errno()
        raise OSError(error, f"seccomp(SECCOMP_FILTER_FLAG_NEW_LISTENER): {os.strerror(error)}")
    os.set_inheritable(fd, False)
    return int(fd)
