"""Huge pages under the zygote's preloaded heap, so that forking a worker and ending one cost less.

Every call runs in a fresh fork of the zygote, which holds some 50 MiB of Python objects (numpy, sympy). In
4 KiB pages, each fork copies about 13,000 page-table entries and takes a reference on every page, and each worker's
exit drops them all again: on a small machine that is a third of the CPU a short call costs. Collapsed into 2 MiB
transparent huge pages, the same memory is a few dozen entries. Copy-on-write is unchanged in what it shares: a
worker that writes to a huge page gets a copy of the 4 KiB it wrote, not of the 2 MiB (Linux 5.8 and later).

Done once, after the preload, with ``madvise(MADV_COLLAPSE)`` (Linux 6.1 and later), and only on 2 MiB ranges of
private anonymous memory that are at least half resident: the holes of a range are filled when it is collapsed, so
a sparse one (a library's reserved buffer) is left alone. Best effort: a kernel without the call, or without a
free huge page at the moment, leaves the memory as it was. Loaded by the zygote without ``rstar_env``.
"""

from __future__ import annotations

import ctypes
import os

MADV_COLLAPSE = 25
MIN_RESIDENT = 0.5
"""Collapse a range only if at least this share of its pages is in memory already."""

_PMD_SIZE_FILE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"


def collapse_heap(size: int) -> int:
    """Collapse this process's resident private anonymous memory into huge pages of ``size`` bytes (from
    :func:`huge_page_size`, read by the pool: the zygote's view has no ``/sys``). Returns the bytes collapsed."""
    libc = ctypes.CDLL(None, use_errno=True)
    madvise, mincore = libc.madvise, libc.mincore
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    pages = size // os.sysconf("SC_PAGE_SIZE")
    residency = ctypes.create_string_buffer(pages)
    collapsed = 0
    for start, end in anonymous_ranges():  # read whole first: collapsing splits the ranges it works on
        for chunk in range(-(-start // size) * size, end - size + 1, size):
            if mincore(chunk, size, residency) != 0:
                continue
            if sum(byte & 1 for byte in residency.raw) < MIN_RESIDENT * pages:
                continue
            if madvise(chunk, size, MADV_COLLAPSE) == 0:
                collapsed += size
    return collapsed


def anonymous_ranges() -> list[tuple[int, int]]:
    """``(start, end)`` of this process's private, writable, anonymous mappings (the heap included)."""
    ranges = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            path = fields[5] if len(fields) > 5 else ""
            if fields[1].startswith("rw") and fields[1].endswith("p") and path in ("", "[heap]"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                ranges.append((start, end))
    return ranges


def huge_page_size() -> int | None:
    """The size of a transparent huge page on this machine; None if the kernel has none."""
    try:
        with open(_PMD_SIZE_FILE) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None  # no transparent huge pages in this kernel
