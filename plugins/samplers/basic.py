"""``grpo`` and ``reject_equal``: the baseline group samplers, and helpers shared with ``roc``.

Every sampler returns exactly ``keep`` indices (in increasing order) or ``None``: trainers size their batches by
``keep``, so a group that cannot supply ``keep`` rollouts is dropped rather than passed on short.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from rstar_env.plugins import plugin_options
from rstar_env.sampler import TrajectorySummary

Subsample = Literal["random", "first"]


def check_keep(keep: int) -> None:
    if isinstance(keep, bool) or not isinstance(keep, int | np.integer) or keep < 1:
        raise ValueError(f"keep must be a positive integer (the G of GRPO), got {keep!r}")


def as_generator(rng: Any) -> np.random.Generator:
    """The contract passes a ``numpy.random.Generator``; a seed (or ``None``) is accepted for convenience."""
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, int | np.integer):
        return np.random.default_rng(rng)
    raise TypeError(f"rng must be a numpy.random.Generator (e.g. numpy.random.default_rng(seed)), got {type(rng)}")


def rewards_equal(rewards: Sequence[float]) -> bool:
    """Every reward is the same (exact comparison): the group carries no advantage signal."""
    return len(rewards) > 0 and max(rewards) == min(rewards)


def _subsample(n: int, keep: int, how: Subsample, rng: Any) -> list[int]:
    if n == keep:
        return list(range(n))
    if how == "first":
        return list(range(keep))
    return sorted(int(i) for i in as_generator(rng).choice(n, size=keep, replace=False))


class GRPOOptions(BaseModel):
    """The options of ``grpo`` and ``reject_equal``, checked when a config loads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subsample: Subsample = "random"
    """How a group larger than ``keep`` is cut: ``random`` (a uniform draw) or ``first`` (rollout order)."""


class GRPOSampler:
    """Plain GRPO: train on the whole group.

    A group of exactly ``keep`` is kept whole; a smaller group is dropped (``None``). A larger group (an
    oversampled run with the plain sampler) is cut to ``keep``: with ``subsample="random"`` (default) by a uniform
    draw without replacement, ``rng.choice(n, size=keep, replace=False)``, because rollouts collected as they
    complete are ordered by length, so "the first ``keep``" would favour short rollouts; ``subsample="first"``
    keeps the first ``keep`` in rollout order (consumes no randomness).
    """

    name: ClassVar[str] = "grpo"
    options_model: ClassVar[type[BaseModel]] = GRPOOptions

    def __init__(self, options: GRPOOptions | None = None, **settings: Any) -> None:
        self.options = plugin_options(GRPOOptions, options, settings)
        self.subsample: Subsample = self.options.subsample

    def select(self, group: Sequence[TrajectorySummary], keep: int, rng: Any) -> list[int] | None:
        check_keep(keep)
        if len(group) < keep:
            return None
        return _subsample(len(group), keep, self.subsample, rng)


class RejectEqualSampler(GRPOSampler):
    """GRPO that first drops groups whose rewards are all equal (all solved or all failed: zero advantage
    everywhere, so they would only dilute the batch). Otherwise exactly like ``grpo``."""

    name: ClassVar[str] = "reject_equal"

    def select(self, group: Sequence[TrajectorySummary], keep: int, rng: Any) -> list[int] | None:
        check_keep(keep)
        if len(group) < keep or rewards_equal([float(t.reward) for t in group]):
            return None
        return _subsample(len(group), keep, self.subsample, rng)
