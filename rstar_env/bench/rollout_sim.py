"""A pure simulation of multi-turn rollout over several inference engines (no model, no server).

Three schedulers run the same workload:

* ``lockstep``: rounds with a barrier (how rstar-env's collector used to run): every live episode generates, the
  round waits for its slowest generation and then for its slowest tool call; episodes pinned to engines round-robin.
* ``static``: OpenRLHF's ``_dispatch_prompts_to_vllm``: each prompt's samples pinned to one engine up front
  (round-robin), no barrier.
* ``dynamic``: :class:`~rstar_env.rollout.dispatch.DispatchPolicy`'s rule
  (:func:`~rstar_env.rollout.admission.pick_engine`, the same code): no barrier; a request goes to the engine
  with the most free KV capacity, waits in the dispatcher while none has room, prefers its episode's engine.

**Model.** An engine decodes each admitted request at its own ``speed`` (tokens/s) independently of the others, as
long as the KV tokens it reserves (context + max tokens) fit its ``capacity``. A request pinned to a full engine
waits in that engine's queue: an *over-capacity moment* (on a real vLLM engine: preemption and recompute, or a queue
while other engines idle). The workload: ``prompts`` x ``samples`` episodes, each ``turns`` turns; generation lengths
long-tailed (log-normal), tool latencies exponential; engines of unequal speed and capacity.

**Lower bound.** No schedule beats the longest episode run on the fastest engine with no waiting, nor the total
generated tokens over the engines' combined throughput when each holds as many requests as its capacity allows.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rstar_env.rollout.admission import pick_engine

SCHEDULERS = ("lockstep", "static", "dynamic")


@dataclass(frozen=True)
class EngineModel:
    speed: float
    """Decode tokens per second of one request."""
    capacity: int
    """KV-cache tokens."""


@dataclass(frozen=True)
class Workload:
    prompts: int = 32
    samples: int = 8
    turns: int = 3
    prompt_tokens: int = 300
    max_new_tokens: int = 1024
    gen_median: float = 200.0
    gen_sigma: float = 1.0
    tool_mean_s: float = 0.3
    width: int = 128
    engines: tuple[EngineModel, ...] = (
        EngineModel(400.0, 40_000),
        EngineModel(250.0, 24_000),
        EngineModel(400.0, 40_000),
        EngineModel(150.0, 16_000),
    )
    seed: int = 0

    def draw(self) -> list[list[tuple[int, float]]]:
        """Per episode, per turn: (generated tokens, tool latency after it)."""
        rng = random.Random(self.seed)
        episodes = []
        for _ in range(self.prompts * self.samples):
            turns = []
            for _ in range(self.turns):
                tokens = min(
                    self.max_new_tokens, max(1, int(rng.lognormvariate(math.log(self.gen_median), self.gen_sigma)))
                )
                turns.append((tokens, rng.expovariate(1 / self.tool_mean_s) if self.tool_mean_s else 0.0))
            episodes.append(turns)
        return episodes


@dataclass
class _Engine:
    model: EngineModel
    used: int = 0
    running: int = 0
    queue: deque[Any] = field(default_factory=deque)
    busy_s: float = 0.0
    busy_since: float | None = None
    peak: int = 0


def simulate(workload: Workload, scheduler: str) -> dict[str, Any]:
    """Makespan, per-engine busy %, over-capacity moments and ratio to the lower bound of one scheduler."""
    if scheduler not in SCHEDULERS:
        raise ValueError(f"unknown scheduler {scheduler!r}; choose one of {SCHEDULERS}")
    episodes = workload.draw()
    engines = [_Engine(m) for m in workload.engines]
    events: list[tuple[float, int, str, Any]] = []
    seq = [0]
    now = 0.0
    over = 0
    waiting: deque[tuple[int, int]] = deque()  # dynamic: requests held in the dispatcher
    affinity: dict[int, int] = {}
    context = [workload.prompt_tokens] * len(episodes)
    pending = deque(range(len(episodes)))
    live: set[int] = set()
    # lockstep bookkeeping
    round_left = [0]
    round_tools: list[int] = []

    def push(t: float, kind: str, data: Any) -> None:
        seq[0] += 1
        heapq.heappush(events, (t, seq[0], kind, data))

    def cost(episode: int) -> int:
        return context[episode] + workload.max_new_tokens

    def pinned(episode: int) -> int:
        return (episode // workload.samples) % len(engines)

    def run_on(e: int, episode: int, turn: int) -> None:
        engine = engines[e]
        engine.used += cost(episode)
        engine.peak = max(engine.peak, engine.used)
        engine.running += 1
        if engine.busy_since is None:
            engine.busy_since = now
        tokens = episodes[episode][turn][0]
        push(now + tokens / engine.model.speed, "done", (e, episode, turn))

    def submit(episode: int, turn: int) -> None:
        nonlocal over
        if scheduler == "dynamic":
            waiting.append((episode, turn))
            admit_waiting()
            return
        e = pinned(episode)
        engine = engines[e]
        if engine.queue or engine.used + cost(episode) > engine.model.capacity:
            over += 1
            engine.queue.append((episode, turn))
        else:
            run_on(e, episode, turn)

    def admit_waiting() -> None:
        while waiting:
            episode, turn = waiting[0]
            need = cost(episode)
            e = pick_engine(
                [g.model.capacity - g.used for g in engines], [need] * len(engines), preferred=affinity.get(episode)
            )
            if e is None:
                return
            waiting.popleft()
            affinity[episode] = e
            run_on(e, episode, turn)

    def start_next() -> None:
        while pending and len(live) < workload.width:
            episode = pending.popleft()
            live.add(episode)
            if scheduler == "lockstep":
                continue
            submit(episode, 0)

    def start_round() -> None:
        round_tools.clear()
        round_left[0] = len(live)
        for episode in sorted(live):
            submit(episode, turn_of[episode])

    turn_of = [0] * len(episodes)
    start_next()
    if scheduler == "lockstep":
        start_round()
    while events:
        now, _, kind, data = heapq.heappop(events)
        if kind == "done":
            e, episode, turn = data
            engine = engines[e]
            engine.used -= cost(episode)
            engine.running -= 1
            if engine.running == 0 and engine.busy_since is not None:
                engine.busy_s += now - engine.busy_since
                engine.busy_since = None
            context[episode] += episodes[episode][turn][0]
            while engine.queue and engine.used + cost(engine.queue[0][0]) <= engine.model.capacity:
                run_on(e, *engine.queue.popleft())
            if scheduler == "dynamic":
                admit_waiting()
            last = turn == workload.turns - 1
            tool = 0.0 if last else episodes[episode][turn][1]
            if scheduler == "lockstep":
                round_tools.append(int(tool * 1e6))
                round_left[0] -= 1
                if round_left[0] == 0:
                    push(now + max(round_tools) / 1e6, "round", None)
                if last:
                    live.discard(episode)
                else:
                    turn_of[episode] = turn + 1
                    context[episode] += 50  # the tool's feedback
            else:
                push(now + tool, "step", (episode, turn, last))
        elif kind == "step":
            episode, turn, last = data
            if last:
                live.discard(episode)
                start_next()
            else:
                context[episode] += 50
                submit(episode, turn + 1)
        elif kind == "round":
            start_next()
            if live:
                start_round()
    makespan = now
    return {
        "scheduler": scheduler,
        "makespan_s": makespan,
        "busy_pct": [100 * g.busy_s / makespan if makespan else 0.0 for g in engines],
        "over_capacity": over,
        "peak_over_capacity": [max(0, g.peak - g.model.capacity) for g in engines],
        "lower_bound_s": lower_bound(workload),
        "ratio": makespan / lower_bound(workload),
    }


def lower_bound(workload: Workload) -> float:
    episodes = workload.draw()
    fastest = max(m.speed for m in workload.engines)
    chain = max(sum(t / fastest for t, _ in turns) + sum(s for _, s in turns[:-1]) for turns in episodes)
    mean_cost = workload.prompt_tokens + workload.max_new_tokens + workload.gen_median * (workload.turns - 1)
    throughput = sum(m.speed * max(1.0, m.capacity // mean_cost) for m in workload.engines)
    throughput = min(throughput, sum(m.speed for m in workload.engines) * workload.width)
    total = sum(t for turns in episodes for t, _ in turns)
    return max(chain, total / throughput)


def compare(workload: Workload | None = None) -> list[dict[str, Any]]:
    workload = workload or Workload()
    return [simulate(workload, s) for s in SCHEDULERS]
