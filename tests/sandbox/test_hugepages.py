"""The zygote's preloaded heap in huge pages (``rstar_env.sandbox._hugepages``): what is collapsed, what is left
alone, and that a worker writing into that shared memory still changes nothing another call sees."""

from __future__ import annotations

import asyncio
import json
import os
import platform
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest

from rstar_env.sandbox import _hugepages
from rstar_env.sandbox.local import LocalSandbox

from .test_hostile import start_or_skip


def _collapse_unavailable() -> str | None:
    if _hugepages.huge_page_size() is None:
        return "this kernel has no transparent huge pages"
    major, minor = (int(part) for part in platform.release().split(".")[:2])
    if (major, minor) < (6, 1):
        return f"MADV_COLLAPSE needs Linux 6.1 (this is {platform.release()})"
    return None


@pytest.fixture(autouse=True)
def collapse_available() -> None:
    reason = _collapse_unavailable()
    if reason is not None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and huge pages cannot be tested: {reason}")
        pytest.skip(reason)


def test_dense_memory_is_collapsed_and_sparse_memory_is_left_alone() -> None:
    # A fresh interpreter: a dense 8 MiB mapping (every page written) and a sparse 32 MiB one (1 page in 16),
    # the sparse one without swap reserved so that the kernel cannot merge the two mappings into one.
    script = textwrap.dedent(
        """
        import ctypes, json, mmap, sys
        from rstar_env.sandbox import _hugepages
        MIB, PAGE = 1 << 20, mmap.PAGESIZE
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        dense = mmap.mmap(-1, 8 * MIB, flags=flags)
        sparse = mmap.mmap(-1, 32 * MIB, flags=flags | getattr(mmap, "MAP_NORESERVE", 0x4000))
        for offset in range(0, 8 * MIB, PAGE):
            dense[offset] = 1
        for offset in range(0, 32 * MIB, 16 * PAGE):
            sparse[offset] = 1
        address = {
            name: ctypes.addressof(ctypes.c_char.from_buffer(m)) for name, m in (("dense", dense), ("sparse", sparse))
        }

        def vma(addr):
            fields, inside = {}, False
            for line in open("/proc/self/smaps"):
                head = line.split()[0]
                if "-" in head and ":" not in head:
                    start, end = (int(x, 16) for x in head.split("-"))
                    inside = start <= addr < end
                elif inside and line.split()[0] in ("Rss:", "AnonHugePages:"):
                    fields[line.split()[0][:-1]] = int(line.split()[1])
            return fields

        before = {name: vma(a) for name, a in address.items()}
        collapsed = _hugepages.collapse_heap(int(sys.argv[1]))
        after = {name: vma(a) for name, a in address.items()}
        print(json.dumps({"collapsed": collapsed, "before": before, "after": after, "dense": dense[::PAGE].count(1)}))
        """
    )
    size = _hugepages.huge_page_size()
    done = subprocess.run([sys.executable, "-c", script, str(size)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    # 8 MiB hold at least three whole aligned 2 MiB ranges, all resident: collapsed, the content intact.
    assert report["after"]["dense"]["AnonHugePages"] >= 3 * size // 1024, report
    assert report["dense"] == 8 * 1024 * 1024 // os.sysconf("SC_PAGE_SIZE")
    assert report["collapsed"] >= 3 * size
    # The sparse mapping keeps its holes: no huge page, and no more memory than it had.
    assert report["after"]["sparse"]["AnonHugePages"] == 0, report
    assert report["after"]["sparse"]["Rss"] == report["before"]["sparse"]["Rss"], report


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    box = LocalSandbox(timeout_s=10.0, max_concurrency=2, spares=2)
    start_or_skip(box)
    yield box
    box.close()


def test_the_zygote_heap_is_in_huge_pages(sandbox: LocalSandbox) -> None:
    # numpy and sympy alone are tens of MiB of Python objects; most of them must be in huge pages.
    assert sandbox.info["huge_pages_mb"] >= 16, sandbox.info


def test_a_raw_write_into_the_shared_heap_reaches_no_other_call(sandbox: LocalSandbox) -> None:
    # The cell overwrites, byte by byte through ctypes, a string every worker shares with the zygote (in a huge
    # page now), and mutates a preloaded class. Neither may show in the next call, nor in one running beside it.
    vandal = textwrap.dedent(
        """
        import ctypes, sys, sympy, fractions
        text = sympy.__version__
        start = id(text) + sys.getsizeof(text) - len(text) - 1  # a compact ASCII string's characters
        ctypes.memmove(start, b"X" * len(text), len(text))
        fractions.Fraction.planted = "yes"
        print(sympy.__version__, fractions.Fraction.planted)
        """
    )
    look = "import sympy, fractions; print(sympy.__version__, getattr(fractions.Fraction, 'planted', 'no'))"

    async def scenario() -> tuple[str, str, str]:
        clean = await sandbox.execute(look)
        vandalised, beside = await asyncio.gather(sandbox.execute(vandal), sandbox.execute(look))
        after = await sandbox.execute(look)
        for result in (clean, vandalised, beside, after):
            assert result.status == "ok", result
        assert "X" * 3 in vandalised.stdout and "yes" in vandalised.stdout  # the write did happen, in its worker
        return clean.stdout, beside.stdout, after.stdout

    clean, beside, after = asyncio.run(scenario())
    assert "X" not in clean and clean.endswith(" no\n"), clean
    assert beside == clean
    assert after == clean
