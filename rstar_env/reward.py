"""The reward contract: a reward plugin scores a final response against the gold answer.

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
from contextvars import ContextVar
from typing import ClassVar, Protocol, runtime_checkable

from rstar_env.trajectory import RewardResult

current_client: ContextVar[str | None] = ContextVar("rstar_env_reward_client", default=None)
"""Whose answer is being scored: a server's client key, or None for the one default client. The env sets it
around ``score`` (from ``MathToolEnv.client``) and the server's ``/verify`` around each request. A reward plugin
that queues work for shared workers may read it in ``score`` (on the event loop, before handing work to a thread:
threads do not inherit it) to serve clients in turn, as the built-in ``math`` reward does, so one client's backlog
of slow answers does not delay another client's."""


@runtime_checkable
class Reward(Protocol):
    """A reward plugin. ``score`` is ``async def`` or plain ``def`` (run in a thread). Optional: ``options_model``
    (checked when a config loads), ``async def score_batch(pairs) -> list[RewardResult]`` (used by trainers, see
    :func:`score_many`) and ``async def aclose()`` (release workers when the env that built it closes)."""

    name: ClassVar[str] | str
    """The name configs use (``reward: math``)."""

    def score(self, response: str, answer: str) -> Awaitable[RewardResult] | RewardResult:
        """Score one episode's response against the gold answer.

        Bounded in time and memory from any thread; the env also stops it after ``env.reward_timeout_s``.

        Args:
            response: the episode's final assistant action (every action, with ``env.scored_text: all_actions``),
                in which the plugin finds the answer itself, in its own format.
            answer: the gold answer of the dataset row, as written there.

        Returns:
            A :class:`RewardResult`: ``reward`` (1.0 / 0.0 for correctness, any float for shaped rewards), the
            answer ``extracted`` from ``response`` (``None`` if none) and a short ``reason`` code. A wrong or
            missing answer is a score (``RewardResult(0.0, None, "no_answer")``), not an error.

        Raises:
            Only for a bug in the plugin: the episode then ends unscored as ``env_error``, the exception in
            ``info["error"]`` (evaluation counts it, training drops the group).
        """
        ...


async def score_many(reward: Reward, pairs: Sequence[tuple[str, str]]) -> list[RewardResult]:
    """Score ``(response, answer)`` pairs concurrently, through the plugin's batch API when it has one."""
    batch = getattr(reward, "score_batch", None)
    if batch is not None:
        return list(await batch(list(pairs)))
    from rstar_env.invoke import invoke

    return list(await asyncio.gather(*(invoke(reward.score, r, a) for r, a in pairs)))
