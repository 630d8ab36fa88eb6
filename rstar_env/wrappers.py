"""The env's own API on the outside of gymnasium's wrappers.

Gymnasium's wrappers (the env checker, ``OrderEnforcing``, ``TimeLimit``) take ``step(action)`` alone and have no
async methods. :class:`EnvAPI` goes outside them, ``env = EnvAPI(gym.make("rstar_env/MathTool-v0", ...))``, and
gives back what they hide:

- ``step(action, token_ids=..., logprobs=...)``: the keywords ride inside a :class:`~rstar_env.spaces.TokenAction`
  through every wrapper below, so ``TimeLimit`` still counts the step and the env checker still checks it;
- ``areset``/``astep``: the same wrapper stack, run on a thread of this wrapper's own, so the caller's event loop
  never blocks and each wrapper's rules hold (an ``astep`` is one ``TimeLimit`` step).

It is not part of the registration: gymnasium's ``make_vec`` refuses a registered ``additional_wrappers`` in its
``vector_entry_point`` mode, which is this env's fast vector path.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, SupportsFloat

import gymnasium
from gymnasium.utils import RecordConstructorArgs

from rstar_env.spaces import TokenAction


class EnvAPI(gymnasium.Wrapper, RecordConstructorArgs):
    """Token-level ``step`` and the async API on the outside of ``gym.make``'s wrappers."""

    def __init__(self, env: gymnasium.Env) -> None:
        RecordConstructorArgs.__init__(self)
        gymnasium.Wrapper.__init__(self, env)
        self._executor: ThreadPoolExecutor | None = None

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
        return await self._in_thread(lambda: self.env.reset(seed=seed, options=options))

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
