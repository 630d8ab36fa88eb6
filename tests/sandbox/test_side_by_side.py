"""``scripts/sandbox_side_by_side.py``: the paired comparison of two installs' sandboxes behind docs/benchmarks.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "sandbox_side_by_side.py"


def test_two_sides_run_together_and_the_ratio_is_reported() -> None:
    # The same install on both sides: one cell, one round, a short load.
    args = ["--b", sys.executable, "--rounds", "1", "--seconds", "0.5", "--warmup-s", "8"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--concurrency", "2", "--workload", "print"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    row = re.search(
        r"round 1  print x2:  a +([\d.]+) ms \((\d+) calls\)  b +([\d.]+) ms \((\d+) calls\)  a/b ([\d.]+)", done.stdout
    )
    assert row is not None, done.stdout
    a_ms, a_calls, b_ms, b_calls, ratio = (float(x) for x in row.groups())
    assert a_calls >= 2 and b_calls >= 2  # both loaded their pool for the whole half second
    assert abs(ratio - a_ms / b_ms) < 0.01
    assert re.search(r"median a/b of p50 over the rounds:\n  print x2: [\d.]+", done.stdout), done.stdout
