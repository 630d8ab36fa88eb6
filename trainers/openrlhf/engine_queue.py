"""Feed OpenRLHF's vLLM engine actors from one shared queue by free KV capacity (rStar2-Agent §3.2).

OpenRLHF's ``_dispatch_prompts_to_vllm`` assigns every prompt of a batch to an engine up front (by a snapshot of
unfinished requests) and sends them all at once, so a slow or small engine holds a long queue while a fast one
idles, and an engine given more than its KV cache holds preempts and recomputes. :func:`generate_vllm_shared_queue`
instead keeps the prompts in one queue here and sends the next one to the engine with the most free capacity as
soon as it has room for it; a prompt's ``n`` samples go together in one request (RoC selects within a prompt's
group, which must come back whole).

**Capacity.** Per engine, in KV tokens: ``trainer.engine_capacity_tokens`` from the config, else what the engine's
vLLM cache config says (``num_gpu_blocks`` x ``block_size``, read from the actor), else unbounded with at most
``trainer.engine_max_prompts`` prompts in flight. A request costs ``n_samples x max_len`` tokens (OpenRLHF's
truncation length bounds prompt + response). An idle engine always takes one request, even one larger than its
capacity (vLLM then schedules its samples in turn), so nothing waits forever.

The admission rule is :func:`rstar_env.rollout.admission.pick_engine`, the one the multi-engine dispatcher of
``eval`` uses. The scheduling is :class:`SharedQueue`, pure and independent of Ray (``wait`` and ``get`` are
passed in), so it is tested with stub engines of unequal speed.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rstar_env.rollout.admission import pick_engine

logger = logging.getLogger(__name__)


@dataclass
class EngineLoad:
    """What one engine holds and has done."""

    capacity: float
    """KV tokens (``inf``: unknown, bounded by ``max_prompts``)."""
    max_prompts: int
    used: float = 0.0
    in_flight: int = 0
    served: int = 0
    peak_used: float = 0.0
    peak_in_flight: int = 0
    over_capacity: int = 0
    """Requests admitted alone although larger than the capacity."""

    def room_for(self, cost: float) -> bool:
        if self.in_flight == 0:
            return True
        return self.in_flight < self.max_prompts and self.used + cost <= self.capacity

    def free(self) -> float:
        return self.capacity - self.used if self.capacity != float("inf") else float(self.max_prompts - self.in_flight)


@dataclass
class SharedQueue:
    """Dispatch items to engines by free capacity; ``run`` returns when every item (and any it adds) is done."""

    loads: list[EngineLoad]
    wait: Callable[..., tuple[list[Any], list[Any]]]
    get: Callable[[Any], Any]
    order: list[int] = field(default_factory=list)
    """The engine each request went to, in dispatch order (for tests and logs)."""

    def run(
        self,
        items: Sequence[Any],
        submit: Callable[[int, Any], Any],
        cost: Callable[[Any], float],
        on_done: Callable[[Any, Any], Sequence[Any]],
    ) -> None:
        """``submit(engine, item)`` returns a ref; ``on_done(item, result)`` returns items to queue next (refills)."""
        pending = deque(items)
        in_flight: list[tuple[Any, int, float, Any]] = []  # (ref, engine, cost, item)
        while pending or in_flight:
            while pending:
                item = pending[0]
                need = cost(item)
                engine = pick_engine(
                    [load.free() if load.room_for(need) else -1.0 for load in self.loads],
                    [need if load.capacity != float("inf") else 1.0 for load in self.loads],
                    idle=[load.in_flight == 0 for load in self.loads],
                )
                if engine is None:
                    break  # it waits here, in the shared queue, for the first engine that frees enough
                pending.popleft()
                load = self.loads[engine]
                if need > load.capacity:
                    load.over_capacity += 1
                load.used += need
                load.in_flight += 1
                load.peak_used = max(load.peak_used, load.used)
                load.peak_in_flight = max(load.peak_in_flight, load.in_flight)
                self.order.append(engine)
                in_flight.append((submit(engine, item), engine, need, item))
            ready, _ = self.wait([entry[0] for entry in in_flight], num_returns=1, timeout=10.0)
            for ref in ready:
                index = next(i for i, entry in enumerate(in_flight) if entry[0] is ref or entry[0] == ref)
                _, engine, need, item = in_flight.pop(index)
                load = self.loads[engine]
                load.used -= need
                load.in_flight -= 1
                load.served += 1
                pending.extend(on_done(item, self.get(ref)))


def engine_kv_tokens(engines: Sequence[Any], get: Callable[[Any], Any]) -> list[float | None]:
    """Each vLLM engine actor's KV-cache tokens from its cache config, or ``None`` where it cannot be read."""
    out: list[float | None] = []
    for engine in engines:
        try:
            caller = engine.__ray_call__  # Ray's hook to run a function on the actor instance
            out.append(get(caller.remote(_kv_tokens_of_actor)))
        except Exception as exc:  # an engine without a readable cache config: the config or a prompt limit decide
            logger.info("engine KV capacity not readable (%s); using the config or a prompt limit", exc)
            out.append(None)
    return out


def _kv_tokens_of_actor(actor: Any) -> float | None:
    llm = getattr(actor, "llm", None)
    engine = getattr(llm, "llm_engine", None) or getattr(llm, "engine", None) or llm
    config = getattr(engine, "cache_config", None) or getattr(
        getattr(engine, "vllm_config", None), "cache_config", None
    )
    blocks, size = getattr(config, "num_gpu_blocks", None), getattr(config, "block_size", None)
    return float(blocks * size) if blocks and size else None


def generate_vllm_shared_queue(
    generator: Any,
    dataloader_iter: Any,
    num_prompts: int,
    dynamic_filtering: Any,
    *,
    capacity_tokens: float | None = None,
    max_prompts: int = 64,
    wait: Callable[..., Any] | None = None,
    get: Callable[[Any], Any] | None = None,
    **generate_kwargs: Any,
) -> tuple[list[Any], int, bool]:
    """``SamplesGenerator._generate_vllm`` with the shared queue: same inputs, same ``(experiences, prompts
    consumed, exhausted)`` result, same dynamic filtering (a filtered prompt is replaced by a new one)."""
    import ray
    from openrlhf.trainer.ppo_utils.samples_generator import _collect_prompt_batch

    wait = wait or ray.wait
    get = get or ray.get
    prompts, labels, images, exhausted = _collect_prompt_batch(dataloader_iter, num_prompts)
    if not prompts:
        return [], 0, True
    engines = list(generator.vllm_engines)
    read = getattr(generator, "_engine_kv_tokens", None)
    if capacity_tokens is not None:
        read = [None] * len(engines)
    elif read is None or len(read) != len(engines):  # read once: an engine's cache size does not change
        read = generator._engine_kv_tokens = engine_kv_tokens(engines, get)
    loads = [EngineLoad(capacity_tokens or kv or float("inf"), max_prompts) for kv in read]
    queue = SharedQueue(loads, wait, get)
    n_samples = generate_kwargs.get("n_samples_per_prompt", generator.args.rollout.n_samples_per_prompt)
    max_len = generate_kwargs.get("max_len", 2048)
    consumed = [len(prompts)]
    state = {"exhausted": exhausted}
    accepted: list[Any] = []

    def submit(engine: int, item: tuple[Any, Any, Any]) -> Any:
        # OpenRLHF builds the request (sampling params, truncation, tokenizer) as it always does, for one engine.
        everyone = generator.vllm_engines
        generator.vllm_engines = [everyone[engine]]
        try:
            (ref,) = generator._dispatch_prompts_to_vllm([item[0]], [item[1]], images=[item[2]], **generate_kwargs)
        finally:
            generator.vllm_engines = everyone
        return ref

    def on_done(item: Any, responses: Any) -> list[Any]:
        experiences = [generator._process_response_into_experience(r, **generate_kwargs) for r in responses]
        if dynamic_filtering and experiences and all(e.scores is not None for e in experiences):
            scores = [e.scores[0].item() for e in experiences]
            low, high = generator.args.algo.dynamic_filtering_range
            if not low < sum(scores) / len(scores) < high:
                experiences = []
        if experiences:
            accepted.extend(experiences)
            return []
        if not dynamic_filtering:
            return []
        new_prompts, new_labels, new_images, state["exhausted"] = _collect_prompt_batch(dataloader_iter, 1)
        consumed[0] += len(new_prompts)
        return list(zip(new_prompts, new_labels, new_images or [None] * len(new_prompts), strict=True))

    items = list(zip(prompts, labels, images or [None] * len(prompts), strict=True))
    queue.run(items, submit, lambda _item: float(n_samples * max_len), on_done)
    logger.info(
        "shared engine queue: %s prompts per engine, peak KV tokens %s",
        [load.served for load in loads],
        [load.peak_used for load in loads],
    )
    generator.engine_loads = loads
    return accepted, consumed[0], state["exhausted"]
