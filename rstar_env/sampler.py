"""The group-sampler contract: which of a prompt's rollouts are trained on.

A sampler plugin is a class with ``name`` and ``def select(group, keep, rng) -> list[int] | None``: the indices of
the ``keep`` trajectories to train on, or ``None`` (or ``[]``) to drop the whole group. Trainers call it through
:func:`checked_select`, which refuses anything else. Samplers read only the summary
attributes in :class:`TrajectorySummary`, so a trainer's own records work as long as they carry them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

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
    """A group sampler plugin. Optional: ``options_model`` (checked when a config loads)."""

    name: ClassVar[str] | str
    """The name configs use (``sampler: roc``)."""

    def select(self, group: Sequence[TrajectorySummary], keep: int, rng: np.random.Generator) -> list[int] | None:
        """Choose which rollouts of one prompt a trainer learns from. A plain ``def``: trainers call it directly,
        through :func:`checked_select`.

        Args:
            group: the prompt's rollouts (usually ``2 * keep``), in rollout order: ``Trajectory`` objects or a
                trainer's own records; read only the :class:`TrajectorySummary` attributes.
            keep: how many to keep (the ``G`` of GRPO), at least 1.
            rng: the trainer's seeded generator; draw every random choice from it, so a run is reproducible.

        Returns:
            Exactly ``keep`` distinct indices into ``group`` (any order), or ``None`` (or ``[]``) to drop the
            whole group (too small, no learning signal).

        Raises:
            Whatever the plugin raises propagates to the trainer; a result of the wrong shape is refused by
            :func:`checked_select` with a :class:`SamplerError` naming the sampler.
        """
        ...


class SamplerError(ValueError):
    """A sampler returned something other than ``keep`` distinct in-range indices or a drop."""


def checked_select(sampler: Any, group: Sequence[Any], keep: int, rng: np.random.Generator) -> list[int] | None:
    """``sampler.select(group, keep, rng)``, validated: the one place both trainers call a sampler through.

    Returns exactly ``keep`` distinct indices into ``group`` (as ``int``, in the sampler's order), or ``None`` when
    the sampler drops the group (it returned ``None`` or an empty list). Anything else raises
    :class:`SamplerError` naming the sampler and what it returned, at the first group it happens in.
    """
    name = getattr(sampler, "name", type(sampler).__name__)
    chosen = sampler.select(group, keep, rng)
    if chosen is None:
        return None
    shown = repr(chosen) if len(repr(chosen)) <= 200 else repr(chosen)[:200] + "..."

    def fail(why: str) -> SamplerError:
        return SamplerError(
            f"sampler {name!r} returned {shown} for a group of {len(group)} with keep={keep}: {why}. A sampler "
            f"returns exactly keep distinct indices in range({len(group)}), or None (or []) to drop the group"
        )

    if isinstance(chosen, str | bytes | dict) or not isinstance(chosen, Iterable):
        raise fail("not a list of indices")
    indices = list(chosen)
    if not indices:
        return None
    if not all(isinstance(i, int | np.integer) and not isinstance(i, bool) for i in indices):
        raise fail("an index is not an integer")
    if len(indices) != keep:
        raise fail(f"{len(indices)} indices, not {keep}")
    if len(set(indices)) != len(indices):
        raise fail("an index is repeated")
    outside = [int(i) for i in indices if not 0 <= i < len(group)]
    if outside:
        raise fail(f"index {outside[0]} is out of range")
    return [int(i) for i in indices]
