"""``rstar-env bench reward``: how fast and how right the ``math`` reward is, against math-verify called directly.

Three speed workloads, each measured both ways in one run (the verdict cache off, so nothing is answered twice):

* **integer**: AIME-style responses with an integer in ``\\boxed{}`` (half right, half wrong), the exact fast path;
* **symbolic**: roots, polynomials, intervals, sets, matrices, equations (distinct pairs, all correct), which go to
  the math-verify worker pool;
* **mixed**: the held-out pairs of the labelled set ``tests/fixtures/verifier_cases.jsonl`` (numbers, fractions, sets,
  tuples, intervals, several boxes, text answers, prose; right and wrong answers; drawn from other projects' test
  suites), shuffled, each prediction framed as a final answer block ``<answer>PRED</answer>``. Each parser first
  sees the set's dev pairs once, uncounted (math-verify in this process, and each worker of the reward):
  math-verify's LaTeX parser gets faster as it sees more answers, and a trainer's reward is measured in that
  steady state, not on its first answers.

"direct" is ``math_verify.parse`` of gold and prediction plus ``verify`` in this process, on one core, one pair after
another, with math-verify's defaults (``verify(parse(gold), parse(pred))``; for integer and symbolic the gold is
wrapped in ``$...$``): what a trainer does when it calls the library itself. The ratio is rstar-env / direct. Worker
start-up is measured separately and not counted in the rates.

**agreement** (``--agreement``) scores the labelled set's held-out part both ways and prints how often each agrees
with the expected verdicts, and the false accepts of each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
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
        lambda k: (
            f"\\begin{{pmatrix}} {k} & 1 \\\\ 0 & {k} \\end{{pmatrix}}",
            f"\\begin{{pmatrix}}{k}&1\\\\0&{k}\\end{{pmatrix}}",
        ),
        lambda k: (f"y = {k} + 2x", f"y=2x+{k}"),
        lambda k: (f"{k}\\pi", f"\\frac{{{2 * k}\\pi}}{{2}}"),
        lambda k: (f"({k}, -{k + 1})", f"({k},-{k + 1})"),
        lambda k: (f"\\frac{{{k + 1}}}{{\\sqrt{{3}}}}", f"\\frac{{{k + 1}\\sqrt{{3}}}}{{3}}"),
        lambda k: (f"(-\\infty, {k}]", f"(-\\infty,{k}]"),
        lambda k: (f"x^2 - {k * k}", f"(x-{k})(x+{k})"),
    ]
    return [
        (_RESPONSE.format(pred), gold)
        for k in range(n)
        for pred, gold in [makers[k % len(makers)](k // len(makers) + 1)]
    ]


CASES_PATH = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "verifier_cases.jsonl"
"""The labelled set (a source checkout's ``tests/fixtures``): one JSON object a line with ``gold``, ``pred``,
``expected`` (1 right, 0 wrong), ``split`` (``dev`` or ``heldout``), ``source`` and ``topic``."""


def load_cases(path: str | Path | None = None, split: str | None = None) -> list[dict[str, Any]]:
    """The labelled (gold, prediction, expected verdict) cases, all or one ``split``."""
    where = Path(path) if path is not None else CASES_PATH
    if not where.is_file():
        raise click.ClickException(
            f"no labelled cases at {where}: run from a source checkout of rstar-env, or pass "
            "--cases PATH (JSON lines with gold, pred, expected, split)"
        )
    cases = [json.loads(line) for line in where.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [c for c in cases if split is None or c.get("split") == split]


def frame(pred: str) -> str:
    """A prediction as the model's final answer block, the way the ``math`` reward reads it."""
    return f"<answer>{pred}</answer>"


def mixed_pairs(
    n: int, path: str | Path | None = None, seed: int = 0, split: str | None = None
) -> list[tuple[str, str, str]]:
    """``n`` pairs ``(framed response, gold, raw prediction)`` from the labelled set (or its ``split``), shuffled,
    repeated only when ``n`` is more than the cases."""
    cases = load_cases(path, split)
    rng = random.Random(seed)
    out: list[tuple[str, str, str]] = []
    while len(out) < n:
        batch = [(frame(c["pred"]), str(c["gold"]), c["pred"]) for c in cases]
        rng.shuffle(batch)
        out += batch
    return out[:n]


def direct_verdict(gold: str, pred: str) -> bool:
    """math-verify called directly with its defaults (main thread: its timeouts use ``signal.alarm``)."""
    from math_verify import parse, verify

    return bool(verify(parse(gold), parse(pred)))


def agreement(
    path: str | Path | None = None, split: str | None = "heldout", workers: int | None = None
) -> dict[str, Any]:
    """How often the ``math`` reward and math-verify direct agree with the labelled verdicts of ``split``."""
    from rstar_env.plugins import load_reward

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    cases = load_cases(path, split)
    options: dict[str, Any] = {"cache_size": 0}
    if workers is not None:
        options["workers"] = workers
    reward = load_reward("math", **options)
    try:
        ours = asyncio.run(reward.score_batch([(frame(c["pred"]), str(c["gold"])) for c in cases]))
    finally:
        reward.close()
    rows = []
    for case, result in zip(cases, ours, strict=True):
        rows.append(
            {
                "id": case["id"],
                "gold": case["gold"],
                "pred": case["pred"],
                "expected": int(case["expected"]),
                "ours": int(result.reward > 0.5),
                "reason": result.reason,
                "direct": int(direct_verdict(str(case["gold"]), case["pred"])),
            }
        )

    def summary(key: str) -> dict[str, Any]:
        false_accepts = [r["id"] for r in rows if r[key] == 1 and r["expected"] == 0]
        return {
            "agree": sum(r[key] == r["expected"] for r in rows),
            "false_accepts": false_accepts,
            "false_rejects": [r["id"] for r in rows if r[key] == 0 and r["expected"] == 1],
        }

    ours_summary, direct_summary = summary("ours"), summary("direct")
    return {
        "split": split or "all",
        "cases": len(rows),
        "rstar_env": ours_summary,
        "direct": direct_summary,
        "false_accepts_direct_avoids": sorted(
            set(ours_summary["false_accepts"]) - set(direct_summary["false_accepts"])
        ),
        "rows": rows,
    }


def _rate(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def _direct(pairs: list[tuple[str, str]], budget_s: float, raw: list[str] | None = None) -> tuple[float, int, int]:
    """math-verify in-process, sequentially, until the pairs or the time budget run out:
    ``(rate, pairs done, pairs verified)``. With ``raw`` (the mixed workload): ``verify(parse(gold), parse(pred))``
    on the unframed predictions, math-verify's defaults exactly."""
    from math_verify import parse, verify

    done = correct = 0
    start = time.perf_counter()
    for i, (response, gold) in enumerate(pairs):
        if raw is not None:
            correct += bool(verify(parse(gold), parse(raw[i])))
        else:
            correct += bool(verify(parse(f"${gold}$"), parse(response)))
        done += 1
        if time.perf_counter() - start > budget_s:
            break
    return _rate(done, time.perf_counter() - start), done, correct


def run_bench(
    n_int: int = 20_000,
    n_sym: int = 240,
    workers: int | None = None,
    direct_budget_s: float = 10.0,
    timeout_s: float = 3.0,
    rounds: int = 4,
    n_mix: int = 163,
    cases: str | Path | None = None,
) -> dict[str, Any]:
    """Run both workloads both ways; returns the figures :func:`command` prints.

    Each workload is cut into ``rounds`` slices and the two ways alternate slice by slice, so a change in machine
    load during the run weighs on both sides alike.
    """
    # Through the registry, not an import: rstar_env never imports the built-in plugins package directly.
    from rstar_env.plugins import load_reward

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    options: dict[str, Any] = {"timeout_s": timeout_s, "cache_size": 0}
    if workers is not None:
        options["workers"] = workers
    reward = load_reward("math", **options)
    results: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "workers": reward.workers,
        "rounds": rounds,
        "load_avg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    mixed = mixed_pairs(n_mix, cases, split="heldout") if n_mix > 0 else []
    workloads: list[tuple[str, list[tuple[str, str]], list[str] | None]] = [
        ("integer", integer_pairs(n_int), None),
        ("symbolic", symbolic_pairs(n_sym), None),
        ("mixed", [(response, gold) for response, gold, _ in mixed], [pred for _, _, pred in mixed]),
    ]
    try:
        start = time.perf_counter()
        reward.start(wait=True)  # start-up is measured on its own, not part of the rates
        results["pool_startup_s"] = time.perf_counter() - start
        for name, pairs, raw in workloads:
            if not pairs:
                continue
            if name == "mixed":  # the steady state: both ways have seen the dev pairs first (not counted)
                warm = mixed_pairs(len(load_cases(cases, "dev")), cases, split="dev")
                reward.warm_up([(response, gold) for response, gold, _ in warm])  # every worker sees them once
                _direct([(response, gold) for response, gold, _ in warm], float("inf"), [p for *_, p in warm])
                results["mixed_warm_up_pairs"] = len(warm)
            ours_s = direct_s = 0.0
            direct_done = direct_correct = 0
            outcome = []
            for r in range(rounds):
                lo, hi = r * len(pairs) // rounds, (r + 1) * len(pairs) // rounds
                chunk = pairs[lo:hi]
                start = time.perf_counter()
                outcome += asyncio.run(reward.score_batch(chunk))
                ours_s += time.perf_counter() - start
                rate, done, correct = _direct(chunk, direct_budget_s / rounds, raw[lo:hi] if raw else None)
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
@click.option(
    "--n-mix",
    default=163,
    show_default=True,
    help="Mixed pairs (the labelled set's held-out part, shuffled) to score; 0 skips the workload.",
)
@click.option(
    "--workers",
    type=int,
    default=None,
    help="math-verify worker processes (default: the reward's, one per usable CPU, at most 8).",
)
@click.option(
    "--direct-budget",
    default=10.0,
    show_default=True,
    help="Seconds the direct math-verify baseline may spend per workload (it is sequential and slow).",
)
@click.option(
    "--rounds",
    default=4,
    show_default=True,
    help="Slices per workload; the two ways alternate slice by slice so load changes hit both alike.",
)
@click.option(
    "--agreement/--no-agreement",
    "with_agreement",
    default=True,
    show_default=True,
    help="Also score the labelled set's held-out part both ways and print the agreement figures.",
)
@click.option(
    "--cases",
    type=click.Path(dir_okay=False),
    default=None,
    help="The labelled set (default: tests/fixtures/verifier_cases.jsonl of this checkout).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
def command(
    n_int: int,
    n_sym: int,
    n_mix: int,
    workers: int | None,
    direct_budget: float,
    rounds: int,
    with_agreement: bool,
    cases: str | None,
    as_json: bool,
) -> None:
    """Verifications/s of the math reward vs math-verify called directly (integer, symbolic and mixed answers),
    and how often each agrees with the labelled verdicts."""
    results = run_bench(
        n_int=n_int,
        n_sym=n_sym,
        workers=workers,
        direct_budget_s=direct_budget,
        rounds=rounds,
        n_mix=n_mix,
        cases=cases,
    )
    if with_agreement:
        figures = agreement(cases, "heldout", workers)
        figures.pop("rows")
        results["agreement"] = figures
    if as_json:
        click.echo(json.dumps(results))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"math reward: verifications/s ({results['cpus']} CPUs, {results['workers']} workers, "
        f"load average {results['load_avg']:.2f})"
    )
    for column in ("workload", "pairs", "rstar-env /s", "math-verify direct /s", "ratio", "reasons"):
        table.add_column(column, justify="left" if column in ("workload", "reasons") else "right")
    for name in ("integer", "symbolic", "mixed"):
        row = results.get(name)
        if row is None:
            continue
        table.add_row(
            name,
            str(row["pairs"]),
            f"{row['rstar_env_per_s']:,.0f}",
            f"{row['direct_per_s']:,.0f}",
            f"{row['ratio']:.1f}x",
            ", ".join(f"{k}={v}" for k, v in sorted(row["reasons"].items())),
        )
    console = Console()
    console.print(table)
    console.print(f"worker pool start-up (not counted): {results['pool_startup_s']:.2f}s")
    figures = results.get("agreement")
    if figures:
        n = figures["cases"]
        agree = Table(title=f"agreement with the labelled verdicts ({figures['split']} part, {n} cases)")
        for column in ("verifier", "agrees", "%", "false accepts", "false rejects"):
            agree.add_column(column, justify="left" if column == "verifier" else "right")
        for label, key in (
            ("math reward (<answer>PRED</answer>)", "rstar_env"),
            ("math-verify direct, defaults", "direct"),
        ):
            row = figures[key]
            agree.add_row(
                label,
                f"{row['agree']}/{n}",
                f"{100 * row['agree'] / max(n, 1):.1f}",
                str(len(row["false_accepts"])),
                str(len(row["false_rejects"])),
            )
        console.print(agree)
        only = figures["false_accepts_direct_avoids"]
        console.print(f"false accepts of the math reward that math-verify avoids: {', '.join(only) or 'none'}")
