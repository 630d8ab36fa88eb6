"""A sampler: keep the ``keep`` rollouts with the fewest assistant turns (ties: fewer tool errors, then order)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from rstar_env.plugin import TrajectorySummary


class KeepShortest:
    """Drops a group whose rewards are all equal (no advantage signal) or that has fewer than ``keep`` rollouts."""

    name: ClassVar[str] = "keep_shortest"

    def select(self, group: Sequence[TrajectorySummary], keep: int, rng: np.random.Generator) -> list[int] | None:
        rewards = [t.reward for t in group]
        if len(group) < keep or max(rewards) == min(rewards):
            return None
        order = sorted(range(len(group)), key=lambda i: (group[i].num_assistant_turns, group[i].num_tool_errors, i))
        return sorted(order[:keep])
