"""A local transformers model as a token-level policy.

The default model is SmolLM2-135M-Instruct; any local Hugging Face model directory or ``.gguf`` file works too
(:mod:`rstar_env.rollout.models` finds and loads them). No model hub is contacted.

Generation is a KV-cached sampling loop of our own rather than ``model.generate``: it stops each row at its own
end-of-turn token or ``</tool_call>``, and records exactly the ids it sampled with their log-probs under the
sampling distribution. Those ids, never a re-tokenization of the text, are what trainers learn on.

Each row draws its tokens from its own generator, seeded by the request's ``seed`` (see
:func:`rstar_env.rollout.collect.stream_seed`): one uniform number per token, turned into a token by the inverse
CDF of that row's distribution. The uniforms come from CPU generators, so they are the same on every device; which
rows share a batch changes only the floating-point noise of the logits, which flips a draw only when a uniform
falls within that noise of a CDF boundary (rare, and not excluded).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rstar_env import threads
from rstar_env.format import TOOL_CALL_CLOSE
from rstar_env.rollout.models import (  # noqa: F401  (loading lived here: its names stay importable from here)
    DEFAULT_MODEL,
    ModelNotFoundError,
    load_model,
    load_pretrained,
    require_torch,
    resolve_model,
    without_library_bars,
)
from rstar_env.rollout.policy import Generation, Request, SamplingParams, end_of_turn_ids


@dataclass
class _Row:
    context: list[int]
    cap: int
    ids: list[int]
    logprobs: list[float]
    generator: Any = None
    """This row's own sampling stream (a CPU ``torch.Generator``)."""
    finish: str | None = None


class TransformersPolicy:
    """A local causal LM generating the next assistant action for a batch of episodes.

    Args:
        model: ``"smollm2"`` (default), a model directory or ``.gguf`` file, or an already loaded model (then pass
            ``tokenizer`` too; the trainer does this to roll out with the weights it is training).
        sampling: temperature, top_p, per-turn token cap, seed.
        batch_size: rows generated together (sorted by context length to waste little padding).
        stop_on_tool_call: end a turn right after ``</tool_call>`` (the env then runs the call).
        batch_window_s: how long an idle model waits for more requests to join a batch that is not full.
        dtype: ``float32`` (default) or ``bfloat16`` / ``float16``: the compute precision of the forward passes
            (autocast; a model loaded here by name is loaded in it too). Sampling itself runs in float32 on the
            float32 logits.

    **Micro-batching.** ``generate`` puts its requests on a queue and waits for their results. One drain task per
    event loop takes up to ``batch_size`` queued requests into one forward batch, in arrival order; while the model
    runs, new requests queue, and the next batch starts the moment the last one ends (the model is never idle while
    requests wait). Only an idle model waits ``batch_window_s`` for requests that arrive together (the episodes of
    one collector step each call ``generate`` on their own). ``batches`` and ``rows_batched`` count what it did.
    """

    def __init__(
        self,
        model: Any = None,
        *,
        tokenizer: Any = None,
        sampling: SamplingParams | None = None,
        batch_size: int = 16,
        device: str = "cpu",
        stop_on_tool_call: bool = True,
        batch_window_s: float = 0.005,
        dtype: str = "float32",
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
        self.torch = require_torch()
        self.dtype = check_dtype(dtype, device)
        if model is None or isinstance(model, str | os.PathLike):
            self.model, self.tokenizer = load_model(model, device=device, dtype=dtype)
        else:
            if tokenizer is None:
                raise ValueError("pass the tokenizer with an already loaded model")
            self.model, self.tokenizer = model, tokenizer
        self.sampling = sampling or SamplingParams()
        self.batch_size = batch_size
        self.device = device
        self.stop_on_tool_call = stop_on_tool_call
        self.eos_ids = end_of_turn_ids(
            self.tokenizer, getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        )
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_ids[0]
        # Seeds the streams of requests that carry no seed of their own (a CPU generator, like the rows').
        self._generator = self.torch.Generator()
        self._generator.manual_seed(self.sampling.seed if self.sampling.seed is not None else 0)
        self._lock = threading.Lock()  # one batch at a time on the model
        self.tokens_generated = 0
        self.seconds_generating = 0.0
        self.batch_window_s = batch_window_s
        self.batches = 0
        self.rows_batched = 0
        self._queue: list[tuple[Request, asyncio.Future[Generation]]] = []
        self._drain_task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_generated / self.seconds_generating if self.seconds_generating else 0.0

    def rng_state(self) -> Any:
        """The state of the policy's own sampling stream (the seeds of requests that carry none), for a checkpoint."""
        return self._generator.get_state()

    def set_rng_state(self, state: Any) -> None:
        """Resume the policy's own sampling stream from :meth:`rng_state`."""
        self._generator.set_state(state)

    async def generate(self, requests: Sequence[Request]) -> list[Generation]:
        """Queue ``requests`` for the micro-batcher and wait for their generations (see the class doc)."""
        if not requests:
            return []
        for request in requests:  # a bad request fails its caller now, not a batch of other episodes later
            if request.context_ids is None:
                raise ValueError("TransformersPolicy needs context_ids: build the env with tokenizer=policy.tokenizer")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (the trainer runs one per step): nothing carries over
            self._loop, self._queue, self._drain_task = loop, [], None
        futures = [loop.create_future() for _ in requests]
        self._queue.extend(zip(requests, futures, strict=True))
        if self._drain_task is None or self._drain_task.done():
            self._drain_task = loop.create_task(self._drain())
        return list(await asyncio.gather(*futures))

    async def _drain(self) -> None:
        # Runs while requests wait; ends when the queue is empty (a later generate starts a new one).
        if len(self._queue) < self.batch_size and self.batch_window_s:
            await asyncio.sleep(self.batch_window_s)  # the model was idle: let requests sent together join
        while self._queue:
            batch, self._queue = self._queue[: self.batch_size], self._queue[self.batch_size :]
            live = [(r, f) for r, f in batch if not f.cancelled()]
            if not live:
                continue
            try:
                # The model runs in a worker thread so tool calls of other episodes go on meanwhile.
                generations = await asyncio.to_thread(self.generate_sync, [r for r, _ in live])
            except Exception as exc:  # each waiting caller gets the error
                for _, future in live:
                    if not future.done():
                        future.set_exception(exc)
                continue
            self.batches += 1
            self.rows_batched += len(live)
            for (_, future), generation in zip(live, generations, strict=True):
                if not future.done():
                    future.set_result(generation)

    def generate_sync(self, requests: Sequence[Request]) -> list[Generation]:
        rows = []
        for request in requests:
            if request.context_ids is None:
                raise ValueError("TransformersPolicy needs context_ids: build the env with tokenizer=policy.tokenizer")
            cap = min(self.sampling.max_new_tokens, request.max_new_tokens or self.sampling.max_new_tokens)
            seed = request.seed
            if seed is None:  # no stream of its own: one from the policy's, in request order
                seed = int(self.torch.randint(0, 2**62, (1,), generator=self._generator))
            generator = self.torch.Generator()
            generator.manual_seed(seed)
            rows.append(_Row(list(request.context_ids), max(cap, 1), [], [], generator))
        order = sorted(range(len(rows)), key=lambda i: len(rows[i].context))
        with self._lock:
            start = time.perf_counter()
            for lo in range(0, len(order), self.batch_size):
                self._sample([rows[i] for i in order[lo : lo + self.batch_size]])
            self.seconds_generating += time.perf_counter() - start
            self.tokens_generated += sum(len(r.ids) for r in rows)
        return [
            Generation(
                text=self.tokenizer.decode(r.ids, skip_special_tokens=False),
                token_ids=r.ids,
                logprobs=r.logprobs,
                finish_reason=r.finish or "length",  # type: ignore[arg-type]
            )
            for r in rows
        ]

    def _sample(self, rows: list[_Row]) -> None:
        torch = self.torch
        # GRPO rolls out each prompt many times: rows with the same context share one prefill, whose KV cache is
        # then copied to every row (prefill of long prompts is most of the cost on a CPU).
        unique: dict[tuple[int, ...], int] = {}
        for r in rows:
            unique.setdefault(tuple(r.context), len(unique))
        contexts = list(unique)
        temperature, top_p = self.sampling.temperature, self.sampling.top_p
        on_cpu = str(self.device).startswith("cpu")
        with torch.no_grad(), autocast(self.dtype, self.device):
            if on_cpu:
                threads.adapt()
            past, mask, positions, logits = self._prefill(contexts)
            expand = torch.tensor([unique[tuple(r.context)] for r in rows], device=self.device)
            if len(contexts) != len(rows):
                past.reorder_cache(expand)
            logits = logits[expand]
            mask, step_pos = mask[expand], positions[expand][:, -1:]
            live = list(rows)  # the rows still in the batch, in cache order
            for _ in range(max(r.cap for r in rows)):
                if temperature == 0:
                    chosen = logits.argmax(-1)
                    logprobs = torch.log_softmax(logits, -1).gather(-1, chosen[:, None])[:, 0]
                else:
                    logp = torch.log_softmax(logits / temperature, -1)
                    chosen = _sample_rows(logp, top_p, [r.generator for r in live])
                    logprobs = logp.gather(-1, chosen[:, None])[:, 0]
                for i, r in enumerate(live):
                    if r.finish is None:
                        self._append(r, int(chosen[i]), float(logprobs[i]))
                going = [i for i, r in enumerate(live) if r.finish is None]
                if not going:
                    break
                if len(going) <= len(live) * 3 // 4:
                    # Lengths are long-tailed: once a quarter of the batch has finished, drop the finished rows
                    # from the cache rather than keep computing them until the longest row ends.
                    keep = torch.tensor(going, device=self.device)
                    past.reorder_cache(keep)
                    mask, step_pos = mask[keep], step_pos[keep]
                    live = [live[i] for i in going]
                step_ids = torch.tensor(
                    [[r.ids[-1] if r.finish is None else self.pad_id] for r in live], device=self.device
                )
                step_pos = step_pos + 1
                mask = torch.cat([mask, torch.ones((len(live), 1), dtype=mask.dtype, device=self.device)], dim=1)
                if on_cpu:
                    threads.adapt()  # a neighbour may have come or gone: cheap between measurements
                out = self.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=step_pos,
                    use_cache=True,
                    **_cache_kwarg(self.model, past),
                )
                past = _cache_of(out)
                logits = out.logits[:, -1, :].float()

    def _prefill(self, contexts: list[tuple[int, ...]]) -> tuple[Any, Any, Any, Any]:
        """Run ``contexts`` through the model; returns the KV cache, the attention mask and position ids it was
        built with, and each context's next-token logits (float).

        Contexts that start alike (every episode's prompt opens with the same system prompt and tool schemas)
        share that prefix's prefill: it runs once, its cache is copied to every row, and only each row's rest is
        prefilled, laid out as ``[prefix | left padding | rest]`` so that every row's next token sits in the last
        column. Only the last position's logits are computed: the full ``[rows, width, vocab]`` would be most of
        the memory of a long batch (49k-token vocabulary).
        """
        torch = self.torch
        shared = _common_prefix_length(contexts) if len(contexts) > 1 else 0
        if shared < _MIN_SHARED_PREFIX:
            shared = 0
        rests = [c[shared:] for c in contexts]
        width = max(len(r) for r in rests)
        ids = torch.full((len(contexts), width), self.pad_id, dtype=torch.long)
        rest_mask = torch.zeros((len(contexts), width), dtype=torch.long)
        for i, rest in enumerate(rests):  # left padding: every row's next token sits in the last column
            ids[i, width - len(rest) :] = torch.tensor(rest)
            rest_mask[i, width - len(rest) :] = 1
        ids, rest_mask = ids.to(self.device), rest_mask.to(self.device)
        past = None
        mask = rest_mask
        if shared:
            head = torch.tensor([contexts[0][:shared]], dtype=torch.long, device=self.device)
            past = _cache_of(self.model(input_ids=head, use_cache=True, logits_to_keep=1))
            past.reorder_cache(torch.zeros(len(contexts), dtype=torch.long, device=self.device))
            mask = torch.cat([torch.ones((len(contexts), shared), dtype=torch.long, device=self.device), rest_mask], 1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]
        # In chunks of columns: attention over a padded batch materialises [rows, heads, queries, keys] scores,
        # which for 32 rows of 700 tokens would be the biggest allocation of a training step.
        for lo in range(0, width, _PREFILL_CHUNK):
            hi = min(lo + _PREFILL_CHUNK, width)
            out = self.model(
                input_ids=ids[:, lo:hi],
                attention_mask=mask[:, : shared + hi],
                position_ids=positions[:, lo:hi],
                use_cache=True,
                logits_to_keep=1,
                **_cache_kwarg(self.model, past),
            )
            past = _cache_of(out)
        return past, mask, positions, out.logits[:, -1, :].float()

    def _append(self, row: _Row, token: int, logprob: float) -> None:
        row.ids.append(token)
        row.logprobs.append(logprob)
        if token in self.eos_ids:
            row.finish = "stop"
        elif self.stop_on_tool_call and TOOL_CALL_CLOSE in self.tokenizer.decode(row.ids[-8:]):
            row.finish = "tool_call"
        elif len(row.ids) >= row.cap:
            row.finish = "length"

    async def aclose(self) -> None:
        return None


_PREFILL_CHUNK = 256
"""Columns prefilled per forward pass."""
_MIN_SHARED_PREFIX = 16
"""Shorter common prefixes are prefilled with the rest: a separate pass would cost more than it saves."""


def _cache_kwarg(model: Any, cache: Any) -> dict[str, Any]:
    """The KV cache as the model's forward takes it: ``cache=`` (transformers >= 5.2x), else ``past_key_values=``
    (the older name, which newer versions still take but deprecate)."""
    key = _CACHE_ARG.get(type(model))
    if key is None:
        import inspect

        params = inspect.signature(model.forward).parameters
        key = _CACHE_ARG[type(model)] = "cache" if "cache" in params else "past_key_values"
    return {key: cache}


def _cache_of(output: Any) -> Any:
    """The KV cache a forward returned, under its current name or the older one (read without a deprecation)."""
    fields = getattr(output, "__dataclass_fields__", {})
    return output.cache if "cache" in fields else output.past_key_values


_CACHE_ARG: dict[type, str] = {}


def _common_prefix_length(contexts: Sequence[Sequence[int]]) -> int:
    """Tokens every context starts with, leaving each at least one token of its own (its next-token logits)."""
    first, limit = contexts[0], min(len(c) for c in contexts) - 1
    n = 0
    while n < limit and all(c[n] == first[n] for c in contexts):
        n += 1
    return n


def _sample_rows(logp: Any, top_p: float, generators: Sequence[Any]) -> Any:
    """One token per row, row ``i`` drawn with ``generators[i]`` alone: a uniform number from the row's stream,
    mapped through the inverse CDF of the row's (top-p truncated) distribution, in vocabulary order."""
    import torch

    probs = logp.exp()
    if top_p < 1.0:
        sorted_probs, index = probs.sort(-1, descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < top_p  # always keeps the most likely token
        sorted_probs = sorted_probs * keep
        probs = torch.zeros_like(probs).scatter(-1, index, sorted_probs)
    # float64 CDF: a draw flips only when the uniform falls within rounding of a boundary.
    cdf = probs.double().cumsum(-1)
    uniforms = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in generators]).to(cdf.device)
    target = (uniforms * cdf[:, -1])[:, None]
    # right=True: the first token whose CDF exceeds the target, never a zero-probability one.
    chosen = torch.searchsorted(cdf, target, right=True)[:, 0]
    return chosen.clamp_(max=probs.shape[-1] - 1)


_DTYPES = ("float32", "bfloat16", "float16")


def check_dtype(dtype: str, device: str) -> str:
    """``dtype`` if this device computes in it; otherwise a clear error naming what to use instead."""
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    torch = require_torch()
    if dtype == "bfloat16" and device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r}: torch sees no CUDA GPU (torch {torch.__version__})")
        if not torch.cuda.is_bf16_supported():
            raise ValueError(f"{torch.cuda.get_device_name(device)} has no bfloat16: use dtype float16 or float32")
    if dtype == "float16" and device == "cpu":
        raise ValueError("float16 is for GPUs: on a CPU use float32 (or bfloat16 where the CPU has it)")
    return dtype


def autocast(dtype: str, device: str) -> Any:
    """The forward passes' precision: a no-op for float32, ``torch.autocast`` otherwise. Weights stay in the dtype
    they were loaded in (a trainer keeps float32 master weights: a 1e-6 update would vanish in bfloat16)."""

    torch = require_torch()
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=getattr(torch, dtype))
