"""Evaluation metrics, as the rStar2-Agent report measures them.

pass@1 is the mean reward over all k samples of every problem (the report's "average pass@1 over k samples");
pass@k is the unbiased estimator of Chen et al. (2021) at the largest k every problem has. Tool statistics count
structured error kinds, never output text.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from math import comb
from statistics import fmean
from typing import Any

from rstar_env.format import answer_blocks, last_boxed
from rstar_env.trajectory import Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of ``k`` samples drawn from ``n`` (``c`` correct) is correct."""
    if not 0 < k <= n:
        raise ValueError(f"need 0 < k <= n, got k={k}, n={n}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


def has_answer_format(trajectory: Trajectory) -> bool:
    """The final action has exactly one ``<answer>`` block holding a ``\\boxed{}``."""
    if not trajectory.turns:
        return False
    blocks = answer_blocks(trajectory.turns[-1].action)
    return len(blocks) == 1 and last_boxed(blocks[0]) is not None


def summarize(trajectories: Sequence[Trajectory], *, correct_threshold: float = 0.5) -> dict[str, Any]:
    """The evaluation summary of a set of trajectories (several samples per problem id allowed).

    Episodes that ended in a failure of the system (``env_error``, ``policy_error``) are counted in ``env_errors``
    and ``policy_errors`` and left out of every other figure: an outage is not a wrong answer. With nothing scored,
    the rates are ``None``.
    """
    if not trajectories:
        return {"episodes": 0}
    end_reasons: dict[str, int] = defaultdict(int)
    for t in trajectories:
        end_reasons[str(t.end_reason)] += 1
    failures = {"env_errors": end_reasons.get("env_error", 0), "policy_errors": end_reasons.get("policy_error", 0)}
    problems = len({t.id or t.problem for t in trajectories})
    scored = [t for t in trajectories if not t.failed]
    if not scored:
        return {
            "problems": problems,
            "episodes": len(trajectories),
            "scored": 0,
            "pass@1": None,
            "mean_reward": None,
            "end_reasons": dict(end_reasons),
            **failures,
        }
    by_problem: dict[str, list[Trajectory]] = defaultdict(list)
    for t in scored:
        by_problem[t.id or t.problem].append(t)
    k = min(len(group) for group in by_problem.values())
    correct = [t for t in scored if t.reward > correct_threshold]
    calls = sum(t.num_tool_calls for t in scored)
    errors = sum(t.num_tool_errors for t in scored)
    correct_calls = sum(t.num_tool_calls for t in correct)
    correct_errors = sum(t.num_tool_errors for t in correct)
    tokens = [t.response_tokens for t in scored if t.response_tokens is not None]
    error_kinds: dict[str, int] = defaultdict(int)
    for t in scored:
        for kind, n in t.tool_error_counts().items():
            error_kinds[kind] += n
    return {
        "problems": problems,
        "problems_scored": len(by_problem),
        "episodes": len(trajectories),
        "scored": len(scored),
        "samples_per_problem": k,
        "pass@1": fmean(t.reward > correct_threshold for t in scored),
        "mean_reward": fmean(t.reward for t in scored),
        f"pass@{k}": fmean(
            pass_at_k(len(g), sum(t.reward > correct_threshold for t in g), k) for g in by_problem.values()
        ),
        "mean_response_tokens": fmean(tokens) if tokens else None,
        "mean_response_chars": fmean(len(t.response) for t in scored),
        "mean_turns": fmean(t.num_assistant_turns for t in scored),
        "tool_calls_per_episode": calls / len(scored),
        "tool_error_ratio": errors / calls if calls else 0.0,
        "tool_error_ratio_correct": correct_errors / correct_calls if correct_calls else 0.0,
        "answer_format_rate": fmean(has_answer_format(t) for t in scored),
        "end_reasons": dict(end_reasons),
        "tool_errors_by_kind": dict(error_kinds),
        **failures,
    }


def format_summary_rows(summary: dict[str, Any]) -> Iterable[tuple[str, str]]:
    """``(metric, value)`` rows for a terminal table."""
    for key, value in summary.items():
        if key == "engines" and isinstance(value, list):  # the dispatcher's stats: one row per engine
            for engine in value:
                yield (
                    f"engine {engine.get('endpoint')}",
                    f"requests {engine.get('requests')}, failed {engine.get('failed')}, "
                    f"busy {float(engine.get('busy_s') or 0):.1f}s",
                )
        elif isinstance(value, float):
            yield key, f"{value:.4f}"
        elif isinstance(value, dict):
            yield key, ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or "-"
        else:
            yield key, "-" if value is None else str(value)
