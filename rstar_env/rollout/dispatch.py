"""A :class:`~rstar_env.rollout.policy.Policy` over several inference engines: admission by free KV capacity,
affinity, failover (rStar2-Agent §3.2's load-balanced rollout scheduler).

Each engine is a policy of its own (an :class:`~rstar_env.rollout.openai.OpenAIPolicy` per endpoint, or any
policy) with a **capacity**:

* ``tokens``: a KV-cache token capacity, given (config or CLI) or read from the server's vLLM ``/metrics``
  (``vllm:cache_config_info``: ``num_gpu_blocks`` x ``block_size``) and refreshed with its live usage
  (``vllm:kv_cache_usage_perc`` / ``vllm:gpu_cache_usage_perc``, ``vllm:num_requests_waiting``);
* otherwise ``requests``: a concurrency limit.

**Admission.** A request costs its prompt tokens plus its ``max_tokens`` (the context's ids where the request has
them, else the dispatcher's tokenizer, else the stated estimate of one token per
:data:`CHARS_PER_TOKEN_ESTIMATE` characters), or 1 on a concurrency-limited engine. It goes to the engine with the
most free capacity (free tokens when every engine counts tokens, else the free fraction). When no engine has room it
waits here, never in an engine's queue, and goes to the first engine that frees enough. The in-flight cost on an
engine never exceeds its capacity; a request larger than every engine's capacity fails at once with a message
saying so. When the live metrics say the cache is fuller than our own count (other clients) or that the server
queues requests, the engine is treated as that full until the next refresh.

**Affinity.** Later turns of an episode (:attr:`Request.episode`) prefer the engine that served the earlier ones,
whose prefix cache holds the context, unless it lacks room and another engine has it.

**Failover.** A generation that fails for a reason of the engine (connection refused or dropped, timeouts, 5xx, 429
after the engine policy's own retries, an exception) is sent again to another engine. An engine that refuses
connections, or fails ``failure_threshold`` times in a row, is marked down: it gets no requests until a backoff
(``backoff_s``, doubling per consecutive outage up to ``max_backoff_s``) has passed, after which it is probed with
live traffic again. A request fails (``finish_reason="error"``, so the episode ends as ``policy_error``) only when
every engine has failed it, or when the error is the request's own (HTTP 400: context too long, ...), which no other
engine would answer differently.

**Stats.** :meth:`DispatchPolicy.stats` lists per engine ``endpoint``, ``requests`` (attempts sent), ``failed``
(attempts that failed), ``busy_s`` (wall time with at least one request in flight), ``capacity``, ``capacity_unit``,
``capacity_source``, ``peak_in_flight_cost``, ``marked_down``. ``sum(requests) - sum(failed)`` is the number of
generations returned without error.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rstar_env.rollout.admission import pick_engine
from rstar_env.rollout.policy import Generation, Request

if TYPE_CHECKING:
    import httpx

CHARS_PER_TOKEN_ESTIMATE = 3.0
"""Characters per token assumed when a request's context has no ids and no tokenizer is known: a conservative
figure (English BPE averages ~4), so the estimate errs towards admitting too little rather than too much."""

_AFFINITY_MEMORY = 100_000  # episodes remembered for affinity (least recently used forgotten first)


@dataclass
class EngineSpec:
    """One engine as the user gives it: its policy and, optionally, its capacity."""

    policy: Any
    endpoint: str
    capacity_tokens: int | None = None
    """KV-cache tokens; ``None``: read from ``metrics_url`` when it serves vLLM metrics, else ``max_concurrency``."""
    max_concurrency: int = 64
    """The concurrency limit used when the engine's token capacity is unknown."""
    metrics_url: str | None = None
    """Where the server's Prometheus metrics are (vLLM: ``http://host:port/metrics``)."""


@dataclass
class _Engine:
    spec: EngineSpec
    capacity: float
    unit: Literal["tokens", "requests"]
    source: str
    in_flight_cost: float = 0.0
    in_flight: int = 0
    requests: int = 0
    failed: int = 0
    busy_s: float = 0.0
    busy_since: float | None = None
    peak_cost: float = 0.0
    consecutive_failures: int = 0
    outages: int = 0
    down_until: float = 0.0
    marked_down: int = 0
    external_used: float = 0.0  # from live metrics: what the cache holds beyond our own in-flight count
    waiting: int = 0
    refreshed_at: float = 0.0
    metrics_error: str | None = None

    @property
    def endpoint(self) -> str:
        return self.spec.endpoint

    def up(self, now: float) -> bool:
        return now >= self.down_until

    def free(self) -> float:
        used = max(self.in_flight_cost, self.external_used)
        if self.waiting > 0 and self.in_flight > 0:  # the server already queues: it has no room, whatever we count
            return 0.0
        return self.capacity - used


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """The vLLM figures the dispatcher uses, from a Prometheus text exposition; missing ones are left out.

    Keys: ``capacity_tokens`` (``num_gpu_blocks`` x ``block_size`` of ``vllm:cache_config_info``), ``usage``
    (0..1, ``vllm:kv_cache_usage_perc`` or the older ``vllm:gpu_cache_usage_perc``), ``waiting``
    (``vllm:num_requests_waiting``), ``running`` (``vllm:num_requests_running``). Samples of several model labels are
    summed (usage: averaged).
    """
    found: dict[str, list[float]] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        try:
            number = float(value)
        except ValueError:
            continue
        if name == "vllm:cache_config_info":
            info = dict(_LABEL.findall(labels))
            try:
                blocks, size = int(float(info["num_gpu_blocks"])), int(float(info["block_size"]))
            except (KeyError, ValueError):
                continue
            if blocks > 0 and size > 0:
                found.setdefault("capacity_tokens", []).append(blocks * size)
        elif name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            found.setdefault("usage", []).append(number)
        elif name == "vllm:num_requests_waiting":
            found.setdefault("waiting", []).append(number)
        elif name == "vllm:num_requests_running":
            found.setdefault("running", []).append(number)
    out = {key: sum(values) for key, values in found.items() if key != "usage"}
    if "usage" in found:
        out["usage"] = min(max(sum(found["usage"]) / len(found["usage"]), 0.0), 1.0)
    return out


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class NoEngineError(RuntimeError):
    """No engine can serve a request (all failed it, or it is larger than every engine's capacity)."""


class DispatchPolicy:
    """A policy that sends each request to one of several engines; see the module doc.

    Args:
        engines: the engines (:class:`EngineSpec`), at least one.
        tokenizer: the tokenizer shared by token-level engine policies (default: the engines' own, which must be
            the same object), used for token-level truth and to count prompt tokens.
        max_new_tokens: a request's ``max_tokens`` when it carries none (default: the first engine policy's
            ``sampling.max_new_tokens``, else 512).
        failure_threshold: consecutive failures after which an engine is marked down (a refused connection marks
            it down at once).
        backoff_s / max_backoff_s: how long a down engine rests before it is tried again, doubling per outage.
        refresh_s: how often live metrics are read (engines with a ``metrics_url``).
        transport: the ``httpx`` transport metrics are read through (default: the network), e.g. the
            ``httpx.MockTransport`` the engines' policies answer through.
    """

    def __init__(
        self,
        engines: Sequence[EngineSpec],
        *,
        tokenizer: Any = None,
        max_new_tokens: int | None = None,
        failure_threshold: int = 3,
        backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        refresh_s: float = 1.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        if not engines:
            raise ValueError("DispatchPolicy needs at least one engine")
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, got {failure_threshold}")
        names = [e.endpoint for e in engines]
        if len(set(names)) != len(names):
            repeated = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"each engine must be given once; repeated: {repeated}")
        tokenizers = {id(getattr(e.policy, "tokenizer", None)) for e in engines}
        if tokenizer is None and len(tokenizers) > 1:
            raise ValueError(
                "the engines' policies have different tokenizers: token-level truth needs one; pass "
                "tokenizer= or give every engine the same one"
            )
        self.tokenizer = tokenizer if tokenizer is not None else getattr(engines[0].policy, "tokenizer", None)
        sampling = getattr(engines[0].policy, "sampling", None)
        self.max_new_tokens = max_new_tokens or getattr(sampling, "max_new_tokens", None) or 512
        self.failure_threshold = failure_threshold
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.refresh_s = refresh_s
        self.transport = transport
        self.engines = [self._engine(spec) for spec in engines]
        self._affinity: OrderedDict[str, int] = OrderedDict()
        self._changed: asyncio.Condition | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._metrics_client: Any = None
        self._first_read: asyncio.Task[None] | None = None
        self.waited = 0
        """Requests that found no engine with room and waited in the dispatcher."""
        self.affinity_hits = 0

    @staticmethod
    def _engine(spec: EngineSpec) -> _Engine:
        if spec.capacity_tokens is not None:
            if spec.capacity_tokens < 1:
                raise ValueError(f"{spec.endpoint}: capacity_tokens must be at least 1, got {spec.capacity_tokens}")
            return _Engine(spec, float(spec.capacity_tokens), "tokens", "config")
        if spec.max_concurrency < 1:
            raise ValueError(f"{spec.endpoint}: max_concurrency must be at least 1, got {spec.max_concurrency}")
        return _Engine(spec, float(spec.max_concurrency), "requests", "concurrency")

    # -- Policy API ------------------------------------------------------------------------------------------------
    async def generate(self, requests: Sequence[Request]) -> list[Generation]:
        """One generation per request; each is dispatched on its own (see the module doc)."""
        await self._start()
        return list(await asyncio.gather(*(self._dispatch(r) for r in requests)))

    async def aclose(self) -> None:
        client, self._metrics_client = self._metrics_client, None
        if client is not None:
            with contextlib.suppress(RuntimeError):  # its loop is gone
                await client.aclose()
        await asyncio.gather(*(e.spec.policy.aclose() for e in self.engines), return_exceptions=True)

    def stats(self) -> list[dict[str, Any]]:
        """Per engine: ``endpoint``, ``requests``, ``failed``, ``busy_s`` and more (see the module doc)."""
        now = time.monotonic()
        out = []
        for e in self.engines:
            busy = e.busy_s + (now - e.busy_since if e.busy_since is not None else 0.0)
            out.append(
                {
                    "endpoint": e.endpoint,
                    "requests": e.requests,
                    "failed": e.failed,
                    "busy_s": round(busy, 6),
                    "capacity": e.capacity,
                    "capacity_unit": e.unit,
                    "capacity_source": e.source,
                    "peak_in_flight_cost": e.peak_cost,
                    "marked_down": e.marked_down,
                    **({"metrics_error": e.metrics_error} if e.metrics_error else {}),
                }
            )
        return out

    def cost(self, request: Request, engine: _Engine | None = None) -> float:
        """What ``request`` occupies on ``engine``: prompt + max tokens (token capacity), or 1 (concurrency)."""
        if engine is not None and engine.unit == "requests":
            return 1.0
        return float(self.prompt_tokens(request) + (request.max_new_tokens or self.max_new_tokens))

    def prompt_tokens(self, request: Request) -> int:
        if request.context_ids is not None:
            return len(request.context_ids)
        text = _context_text(request)
        if self.tokenizer is not None and hasattr(self.tokenizer, "encode"):
            return len(self.tokenizer.encode(text, add_special_tokens=False))
        return int(len(text) / CHARS_PER_TOKEN_ESTIMATE) + 1

    # -- scheduling ------------------------------------------------------------------------------------------------
    async def _start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop: conditions and clients bind to it
            self._loop, self._changed, self._metrics_client = loop, asyncio.Condition(), None
            for e in self.engines:  # what was in flight on the old loop is gone
                e.in_flight, e.in_flight_cost, e.busy_since = 0, 0.0, None
            # Every request waits for the first read of the metrics: capacities are known before anything is sent.
            self._first_read = loop.create_task(self._refresh_metrics(force=True))
        await asyncio.shield(self._first_read)
        await self._refresh_metrics(force=False)

    async def _dispatch(self, request: Request) -> Generation:
        failed_on: set[int] = set()
        errors: list[str] = []
        while True:
            try:
                index, cost = await self._acquire(request, failed_on)
            except NoEngineError as exc:
                detail = "; ".join(errors[-len(self.engines) :])
                message = f"{exc}" + (f" (last errors: {detail})" if detail else "")
                return Generation(
                    "", finish_reason="error", metadata={"error": message, "engines_tried": len(failed_on)}
                )
            engine = self.engines[index]
            try:
                generation = await self._send(engine, request)
            finally:
                await self._release(engine, cost)
            if generation.finish_reason != "error":
                engine.consecutive_failures = 0
                engine.outages = 0
                self._remember(request, index)
                generation.metadata["engine"] = engine.endpoint
                return generation
            engine.failed += 1
            error = str(generation.metadata.get("error", ""))
            if generation.metadata.get("retryable") is False:  # the request's own fault: no engine answers otherwise
                generation.metadata["engine"] = engine.endpoint
                return generation
            errors.append(f"{engine.endpoint}: {error}")
            failed_on.add(index)
            engine.consecutive_failures += 1
            if generation.metadata.get("connection_error") or engine.consecutive_failures >= self.failure_threshold:
                self._mark_down(engine)
            async with self._cond():
                self._cond().notify_all()

    async def _send(self, engine: _Engine, request: Request) -> Generation:
        try:
            (generation,) = await engine.spec.policy.generate([request])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an engine's bug or outage must not sink the request: another engine may serve it
            generation = Generation("", finish_reason="error", metadata={"error": f"{type(exc).__name__}: {exc}"})
        return generation

    def _cond(self) -> asyncio.Condition:
        assert self._changed is not None
        return self._changed

    async def _acquire(self, request: Request, failed_on: set[int]) -> tuple[int, float]:
        cond = self._cond()
        waited = False
        async with cond:
            while True:
                now = time.monotonic()
                candidates = [i for i in range(len(self.engines)) if i not in failed_on]
                if not candidates:
                    raise NoEngineError(f"no engine could serve this request: all {len(self.engines)} failed it")
                fits = [i for i in candidates if self.cost(request, self.engines[i]) <= self.engines[i].capacity]
                if not fits:
                    sizes = ", ".join(
                        f"{self.engines[i].endpoint}: {self.engines[i].capacity:g} {self.engines[i].unit}"
                        for i in candidates
                    )
                    raise NoEngineError(
                        f"the request needs {self.cost(request):g} tokens (prompt + max_tokens), more than any "
                        f"engine's capacity ({sizes}); lower --max-new-tokens or the length budget, or raise the "
                        "engines' capacity"
                    )
                # Down engines rest while another is up; with all of them down, one is probed at once rather
                # than the request failing or idling (a single engine behaves as if there were no dispatcher).
                up = [i for i in fits if self.engines[i].up(now)]
                choice = self._choose(request, up or fits)
                if choice is not None:
                    engine = self.engines[choice]
                    cost = self.cost(request, engine)
                    engine.in_flight_cost += cost
                    engine.in_flight += 1
                    engine.requests += 1
                    engine.peak_cost = max(engine.peak_cost, engine.in_flight_cost)
                    if engine.busy_since is None:
                        engine.busy_since = now
                    return choice, cost
                if not waited:
                    waited = True
                    self.waited += 1
                # Wake on a release, or when a down engine's backoff ends, or to re-read live metrics.
                wake = [self.engines[i].down_until - now for i in fits if not self.engines[i].up(now)]
                timeout = min([*wake, self.refresh_s if self._has_metrics() else 5.0])
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cond.wait(), timeout=max(timeout, 0.001))
                if self._has_metrics():
                    cond.release()
                    try:
                        await self._refresh_metrics(force=False)
                    finally:
                        await cond.acquire()

    def _choose(self, request: Request, up: list[int]) -> int | None:
        preferred = self._affinity.get(request.episode) if request.episode is not None else None
        free = [e.free() for e in self.engines]
        need = [self.cost(request, e) for e in self.engines]
        mixed = any(e.unit != "tokens" for e in self.engines)  # then compare free fractions, not amounts
        choice = pick_engine(
            free, need, preferred=preferred, eligible=up, capacity=[e.capacity for e in self.engines] if mixed else None
        )
        if choice is not None and choice == preferred:
            self.affinity_hits += 1
        return choice

    async def _release(self, engine: _Engine, cost: float) -> None:
        engine.in_flight_cost = max(engine.in_flight_cost - cost, 0.0)
        engine.in_flight = max(engine.in_flight - 1, 0)
        if engine.in_flight == 0 and engine.busy_since is not None:
            engine.busy_s += time.monotonic() - engine.busy_since
            engine.busy_since = None
        cond = self._cond()
        async with cond:
            cond.notify_all()

    def _mark_down(self, engine: _Engine) -> None:
        wait = min(self.max_backoff_s, self.backoff_s * 2**engine.outages)
        engine.outages += 1
        engine.marked_down += 1
        engine.consecutive_failures = 0
        engine.down_until = time.monotonic() + wait

    def _remember(self, request: Request, index: int) -> None:
        if request.episode is None:
            return
        self._affinity[request.episode] = index
        self._affinity.move_to_end(request.episode)
        while len(self._affinity) > _AFFINITY_MEMORY:
            self._affinity.popitem(last=False)

    # -- live metrics ----------------------------------------------------------------------------------------------
    def _has_metrics(self) -> bool:
        return any(e.spec.metrics_url for e in self.engines)

    async def _refresh_metrics(self, *, force: bool) -> None:
        now = time.monotonic()
        due = [e for e in self.engines if e.spec.metrics_url and (force or now - e.refreshed_at >= self.refresh_s)]
        if not due:
            return
        for e in due:
            e.refreshed_at = now
        await asyncio.gather(*(self._read_metrics(e) for e in due))

    async def _read_metrics(self, engine: _Engine) -> None:
        url = engine.spec.metrics_url
        assert url is not None
        try:
            import httpx
        except ImportError:
            engine.metrics_error = "httpx is not installed: pip install 'rstar-env[openai]'"
            return
        if self._metrics_client is None:
            self._metrics_client = httpx.AsyncClient(timeout=httpx.Timeout(2.0), transport=self.transport)
        try:
            response = await self._metrics_client.get(url)
            if response.status_code == 404:  # not a vLLM server: it keeps its concurrency limit, no more polling
                engine.spec.metrics_url = None
                engine.metrics_error = f"{url} is not served (404): no live KV metrics"
                return
            response.raise_for_status()
            figures = parse_vllm_metrics(response.text[:4_000_000])
        except Exception as exc:  # metrics are advisory: the engine keeps its last known capacity
            engine.metrics_error = f"{type(exc).__name__}: {exc}"[:300]
            return
        engine.metrics_error = None
        # A concurrency-limited engine switches to counting tokens only while nothing of ours is in flight on it.
        if (
            engine.spec.capacity_tokens is None
            and "capacity_tokens" in figures
            and (engine.unit == "tokens" or engine.in_flight == 0)
        ):
            engine.capacity, engine.unit, engine.source = figures["capacity_tokens"], "tokens", "vllm_metrics"
        if engine.unit == "tokens" and "usage" in figures:
            engine.external_used = figures["usage"] * engine.capacity
        engine.waiting = int(figures.get("waiting", 0))
        cond = self._changed
        if cond is not None:
            async with cond:
                cond.notify_all()


def _context_text(request: Request) -> str:
    t = request.trajectory
    parts = [t.prompt or t.problem]
    for turn in t.turns:
        parts.append(turn.action)
        if turn.feedback:
            parts.append(turn.feedback)
    return "".join(parts)


def engine_stats_metrics(stats: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The engines' stats as flat trainer metrics: ``engines/{i}/requests``, ``.../failed``, ``.../busy_s``."""
    metrics: dict[str, float] = {}
    for i, entry in enumerate(stats):
        for key in ("requests", "failed", "busy_s", "marked_down"):
            metrics[f"engines/{i}/{key}"] = float(entry.get(key, 0))
    return metrics


def metrics_url_for(url: str) -> str:
    """Where a vLLM server behind the API root ``url`` serves its metrics: ``http://host:port/metrics``."""
    root = url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    return root + "/metrics"


def endpoint_policy(
    env: Any,
    endpoints: Sequence[Any],
    served_model: str,
    *,
    native_tools: bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
    **policy_options: Any,
) -> DispatchPolicy:
    """A dispatcher over one :class:`~rstar_env.rollout.openai.OpenAIPolicy` per endpoint, speaking to ``env``.

    ``endpoints``: :class:`~rstar_env.config.EndpointSpec` (or URL strings). With several endpoints each policy
    retries a failure once before the dispatcher fails over to another engine (a dead server costs one backoff, not
    five); with one, the policy's own retries are all there is. ``policy_options`` go to each ``OpenAIPolicy``;
    ``transport`` (an ``httpx`` transport, e.g. ``httpx.MockTransport``) carries every request, metrics included.
    """
    from rstar_env.config import EndpointSpec
    from rstar_env.rollout.openai import OpenAIPolicy

    specs = [e if isinstance(e, EndpointSpec) else EndpointSpec.model_validate(e) for e in endpoints]
    if not specs:
        raise ValueError(
            "no endpoint given: pass --endpoint URL (several times for several engines) or set "
            "inference.endpoints in the config"
        )
    if len(specs) > 1:
        policy_options.setdefault("max_retries", 1)
    engines = []
    for spec in specs:
        options = {"max_concurrency": spec.max_concurrency, **policy_options}
        policy = OpenAIPolicy.for_env(
            env, spec.url, served_model, native_tools=native_tools, transport=transport, **options
        )
        engines.append(
            EngineSpec(
                policy,
                spec.url,
                capacity_tokens=spec.capacity_tokens,
                max_concurrency=spec.max_concurrency,
                metrics_url=spec.metrics_url or metrics_url_for(spec.url),
            )
        )
    return DispatchPolicy(engines, transport=transport)
