"""The long-tailed rollout scenario of issue 18, run for real against the replay server.

64 episodes at width 16 through :func:`~rstar_env.rollout.evaluate.evaluate` with an
:class:`~rstar_env.rollout.openai.OpenAIPolicy` (text tools) and the real ``python`` tool. Each episode makes two
python calls, then answers: three requests, each answered after 0.2 s (80%) or 2 s (20%), drawn per (episode, turn)
from a seeded generator before the run, so every scheduler faces the same delays.

The *ideal* event-driven run takes each episode, in order, into the first free slot and adds no overhead: its
makespan is the list schedule of the episodes' total server times over ``width`` slots. The *packing bound* is
total server time / width, and no run beats the longest single episode either.
"""

from __future__ import annotations

import heapq
import random
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
        return [[self.slow_s if rng.random() < self.slow_share else self.fast_s for _ in range(self.turns)]
                for _ in range(self.episodes)]


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


def _replay_server() -> Any:
    """The testkit's replay server module: this benchmark plays a scripted endpoint, which the product lacks."""
    try:
        from rstar_env_testkit import replay_server
    except ImportError as exc:
        raise RuntimeError(
            "the long-tail rollout benchmark needs the replay server of the rstar-env-testkit package, which is not "
            f"installed ({exc}); install it from a checkout with `pip install --no-deps -e testkit` "
            "(or `bash scripts/setup.sh --dev`)"
        ) from exc
    return replay_server


def responder(scenario: LongTail) -> Any:
    """The replay server's answer to each request: python calls, then a boxed answer, after the drawn delay."""
    from rstar_env.testing import answer, python_call

    reply = _replay_server().reply

    delays = scenario.delays()
    lock = threading.Lock()

    def respond(body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        problem = next((m.get("content") for m in messages if m.get("role") == "user"), "") or ""
        found = _PROBLEM.search(problem)
        episode = int(found.group(1)) if found else 0
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        with lock:
            delay = delays[episode % len(delays)][min(turn, scenario.turns - 1)]
        if turn < scenario.turns - 1:
            return reply(python_call(f"print({episode} + {turn})"), delay_s=delay)
        return reply(answer(episode), delay_s=delay)

    return respond


def rows(scenario: LongTail) -> list[dict[str, Any]]:
    return [{"id": f"e{i}", "problem": f"Episode {i}: what is {i}?", "answer": str(i)}
            for i in range(scenario.episodes)]


def run(scenario: LongTail, *, instant: bool = False) -> dict[str, Any]:
    """Run the scenario through ``evaluate``; ``instant`` answers at once (the run's fixed overhead)."""
    from rstar_env import aio
    from rstar_env.rollout.evaluate import evaluate
    from rstar_env.rollout.openai import OpenAIPolicy
    from rstar_env.vector import MathToolVectorEnv

    ReplayServer = _replay_server().ReplayServer

    if instant:
        scenario = LongTail(**{**scenario.__dict__, "fast_s": 0.0, "slow_s": 0.0})
    with ReplayServer(responder=responder(scenario), strict=False) as server, \
            tempfile.TemporaryDirectory() as tmp:
        env = MathToolVectorEnv(scenario.width, max_turns=scenario.turns)
        policy = OpenAIPolicy.for_env(env, server.base_url, "replay", native_tools=False)

        async def go() -> dict[str, Any]:
            try:
                return await evaluate(policy, rows(scenario), out=Path(tmp) / "eval.jsonl", env=env)
            finally:
                await policy.aclose()
                await env.aclose()

        start = time.perf_counter()
        summary = aio.run_sync(go())
        wall = time.perf_counter() - start
    return {"wall_s": wall, "episodes": summary.get("episodes"), "pass@1": summary.get("pass@1"),
            "policy_errors": summary.get("policy_errors", 0), "env_errors": summary.get("env_errors", 0),
            "max_in_flight": server.max_in_flight, "requests": len(server.requests)}
