"""Run OpenRLHF's rollout code on a CPU: stand-in modules for vLLM, flash-attn and Ray, and a CPU engine.

OpenRLHF's own tests exercise rollout code without a GPU by putting small stand-ins for ``vllm``, ``flash_attn``
and ``ray`` in ``sys.modules``; :func:`cpu_stub_modules` builds ours the same way (use them with
``monkeypatch.setitem(sys.modules, name, module)``). Only what the imported code paths touch is provided:

- ``vllm``: ``SamplingParams`` (a mutable record with vLLM's field names), ``inputs.TokensPrompt``,
  ``utils.random_uuid``, ``__version__``;
- ``flash_attn``: an empty module;
- ``ray``: ``remote`` (returns the class unchanged), ``get``/``wait``/``put`` acting on plain values (an "object
  ref" is the value itself), and the ``ray.util`` modules OpenRLHF imports names from.

:class:`CPUEngine` has the interface of OpenRLHF's ``RolloutRayActor.generate`` and generates with a local
transformers model (SmolLM2-135M in the tests), returning vLLM-shaped outputs with the sampled ids and log-probs.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from types import ModuleType, SimpleNamespace
from typing import Any


class StubSamplingParams:
    """vLLM's ``SamplingParams`` fields that OpenRLHF and our agent set, as a plain mutable object."""

    def __init__(
        self,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        max_tokens: int | None = 16,
        min_tokens: int = 0,
        stop: str | list[str] | None = None,
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        logprobs: int | None = None,
        **extra: Any,
    ) -> None:
        self.n = n
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.max_tokens = max_tokens
        self.min_tokens = min_tokens
        self.stop = [stop] if isinstance(stop, str) else list(stop or [])
        self.include_stop_str_in_output = include_stop_str_in_output
        self.skip_special_tokens = skip_special_tokens
        self.logprobs = logprobs
        self.extra = extra

    def __repr__(self) -> str:
        return f"StubSamplingParams({vars(self)})"


def _module(name: str, **attrs: Any) -> ModuleType:
    module = ModuleType(name)
    module.__dict__.update(attrs)
    return module


def cpu_stub_modules() -> dict[str, ModuleType]:
    """``{module name: stand-in}`` for vllm, flash_attn and ray (see the module docstring)."""
    vllm = _module("vllm", __version__="0.11.0", SamplingParams=StubSamplingParams)
    vllm_inputs = _module("vllm.inputs", TokensPrompt=dict)
    vllm_utils = _module("vllm.utils", random_uuid=lambda: uuid.uuid4().hex)
    vllm.inputs, vllm.utils = vllm_inputs, vllm_utils  # type: ignore[attr-defined]

    def remote(*args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]
        return lambda target: target

    def wait(refs: Sequence[Any], num_returns: int = 1, timeout: float | None = None) -> tuple[list, list]:
        refs = list(refs)
        return refs[:num_returns], refs[num_returns:]

    class _Queue:
        def __init__(self, maxsize: int = 0) -> None:
            self.items: list[Any] = []

        def put(self, item: Any, block: bool = True) -> None:
            self.items.append(item)

        def get(self, block: bool = True) -> Any:
            return self.items.pop(0)

    ray = _module(
        "ray", remote=remote, get=lambda ref: ref, put=lambda value: value, wait=wait, is_initialized=lambda: False
    )
    util = _module("ray.util", placement_group_table=lambda pg: {"bundles_to_node_id": {}})
    pg = _module(
        "ray.util.placement_group",
        placement_group=lambda *a, **k: SimpleNamespace(ready=lambda: None),
        PlacementGroup=object,
    )
    strategies = _module("ray.util.scheduling_strategies", PlacementGroupSchedulingStrategy=dict)
    queue = _module("ray.util.queue", Queue=_Queue)
    ray.util = util  # type: ignore[attr-defined]
    util.placement_group, util.scheduling_strategies, util.queue = pg, strategies, queue  # type: ignore[attr-defined]
    return {
        "vllm": vllm,
        "vllm.inputs": vllm_inputs,
        "vllm.utils": vllm_utils,
        "flash_attn": _module("flash_attn"),
        "ray": ray,
        "ray.util": util,
        "ray.util.placement_group": pg,
        "ray.util.scheduling_strategies": strategies,
        "ray.util.queue": queue,
    }


class CPUEngine:
    """``generate(prompt_token_ids, sampling_params, multi_modal_data=None)`` like OpenRLHF's vLLM engine actor,
    with a local transformers model on CPU.

    Honours ``max_tokens`` and stops at the end-of-turn token or after ``</tool_call>`` (our agent's stop strings).
    Generation runs in a worker thread, as vLLM runs outside the event loop. ``script(prompt_token_ids)`` may
    return a text to emit instead of sampling (to make a small model call a tool on cue); its log-probs are still
    the model's, scored by teacher forcing (when ``logprobs`` is requested). ``calls`` records each request's
    ``(prompt length, params)``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        temperature: float = 1.0,
        seed: int = 0,
        script: Callable[[list[int]], str | None] | None = None,
    ) -> None:
        from rstar_env.rollout.local import TransformersPolicy
        from rstar_env.rollout.policy import SamplingParams

        self.model = model
        self.tokenizer = tokenizer
        self.script = script
        self.policy = TransformersPolicy(
            model,
            tokenizer=tokenizer,
            sampling=SamplingParams(temperature=temperature, max_new_tokens=1 << 20, seed=seed),
        )
        self.calls: list[tuple[int, dict[str, Any]]] = []

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> Any:
        from rstar_env.rollout.policy import Request
        from rstar_env.trajectory import Trajectory

        self.calls.append((len(prompt_token_ids), dict(vars(sampling_params))))
        cap = int(sampling_params.max_tokens)
        forced = self.script(list(prompt_token_ids)) if self.script is not None else None
        if forced is not None:
            ids = list(self.tokenizer.encode(forced, add_special_tokens=False))[:cap]
            # Scoring costs a forward pass over the whole context: only when log-probs are asked for.
            wanted = sampling_params.logprobs is not None
            logprobs = await asyncio.to_thread(self._score, list(prompt_token_ids), ids) if wanted else []
            full = self.tokenizer.encode(forced, add_special_tokens=False)
            finish = "length" if len(full) > cap else "stop"
        else:
            request = Request(
                trajectory=Trajectory(problem="", answer=""), context_ids=list(prompt_token_ids), max_new_tokens=cap
            )
            (generation,) = await self.policy.generate([request])
            ids, logprobs = list(generation.token_ids or []), list(generation.logprobs or [])
            finish = "length" if generation.finish_reason == "length" else "stop"
        entries = None
        if sampling_params.logprobs is not None:
            entries = [{t: SimpleNamespace(logprob=lp)} for t, lp in zip(ids, logprobs, strict=True)]
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        output = SimpleNamespace(token_ids=ids, text=text, finish_reason=finish, logprobs=entries)
        return SimpleNamespace(prompt_token_ids=list(prompt_token_ids), outputs=[output])

    def _score(self, context: list[int], ids: list[int]) -> list[float]:
        import torch

        if not ids:
            return []
        with torch.no_grad():
            logits = self.model(input_ids=torch.tensor([context + ids])).logits[0].float()
        logp = torch.log_softmax(logits[len(context) - 1 : -1], -1)
        return [float(v) for v in logp.gather(-1, torch.tensor(ids)[:, None])[:, 0]]
