"""Test support: OpenRLHF's real ``train_ppo_ray`` on a machine without a GPU (the CPU end-to-end test).

Everything OpenRLHF does runs for real (its driver, Ray actors and placement groups, samples generator, experience
maker, DeepSpeed ZeRO-2 actor on DeepSpeed's ``cpu`` accelerator over gloo, weight broadcast to the engines,
checkpoints, resume) except what needs hardware or packages this machine cannot have. Those, and only those, are
replaced here. :func:`install` puts the replacements in place in one process; :func:`write_site_dir` writes a
``sitecustomize.py`` that calls it, so that putting that directory on ``PYTHONPATH`` (in the job's runtime env)
installs them in the driver and in every Ray worker before any OpenRLHF code is imported.

Replaced (the complete list):

* ``vllm`` (not installable without CUDA): a stand-in package with the subset of vLLM's API that OpenRLHF's engine
  actor (``openrlhf.trainer.ray.vllm_engine.RolloutRayActor``), samples generator and weight sync use:

  - ``vllm.__version__``, ``vllm.SamplingParams`` (:class:`~rstar_env_testkit.openrlhf_stubs.StubSamplingParams`),
    ``vllm.inputs.TokensPrompt``, ``vllm.utils.random_uuid``;
  - ``vllm.AsyncEngineArgs`` and ``vllm.AsyncLLMEngine.from_engine_args``: :class:`CPUAsyncLLMEngine`, generating
    with our transformers policy (:class:`~rstar_env_testkit.openrlhf_stubs.CPUEngine`) on the model directory
    OpenRLHF names. Its ``generate``, ``collective_rpc``, ``reset_prefix_cache``, ``sleep``, ``wake_up``,
    ``is_sleeping``, ``pause_generation``, ``resume_generation`` and ``output_processor
    .get_num_unfinished_requests`` are vLLM's methods that ``RolloutRayActor`` calls. ``collective_rpc`` runs the
    named method of OpenRLHF's own worker extension (``openrlhf.trainer.ray.vllm_worker_wrap.WorkerWrap``, from
    the engine args' ``worker_extension_cls``) on a :class:`CPUWorker`, which stands in for vLLM's GPU worker
    (``device``, ``model_config.dtype``, ``model_runner.model.load_weights``, and the one-process default
    torch.distributed group a vLLM worker has);
  - ``vllm.distributed.utils.StatelessProcessGroup.create`` and
    ``vllm.distributed.device_communicators.pynccl.PyNcclCommunicator`` (NCCL): :class:`GlooCommunicator`, a real
    gloo process group over a TCP store, so the weight broadcast really moves the tensors between processes.

* ``flash_attn`` (CUDA only): empty ``flash_attn``, ``flash_attn.bert_padding`` and
  ``flash_attn.utils.distributed`` modules whose functions raise if called (only sample packing, which the CPU
  config turns off, calls them).

* bfloat16 (emulated, about 9x slower than float32, on a CPU without bf16 units): the actor trains in float32.
  ``openrlhf.utils.utils.convert_to_torch_dtype`` returns ``torch.float32`` (the model loads in it), the DeepSpeed
  configs from ``openrlhf.utils.deepspeed.deepspeed.get_train_ds_config`` / ``get_eval_ds_config`` have ``bf16``
  and ``fp16`` off, and the engine's worker takes float32 weights (OpenRLHF asks vLLM for bfloat16).

* CUDA calls OpenRLHF makes unconditionally: ``torch.cuda.set_device`` and ``torch.cuda.synchronize`` do nothing,
  ``torch.cuda.current_device`` returns the CPU device, ``torch.cuda.current_stream`` returns ``None``;
  ``openrlhf.utils.deepspeed.deepspeed.init_device_mesh`` builds the mesh on ``"cpu"`` where OpenRLHF asks for
  ``"cuda"``; ``openrlhf.trainer.ppo_utils.replay_buffer.NaiveReplayBuffer.__init__`` is followed by setting its
  ``target_device`` (OpenRLHF builds ``cuda:{current_device()}``) to the CPU; inside :meth:`CPUWorker.run` (only
  there), tensor factories asked for ``device="cuda"`` (as
  ``WorkerWrap.update_weight`` does) allocate on the CPU.

Observed, not replaced: ``RemoteExperienceMaker.compute_advantages_and_returns`` (where ``group_norm`` runs) is
wrapped to record, before calling the real method, which prompt each reward belongs to, in OpenRLHF's order.

Scripted rollouts: with ``$RSTAR_CPU_E2E_SCRIPT`` set, of every four rollouts per problem one is a scripted tool
call and correct answer and one a scripted wrong answer (:meth:`CPUAsyncLLMEngine.script`), so every group has a
learning signal; the other two are sampled from the model.

Evidence for the test goes to JSONL files in ``$RSTAR_CPU_E2E_EVIDENCE`` (when set): ``engine.jsonl`` (engine
start, every weight received with a checksum, generation counts) and ``group_norm.jsonl`` (the reward rows
``group_norm`` normalises).
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.machinery
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

EVIDENCE_ENV = "RSTAR_CPU_E2E_EVIDENCE"
SCRIPT_ENV = "RSTAR_CPU_E2E_SCRIPT"
"""A prompts JSONL (``problem``/``answer`` rows): one rollout in four per problem is then scripted (see
:meth:`CPUAsyncLLMEngine.script`)."""
SCRIPT_EVERY = 4
VLLM_VERSION = "0.11.0"
"""What the stand-in reports: above OpenRLHF's minimum (0.8.5)."""

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


# -- weight sync over gloo -----------------------------------------------------------------------------------------
class StatelessProcessGroup:
    """``vllm.distributed.utils.StatelessProcessGroup``: rendezvous data for a group outside torch's default one."""

    def __init__(self, host: str, port: int, rank: int, world_size: int) -> None:
        self.host, self.port, self.rank, self.world_size = host, port, rank, world_size

    @classmethod
    def create(cls, host: str, port: int, rank: int, world_size: int, **_: Any) -> StatelessProcessGroup:
        return cls(host, port, rank, world_size)


class GlooCommunicator:
    """``PyNcclCommunicator(pg, device)`` over gloo: ``broadcast(tensor, src, stream=None)`` in place."""

    def __init__(self, group: StatelessProcessGroup, device: Any = None) -> None:
        import datetime

        import torch.distributed as dist

        store = dist.TCPStore(
            group.host, group.port, group.world_size, is_master=group.rank == 0, timeout=datetime.timedelta(seconds=120)
        )
        self.rank = group.rank
        self.world_size = group.world_size
        self._pg = dist.ProcessGroupGloo(store, group.rank, group.world_size)

    def broadcast(self, tensor: Any, src: int, stream: Any = None) -> None:
        import torch
        import torch.distributed as dist

        if not tensor.is_contiguous():
            raise ValueError("broadcast needs a contiguous tensor (it is received in place)")
        options = dist.BroadcastOptions()
        options.rootRank = src
        # A broadcast moves bytes: as uint8, every dtype (bfloat16 included) goes through gloo unchanged.
        self._pg.broadcast([tensor.reshape(-1).view(torch.uint8)], options).wait()


# -- the engine ----------------------------------------------------------------------------------------------------
class _CudaToCpu:
    """A TorchFunctionMode that turns ``device="cuda"`` of tensor factories into the CPU (see :meth:`CPUWorker.run`)."""

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


class CPUWorker:
    """What OpenRLHF's ``WorkerWrap`` methods find on ``self`` inside a vLLM worker, for a CPU model."""

    def __init__(self, model: Any, dtype: Any) -> None:
        import torch

        self.device = torch.device("cpu")
        self.model_config = SimpleNamespace(dtype=dtype)
        self.model_runner = SimpleNamespace(model=SimpleNamespace(load_weights=self.load_weights))
        self._model = model
        self._params = dict(model.named_parameters())
        self.received = 0

    def load_weights(self, weights: list[tuple[str, Any]]) -> None:
        import torch

        for name, tensor in weights:
            if name not in self._params:
                raise KeyError(f"the engine's model has no parameter {name!r}")
            with torch.no_grad():
                self._params[name].copy_(tensor.to(self._params[name].dtype))
            self.received += 1
            record("engine", event="weight", name=name, checksum=checksum(self._params[name]))

    def run(self, method: str, args: tuple, kwargs: dict) -> Any:
        with _CudaToCpu():
            return getattr(self, method)(*args, **kwargs)


def _default_group() -> None:
    """The one-process default group every vLLM worker has (``WorkerWrap.init_process_group`` asserts it)."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


class AsyncEngineArgs:
    """``vllm.AsyncEngineArgs``: the keyword arguments OpenRLHF passes, kept as attributes."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if args:
            raise TypeError("the stand-in takes keyword engine arguments only, as OpenRLHF passes them")
        self.__dict__.update(kwargs)


class CPUAsyncLLMEngine:
    """``vllm.AsyncLLMEngine`` for :class:`RolloutRayActor`, generating with our transformers policy on CPU."""

    def __init__(self, engine_args: AsyncEngineArgs) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from rstar_env_testkit.openrlhf_stubs import CPUEngine

        path = engine_args.model
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.answers: dict[str, str] = {}
        if os.environ.get(SCRIPT_ENV):
            rows = Path(os.environ[SCRIPT_ENV]).read_text(encoding="utf-8").splitlines()
            self.answers = {row["problem"]: str(row["answer"]) for row in map(json.loads, filter(None, rows))}
        self._first_turns: dict[str, int] = {}
        self.engine = CPUEngine(
            self.model,
            self.tokenizer,
            seed=int(getattr(engine_args, "seed", 0)),
            script=self.script if self.answers else None,
        )
        module, _, name = engine_args.worker_extension_cls.rpartition(".")
        extension = getattr(importlib.import_module(module), name)
        # OpenRLHF asks for bfloat16; the actor trains in float32 here (see _float32_config), and the weights it
        # broadcasts must match the worker's dtype.
        dtype = torch.float32
        self.worker = type("CPUWorkerWithExtension", (extension, CPUWorker), {})(self.model, dtype)
        self.sleeping = False
        self.unfinished = 0
        self.output_processor = SimpleNamespace(get_num_unfinished_requests=lambda: self.unfinished)
        _default_group()
        record(
            "engine",
            event="start",
            model=str(path),
            initial={n: checksum(p) for n, p in list(self.model.named_parameters())[:4]},
        )

    def script(self, prompt_token_ids: list[int]) -> str | None:
        """The scripted text for this request, or ``None`` to sample from the model.

        SmolLM2-135M almost never solves a problem, so a group of sampled rollouts has no positive and RoC drops
        it: nothing would train. With ``$RSTAR_CPU_E2E_SCRIPT`` set, the first of every four first-turn requests
        for a problem is scripted: a python tool call printing the gold answer, then (second turn) the answer; the
        second is a wrong answer (the gold one with a digit appended); the other two are sampled.
        Its log-probs are still the model's (scored by teacher forcing); the env runs the tool and the reward as
        for any rollout.
        """
        context = self.tokenizer.decode(prompt_token_ids)
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

    @classmethod
    def from_engine_args(cls, engine_args: AsyncEngineArgs) -> CPUAsyncLLMEngine:
        return cls(engine_args)

    async def is_sleeping(self) -> bool:
        return self.sleeping

    async def sleep(self, level: int = 1) -> None:
        self.sleeping = True

    async def wake_up(self, tags: list[str] | None = None) -> None:
        self.sleeping = False

    async def reset_prefix_cache(self) -> None:
        return None

    async def pause_generation(self, mode: str = "keep") -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def collective_rpc(self, method: str, args: tuple = (), kwargs: dict | None = None) -> list[Any]:
        # A blocking collective (the broadcast's receive) runs in a thread: the actor's event loop stays free.
        return [await asyncio.to_thread(self.worker.run, method, tuple(args), dict(kwargs or {}))]

    async def generate(self, prompt: dict[str, Any], sampling_params: Any, request_id: str) -> AsyncIterator[Any]:
        if self.sleeping:
            raise RuntimeError("generate() on a sleeping engine: OpenRLHF must wake it up first")
        self.unfinished += 1
        try:
            output = await self.engine.generate(list(prompt["prompt_token_ids"]), sampling_params)
        finally:
            self.unfinished -= 1
        record(
            "engine",
            event="generate",
            prompt_tokens=len(prompt["prompt_token_ids"]),
            tokens=len(output.outputs[0].token_ids),
        )
        yield output


# -- module stand-ins ----------------------------------------------------------------------------------------------
def _module(name: str, **attrs: Any) -> ModuleType:
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
    """``{name: module}`` for the ``vllm`` and ``flash_attn`` stand-ins listed in the module docstring."""
    from rstar_env_testkit.openrlhf_stubs import StubSamplingParams

    modules = {
        "vllm": _module(
            "vllm",
            __version__=VLLM_VERSION,
            SamplingParams=StubSamplingParams,
            AsyncEngineArgs=AsyncEngineArgs,
            AsyncLLMEngine=CPUAsyncLLMEngine,
        ),
        "vllm.inputs": _module("vllm.inputs", TokensPrompt=dict),
        "vllm.utils": _module("vllm.utils", random_uuid=lambda: uuid.uuid4().hex),
        "vllm.distributed": _module("vllm.distributed"),
        "vllm.distributed.utils": _module("vllm.distributed.utils", StatelessProcessGroup=StatelessProcessGroup),
        "vllm.distributed.device_communicators": _module("vllm.distributed.device_communicators"),
        "vllm.distributed.device_communicators.pynccl": _module(
            "vllm.distributed.device_communicators.pynccl", PyNcclCommunicator=GlooCommunicator
        ),
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


def _patch_openrlhf(module: ModuleType) -> None:
    if module.__name__ == "openrlhf.utils.deepspeed.deepspeed":
        real = module.init_device_mesh

        def init_device_mesh(device_type: str, *args: Any, **kwargs: Any) -> Any:
            return real("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

        module.init_device_mesh = init_device_mesh
        # float32 training: a CPU without bfloat16 units emulates bf16 matmuls about 9x slower than float32 (one
        # DeepSpeed micro-step took ~95 s instead of ~10 s), and OpenRLHF offers only bf16 and fp16.
        module.get_train_ds_config = _float32_config(module.get_train_ds_config)
        module.get_eval_ds_config = _float32_config(module.get_eval_ds_config)
    elif module.__name__ == "openrlhf.utils.utils":
        import torch

        module.convert_to_torch_dtype = lambda param_dtype: torch.float32  # the model loads in float32 too
    elif module.__name__ == "openrlhf.trainer.ppo_utils.replay_buffer":
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
    elif module.__name__ == "openrlhf.trainer.ppo_utils.experience_maker":
        cls = module.RemoteExperienceMaker
        real = cls.compute_advantages_and_returns

        def compute_advantages_and_returns(self: Any, experiences: list[Any]) -> Any:
            rows: dict[int, tuple[str, float]] = {}
            for experience in experiences:
                for i, prompt, reward in zip(
                    experience.index, experience.prompts, experience.rewards.tolist(), strict=True
                ):
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


OPENRLHF_TARGETS = (
    "openrlhf.utils.utils",
    "openrlhf.utils.deepspeed.deepspeed",
    "openrlhf.trainer.ppo_utils.replay_buffer",
    "openrlhf.trainer.ppo_utils.experience_maker",
)


def install() -> None:
    """Install every replacement listed in the module docstring in this process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    from rstar_trainers.openrlhf.patch import PatchFinder

    _cuda_shims()
    for name, module in stand_in_modules().items():
        sys.modules.setdefault(name, module)
    for name in OPENRLHF_TARGETS:
        if name in sys.modules:
            _patch_openrlhf(sys.modules[name])
    sys.meta_path.insert(0, PatchFinder(OPENRLHF_TARGETS, _patch_openrlhf))


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
