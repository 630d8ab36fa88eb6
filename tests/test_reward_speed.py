"""The ``math`` reward is no slower than math-verify called directly on the labelled set's held-out part.

Wall-clock rates on a shared machine are noise, so this compares CPU time: each side runs in its own fresh process
(no parser cache shared), first sees the dev pairs once (uncounted: math-verify's LaTeX parser gets faster as it
sees answers, and a training run is in that steady state), then scores the held-out pairs. The reward's side is the
code its workers run (extraction, the fast path, then math-verify under the reward's reading rule), so the figure
leaves out the worker hop; ``rstar-env bench reward`` measures the whole path end to end, side by side.
"""

from __future__ import annotations

import subprocess
import sys

_SCRIPT = r"""
import json, logging, sys, time
logging.disable(logging.CRITICAL)
from rstar_env.bench.reward import load_cases
side = sys.argv[1]
dev, held = load_cases(split="dev"), load_cases(split="heldout")
if side == "ours":
    from rstar_plugins.rewards import MathReward, _worker
    reward = MathReward(workers=1)
    for pred, gold in _worker._WARM_UP:
        _worker.compare(pred, gold)
    def run(cases):
        for c in cases:
            item = reward._prepare("<answer>" + c["pred"] + "</answer>", str(c["gold"]))
            if isinstance(item, tuple):
                _worker.compare(item[0], item[1])
else:
    from math_verify import parse, verify
    def run(cases):
        for c in cases:
            verify(parse(str(c["gold"])), parse(c["pred"]))
run(dev)
start = time.process_time()
run(held)
print(time.process_time() - start)
"""


def _cpu_seconds(side: str) -> float:
    out = subprocess.run([sys.executable, "-c", _SCRIPT, side], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip().splitlines()[-1])


def test_no_slower_than_math_verify_on_the_heldout_set() -> None:
    ours, direct = _cpu_seconds("ours"), _cpu_seconds("direct")
    assert ours <= direct, f"math reward {ours:.2f} CPU s, math-verify direct {direct:.2f} CPU s"
