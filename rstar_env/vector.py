"""``MathToolVectorEnv``: N episodes stepped concurrently, sharing one set of tools and one reward plugin.

    >>> vec = gymnasium.make_vec("rstar_env/MathTool-v0", num_envs=16,
    ...                          vectorization_mode="vector_entry_point", tools=["python"])   # doctest: +SKIP

A ``step`` runs every sub-env's ``astep`` at once on the shared sandbox pool and reward plugin, so sixteen episodes
whose tool calls each sleep 0.5 s take about 0.5 s, not 8 s.

``reset(seed=..., options=...)`` takes two option keys, and refuses any other:

* ``"rows"``: one ``{problem, answer[, id]}`` dict per sub-env (``None`` for a sub-env draws from the dataset);
* ``"reset_mask"``: a boolean array of ``num_envs``: only those sub-envs start new episodes; the others keep
  theirs, and the observation returned for them is their last one.

``autoreset_mode`` (a keyword of ``make_vec``; stated in ``metadata["autoreset_mode"]``) is gymnasium's:

* ``NEXT_STEP`` (default): the step after an episode ends resets that sub-env, ignores its action and returns its
  new prompt with reward 0;
* ``SAME_STEP``: the step that ends an episode resets the sub-env at once and returns the new prompt; the last
  observation and info of the ended episode are in ``infos["final_obs"]`` / ``infos["final_info"]``;
* ``DISABLED``: nothing resets by itself; reset ended sub-envs with ``reset(options={"reset_mask": ...})``. Stepping
  an ended sub-env raises ``ResetNeeded`` before any sub-env is stepped.

An autoreset draws the sub-env's next problem from the configured dataset with that sub-env's own random generator
(seeded by the last ``reset(seed=...)``), never from earlier ``rows``.

Trainers that do not step in lockstep (OpenRLHF steps each sample from its own coroutine) use the sub-envs'
async API directly: ``await vec.envs[i].astep(action)``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from rstar_env import aio
from rstar_env.data.records import check_row
from rstar_env.env import MathToolEnv

RESET_OPTIONS: tuple[str, ...] = ("rows", "reset_mask")
"""The keys ``MathToolVectorEnv.reset(options=...)`` takes."""

StepResult = tuple[str, float, bool, bool, dict[str, Any]]


class MathToolVectorEnv(VectorEnv):
    """``num_envs`` :class:`MathToolEnv` copies with shared plugins; keyword options as for ``MathToolEnv``.

    ``autoreset_mode``: an :class:`~gymnasium.vector.AutoresetMode` (or its value, ``"SameStep"``, or name,
    ``"same_step"``). ``max_episode_steps``: each sub-env's time limit (see :class:`MathToolEnv`).
    """

    metadata: ClassVar[dict[str, Any]] = {"autoreset_mode": AutoresetMode.NEXT_STEP, "render_modes": ["ansi"]}

    def __init__(
        self,
        num_envs: int = 1,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        max_episode_steps: int | None = None,
        **options: Any,
    ) -> None:
        if num_envs < 1:
            raise ValueError(f"num_envs must be at least 1, got {num_envs}")
        self.autoreset_mode = _autoreset_mode(autoreset_mode)
        self.metadata = {**type(self).metadata, "autoreset_mode": self.autoreset_mode}
        self.num_envs = num_envs
        first = MathToolEnv(max_episode_steps=max_episode_steps, **options)
        # The others are built from the first's validated config and borrow its plugins and loaded rows.
        shared = {
            "config": first.config,
            "tools": list(first.tools.values()),
            "reward": first.reward_fn,
            "tokenizer": first.tokenizer,
            "render_mode": first.render_mode,
            "max_episode_steps": max_episode_steps,
        }
        self.envs: list[MathToolEnv] = [first]
        for _ in range(num_envs - 1):
            env = MathToolEnv(**shared)
            env._dataset = first._dataset
            self.envs.append(env)
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self.render_mode = first.render_mode
        self._ended = np.zeros(num_envs, dtype=bool)  # whose episode ended at the last step
        self._last_obs: list[str] = [""] * num_envs

    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        """Reset every sub-env, or those in ``options["reset_mask"]``; ``options["rows"]`` gives their problems."""
        return aio.run_sync(self.areset(seed=seed, options=options))

    def step(self, actions: Sequence[str]) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict]:
        return aio.run_sync(self.astep(actions))

    async def areset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        seeds = _seeds(seed, self.num_envs)
        options = dict(options or {})
        unknown = sorted(set(options) - set(RESET_OPTIONS))
        if unknown:
            raise ValueError(
                f"unknown reset option(s) {', '.join(map(repr, unknown))}: MathToolVectorEnv.reset takes 'rows' "
                "(one {problem, answer} dict per sub-env, or None to draw from the dataset) and 'reset_mask' (a "
                "boolean array: which sub-envs to reset)"
            )
        mask = _reset_mask(options.get("reset_mask"), self.num_envs)
        rows = _rows(options.get("rows"), self.num_envs)
        chosen = [i for i in range(self.num_envs) if mask[i]]
        results = await asyncio.gather(*(self.envs[i].areset(seed=seeds[i], options=rows[i]) for i in chosen))
        infos: dict[str, Any] = {}
        for i, (obs, info) in zip(chosen, results, strict=True):
            self._last_obs[i] = obs
            self._ended[i] = False
            infos = self._add_info(infos, info, i)
        return tuple(self._last_obs), infos

    async def astep(
        self, actions: Sequence[str]
    ) -> tuple[tuple[str, ...], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        if len(actions) != self.num_envs:
            raise ValueError(f"got {len(actions)} actions for {self.num_envs} sub-envs")
        if self.autoreset_mode == AutoresetMode.DISABLED and self._ended.any():
            ended = np.flatnonzero(self._ended).tolist()
            raise gymnasium.error.ResetNeeded(
                f"sub-env(s) {ended} have ended and autoreset_mode is DISABLED: reset them with "
                f"reset(options={{'reset_mask': mask}}) before the next step (no sub-env was stepped)"
            )
        results = await asyncio.gather(*(self._step_one(i, actions[i]) for i in range(self.num_envs)))
        observations = tuple(r[0] for r in results)
        rewards = np.array([r[1] for r in results], dtype=np.float64)
        terminations = np.array([r[2] for r in results], dtype=bool)
        truncations = np.array([r[3] for r in results], dtype=bool)
        self._last_obs = list(observations)
        if self.autoreset_mode != AutoresetMode.SAME_STEP:
            self._ended = terminations | truncations
        infos: dict[str, Any] = {}
        for i, result in enumerate(results):
            infos = self._add_info(infos, result[4], i)
        return observations, rewards, terminations, truncations, infos

    async def _step_one(self, i: int, action: str) -> StepResult:
        env = self.envs[i]
        if self._ended[i]:  # NEXT_STEP: this step resets the sub-env and ignores its action
            obs, info = await env.areset()
            return obs, 0.0, False, False, info
        obs, reward, terminated, truncated, info = await env.astep(action)
        if self.autoreset_mode == AutoresetMode.SAME_STEP and (terminated or truncated):
            new_obs, reset_info = await env.areset()
            return new_obs, reward, terminated, truncated, {**reset_info, "final_obs": obs, "final_info": info}
        return obs, reward, terminated, truncated, info

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


def _autoreset_mode(value: AutoresetMode | str) -> AutoresetMode:
    if isinstance(value, AutoresetMode):
        return value
    if isinstance(value, str):
        for mode in AutoresetMode:
            if value in (mode.value, mode.name) or value.upper() == mode.name:
                return mode
    choices = ", ".join(f"AutoresetMode.{m.name} ({m.value!r})" for m in AutoresetMode)
    raise ValueError(f"unknown autoreset_mode {value!r}: choose one of {choices}")


def _reset_mask(mask: Any, n: int) -> np.ndarray:
    if mask is None:
        return np.ones(n, dtype=bool)
    array = np.asarray(mask)
    if array.shape != (n,) or array.dtype != np.bool_:
        raise ValueError(
            f"options['reset_mask'] must be a boolean array of shape ({n},), one flag per sub-env; "
            f"got shape {array.shape} and dtype {array.dtype}"
        )
    if not array.any():
        raise ValueError("options['reset_mask'] selects no sub-env: set at least one flag to True")
    return array


def _rows(rows: Any, n: int) -> list[dict[str, Any] | None]:
    if rows is None:
        return [None] * n
    if isinstance(rows, dict | str) or not isinstance(rows, Sequence):
        raise ValueError(f"options['rows'] must be a list of {n} {{problem, answer}} dicts, got {type(rows).__name__}")
    if len(rows) != n:
        raise ValueError(f"options['rows'] has {len(rows)} rows for {n} sub-envs: give one per sub-env (None draws)")
    for i, row in enumerate(rows):
        if row is not None and not isinstance(row, dict):
            got = type(row).__name__
            raise ValueError(f"options['rows'][{i}] must be a {{problem, answer}} dict or None, got {got}")
        if row is not None:
            check_row(row, f"options['rows'][{i}]")
    return list(rows)


def _seeds(seed: int | Sequence[int | None] | None, n: int) -> list[int | None]:
    if seed is None:
        return [None] * n
    if isinstance(seed, int):
        return [seed + i for i in range(n)]
    if len(seed) != n:
        raise ValueError(f"got {len(seed)} seeds for {n} sub-envs")
    return list(seed)
