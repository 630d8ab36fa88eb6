"""A worker's own view of the host's counters: constant files bound over ``/proc/meminfo``, ``/proc/stat`` and
the like (the LXCFS approach, without a daemon).

The kernel's counters are machine-wide: a worker that reads ``MemAvailable`` in ``/proc/meminfo``, the fork
counter in ``/proc/stat``, the thread count in ``/proc/loadavg``, or pressure in ``/proc/pressure/*`` sees every
other worker's allocations, threads and forks, a channel between concurrent episodes. Here each of those files
(:data:`COUNTERS`) is replaced, in the worker's own mount namespace, by a copy rendered once per pool
(:func:`render`) whose numbers never move:

* ``meminfo``: ``MemTotal``, ``MemFree`` and ``MemAvailable`` are the worker's memory budget (the host's total
  without one), every other amount 0 (page sizes kept);
* ``stat``: one ``cpuN`` line per CPU of the host (``os.cpu_count()`` counts them where ``/sys`` is not visible),
  idle time constant and everything else 0; ``btime`` is the host's (fixed since boot);
* ``loadavg`` ``0.00 0.00 0.00 1/1 1``; ``uptime`` the host's at pool start;
* ``cpuinfo``: every ``cpu MHz`` line fixed at its value at pool start (the clock moves with load);
* the others (``vmstat``, ``pressure/*``, ``interrupts``, ``softirqs``, ``diskstats``, ``zoneinfo``, ...): the
  host's text at pool start with every counter set to 0 (names and labels kept).

So ``os.cpu_count()``, ``os.getloadavg()`` and psutil's readers parse them as usual: memory is the budget, CPU
use and load are 0. The copies live on a small read-only tmpfs whose own mount point is detached once they are
bound, so no path leads to them but ``/proc``; the worker installs them (:func:`install`) while it still holds
``CAP_SYS_ADMIN``, and its syscall filter refuses ``mount`` and ``umount2`` from then on.

Stdlib only: the zygote loads this module without ``rstar_env``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re

COUNTERS = (
    "meminfo",
    "stat",
    "loadavg",
    "uptime",
    "cpuinfo",
    "vmstat",
    "zoneinfo",
    "buddyinfo",
    "pagetypeinfo",
    "interrupts",
    "softirqs",
    "schedstat",
    "diskstats",
    "swaps",
    "pressure/cpu",
    "pressure/memory",
    "pressure/io",
    "pressure/irq",
    "sys/fs/file-nr",
    "sys/fs/inode-nr",
    "sys/fs/dentry-state",
    "sys/kernel/pty/nr",
)
"""Files under ``/proc`` replaced where the host has them (``pressure/*`` as one folder)."""
KEEP_FIELDS = {"diskstats": 3}
"""Leading fields of each line that are names, not counters (a disk's major and minor numbers)."""
MEMORY_KEEP = ("Hugepagesize", "Hugetlb")
"""``meminfo`` lines kept as the host has them (sizes of pages, not amounts in use)."""
IDLE_TICKS = 100
"""Idle time of each CPU in ``stat`` (constant: CPU use computed between two reads is 0)."""
_NUMBER = re.compile(rb"(?<![\w.])\d+(\.\d+)?(?![\w.:])")
_STAGING = "/tmp/.rstar-proc"
MS_RDONLY, MS_REMOUNT, MS_BIND, MNT_DETACH = 1, 32, 4096, 2
_libc = ctypes.CDLL(None, use_errno=True)


def _zeroed(text: bytes, keep_fields: int = 0) -> bytes:
    """``text`` with every number set to 0 (``0.00`` for a decimal), past the first ``keep_fields`` of a line."""

    def zero(match: re.Match[bytes]) -> bytes:
        return b"0.00" if match.group(1) else b"0"

    if not keep_fields:
        return _NUMBER.sub(zero, text)
    lines = []
    for line in text.split(b"\n"):
        fields = line.split()
        if len(fields) <= keep_fields:
            lines.append(line)
            continue
        # The kept fields are re-joined as they were; the counters after them are zeroed.
        cut = 0
        for field in fields[:keep_fields]:
            cut = line.index(field, cut) + len(field)
        lines.append(line[:cut] + _NUMBER.sub(zero, line[cut:]))
    return b"\n".join(lines)


def _meminfo(host: bytes, memory_bytes: int | None) -> bytes:
    total = memory_bytes
    if total is None:
        found = re.search(rb"^MemTotal:\s+(\d+) kB", host, re.M)
        total = int(found.group(1)) << 10 if found else 0
    budget = {b"MemTotal", b"MemFree", b"MemAvailable"}
    lines = []
    for line in host.splitlines():
        name, _, rest = line.partition(b":")
        if name in budget:
            lines.append(name + b":" + f"{total >> 10:>16} kB".encode())
        elif name.decode(errors="replace").startswith(MEMORY_KEEP):
            lines.append(line)
        else:
            lines.append(name + b":" + _zeroed(rest))
    return b"\n".join(lines) + b"\n"


def _stat(host: bytes) -> bytes:
    cpus = [line.split()[0] for line in host.splitlines() if re.match(rb"cpu\d+ ", line)]
    btime = re.search(rb"^btime (\d+)", host, re.M)
    idle = f"0 0 0 {IDLE_TICKS} 0 0 0 0 0 0"
    lines = [f"cpu  0 0 0 {IDLE_TICKS * len(cpus)} 0 0 0 0 0 0".encode()]
    lines += [cpu + b" " + idle.encode() for cpu in cpus]
    lines += [b"intr 0", b"ctxt 0", b"btime " + (btime.group(1) if btime else b"0")]
    lines += [b"processes 1", b"procs_running 1", b"procs_blocked 0", b"softirq 0 0 0 0 0 0 0 0 0 0 0"]
    return b"\n".join(lines) + b"\n"


def _cpuinfo(host: bytes) -> bytes:
    clock = re.search(rb"^cpu MHz\s*:\s*([\d.]+)", host, re.M)
    if clock is None:
        return host
    return re.sub(rb"^(cpu MHz\s*:\s*)[\d.]+", lambda m: m.group(1) + clock.group(1), host, flags=re.M)


def render(memory_mb: int | None, proc: str = "/proc") -> dict[str, bytes]:
    """The worker's copies of :data:`COUNTERS` that the host has, ``{path under /proc: content}``: rendered once
    per pool, in the zygote, from the host's files as they are now (only their layout and fixed values are used)."""
    files: dict[str, bytes] = {}
    for name in COUNTERS:
        try:
            with open(os.path.join(proc, name), "rb") as f:
                host = f.read()
        except OSError:
            continue  # not on this kernel (no PSI, no schedstat), or not readable here: nothing to replace
        if name == "meminfo":
            files[name] = _meminfo(host, memory_mb << 20 if memory_mb else None)
        elif name == "stat":
            files[name] = _stat(host)
        elif name == "loadavg":
            files[name] = b"0.00 0.00 0.00 1/1 1\n"
        elif name == "uptime":
            files[name] = re.sub(rb" [\d.]+\n?$", b" 0.00\n", host)
        elif name == "cpuinfo":
            files[name] = _cpuinfo(host)
        else:
            files[name] = _zeroed(host, KEEP_FIELDS.get(name, 0))
    return files


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    args = [v.encode() if v is not None else None for v in (source, target, fstype)]
    if _libc.mount(*args, ctypes.c_ulong(flags), data.encode() if data is not None else None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount {target}: {os.strerror(errno)}")


def install(files: dict[str, bytes], proc: str = "/proc") -> None:
    """Bind ``files`` (from :func:`render`) over their paths under ``proc``, read-only. In the worker, in a mount
    namespace of its own with its own ``/tmp`` (where the copies are staged, then hidden), before it drops
    ``CAP_SYS_ADMIN``. Raises OSError if it cannot."""
    os.mkdir(_STAGING, 0o700)
    try:
        size = sum(len(content) for content in files.values()) + (64 << 10)
        _mount("tmpfs", _STAGING, "tmpfs", 0, f"size={size},mode=0755")
        try:
            for name, content in files.items():
                path = os.path.join(_STAGING, name.replace("/", "_") if not name.startswith("pressure/") else name)
                os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
                try:
                    os.write(fd, content)
                finally:
                    os.close(fd)
            # Read-only as a whole (the superblock, not a bind): no uid, root included, can change a copy.
            _mount(None, _STAGING, None, MS_REMOUNT | MS_RDONLY, f"size={size},mode=0755")
            bound_pressure = False
            for name in files:
                if name.startswith("pressure/"):
                    if not bound_pressure:
                        _mount(os.path.join(_STAGING, "pressure"), os.path.join(proc, "pressure"), None, MS_BIND)
                        bound_pressure = True
                    continue
                _mount(os.path.join(_STAGING, name.replace("/", "_")), os.path.join(proc, name), None, MS_BIND)
        finally:
            # The binds keep the tmpfs alive; its own mount point goes, so nothing but /proc reaches the copies.
            if _libc.umount2(_STAGING.encode(), MNT_DETACH) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"umount {_STAGING}: {os.strerror(errno)}")
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(_STAGING)
