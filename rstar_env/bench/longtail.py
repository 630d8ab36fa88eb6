"""The long-tailed rollout scenario, run for real against a scripted endpoint.

64 episodes at width 16 through :func:`~rstar_env.rollout.evaluate.evaluate` with an
:class:`~rstar_env.rollout.openai.OpenAIPolicy` (text tools) and the real ``python`` tool. Each episode makes two
python calls, then answers: three requests, each answered after 0.2 s (80%) or 2 s (20%), drawn per (episode, turn)
from a seeded generator before the run, so every scheduler faces the same delays. The endpoint is played in process
(:class:`ScriptedEndpoint`, an ``httpx.MockTransport`` handler): the policy's client, retries and concurrency limit
run as against a server, with no server and no socket to add their own latency.

The *ideal* event-driven run takes each episode, in order, into the first free slot and adds no overhead: its
makespan is the list schedule of the episodes' total server times over ``width`` slots. The *packing bound* is
total server time / width, and no run beats the longest single episode either.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import random
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import httpx

_PROBLEM = re.compile(r"Episode (\d+):")


@dataclass(frozen=True)
class LongTail:
    episodes: int = 64
    width: int = 16
    turns: int = 3
    fast_s: float = 0.2
    slow_s: float = 2.0
    slow_share: float = 0.2
    seed: int = 0

    def delays(self) -> list[list[float]]:
        """``delays[episode][turn]``: how long the server takes to answer that request."""
        rng = random.Random(self.seed)
        return [
            [self.slow_s if rng.random() < self.slow_share else self.fast_s for _ in range(self.turns)]
            for _ in range(self.episodes)
        ]


def list_schedule(durations: list[float], width: int) -> float:
    """Makespan of taking each job, in order, into the first free of ``width`` slots."""
    free = [0.0] * min(width, len(durations))
    for duration in durations:
        heapq.heappush(free, heapq.heappop(free) + duration)
    return max(free) if free else 0.0


def bounds(scenario: LongTail) -> dict[str, float]:
    delays = scenario.delays()
    totals = [sum(d) for d in delays]
    return {
        "ideal_s": list_schedule(totals, scenario.width),
        "packing_bound_s": sum(totals) / scenario.width,
        "longest_episode_s": max(totals),
    }


def responder(scenario: LongTail) -> Any:
    """The endpoint's answer to each request body, ``{"content", "delay_s"}``: python calls, then a boxed answer,
    after the delay drawn for that (episode, turn)."""
    from rstar_env.testing import answer, python_call

    delays = scenario.delays()

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        problem = next((m.get("content") for m in messages if m.get("role") == "user"), "") or ""
        found = _PROBLEM.search(problem)
        episode = int(found.group(1)) if found else 0
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        delay = delays[episode % len(delays)][min(turn, scenario.turns - 1)]
        if turn < scenario.turns - 1:
            return {"content": python_call(f"print({episode} + {turn})"), "delay_s": delay}
        return {"content": answer(episode), "delay_s": delay}

    return respond


class ScriptedEndpoint:
    """An OpenAI-compatible chat-completions endpoint played in process: pass :meth:`transport` to the policy.

    Each ``POST .../chat/completions`` is answered by :func:`responder` after its delay (an ``asyncio.sleep``: the
    event loop runs the other episodes meanwhile, as a server would serve them); any other route is a 404. It
    counts the requests and the most in flight at once. Used on one event loop (the policy's), so no lock.
    """

    def __init__(self, scenario: LongTail) -> None:
        self.respond = responder(scenario)
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0

    def transport(self) -> httpx.MockTransport:
        """An ``httpx.MockTransport`` that answers through :meth:`handle`."""
        try:
            import httpx
        except ImportError:
            raise ImportError(
                "the long-tail benchmark's policy needs httpx, an optional dependency: pip install 'rstar-env[openai]'"
            ) from None
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        import httpx

        if request.method != "POST" or not request.url.path.rstrip("/").endswith("/chat/completions"):
            return httpx.Response(404, json={"error": {"message": f"no route {request.method} {request.url.path}"}})
        body = json.loads(request.content)
        self.requests += 1
        n = self.requests
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            entry = self.respond(body)
            if entry["delay_s"]:
                await asyncio.sleep(entry["delay_s"])
        finally:
            self.in_flight -= 1
        content = entry["content"]
        return httpx.Response(
            200,
            json={
                "id": f"chatcmpl-longtail-{n}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
                ],
                "usage": {
                    "prompt_tokens": 10 * len(body.get("messages") or []),
                    "completion_tokens": max(1, len(content.split())),
                },
            },
        )


def rows(scenario: LongTail) -> list[dict[str, Any]]:
    return [
        {"id": f"e{i}", "problem": f"Episode {i}: what is {i}?", "answer": str(i)} for i in range(scenario.episodes)
    ]


def run(scenario: LongTail, *, instant: bool = False) -> dict[str, Any]:
    """Run the scenario through ``evaluate``; ``instant`` answers at once (the run's fixed overhead)."""
    from rstar_env import aio
    from rstar_env.rollout.evaluate import evaluate
    from rstar_env.rollout.openai import OpenAIPolicy
    from rstar_env.vector import MathToolVectorEnv

    if instant:
        scenario = LongTail(**{**scenario.__dict__, "fast_s": 0.0, "slow_s": 0.0})
    endpoint = ScriptedEndpoint(scenario)
    with tempfile.TemporaryDirectory() as tmp:
        env = MathToolVectorEnv(scenario.width, max_turns=scenario.turns)
        policy = OpenAIPolicy.for_env(
            env, "http://scripted.invalid/v1", "scripted", native_tools=False, transport=endpoint.transport()
        )

        async def go() -> dict[str, Any]:
            try:
                return await evaluate(policy, rows(scenario), out=Path(tmp) / "eval.jsonl", env=env)
            finally:
                await policy.aclose()
                await env.aclose()

        start = time.perf_counter()
        summary = aio.run_sync(go())
        wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "episodes": summary.get("episodes"),
        "pass@1": summary.get("pass@1"),
        "policy_errors": summary.get("policy_errors", 0),
        "env_errors": summary.get("env_errors", 0),
        "max_in_flight": endpoint.max_in_flight,
        "requests": endpoint.requests,
    }
