"""``MathToolVectorEnv``: N episodes stepped concurrently, sharing one set of tools and one verifier.

    >>> vec = gymnasium.make_vec("rstar_env/MathTool-v0", num_envs=16,
    ...                          vectorization_mode="vector_entry_point", tools=["python"])   # doctest: +SKIP

A ``step`` runs every sub-env's ``astep`` at once on the shared sandbox pool and verifier, so sixteen episodes
whose tool calls each sleep 0.5 s take about 0.5 s, not 8 s. Autoreset follows gymnasium's default
(``AutoresetMode.NEXT_STEP``): the step after an episode ends resets that sub-env and ignores its action.

Trainers that do not step in lockstep (OpenRLHF steps each sample from its own coroutine) use the sub-envs'
async API directly: ``await vec.envs[i].astep(action)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rstar_env import _aio
from rstar_env.env import MathToolEnv


class MathToolVectorEnv(VectorEnv):
    """``num_envs`` :class:`MathToolEnv` copies with shared plugins; keyword options as for ``MathToolEnv``."""

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": ["ansi"]}

    def __init__(self, num_envs: int = 1, **options: Any) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.num_envs = num_envs
        first = MathToolEnv(**options)
        shared = {**options, "tools": list(first.tools.values()), "reward": first.reward_fn}
        self.envs: list[MathToolEnv] = [first] + [MathToolEnv(**shared) for _ in range(num_envs - 1)]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.render_mode = options.get("render_mode")
        self._needs_reset = np.zeros(num_envs, dtype=bool)

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset every sub-env. ``options`` may hold ``"rows"``: one ``{problem, answer}`` per sub-env."""
        return _aio.run_sync(self.areset(seed=seed, options=options))

    def step(self, actions: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict]:
        return _aio.run_sync(self.astep(actions))

    async def areset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        seeds = _seeds(seed, self.num_envs)
        rows = (options or {}).get("rows")
        if rows is not None and len(rows) != self.num_envs:
            raise ValueError(f"options['rows'] has {len(rows)} rows for {self.num_envs} sub-envs")
        results = await asyncio.gather(
            *(env.areset(seed=s, options=rows[i] if rows else None)
              for i, (env, s) in enumerate(zip(self.envs, seeds, strict=True)))
        )
        self._needs_reset[:] = False
        infos: dict[str, Any] = {}
        for i, (_, info) in enumerate(results):
            infos = self._add_info(infos, info, i)
        return tuple(obs for obs, _ in results), infos

    async def astep(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if len(actions) != self.num_envs:
            raise ValueError(f"got {len(actions)} actions for {self.num_envs} sub-envs")

        async def one(i: int) -> tuple[str, float, bool, bool, dict[str, Any]]:
            env = self.envs[i]
            if self._needs_reset[i]:
                obs, info = await env.areset()
                return obs, 0.0, False, False, info
            return await env.astep(actions[i])

        results = await asyncio.gather(*(one(i) for i in range(self.num_envs)))
        observations = tuple(r[0] for r in results)
        rewards = np.array([r[1] for r in results], dtype=np.float64)
        terminations = np.array([r[2] for r in results], dtype=bool)
        truncations = np.array([r[3] for r in results], dtype=bool)
        self._needs_reset = terminations | truncations
        infos: dict[str, Any] = {}
        for i, result in enumerate(results):
            infos = self._add_info(infos, result[4], i)
        return observations, rewards, terminations, truncations, infos

    def render(self) -> tuple[str | None, ...]:
        return tuple(env.render() for env in self.envs)

    async def aclose(self) -> None:
        """Close every sub-env (the first owns the shared plugins; the others only borrow them)."""
        for env in reversed(self.envs):
            await env.aclose()
        self.closed = True

    def close_extras(self, **kwargs: Any) -> None:
        # The first env owns the shared plugins; the others only borrow them.
        for env in reversed(self.envs):
            env.close()


def _seeds(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    if len(seed) != n:
        raise ValueError(f"got {len(seed)} seeds for {n} sub-envs")
    return list(seed)
