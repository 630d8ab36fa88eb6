"""``roc``: GRPO-RoC's Resample-on-Correct group sampler (rStar2-Agent, DESIGN.md "GRPO-RoC, precisely").

From a group of ``n`` rollouts of one prompt (usually ``n = 2G``), keep ``G = keep``:

1. Drop the group (return ``None``) when it has fewer than ``keep`` rollouts, or when every reward is equal
   (no learning signal).
2. Positives: reward > 0; negatives: the rest. ``neg_keep = round(|neg| * keep / n)`` with Python's ``round``
   (half to even), ``pos_keep = keep - neg_keep``. If ``neg_keep < min(min_negative, |neg|)`` it is raised to that
   and ``pos_keep`` recomputed; then the same for positives (so when both minimums cannot hold, as with
   ``keep < min_positive + min_negative``, the positive minimum wins). ``pos_keep`` is finally capped at ``keep``.
   See :func:`roc_counts`.
3. Negatives: a uniform sample without replacement of ``neg_keep`` of them,
   ``rng.choice(negatives, size=neg_keep, replace=False)`` (no filtering: failures stay diverse).
4. Positives: penalty ``p_err + p_format`` (see :func:`penalty`); ``mode="topk"`` keeps the ``pos_keep`` lowest
   penalties, ties broken by rollout order (the reference implementation); ``mode="weighted"`` draws ``pos_keep``
   without replacement with probability proportional to ``1 / (penalty + eps)`` (the paper's wording), as
   ``rng.choice(positives, size=pos_keep, replace=False, p=w / w.sum())``.

The counts always fit: ``pos_keep <= |pos|`` and ``neg_keep <= |neg|`` hold for every group (``keep <= n``), so
the result has exactly ``keep`` indices. (Proof: initially ``|pos| - pos_keep = (n - keep) |pos| / n + d`` with
``|d| <= 1/2`` and the left side an integer, so it is >= 0; raising one count only ever lowers the other, and each
raise is capped by the size of its own side.) The property tests check this for every group up to 64 rollouts.

Randomness: negatives are drawn first, then (``weighted`` only) positives, and a draw of size 0 consumes nothing,
so a seeded ``numpy.random.Generator`` gives the same selection every time. The result lists indices in
increasing (rollout) order.

Only the summary attributes ``reward``, ``num_tool_calls``, ``num_tool_errors``, ``num_answer_blocks`` and
``num_assistant_turns`` are read; tool errors come from the structured counts, never from output text.

Two options reproduce the reference implementation (microsoft/rStar, ``rstar2_agent/down_sample/roc.py``) where it
differs from the paper's description, which is our default:

* ``turn_count="after_first"``: the reference counts assistant turns with a regex over the *response*, which never
  sees the first turn (its header is in the prompt), and gives ``p_format = 1`` when it counts none. So a one-turn
  rollout with its single answer block gets ``p_format = 1`` there (0 with ``"all"``, our default), and a correct
  rollout that never called the tool totals 1.5 instead of 0.5: the reference all but never keeps one.
* ``no_call_penalty``: ``p_err`` of a rollout with no tool call (0.5 in the paper and the reference).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from rstar_env.plugins import plugin_options
from rstar_env.sampler import TrajectorySummary

from .basic import as_generator, check_keep, rewards_equal

Mode = Literal["topk", "weighted"]
TurnCount = Literal["all", "after_first"]


def error_penalty(traj: TrajectorySummary, *, no_call_penalty: float = 0.5) -> float:
    """``p_err``: tool calls that failed / all tool calls; ``no_call_penalty`` (0.5) when the rollout made no tool
    call at all (a rollout that never used the tool is neither clean nor broken: it sits between)."""
    calls = int(traj.num_tool_calls)
    if calls <= 0:
        return no_call_penalty
    return int(traj.num_tool_errors) / calls


def counted_turns(traj: TrajectorySummary, turn_count: TurnCount = "all") -> int:
    """The assistant turns ``p_format`` divides by: all of them, or those after the first (the reference)."""
    turns = int(traj.num_assistant_turns)
    return turns if turn_count == "all" else max(0, turns - 1)


def format_penalty(traj: TrajectorySummary, *, turn_count: TurnCount = "all") -> float:
    """``p_format``: 1 with no ``<answer>`` block, else ``min(1, (answer blocks - 1) / assistant turns)``.

    With ``turn_count="after_first"`` the first turn is not counted, and no counted turn means 1 (the reference).
    With ``"all"`` a rollout is never counted as having fewer than one turn.
    """
    blocks = int(traj.num_answer_blocks)
    if blocks <= 0:
        return 1.0
    turns = counted_turns(traj, turn_count)
    if turns <= 0:
        if turn_count == "after_first":
            return 1.0
        turns = 1
    return min(1.0, (blocks - 1) / turns)


def penalty(
    traj: TrajectorySummary,
    *,
    error_ratio: bool = True,
    answer_format: bool = True,
    turn_count: TurnCount = "all",
    no_call_penalty: float = 0.5,
) -> float:
    """The RoC penalty of a positive rollout: ``p_err + p_format``, each term switchable."""
    total = 0.0
    if error_ratio:
        total += error_penalty(traj, no_call_penalty=no_call_penalty)
    if answer_format:
        total += format_penalty(traj, turn_count=turn_count)
    return total


def roc_counts(
    num_pos: int, num_neg: int, keep: int, *, min_positive: int = 2, min_negative: int = 2
) -> tuple[int, int]:
    """``(pos_keep, neg_keep)`` for a group with ``num_pos`` positives and ``num_neg`` negatives (step 2 above).

    Requires ``1 <= keep <= num_pos + num_neg``. The result satisfies ``pos_keep + neg_keep == keep``,
    ``0 <= pos_keep <= num_pos`` and ``0 <= neg_keep <= num_neg``.
    """
    n = num_pos + num_neg
    if not 1 <= keep <= n:
        raise ValueError(f"roc_counts needs 1 <= keep <= group size, got keep={keep} for a group of {n}")
    neg_keep = round(num_neg * keep / n)  # round half to even, as the reference implementation
    pos_keep = keep - neg_keep
    floor_neg = min(min_negative, num_neg)
    if neg_keep < floor_neg:
        neg_keep = floor_neg
        pos_keep = keep - neg_keep
    floor_pos = min(min_positive, num_pos)
    if pos_keep < floor_pos:
        pos_keep = floor_pos
        neg_keep = keep - pos_keep
    # keep < min_positive (e.g. keep=1): the positive floor cannot be met by a group of `keep`; keep all positives.
    pos_keep = min(pos_keep, keep)
    neg_keep = keep - pos_keep
    return pos_keep, neg_keep


class RoCOptions(BaseModel):
    """The ``roc`` sampler's options (``sampler: {name: roc, options: {...}}``), checked when a config loads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_positive: int = Field(2, ge=0)
    """At least this many positives are kept when the group has them (step 2)."""
    min_negative: int = Field(2, ge=0)
    """At least this many negatives are kept when the group has them (step 2)."""
    mode: Mode = "topk"
    """``topk``: the lowest penalties (the reference); ``weighted``: drawn with weight ``1 / (penalty + eps)``."""
    roc_error_ratio: bool = True
    """Count ``p_err`` (failed tool calls / tool calls) in the penalty."""
    roc_answer_format: bool = True
    """Count ``p_format`` (extra answer blocks / turns) in the penalty."""
    eps: float = Field(1e-2, gt=0)
    """``weighted`` mode: a zero-penalty rollout gets a large but finite weight ``1 / eps``."""
    turn_count: TurnCount = "all"
    """The turns ``p_format`` divides by: ``all``, or ``after_first`` (the reference implementation's count)."""
    no_call_penalty: float = Field(0.5, ge=0, le=1)
    """``p_err`` of a rollout that made no tool call: a ratio, 0.5 in the paper and the reference."""


class RoCSampler:
    """GRPO-RoC group sampler; the exact behaviour is in the module docstring, the options in :class:`RoCOptions`.

    Built from a :class:`RoCOptions` or keywords: ``RoCSampler(mode="weighted", eps=0.1)``. A bad value raises
    :class:`~rstar_env.plugins.OptionsError` (a ``ValueError``) naming the option.
    """

    name: ClassVar[str] = "roc"
    options_model: ClassVar[type[BaseModel]] = RoCOptions

    def __init__(self, options: RoCOptions | None = None, **settings: Any) -> None:
        self.options = opts = plugin_options(RoCOptions, options, settings)
        self.min_positive = opts.min_positive
        self.min_negative = opts.min_negative
        self.mode: Mode = opts.mode
        self.roc_error_ratio = opts.roc_error_ratio
        self.roc_answer_format = opts.roc_answer_format
        self.eps = opts.eps
        self.turn_count: TurnCount = opts.turn_count
        self.no_call_penalty = opts.no_call_penalty

    def error_penalty(self, traj: TrajectorySummary) -> float:
        """``p_err`` with this sampler's options (whether or not the term is switched on)."""
        return error_penalty(traj, no_call_penalty=self.no_call_penalty)

    def format_penalty(self, traj: TrajectorySummary) -> float:
        """``p_format`` with this sampler's options (whether or not the term is switched on)."""
        return format_penalty(traj, turn_count=self.turn_count)

    def penalty(self, traj: TrajectorySummary) -> float:
        return penalty(
            traj,
            error_ratio=self.roc_error_ratio,
            answer_format=self.roc_answer_format,
            turn_count=self.turn_count,
            no_call_penalty=self.no_call_penalty,
        )

    def select(self, group: Sequence[TrajectorySummary], keep: int, rng: Any) -> list[int] | None:
        check_keep(keep)
        n = len(group)
        if n < keep:
            return None
        rewards = [float(t.reward) for t in group]
        if rewards_equal(rewards):
            return None
        positives = [i for i, r in enumerate(rewards) if r > 0]
        negatives = [i for i, r in enumerate(rewards) if not r > 0]
        pos_keep, neg_keep = roc_counts(
            len(positives), len(negatives), keep, min_positive=self.min_positive, min_negative=self.min_negative
        )
        generator = as_generator(rng)
        kept: list[int] = []
        if neg_keep:
            kept += [int(i) for i in generator.choice(negatives, size=neg_keep, replace=False)]
        if pos_keep:
            penalties = [self.penalty(group[i]) for i in positives]
            if self.mode == "topk":
                # sorted() is stable, so equal penalties keep rollout order.
                order = sorted(range(len(positives)), key=lambda j: penalties[j])
                kept += [positives[j] for j in order[:pos_keep]]
            else:
                weights = 1.0 / (np.asarray(penalties, dtype=float) + self.eps)
                drawn = generator.choice(positives, size=pos_keep, replace=False, p=weights / weights.sum())
                kept += [int(i) for i in drawn]
        return sorted(kept)

    def __repr__(self) -> str:
        return (
            f"RoCSampler(mode={self.mode!r}, min_positive={self.min_positive}, "
            f"min_negative={self.min_negative}, roc_error_ratio={self.roc_error_ratio}, "
            f"roc_answer_format={self.roc_answer_format}, eps={self.eps}, turn_count={self.turn_count!r}, "
            f"no_call_penalty={self.no_call_penalty})"
        )
