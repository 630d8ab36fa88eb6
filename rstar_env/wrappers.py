"""The env's own API on the outside of gymnasium's wrappers, and a step limit the env scores.

Gymnasium's wrappers (the env checker, ``OrderEnforcing``, ``TimeLimit``) take ``step(action)`` alone and have no
async methods. :class:`EnvAPI` goes outside them, ``env = EnvAPI(gym.make("rstar_env/MathTool-v0", ...))``, and
gives back what they hide:

- ``step(action, token_ids=..., logprobs=...)``: the keywords ride inside a :class:`~rstar_env.spaces.TokenAction`
  through every wrapper below, so ``TimeLimit`` still counts the step and the env checker still checks it;
- ``areset``/``astep``: the same wrapper stack, run on a thread of this wrapper's own, so the caller's event loop
  never blocks and each wrapper's rules hold (an ``astep`` is one ``TimeLimit`` step).

It is not part of the registration: gymnasium's ``make_vec`` refuses a registered ``additional_wrappers`` in its
``vector_entry_point`` mode, which is this env's fast vector path.

**Step limits.** The env scores the step that a step limit cuts, like the turn limit (``end_reason``
``time_limit``). It knows of a limit given as ``max_episode_steps`` to the env (every episode), in
``reset(options={..., "max_episode_steps": n})`` (one episode), or to ``gym.make(..., max_episode_steps=n)`` (the env
finds the ``TimeLimit`` that ``make`` put around it). A gymnasium ``TimeLimit`` a user wraps around an env by hand
truncates from the outside, unscored: use :class:`ScoredTimeLimit` there, a ``TimeLimit`` that tells the env at each
reset. :class:`EnvAPI` does the same for the ``TimeLimit`` layers under it (read from their public ``spec``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, SupportsFloat

import gymnasium
from gymnasium.utils import RecordConstructorArgs

from rstar_env.env import STEP_LIMIT_OPTION
from rstar_env.spaces import TokenAction


def with_step_limit(options: dict[str, Any] | None, limit: int | None) -> dict[str, Any] | None:
    """``options`` for ``reset`` with the episode's step limit lowered to ``limit`` (the smaller one holds)."""
    if limit is None:
        return options
    merged = dict(options or {})
    given = merged.get(STEP_LIMIT_OPTION)
    merged[STEP_LIMIT_OPTION] = limit if given is None else min(given, limit)
    return merged


class ScoredTimeLimit(gymnasium.wrappers.TimeLimit):
    """Gymnasium's ``TimeLimit`` whose cut step the env scores as at its turn limit (``end_reason ==
    "time_limit"``): each ``reset`` passes the limit down as the ``max_episode_steps`` reset option.

        env = ScoredTimeLimit(gym.make("rstar_env/MathTool-v0"), max_episode_steps=8)
    """

    def __init__(self, env: gymnasium.Env, max_episode_steps: int) -> None:
        super().__init__(env, max_episode_steps)
        self.max_episode_steps = max_episode_steps

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return super().reset(seed=seed, options=with_step_limit(options, self.max_episode_steps))


class EnvAPI(gymnasium.Wrapper, RecordConstructorArgs):
    """Token-level ``step`` and the async API on the outside of ``gym.make``'s wrappers."""

    def __init__(self, env: gymnasium.Env) -> None:
        RecordConstructorArgs.__init__(self)
        gymnasium.Wrapper.__init__(self, env)
        self._executor: ThreadPoolExecutor | None = None
        self._step_limit = _gymnasium_time_limit_below(env)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        return self.env.reset(seed=seed, options=with_step_limit(options, self._step_limit))

    def step(
        self, action: Any, *, token_ids: Sequence[int] | None = None, logprobs: Sequence[float] | None = None
    ) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        if token_ids is not None or logprobs is not None:
            if isinstance(action, TokenAction) and (action.token_ids is not None or action.logprobs is not None):
                raise ValueError(
                    "token_ids/logprobs were passed both inside the TokenAction and as keywords; pass them once"
                )
            action = TokenAction(str(action), token_ids=token_ids, logprobs=logprobs)
        return self.env.step(action)

    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        return await self._in_thread(lambda: self.reset(seed=seed, options=options))

    async def astep(
        self, action: Any, *, token_ids: Sequence[int] | None = None, logprobs: Sequence[float] | None = None
    ) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        return await self._in_thread(lambda: self.step(action, token_ids=token_ids, logprobs=logprobs))

    async def _in_thread(self, call: Any) -> Any:
        # One thread per env: its episode's calls are sequential anyway, and many envs stepped from one loop then
        # overlap (the default executor has only cpu_count + 4 threads).
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rstar-env-api")
            weakref.finalize(self, self._executor.shutdown, wait=False)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_executor"] = None  # threads do not travel; a copy starts its own
        return state


def _gymnasium_time_limit_below(env: gymnasium.Env) -> int | None:
    """The smallest limit of gymnasium ``TimeLimit`` wrappers in ``env``'s stack that do not tell the env
    themselves, read from each one's public ``spec``; ``None`` for none. A ``TimeLimit`` without a spec (wrapped by
    hand around an env not built by ``make``) cannot be read: it is named in a warning."""
    limits: list[int] = []
    layer: Any = env
    while isinstance(layer, gymnasium.Wrapper):
        if isinstance(layer, gymnasium.wrappers.TimeLimit) and not isinstance(layer, ScoredTimeLimit):
            spec = layer.spec
            if spec is not None and spec.max_episode_steps is not None:
                limits.append(int(spec.max_episode_steps))
            else:
                gymnasium.logger.warn(
                    "EnvAPI: a gymnasium TimeLimit in this stack has no spec to read its limit from, so the step it "
                    "cuts will not be scored; use rstar_env.wrappers.ScoredTimeLimit instead"
                )
        layer = layer.env
    return min(limits) if limits else None
