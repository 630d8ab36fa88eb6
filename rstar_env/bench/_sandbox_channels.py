"""``rstar-env bench sandbox --workload pagecache``: how many bits per second one episode can still pass to a later
one through the page cache of the files every worker shares.

The probe that carried bits before (``preadv2`` with ``RWF_NOWAIT``, which fails on a page that is not cached) is
refused by the syscall filter; ``mincore`` and ``cachestat`` too. What is left is timing: a read of a page that is
not cached waits for the disk. Each round, a *sender* call drops the pages of a large file of the standard library
from the cache (``posix_fadvise(DONTNEED)``, open to anyone who may read the file) and reads one byte of each page
whose bit is 1; a *receiver* call, in another worker started after the sender's is gone, first tries the refused
probe, then times a one-byte read of each page and calls it 1 when the read was fast. It sets its threshold from
pages it drops and reads itself (cold) and reads again (cached). Both turn readahead off (``FADV_RANDOM``) so that
one page's read does not bring in the next.

A second receiver, ``pagemap``, times nothing: it reads one *anchor* page of each aligned group of 16 (which the
sender leaves alone), maps the file and touches the anchor; the kernel's fault-around then maps the group's other
pages that are cached, and the receiver's own ``/proc/self/pagemap`` shows which were mapped.

The figure: the channel's capacity, ``bits x (1 - H(error rate)) / seconds`` (a binary symmetric channel), over
the wall time of both calls of every round, as the caller sees them.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from typing import Any

from rstar_env.sandbox import create_sandbox

PAGE = 4096
BITS = 64
CALIBRATION_PAGES = 16
FIRST_PAGE = 8
"""The file's first pages are left out (a reader of its header would have them cached)."""

SEND = """
import os
fd = os.open({path!r}, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
for page, bit in zip({pages!r}, {bits!r}):
    if bit:
        os.pread(fd, 1, page * {page_size})
print("sent")
"""

RECEIVE = """
import errno, json, os, statistics, time
fd = os.open({path!r}, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
try:
    os.preadv(fd, [bytearray(1)], {pages[0]} * {page_size}, os.RWF_NOWAIT)
    nowait = "allowed"
except BlockingIOError:
    nowait = "allowed"
except OSError as exc:
    nowait = errno.errorcode.get(exc.errno, str(exc.errno))
def timed(page):
    start = time.perf_counter_ns()
    os.pread(fd, 1, page * {page_size})
    return time.perf_counter_ns() - start
calibration = {calibration!r}
for page in calibration:
    os.posix_fadvise(fd, page * {page_size}, {page_size}, os.POSIX_FADV_DONTNEED)
cold = [timed(page) for page in calibration]
hot = [timed(page) for page in calibration]
threshold = (statistics.median(cold) * statistics.median(hot)) ** 0.5
print(json.dumps({{
    "nowait": nowait,
    "bits": [int(timed(page) < threshold) for page in {pages!r}],
    "cold_us": statistics.median(cold) / 1000,
    "hot_us": statistics.median(hot) / 1000,
}}))
"""


RECEIVE_PAGEMAP = """
import json, mmap, os, struct
fd = os.open({path!r}, os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
pages, anchors = {pages!r}, {anchors!r}
size = (max(pages) + 1) * {page_size}
for anchor in anchors:
    os.pread(fd, 1, anchor * {page_size})
view = mmap.mmap(fd, size, prot=mmap.PROT_READ)
for anchor in anchors:
    view[anchor * {page_size}]  # a read fault: fault-around maps the cached pages beside it
def span(line):
    low, high = (int(x, 16) for x in line.split()[0].split("-"))
    return low, high - low
with open("/proc/self/maps") as maps:
    start = next(span(line)[0] for line in maps if line.rstrip().endswith({path!r}) and span(line)[1] == size)
with open("/proc/self/pagemap", "rb") as f:
    f.seek(start // {page_size} * 8)
    present = struct.unpack(f"{{size // {page_size}}}Q", f.read(size // {page_size} * 8))
bits = [int(present[page] >> 63) for page in pages]
print(json.dumps({{"nowait": "not tried", "bits": bits, "cold_us": 0, "hot_us": 0}}))
"""
GROUP = 16
"""Pages per fault-around window (``fault_around_bytes``, 64 KiB by default)."""


def shared_file() -> str:
    """The largest file of the standard library's folder: present in every worker's view, read by no import."""
    stdlib = os.path.dirname(os.__file__)
    best = (0, "")
    for folder, _dirs, names in os.walk(stdlib):
        for name in names:
            path = os.path.join(folder, name)
            if not os.path.islink(path) and name.endswith((".a", ".py", ".txt", ".pdf", ".wav", ".zip")):
                best = max(best, (os.path.getsize(path), path))
    if best[0] < (FIRST_PAGE + BITS + CALIBRATION_PAGES) * PAGE:
        raise RuntimeError(f"no file of {stdlib} has {FIRST_PAGE + BITS + CALIBRATION_PAGES} pages")
    return best[1]


def _entropy(p: float) -> float:
    return 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


async def page_cache_channel(rounds: int, seed: int = 0, receiver: str = "timing") -> dict[str, Any]:
    """``rounds`` rounds of :data:`BITS` bits from a sender call to a later receiver call (``timing`` or
    ``pagemap``) on a fresh ``local`` pool (default settings); the capacity left, in bits per second."""
    path = shared_file()
    if receiver == "pagemap":
        first = -(-FIRST_PAGE // GROUP) * GROUP
        anchors = list(range(first, first + GROUP * (-(-BITS // (GROUP - 1))), GROUP))
        pages = [page for anchor in anchors for page in range(anchor + 1, anchor + GROUP)][:BITS]
    else:
        anchors, pages = [], list(range(FIRST_PAGE, FIRST_PAGE + BITS))
    calibration = list(range(FIRST_PAGE + BITS, FIRST_PAGE + BITS + CALIBRATION_PAGES))
    rng = random.Random(seed)
    right = wrong = 0
    elapsed = 0.0
    nowait: set[str] = set()
    cold: list[float] = []
    hot: list[float] = []
    async with create_sandbox("local", timeout_s=30.0) as box:
        await box.execute("1")
        for _ in range(rounds):
            bits = [rng.randint(0, 1) for _ in pages]
            start = time.perf_counter()
            sent = await box.execute(SEND.format(path=path, pages=pages, bits=bits, page_size=PAGE))
            if receiver == "pagemap":
                probe = RECEIVE_PAGEMAP.format(path=path, pages=pages, anchors=anchors, page_size=PAGE)
            else:
                probe = RECEIVE.format(path=path, pages=pages, calibration=calibration, page_size=PAGE)
            got = await box.execute(probe)
            elapsed += time.perf_counter() - start
            if not (sent.ok and got.ok):
                raise RuntimeError(f"a channel call failed: {sent!r} {got!r}")
            seen = json.loads(got.stdout)
            nowait.add(seen["nowait"])
            cold.append(seen["cold_us"])
            hot.append(seen["hot_us"])
            matches = sum(a == b for a, b in zip(bits, seen["bits"], strict=True))
            right += matches
            wrong += len(bits) - matches
    total = right + wrong
    error_rate = wrong / total
    capacity = total * (1 - _entropy(error_rate)) / elapsed
    return {
        "channel": "pagecache" if receiver == "timing" else "pagecache (pagemap)",
        "file": path,
        "rounds": rounds,
        "bits": total,
        "wrong": wrong,
        "error_rate": error_rate,
        "seconds": elapsed,
        "bits_per_s": capacity,
        "rwf_nowait": sorted(nowait),
        "cold_read_us": sorted(cold)[len(cold) // 2],
        "cached_read_us": sorted(hot)[len(hot) // 2],
    }
