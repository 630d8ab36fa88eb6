"""The admission rule shared by every rollout scheduler: which engine takes a request, or whether it waits.

One implementation, three front ends: the multi-engine :class:`~rstar_env.rollout.dispatch.DispatchPolicy`, the
OpenRLHF path's shared engine queue (``rstar_trainers.openrlhf.engine_queue``) and the ``bench rollout``
simulation. The rule (rStar2-Agent §3.2): a request goes to the engine with the most free KV capacity among those
with room for it, preferring the engine that holds its episode's prefix; with no room anywhere it waits.
"""

from __future__ import annotations

from collections.abc import Sequence


def pick_engine(
    free: Sequence[float],
    need: Sequence[float],
    *,
    capacity: Sequence[float] | None = None,
    preferred: int | None = None,
    idle: Sequence[bool] | None = None,
    eligible: Sequence[int] | None = None,
) -> int | None:
    """The index of the engine to send a request to, or ``None``: it must wait.

    ``free[i]``: engine i's free capacity; ``need[i]``: what the request costs there. An engine has room when
    ``need[i] <= free[i]``, or when ``idle[i]`` (an idle engine always takes one request, so an oversized one cannot
    wait forever). ``preferred`` (affinity) wins if it has room. Otherwise the most free capacity wins: absolute, or
    as a fraction of ``capacity`` when given (engines counted in different units); ties go to the lowest index.
    ``eligible``: only these engines are considered (default: all).
    """
    candidates = range(len(free)) if eligible is None else eligible
    room = [i for i in candidates if need[i] <= free[i] or (idle is not None and idle[i])]
    if not room:
        return None
    if preferred is not None and preferred in room:
        return preferred

    def score(i: int) -> float:
        return free[i] / capacity[i] if capacity is not None and capacity[i] else free[i]

    return max(room, key=lambda i: (score(i), -i))
