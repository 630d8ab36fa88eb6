"""Compare the `local` sandbox of two installs of rstar-env side by side: for each cell, both installs run the same
workload at the same concurrency at the same time on this machine, so a change in the machine's load weighs on both
alike (on a shared host, run-to-run noise is +-20%, larger than the differences worth measuring).

    python scripts/sandbox_side_by_side.py --a python --b ~/.venvs/old/bin/python --rounds 3

Each side is an interpreter that imports its own ``rstar_env``. For an older revision:

    git worktree add ../rstar-old REV
    python -m venv --system-site-packages ~/.venvs/old
    ~/.venvs/old/bin/pip install --no-deps -e ../rstar-old

(keep the worktree and the venv where your checkout is not their parent: an editable install must not be shadowed).
Prints each side's p50 latency per (workload, concurrency) cell and round, and the median of a/b over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SIDE = r"""
import asyncio, json, statistics, sys, time
from rstar_env.sandbox.local import LocalSandbox

CODE = {
    "print": "print(1)",
    "sympy": "import sympy\nx = sympy.Symbol('x')\nprint(sympy.factor(x**4 - 1))",
}

async def main(start_at, seconds, concurrency, workload):
    box = LocalSandbox()
    for _ in range(10):
        await box.execute(CODE[workload])
    await asyncio.sleep(max(0.0, start_at - time.time()))
    latencies, end = [], time.monotonic() + seconds

    async def caller():
        while time.monotonic() < end:
            began = time.monotonic()
            result = await box.execute(CODE[workload])
            if result.status != "ok":
                raise SystemExit(f"a call failed: {result}")
            latencies.append(time.monotonic() - began)

    await asyncio.gather(*(caller() for _ in range(concurrency)))
    await box.aclose()
    print(json.dumps({"p50_ms": statistics.median(latencies) * 1e3, "calls": len(latencies)}))

asyncio.run(main(float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
"""


def run_cell(pythons: dict[str, str], seconds: float, concurrency: int, workload: str, warmup_s: float) -> dict:
    """Both sides start their pools and warm up, then load them together from the same wall-clock time on."""
    start_at = time.time() + warmup_s
    procs = {
        side: subprocess.Popen(
            # -P: the working directory must not shadow either side's rstar_env.
            [python, "-P", "-c", SIDE, str(start_at), str(seconds), str(concurrency), workload],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=os.path.expanduser("~"),
        )
        for side, python in pythons.items()
    }
    results = {}
    for side, proc in procs.items():
        out, err = proc.communicate(timeout=warmup_s + seconds + 120)
        if proc.returncode != 0:
            raise SystemExit(f"side {side} ({pythons[side]}) failed:\n{err[-2000:]}")
        results[side] = json.loads(out.strip().splitlines()[-1])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--a", default=sys.executable, help="interpreter of side a (default: this one)")
    parser.add_argument("--b", required=True, help="interpreter of side b")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15.0, help="load per cell and round")
    parser.add_argument("--warmup-s", type=float, default=15.0, help="time both sides get to start their pools")
    parser.add_argument("--concurrency", type=int, action="append", help="repeatable (default: 1 and 8)")
    parser.add_argument("--workload", choices=("print", "sympy"), action="append", help="repeatable (default: both)")
    args = parser.parse_args()
    pythons = {"a": args.a, "b": args.b}
    cells = [(w, c) for c in args.concurrency or [1, 8] for w in args.workload or ["print", "sympy"]]
    ratios: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
    for round_ in range(1, args.rounds + 1):
        for workload, concurrency in cells:
            r = run_cell(pythons, args.seconds, concurrency, workload, args.warmup_s)
            ratio = r["a"]["p50_ms"] / r["b"]["p50_ms"]
            ratios[(workload, concurrency)].append(ratio)
            print(
                f"round {round_}  {workload:5s} x{concurrency}:  a {r['a']['p50_ms']:7.2f} ms ({r['a']['calls']} calls)"
                f"  b {r['b']['p50_ms']:7.2f} ms ({r['b']['calls']} calls)  a/b {ratio:.3f}",
                flush=True,
            )
    print("\nmedian a/b of p50 over the rounds:")
    for (workload, concurrency), values in ratios.items():
        print(f"  {workload:5s} x{concurrency}: {statistics.median(values):.3f}")


if __name__ == "__main__":
    main()
