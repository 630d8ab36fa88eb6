"""The sampler-only check: can a setting show GRPO-RoC's effect at all?

On recorded rollouts of one step (``trajectories.jsonl`` of a run, grouped by problem), replay each sampler many
times with fresh random generators and measure what it would train on: the tool-error ratio of the **selected
positives** (tool calls with an error / all tool calls, pooled over the kept trajectories with reward > 0), for
RoC and for GRPO's uniform pick, and their difference. Only groups with mixed rewards count: an all-equal group
gives every kept trajectory a zero advantage under either sampler, so what is kept there is never learned.

If RoC's figure is not clearly below GRPO's here, a training run from these weights cannot show RoC's effect: the
gradient of both arms would push on the same mix of error-free and error-laden positives.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np

from rstar_env.plugins import load_sampler
from rstar_env.trajectory import Trajectory


def read_step_groups(path: str | Path, step: int = 1) -> list[list[Trajectory]]:
    """The groups (one per problem, in file order) of ``step``'s rollouts in a ``trajectories.jsonl``."""
    path = Path(path)
    if path.is_dir():
        path = path / "trajectories.jsonl"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} does not exist: give a run directory that saved its trajectories "
            "(trainer.save_trajectories) or the jsonl itself"
        )
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            if record.get("metadata", {}).get("step", 1) != step:
                continue
            traj = Trajectory.from_dict(record)
            groups[str(traj.id if traj.id is not None else traj.problem)].append(traj)
    if not groups:
        raise ValueError(f"{path} has no trajectories of step {step}")
    return list(groups.values())


def _ratio(trajectories: Sequence[Trajectory]) -> tuple[int, int]:
    return (sum(t.num_tool_errors for t in trajectories), sum(t.num_tool_calls for t in trajectories))


def roc_check(
    groups: Sequence[Sequence[Trajectory]],
    keep: int,
    *,
    draws: int = 200,
    seed: int = 0,
    roc: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Replay ``roc`` (sampler options; default ``mode: topk``) and ``grpo`` ``draws`` times on ``groups``.

    Returns the error ratio of all positives before selection, each sampler's mean over draws of its selected
    positives' error ratio, the difference (RoC - GRPO) with the 2.5 / 97.5 percentiles of its per-draw values, and
    the counts that say how much the setting gives RoC to choose from (mixed groups, positives per mixed group,
    positives with a tool error).
    """
    roc_sampler = load_sampler("roc", **(roc if roc is not None else {"mode": "topk"}))
    grpo_sampler = load_sampler("grpo")
    scored = [g for g in groups if not any(t.failed for t in g)]
    mixed = [g for g in scored if len(g) >= keep and len({t.reward > 0 for t in g}) == 2]
    positives = [t for g in mixed for t in g if t.reward > 0]
    errors, calls = _ratio(positives)
    per_draw: dict[str, list[float]] = {"roc": [], "grpo": []}
    kept_positives: dict[str, list[int]] = {"roc": [], "grpo": []}
    for draw in range(draws):
        for name, sampler in (("roc", roc_sampler), ("grpo", grpo_sampler)):
            rng = np.random.default_rng([seed, draw])
            chosen: list[Trajectory] = []
            for group in mixed:
                selected = sampler.select(list(group), keep, rng)
                if selected:
                    chosen += [group[i] for i in selected if group[i].reward > 0]
            e, c = _ratio(chosen)
            per_draw[name].append(e / c if c else math.nan)
            kept_positives[name].append(len(chosen))
    diffs = [r - g for r, g in zip(per_draw["roc"], per_draw["grpo"], strict=True) if not math.isnan(r - g)]
    report: dict[str, Any] = {
        "groups": len(groups),
        "mixed_groups": len(mixed),
        "rollouts_per_group": max((len(g) for g in groups), default=0),
        "keep": keep,
        "positives": len(positives),
        "positives_per_mixed_group": len(positives) / len(mixed) if mixed else 0.0,
        "positives_with_tool_error": sum(t.num_tool_errors > 0 for t in positives),
        "positives_without_tool_call": sum(t.num_tool_calls == 0 for t in positives),
        "error_ratio_positives_before_selection": errors / calls if calls else math.nan,
        "draws": draws,
    }
    for name in ("roc", "grpo"):
        values = [v for v in per_draw[name] if not math.isnan(v)]
        report[f"{name}_selected_error_ratio"] = fmean(values) if values else math.nan
        report[f"{name}_kept_positives"] = fmean(kept_positives[name]) if kept_positives[name] else 0.0
    report["difference"] = fmean(diffs) if diffs else math.nan
    report["difference_p2.5"] = float(np.percentile(diffs, 2.5)) if diffs else math.nan
    report["difference_p97.5"] = float(np.percentile(diffs, 97.5)) if diffs else math.nan
    grpo = report["grpo_selected_error_ratio"]
    report["relative_reduction"] = -report["difference"] / grpo if grpo and not math.isnan(grpo) else math.nan
    return report


def format_report(report: dict[str, Any]) -> str:
    """The check's figures, as printed by the CLI."""
    lines = [
        f"step-1 rollouts: {report['groups']} groups of {report['rollouts_per_group']}, keep {report['keep']}; "
        f"{report['mixed_groups']} mixed groups, {report['positives']} positives "
        f"({report['positives_per_mixed_group']:.1f} per mixed group), {report['positives_with_tool_error']} with a "
        f"tool error, {report['positives_without_tool_call']} with no tool call",
        f"error ratio of all positives (before selection): {report['error_ratio_positives_before_selection']:.4f}",
        f"selected positives' error ratio over {report['draws']} draws: "
        f"GRPO-RoC {report['roc_selected_error_ratio']:.4f}  GRPO (uniform) {report['grpo_selected_error_ratio']:.4f}",
        f"difference RoC - GRPO: {report['difference']:+.4f} (per-draw 95% band {report['difference_p2.5']:+.4f} .. "
        f"{report['difference_p97.5']:+.4f}); relative reduction {report['relative_reduction']:.1%}",
    ]
    return "\n".join(lines)
