"""The group-sampler contract: which of a prompt's rollouts are trained on.

A sampler plugin is a class with ``name`` and ``def select(group, keep, rng) -> list[int] | None``: the indices of
the ``keep`` trajectories to train on, or ``None`` to drop the whole group. Samplers read only the summary
attributes in :class:`TrajectorySummary`, so a trainer's own records work as long as they carry them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class TrajectorySummary(Protocol):
    """What a sampler may read of a trajectory."""

    @property
    def reward(self) -> float: ...

    @property
    def num_tool_calls(self) -> int: ...

    @property
    def num_tool_errors(self) -> int: ...

    @property
    def num_answer_blocks(self) -> int: ...

    @property
    def num_assistant_turns(self) -> int: ...


@runtime_checkable
class Sampler(Protocol):
    name: ClassVar[str] | str

    def select(
        self, group: Sequence[TrajectorySummary], keep: int, rng: np.random.Generator
    ) -> list[int] | None: ...
