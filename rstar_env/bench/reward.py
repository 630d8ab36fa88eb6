"""``rstar-env bench reward``: verifications per second of the ``math`` reward against math-verify called directly.

Two workloads, each measured both ways in one run:

* **integer**: AIME-style responses with an integer in ``\\boxed{}`` (half right, half wrong), the exact fast path;
* **symbolic**: roots, polynomials, intervals, sets, matrices, equations (distinct pairs, all correct: no cache helps),
  which go to the math-verify worker pool.

"direct" is ``math_verify.parse`` of gold and response plus ``verify`` in this process, one pair after another,
with math-verify's default (signal-based) timeouts: what a trainer does when it calls the library itself. The
ratio is rstar-env / direct. Worker start-up is measured separately and not counted in the rates.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

import click

_RESPONSE = "The tool output confirms the computation.\n\n<answer>\nThe final answer is $\\boxed{{{}}}$.\n</answer>"


def integer_pairs(n: int) -> list[tuple[str, str]]:
    """``n`` distinct integer pairs, every other one wrong."""
    return [(_RESPONSE.format(k), str(k if k % 2 == 0 else k + 1)) for k in range(n)]


def symbolic_pairs(n: int) -> list[tuple[str, str]]:
    """``n`` distinct symbolic pairs (answer as the model writes it, gold as the dataset has it), all correct."""
    makers: list[Callable[[int], tuple[str, str]]] = [
        lambda k: (f"\\frac{{1}}{{2}}\\sqrt{{{k + 2}}}", f"\\frac{{\\sqrt{{{k + 2}}}}}{{2}}"),
        lambda k: (f"x^2+{2 * k}x+{k * k}", f"(x+{k})^2"),
        lambda k: (f"\\sqrt{{{2 * (k + 1) ** 2}}}", f"{k + 1}\\sqrt{{2}}"),
        lambda k: (f"[{k}, {k + 1})", f"[{k},{k + 1})"),
        lambda k: (f"\\{{{k + 2}, {k}, {k + 1}\\}}", f"\\{{{k},{k + 1},{k + 2}\\}}"),
        lambda k: (f"\\begin{{pmatrix}} {k} & 1 \\\\ 0 & {k} \\end{{pmatrix}}",
                   f"\\begin{{pmatrix}}{k}&1\\\\0&{k}\\end{{pmatrix}}"),
        lambda k: (f"y = {k} + 2x", f"y=2x+{k}"),
        lambda k: (f"{k}\\pi", f"\\frac{{{2 * k}\\pi}}{{2}}"),
        lambda k: (f"({k}, -{k + 1})", f"({k},-{k + 1})"),
        lambda k: (f"\\frac{{{k + 1}}}{{\\sqrt{{3}}}}", f"\\frac{{{k + 1}\\sqrt{{3}}}}{{3}}"),
        lambda k: (f"(-\\infty, {k}]", f"(-\\infty,{k}]"),
        lambda k: (f"x^2 - {k * k}", f"(x-{k})(x+{k})"),
    ]
    return [(_RESPONSE.format(pred), gold)
            for k in range(n) for pred, gold in [makers[k % len(makers)](k // len(makers) + 1)]]


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def _direct(pairs: list[tuple[str, str]], budget_s: float) -> tuple[float, int, int]:
    """math-verify in-process, sequentially, until the pairs or the time budget run out:
    ``(rate, pairs done, pairs verified)``."""
    from math_verify import parse, verify

    done = correct = 0
    start = time.perf_counter()
    for response, gold in pairs:
        correct += bool(verify(parse(f"${gold}$"), parse(response)))
        done += 1
        if time.perf_counter() - start > budget_s:
            break
    return _rate(done, time.perf_counter() - start), done, correct


def run_bench(n_int: int = 20_000, n_sym: int = 240, workers: int = 2, direct_budget_s: float = 10.0,
              timeout_s: float = 3.0, rounds: int = 4) -> dict[str, Any]:
    """Run both workloads both ways; returns the figures :func:`command` prints.

    Each workload is cut into ``rounds`` slices and the two ways alternate slice by slice, so a change in machine
    load during the run weighs on both sides alike.
    """
    # Through the registry, not an import: rstar_env never imports the built-in plugins package directly.
    from rstar_env.plugins import load_reward

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    results: dict[str, Any] = {"cpus": os.cpu_count(), "workers": workers, "rounds": rounds}
    reward = load_reward("math", workers=workers, timeout_s=timeout_s, cache_size=0)
    try:
        start = time.perf_counter()
        reward.start(wait=True)  # start-up is measured on its own, not part of the rates
        results["pool_startup_s"] = time.perf_counter() - start
        for name, pairs in (("integer", integer_pairs(n_int)), ("symbolic", symbolic_pairs(n_sym))):
            ours_s = direct_s = 0.0
            direct_done = direct_correct = 0
            outcome = []
            for r in range(rounds):
                chunk = pairs[r * len(pairs) // rounds : (r + 1) * len(pairs) // rounds]
                start = time.perf_counter()
                outcome += asyncio.run(reward.score_batch(chunk))
                ours_s += time.perf_counter() - start
                rate, done, correct = _direct(chunk, direct_budget_s / rounds)
                direct_s += done / rate if rate else 0.0
                direct_done += done
                direct_correct += correct
            ours = _rate(len(pairs), ours_s)
            direct = _rate(direct_done, direct_s)
            reasons: dict[str, int] = {}
            for result in outcome:
                reasons[result.reason] = reasons.get(result.reason, 0) + 1
            results[name] = {
                "pairs": len(pairs),
                "rstar_env_per_s": ours,
                "direct_per_s": direct,
                "direct_pairs": direct_done,
                "ratio": ours / direct if direct else float("inf"),
                "correct": sum(result.reward for result in outcome),
                "direct_correct_of_measured": direct_correct,
                "reasons": reasons,
            }
    finally:
        reward.close()
    return results


@click.command("reward")
@click.option("--n-int", default=20_000, show_default=True, help="Integer (fast-path) pairs to score.")
@click.option("--n-sym", default=240, show_default=True, help="Symbolic (math-verify) pairs to score.")
@click.option("--workers", default=2, show_default=True, help="math-verify worker processes.")
@click.option("--direct-budget", default=10.0, show_default=True,
              help="Seconds the direct math-verify baseline may spend per workload (it is sequential and slow).")
@click.option("--rounds", default=4, show_default=True,
              help="Slices per workload; the two ways alternate slice by slice so load changes hit both alike.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
def command(n_int: int, n_sym: int, workers: int, direct_budget: float, rounds: int, as_json: bool) -> None:
    """Verifications/s of the math reward vs math-verify called directly, for integer and symbolic answers."""
    results = run_bench(n_int=n_int, n_sym=n_sym, workers=workers, direct_budget_s=direct_budget, rounds=rounds)
    if as_json:
        click.echo(json.dumps(results))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"math reward: verifications/s ({results['cpus']} CPUs, {workers} workers)")
    for column in ("workload", "pairs", "rstar-env /s", "math-verify direct /s", "ratio", "reasons"):
        table.add_column(column, justify="left" if column in ("workload", "reasons") else "right")
    for name in ("integer", "symbolic"):
        row = results[name]
        table.add_row(name, str(row["pairs"]), f"{row['rstar_env_per_s']:,.0f}", f"{row['direct_per_s']:,.0f}",
                      f"{row['ratio']:.1f}x", ", ".join(f"{k}={v}" for k, v in sorted(row["reasons"].items())))
    console = Console()
    console.print(table)
    console.print(f"worker pool start-up (not counted): {results['pool_startup_s']:.2f}s")
