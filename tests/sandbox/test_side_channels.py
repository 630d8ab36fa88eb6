"""Round 5 of the ``local`` sandbox's hardening (issue 42): no channel between episodes through the page cache of
the files they share or through the host's counters in ``/proc``, and no host path in ``/proc/self/cgroup``."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from rstar_env.sandbox import ExecResult, SandboxError
from rstar_env.sandbox.local import LocalSandbox

MEMORY_MB = 1024
BITS = 32


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    isolation = os.environ.get("RSTAR_TEST_SANDBOX_ISOLATION", "auto")
    box = LocalSandbox(
        timeout_s=20.0, max_concurrency=2, spares=2, memory_mb=MEMORY_MB, max_processes=128, isolation=isolation
    )
    try:
        box.start()
    except SandboxError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and the local sandbox cannot start: {exc}")
        pytest.skip(f"local sandbox unavailable on this machine (set CI=true to fail instead): {exc}")
    yield box
    box.close()


def execute(box: LocalSandbox, code: str, **kwargs: Any) -> ExecResult:
    result = run(box.execute(code, **kwargs))
    assert result.status == "ok", result
    return result


def require_filter() -> None:
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError) as exc:
        pytest.skip(f"no syscall filter can be had here (pyseccomp or libseccomp is missing: {exc})")


def shared_file() -> str:
    """The largest file of the standard library: every worker reads the same one, and nothing imports it."""
    stdlib = os.path.dirname(os.__file__)
    candidates = []
    for name in os.listdir(stdlib):
        path = os.path.join(stdlib, name)
        if name.endswith(".py") and os.path.isfile(path):
            candidates.append((os.path.getsize(path), path))
    size, path = max(candidates)
    assert size >= (BITS + 8) * 4096, f"{path} is too small for {BITS} bits"
    return path


# ---------------------------------------------------------------------------------------- 42.1: the page cache

PAGE_CACHE = """
import os
PAGE = 4096
path = {path!r}
pages = [8 + i for i in range({bits})]  # one bit per page (readahead is off)
"""

SEND = (
    PAGE_CACHE
    + """
fd = os.open(path, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # every page cold, then read those of the 1 bits
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
for page, bit in zip(pages, {message!r}):
    if bit == "1":
        os.pread(fd, 1, page * PAGE)
print("sent")
"""
)

RECEIVE = (
    PAGE_CACHE
    + """
import errno, json
fd = os.open(path, os.O_RDONLY)
seen = []
for page in pages:
    try:
        os.preadv(fd, [bytearray(1)], page * PAGE, os.RWF_NOWAIT)
        seen.append("1")
    except BlockingIOError:
        seen.append("0")
    except OSError as exc:
        seen.append(errno.errorcode[exc.errno])
print(json.dumps(seen))
# Ordinary reads still work, and so does preadv2 without the flag.
print(len(os.pread(fd, 10, 0)), os.preadv(fd, [bytearray(10)], 0, 0))
"""
)


def test_a_later_episode_learns_nothing_from_the_page_cache_of_shared_files(sandbox: LocalSandbox) -> None:
    """Finding 42.1: episode A reads chosen pages of a file every worker shares; a later episode B probes them
    with ``preadv2(RWF_NOWAIT)``, which fails with EAGAIN on a page that is not cached: 32 bits crossed. Now the
    probe is refused (EOPNOTSUPP, the kernel's own answer for a file that cannot be read without blocking)."""
    require_filter()
    path = shared_file()
    message = "10110010011100001111010100110011"
    assert execute(sandbox, SEND.format(path=path, bits=BITS, message=message)).stdout == "sent\n"
    result = execute(sandbox, RECEIVE.format(path=path, bits=BITS))
    probed, ordinary = result.stdout.splitlines()
    assert json.loads(probed) == [errno.errorcode[errno.EOPNOTSUPP]] * BITS, (
        f"the page cache carried {probed} for {message}"
    )
    assert ordinary == "10 10", result


RESIDENCY_PROBES = """
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
fd = os.open({path!r}, os.O_RDONLY)
scratch = os.open("scratch", os.O_RDWR | os.O_CREAT)
mapped = ctypes.c_void_p(libc.mmap(None, 65536, 1, 1, fd, 0))  # PROT_READ, MAP_SHARED
context = ctypes.c_ulong(0)
calls = {{
    "mincore": lambda: libc.syscall(27, mapped, 65536, ctypes.create_string_buffer(16)),
    "cachestat": lambda: libc.syscall(451, fd, ctypes.create_string_buffer(16), ctypes.create_string_buffer(64), 0),
    "io_setup": lambda: libc.syscall(206, 8, ctypes.byref(context)),
    "pwritev2(RWF_NOWAIT)": lambda: libc.syscall(328, scratch, ctypes.create_string_buffer(16), 0, 0, 0, 8),
}}
for name, call in calls.items():
    ctypes.set_errno(0)
    print(f"{{name}}|{{call()}} {{errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())}}")
"""


def test_other_residency_probes_are_refused(sandbox: LocalSandbox) -> None:
    """``mincore``, ``cachestat``, Linux AIO (whose requests carry ``RWF_NOWAIT`` in memory the filter cannot
    read) and ``pwritev2(RWF_NOWAIT)`` can tell page residency too: all refused."""
    require_filter()
    result = execute(sandbox, RESIDENCY_PROBES.format(path=shared_file()))
    seen = dict(line.split("|", 1) for line in result.stdout.splitlines())
    expected = {
        "mincore": "-1 EPERM",
        "cachestat": "-1 EPERM",
        "io_setup": "-1 EPERM",
        "pwritev2(RWF_NOWAIT)": f"-1 {errno.errorcode[errno.EOPNOTSUPP]}",
    }
    assert seen == expected, result.stdout


# ---------------------------------------------------------------------------------- 42.2: the host's counters

COUNTERS = (
    "/proc/meminfo",
    "/proc/stat",
    "/proc/loadavg",
    "/proc/vmstat",
    "/proc/uptime",
    "/proc/pressure/cpu",
    "/proc/pressure/memory",
    "/proc/pressure/io",
    "/proc/interrupts",
    "/proc/softirqs",
    "/proc/schedstat",
    "/proc/diskstats",
    "/proc/zoneinfo",
    "/proc/buddyinfo",
    "/proc/swaps",
    "/proc/sys/fs/file-nr",
    "/proc/sys/fs/inode-nr",
    "/proc/sys/fs/dentry-state",
    "/proc/sys/kernel/pty/nr",
)

RECEIVER = """
import ctypes, hashlib, json, os, time
paths = {paths!r}
libc = ctypes.CDLL(None, use_errno=True)
def sample():
    seen = {{}}
    answer = ctypes.create_string_buffer(512)  # struct sysinfo, with room to spare
    seen["sysinfo(2)"] = hashlib.sha256(answer.raw).hexdigest() if libc.sysinfo(answer) == 0 else "failed"
    for path in paths:
        try:
            with open(path, "rb") as f:
                seen[path] = hashlib.sha256(f.read()).hexdigest()
        except OSError as exc:
            seen[path] = type(exc).__name__
    return seen
samples = []
start = time.monotonic()
while time.monotonic() - start < {seconds}:
    samples.append(sample())
    time.sleep(0.05)
changed = sorted(p for p in samples[0] if len({{s[p] for s in samples}}) > 1)
print(json.dumps({{"start": start, "end": time.monotonic(), "samples": len(samples), "changed": changed}}))
"""

SENDER = """
import os, threading, time
time.sleep({delay})
start = time.monotonic()
hog = bytearray(200 << 20)
for i in range(0, len(hog), 4096):
    hog[i] = 1  # 200 MiB resident
stop = threading.Event()
threading.stack_size(256 << 10)  # within the worker's address-space limit beside the 200 MiB
threads = [threading.Thread(target=stop.wait) for _ in range(48)]
for t in threads:
    t.start()
forks, until = 0, time.monotonic() + {seconds}
while time.monotonic() < until:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    forks += 1
stop.set()
for t in threads:
    t.join()
print(start, time.monotonic(), forks)
"""


def test_an_episode_cannot_read_another_episodes_activity_in_the_hosts_counters(sandbox: LocalSandbox) -> None:
    """Finding 42.2: while a sender allocated 200 MiB, started 48 threads and forked in a loop, a receiver in a
    concurrent call saw ``MemAvailable`` drop, the host's thread count rise and the fork counter climb. Now the
    counters a worker can read are its own constants: byte for byte the same through the sender's pulse, and so is
    what ``sysinfo(2)`` answers (free memory, load and process count moved with the sender before the zygote
    answered it)."""

    async def both() -> tuple[ExecResult, ExecResult]:
        receiver = sandbox.execute(RECEIVER.format(paths=COUNTERS, seconds=10.0))
        sender = sandbox.execute(SENDER.format(delay=0.3, seconds=1.0))
        return await asyncio.gather(receiver, sender)

    overlapped = 0
    for _attempt in range(3):  # a loaded machine may start the sender late: measure again until they overlap
        received, sent = run(both())
        assert received.status == "ok" and sent.status == "ok", (received, sent)
        seen = json.loads(received.stdout)
        pulse_start, pulse_end, forks = sent.stdout.split()
        assert int(forks) > 0 and seen["samples"] > 10, (seen, sent.stdout)
        assert seen["changed"] == [], f"the host's counters carried the sender's activity: {seen['changed']}"
        # The measurement counts only if the receiver sampled through most of the pulse (a loaded machine may start
        # either call late): at least half a second of it, or all of it.
        overlap = min(float(pulse_end), seen["end"]) - max(float(pulse_start), seen["start"])
        if overlap >= min(0.5, float(pulse_end) - float(pulse_start)):
            overlapped += 1
            break
    assert overlapped, f"the sender's pulse never fell within the receiver's sampling: {seen}, {sent.stdout}"


READERS = """
import json, os, psutil
memory = psutil.virtual_memory()
print(json.dumps({
    "cpu_count": os.cpu_count(),
    "affinity": len(os.sched_getaffinity(0)),
    "psutil_cpus": psutil.cpu_count(),
    "total": memory.total,
    "available": memory.available,
    "percent": psutil.cpu_percent(interval=0.1),
    "per_cpu": len(psutil.cpu_percent(interval=0.1, percpu=True)),
    "load": os.getloadavg(),
    "boot": psutil.boot_time() > 0,
}))
"""


def test_cpu_count_and_psutil_still_read_the_workers_view(sandbox: LocalSandbox) -> None:
    """The synthetic files parse: ``os.cpu_count()`` and psutil's readers work, and the memory they report is the
    worker's budget."""
    pytest.importorskip("psutil")
    seen = json.loads(execute(sandbox, READERS).stdout)
    assert seen["cpu_count"] == os.cpu_count() and seen["psutil_cpus"] == os.cpu_count(), seen
    assert seen["affinity"] == len(os.sched_getaffinity(0)) and seen["per_cpu"] == os.cpu_count(), seen
    assert seen["total"] == MEMORY_MB << 20 and 0 < seen["available"] <= seen["total"], seen
    assert seen["percent"] == 0.0 and seen["load"] == [0.0, 0.0, 0.0] and seen["boot"], seen


SYSINFO = """
import ctypes, json, os, threading
class Sysinfo(ctypes.Structure):
    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3), ("totalram", ctypes.c_ulong),
                ("freeram", ctypes.c_ulong), ("other", ctypes.c_ulong * 4), ("procs", ctypes.c_ushort),
                ("pad", ctypes.c_ushort), ("high", ctypes.c_ulong * 2), ("mem_unit", ctypes.c_uint)]
libc = ctypes.CDLL(None, use_errno=True)
def ask():
    info = Sysinfo()
    status = libc.sysinfo(ctypes.byref(info))
    return [status, info.uptime, list(info.loads), info.totalram, info.freeram, info.procs, info.mem_unit]
seen = {"main": ask()}
seen["bad_pointer"] = [libc.sysinfo(ctypes.c_void_p(8)), ctypes.get_errno()]
threading.stack_size(256 << 10)
answers = []
threads = [threading.Thread(target=lambda: answers.append(ask())) for _ in range(16)]
for t in threads:
    t.start()
for t in threads:
    t.join()
seen["threads"] = answers
r, w = os.pipe()
if os.fork() == 0:
    os.write(w, json.dumps(ask()).encode())
    os._exit(0)
os.wait()
seen["child"] = json.loads(os.read(r, 4096))
with open("/proc/uptime") as f:
    seen["proc_uptime"] = int(float(f.read().split()[0]))
page = os.sysconf("SC_PAGE_SIZE")
seen["sysconf"] = [os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page]
print(json.dumps(seen))
"""


def test_sysinfo_answers_with_the_workers_own_numbers(sandbox: LocalSandbox) -> None:
    """``sysinfo(2)`` gave the host's load, free memory and process count (a channel, and the host's size). The
    zygote now answers it for the kernel: the worker's budget, load 0, one process, the same for its threads and
    forked children; a bad buffer gets ``EFAULT`` as from the kernel, and glibc's ``sysconf`` reads the budget."""
    require_filter()
    answers = []
    for session in (None, "sysinfo"):
        seen = json.loads(execute(sandbox, SYSINFO, session=session).stdout)
        status, uptime, loads, total, free, procs, unit = seen["main"]
        assert (status, loads, total, free, procs, unit) == (0, [0, 0, 0], MEMORY_MB << 20, MEMORY_MB << 20, 1, 1)
        assert uptime == seen["proc_uptime"] > 0, seen  # what the worker's /proc/uptime says: fixed at pool start
        answers.append(seen["main"])
        assert seen["bad_pointer"] == [-1, errno.EFAULT], seen
        assert len(seen["threads"]) == 16 and all(answer == seen["main"] for answer in seen["threads"]), seen
        assert seen["child"] == seen["main"] and seen["sysconf"] == [MEMORY_MB << 20] * 2, seen
    run(sandbox.close_session("sysinfo"))
    assert answers[0] == answers[1]


# ---------------------------------------------------------------------------------- 42.3: a cgroup namespace


def test_proc_self_cgroup_names_no_host_path_or_pid(sandbox: LocalSandbox) -> None:
    """Finding 42.3: ``/proc/self/cgroup`` showed ``memory:/.../rstar-sandbox-<host pid>-<id>/w<id>``. In a cgroup
    namespace of its own, every hierarchy reads ``/``; the worker's budget still holds (its memory limit)."""
    code = "print(open('/proc/self/cgroup').read())"
    for session in (None, "cgroup"):
        text = execute(sandbox, code, session=session).stdout
        paths = [line.split(":", 2)[2] for line in text.splitlines() if line]
        assert paths and set(paths) == {"/"}, text
        assert "rstar-sandbox" not in text and str(os.getpid()) not in text, text
    run(sandbox.close_session("cgroup"))


def test_the_namespaces_stay_refused_to_the_code(sandbox: LocalSandbox) -> None:
    """The worker makes its cgroup namespace before its filter is loaded; the code still cannot make one."""
    require_filter()
    code = (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.unshare(0x02000000), ctypes.get_errno())"
    )
    assert execute(sandbox, code).stdout == f"-1 {errno.EPERM}\n"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
