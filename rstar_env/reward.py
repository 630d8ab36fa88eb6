"""The reward contract: a verifier scores a final response against the gold answer.

A reward plugin is a class with ``name`` and ``score(response: str, answer: str) -> RewardResult``, either
``async def`` (run on the event loop every env shares: it must not block it) or plain ``def`` (run in a thread).
``response`` is the episode's final assistant action; the plugin extracts the answer from it itself (so a plugin
can define its own answer format). Scoring must be bounded in time and memory from any thread: a pathological
input costs at most the plugin's timeout and scores 0 with ``reason="timeout"``. The env also bounds every scoring
by ``env.reward_timeout_s``: past it, or when ``score`` raises, the episode ends unscored as ``env_error``.
A plugin may also offer ``async def score_batch(pairs) -> list[RewardResult]`` for trainers; :func:`score_many`
uses it when present.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from typing import ClassVar, Protocol, runtime_checkable

from rstar_env.trajectory import RewardResult


@runtime_checkable
class Reward(Protocol):
    name: ClassVar[str] | str

    def score(self, response: str, answer: str) -> Awaitable[RewardResult] | RewardResult: ...


async def score_many(reward: Reward, pairs: Sequence[tuple[str, str]]) -> list[RewardResult]:
    """Score ``(response, answer)`` pairs concurrently, through the plugin's batch API when it has one."""
    batch = getattr(reward, "score_batch", None)
    if batch is not None:
        return list(await batch(list(pairs)))
    from rstar_env.invoke import invoke

    return list(await asyncio.gather(*(invoke(reward.score, r, a) for r, a in pairs)))
