"""Statistics of a sampler's choices, as flat ``{name: float}`` dicts for JSONL logs and TensorBoard.

:func:`batch_stats` takes the groups of a step and what the sampler returned for each (indices or ``None``);
:func:`group_stats` is the same for one group. Like the samplers, they read only the five summary attributes.

Keys (all floats; ``prefix`` is prepended to every key):

* counts: ``groups``, ``groups_kept``, ``groups_dropped``, ``dropped_too_small`` (fewer rollouts than ``keep``),
  ``dropped_equal_rewards`` (split into ``dropped_all_correct`` / ``dropped_all_wrong``: all rewards > 0, or
  all <= 0), ``dropped_other`` (dropped by the sampler for another reason), ``drop_frac``; ``rollouts``,
  ``rollouts_kept``, ``positives``, ``negatives``, ``positives_kept``, ``negatives_kept``; ``reward_mean``,
  ``reward_mean_kept``, ``pos_frac``, ``pos_frac_kept``.
* per population, ``{pop}/n``, ``{pop}/tool_error_ratio`` (failed calls / all calls, pooled), ``{pop}/no_tool_frac``
  (rollouts with no tool call), ``{pop}/error_penalty`` and ``{pop}/format_penalty`` (mean RoC penalty terms),
  ``{pop}/penalty`` (their sum), ``{pop}/no_answer_block_frac``, ``{pop}/multi_answer_block_frac``.
  Populations: ``kept_pos`` / ``dropped_pos`` (positives of *kept* groups that were kept / left out: what RoC
  filters), ``kept_neg`` / ``dropped_neg`` (likewise negatives), ``all`` (every rollout of every group), ``all_pos``
  / ``all_neg`` (every positive / negative of every group, before selection: ``all_pos/tool_error_ratio`` is the
  paper's figure of the tool-error ratio of correct trajectories).

A ratio whose population is empty is left out rather than logged as NaN (NaN is not JSON); ``{pop}/n`` is always
present. The penalty terms are the paper's (``roc``'s defaults) unless ``sampler`` is given: then its own
``error_penalty`` / ``format_penalty`` (a ``roc`` sampler with the reference's turn counting, say).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rstar_env.sampler import TrajectorySummary

from .basic import rewards_equal
from .roc import error_penalty, format_penalty

POPULATIONS: tuple[str, ...] = ("kept_pos", "dropped_pos", "kept_neg", "dropped_neg", "all", "all_pos", "all_neg")


def drop_reason(group: Sequence[TrajectorySummary], selection: Sequence[int] | None, keep: int) -> str | None:
    """Why a group was dropped: ``too_small``, ``all_correct``, ``all_wrong``, ``other``; ``None`` if kept."""
    if selection is not None:
        return None
    if len(group) < keep:
        return "too_small"
    rewards = [float(t.reward) for t in group]
    if rewards_equal(rewards):
        return "all_correct" if rewards[0] > 0 else "all_wrong"
    return "other"


@dataclass
class _Population:
    n: int = 0
    calls: int = 0
    errors: int = 0
    no_tool: int = 0
    error_penalty: float = 0.0
    format_penalty: float = 0.0
    no_block: int = 0
    multi_block: int = 0

    def add(self, traj: TrajectorySummary, terms: tuple[Callable[[Any], float], Callable[[Any], float]]) -> None:
        self.n += 1
        calls = int(traj.num_tool_calls)
        self.calls += calls
        self.errors += int(traj.num_tool_errors)
        self.no_tool += calls == 0
        self.error_penalty += terms[0](traj)
        self.format_penalty += terms[1](traj)
        blocks = int(traj.num_answer_blocks)
        self.no_block += blocks == 0
        self.multi_block += blocks > 1

    def write(self, out: dict[str, float], key: str) -> None:
        out[f"{key}/n"] = float(self.n)
        if self.calls:
            out[f"{key}/tool_error_ratio"] = self.errors / self.calls
        if self.n:
            out[f"{key}/no_tool_frac"] = self.no_tool / self.n
            out[f"{key}/error_penalty"] = self.error_penalty / self.n
            out[f"{key}/format_penalty"] = self.format_penalty / self.n
            out[f"{key}/penalty"] = (self.error_penalty + self.format_penalty) / self.n
            out[f"{key}/no_answer_block_frac"] = self.no_block / self.n
            out[f"{key}/multi_answer_block_frac"] = self.multi_block / self.n


def batch_stats(
    groups: Sequence[Sequence[TrajectorySummary]],
    selections: Sequence[Sequence[int] | None],
    keep: int,
    *,
    prefix: str = "",
    sampler: Any = None,
) -> dict[str, float]:
    """Statistics of one step's sampling: ``selections[i]`` is what the sampler returned for ``groups[i]``."""
    terms = (getattr(sampler, "error_penalty", error_penalty), getattr(sampler, "format_penalty", format_penalty))
    if len(groups) != len(selections):
        raise ValueError(
            f"batch_stats: {len(groups)} groups but {len(selections)} selections; pass the "
            f"sampler's result (indices or None) for every group"
        )
    counts = dict.fromkeys(("too_small", "all_correct", "all_wrong", "other"), 0)
    pops = {name: _Population() for name in POPULATIONS}
    groups_kept = rollouts = rollouts_kept = positives = negatives = pos_kept = neg_kept = 0
    reward_sum = reward_sum_kept = 0.0
    for group, selection in zip(groups, selections, strict=True):
        reason = drop_reason(group, selection, keep)
        if reason is not None:
            counts[reason] += 1
        else:
            groups_kept += 1
        chosen = set(selection or ())
        if any(not 0 <= i < len(group) for i in chosen):
            raise ValueError(f"batch_stats: selection {sorted(chosen)} has an index outside a group of {len(group)}")
        for i, traj in enumerate(group):
            reward = float(traj.reward)
            positive = reward > 0
            rollouts += 1
            reward_sum += reward
            positives += positive
            negatives += not positive
            pops["all"].add(traj, terms)
            pops["all_pos" if positive else "all_neg"].add(traj, terms)
            if reason is not None:
                continue
            sign = "pos" if positive else "neg"
            if i in chosen:
                rollouts_kept += 1
                reward_sum_kept += reward
                pos_kept += positive
                neg_kept += not positive
                pops[f"kept_{sign}"].add(traj, terms)
            else:
                pops[f"dropped_{sign}"].add(traj, terms)
    dropped = len(groups) - groups_kept
    out: dict[str, float] = {
        "groups": float(len(groups)),
        "groups_kept": float(groups_kept),
        "groups_dropped": float(dropped),
        "dropped_too_small": float(counts["too_small"]),
        "dropped_equal_rewards": float(counts["all_correct"] + counts["all_wrong"]),
        "dropped_all_correct": float(counts["all_correct"]),
        "dropped_all_wrong": float(counts["all_wrong"]),
        "dropped_other": float(counts["other"]),
        "rollouts": float(rollouts),
        "rollouts_kept": float(rollouts_kept),
        "positives": float(positives),
        "negatives": float(negatives),
        "positives_kept": float(pos_kept),
        "negatives_kept": float(neg_kept),
    }
    if groups:
        out["drop_frac"] = dropped / len(groups)
    if rollouts:
        out["reward_mean"] = reward_sum / rollouts
        out["pos_frac"] = positives / rollouts
    if rollouts_kept:
        out["reward_mean_kept"] = reward_sum_kept / rollouts_kept
        out["pos_frac_kept"] = pos_kept / rollouts_kept
    for name, pop in pops.items():
        pop.write(out, name)
    return {f"{prefix}{key}": value for key, value in out.items()}


def group_stats(
    group: Sequence[TrajectorySummary],
    selection: Sequence[int] | None,
    keep: int,
    *,
    prefix: str = "",
    sampler: Any = None,
) -> dict[str, float]:
    """:func:`batch_stats` of a single group."""
    return batch_stats([group], [selection], keep, prefix=prefix, sampler=sampler)
