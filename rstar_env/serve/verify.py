"""``POST /verify``: the server's reward plugin over HTTP.

Request ``{"response": str, "gold": str}`` (``answer`` is accepted for ``gold``); reply ``{"reward": float,
"extracted": str | null, "reason": str, "reward_plugin": str}``: the same judgement the env gives an episode's
final answer. A reward plugin that fails or outlives ``env.reward_timeout_s`` is answered 503 with the cause (it
judged nothing), never 500.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rstar_env.plugins import invoke
from rstar_env.reward import current_client
from rstar_env.serve.fair import FairGate
from rstar_env.serve.guard import client_of
from rstar_env.serve.resources import Resources, on_background
from rstar_env.trajectory import RewardResult


class VerifyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    response: str = Field(description="The model's response (its final answer inside, e.g. \\boxed{42}).")
    gold: str | None = Field(default=None, description="The gold answer.")
    answer: str | None = Field(default=None, description="Another name for gold.")

    @model_validator(mode="after")
    def _gold_given(self) -> VerifyRequest:
        if (self.gold is None) == (self.answer is None):
            raise ValueError("give the gold answer once, as 'gold' (or 'answer')")
        return self


class VerifyResponse(BaseModel):
    reward: float
    extracted: str | None
    reason: str
    reward_plugin: str


def add_verify_route(app: FastAPI, resources: Resources, gate: FairGate) -> None:
    """Mount ``/verify`` on ``app``, judged by ``resources.reward``; requests wait their turn in ``gate`` (fair per
    client), and the reward's time limit starts once a request is admitted."""
    reward = resources.reward
    limit = resources.config.env.reward_timeout_s

    @app.post("/verify", response_model=VerifyResponse, tags=["Verifier"])
    async def verify(request: VerifyRequest, raw: Request) -> VerifyResponse:
        gold = request.gold if request.gold is not None else request.answer
        assert gold is not None

        client = client_of(raw.scope)

        async def score() -> Any:
            current_client.set(client)  # this task's own context: the reward's workers serve clients in turn
            return await asyncio.wait_for(invoke(reward.score, request.response, gold), limit)

        try:
            async with gate.slot(client):
                result = await on_background(score())
        except TimeoutError:
            raise HTTPException(
                503,
                f"the {reward.name!r} reward plugin did not finish within {limit:g} s "
                "(env.reward_timeout_s); nothing was judged",
            ) from None
        except Exception as exc:
            raise HTTPException(503, f"the {reward.name!r} reward plugin failed: {type(exc).__name__}: {exc}") from None
        if not isinstance(result, RewardResult):
            raise HTTPException(
                503, f"the {reward.name!r} reward plugin returned {type(result).__name__}, not RewardResult"
            )
        return VerifyResponse(
            reward=float(result.reward), extracted=result.extracted, reason=result.reason, reward_plugin=reward.name
        )


__all__ = ["VerifyRequest", "VerifyResponse", "add_verify_route"]
