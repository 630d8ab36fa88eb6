"""A typed OpenEnv client for ``rstar-env serve env``: OpenEnv's own ``EnvClient`` with this server's action,
observation and state models, so results come back as :class:`MathToolObservation` rather than dicts.

    >>> async with MathToolEnvClient(base_url="http://127.0.0.1:8000") as env:   # doctest: +SKIP
    ...     result = await env.reset(problem="What is 6 * 7?", answer="42")
    ...     result = await env.step(MathToolAction(text="<answer>\\\\boxed{42}</answer>"))
    ...     result.reward, result.done, result.observation.info["end_reason"]     # (1.0, True, 'answer')

OpenEnv's ``GenericEnvClient`` works as well (observations as dicts). With a token, use the base URL
``http://HOST:PORT/token/<token>``.
"""

from __future__ import annotations

from typing import Any

import rstar_env.serve._openenv  # noqa: F401  (first: openenv without its Gradio web UI)

# isort: split
from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from rstar_env.serve.env_server import MathToolAction, MathToolObservation, MathToolState


class MathToolEnvClient(EnvClient[MathToolAction, MathToolObservation, MathToolState]):
    """``EnvClient`` for the rstar-env env server; ``step`` also takes a plain ``str`` (the turn's text)."""

    def _step_payload(self, action: MathToolAction | str) -> dict[str, Any]:
        if isinstance(action, str):
            action = MathToolAction(text=action)
        return action.model_dump(exclude_none=True, exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[MathToolObservation]:
        observation = MathToolObservation(
            **payload.get("observation", {}), reward=payload.get("reward"), done=payload.get("done", False)
        )
        return StepResult(observation=observation, reward=payload.get("reward"), done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> MathToolState:
        return MathToolState(**payload)


__all__ = ["MathToolEnvClient"]
