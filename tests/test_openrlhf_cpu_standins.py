"""The CPU stand-ins of the OpenRLHF end-to-end test, in isolation (fast): gloo weight broadcast, the CUDA factory
shim, the rollout script, and that installing them leaves the process's real modules alone when present."""

from __future__ import annotations

import socket
import threading
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from rstar_env_testkit import cpu_standins  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_gloo_communicator_broadcasts_bfloat16_in_place():
    port = free_port()
    sent = torch.randn(3, 5).to(torch.bfloat16)
    received = torch.zeros(3, 5, dtype=torch.bfloat16)
    errors = []

    def rank(r: int, tensor):
        try:
            group = cpu_standins.StatelessProcessGroup.create("127.0.0.1", port, r, 2)
            cpu_standins.GlooCommunicator(group).broadcast(tensor, src=0, stream=None)
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


def test_worker_run_allocates_cuda_factories_on_the_cpu_and_loads_weights():
    model = torch.nn.Linear(2, 2)
    worker = cpu_standins.CPUWorker(model, torch.bfloat16)
    worker.run("load_weights", ([("bias", torch.full((2,), 3.0, dtype=torch.bfloat16))],), {})
    assert model.bias.tolist() == [3.0, 3.0]
    with cpu_standins._CudaToCpu():
        weight = torch.empty((2, 2), dtype=torch.bfloat16, device="cuda")
    assert weight.device.type == "cpu"
    worker.load_weights([("weight", torch.ones(2, 2, dtype=torch.bfloat16))])
    assert torch.equal(model.weight.detach(), torch.ones(2, 2)) and worker.received == 2
    with pytest.raises(KeyError, match="no parameter 'nope'"):
        worker.load_weights([("nope", torch.ones(1))])


def test_script_makes_every_group_of_four_mixed():
    engine = object.__new__(cpu_standins.CPUAsyncLLMEngine)
    engine.tokenizer = SimpleNamespace(decode=lambda ids: "".join(ids))
    engine.answers = {"What is 3 + 4?": "7"}
    engine._first_turns = {}
    first = ["<|im_start|>user\nWhat is 3 + 4?<|im_start|>assistant\n"]
    texts = [engine.script(first) for _ in range(4)]
    assert texts[0].startswith("<tool_call>") and '"code": "print(7)"' in texts[0]
    assert texts[1] == "<answer>\\boxed{71}</answer><|im_end|>"
    assert texts[2:] == [None, None]  # sampled
    second = [first[0] + texts[0] + "<|im_start|>user\n<tool_response>7</tool_response><|im_start|>assistant\n"]
    assert engine.script(second) == "It printed 7.\n<answer>\\boxed{7}</answer><|im_end|>"
    assert engine.script(["<|im_start|>user\nsomething else<|im_start|>assistant\n"]) is None


def test_stand_in_modules_have_specs_and_submodules():
    modules = cpu_standins.stand_in_modules()
    assert modules["vllm"].distributed.utils.StatelessProcessGroup is cpu_standins.StatelessProcessGroup
    assert modules["vllm.distributed.device_communicators.pynccl"].PyNcclCommunicator is cpu_standins.GlooCommunicator
    assert all(m.__spec__ is not None for m in modules.values())  # transformers' find_spec probes need one
    with pytest.raises(RuntimeError, match="needs flash-attn"):
        modules["flash_attn.bert_padding"].pad_input()
