"""Policy versions for OpenRLHF's async trainer and partial rollouts, without Ray or vLLM: the engine's version tag,
each generated token's version (also when a weight sync lands in the middle of a turn), the staleness of a batch,
and groups that span versions. ``test_async_e2e.py`` runs the same code in OpenRLHF's real async trainer."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from types import SimpleNamespace
from typing import Any

import pytest

if importlib.util.find_spec("openrlhf") is None:  # looked up, not imported: OpenRLHF costs every worker seconds
    pytest.skip("openrlhf is not installed (the openrlhf extra)", allow_module_level=True)
torch = pytest.importorskip("torch")

from rstar_trainers.openrlhf import policy_version as pv  # noqa: E402

from .test_agent import ANSWER, TOOL_CALL, make_script, run_config, sampling  # noqa: E402


@pytest.fixture(autouse=True)
def version_zero():
    pv.set_engine_version(None, 0)
    yield
    pv.set_engine_version(None, 0)


def test_version_runs_and_staleness():
    assert pv.version_runs([]) == []
    assert pv.version_runs([3, 3, 4, 4, 4, 3]) == [[3, 2], [4, 3], [3, 1]]
    stats = pv.staleness_stats([2.0, 1.0, 1.0, 0.0], [2.0, 2.0, 1.0, 0.0], current=2)
    assert stats == {
        "async/policy_version": 2.0,
        "async/staleness_min": 0.0,
        "async/staleness_mean": 1.0,
        "async/staleness_max": 2.0,
        "async/mixed_version_samples": 0.25,
    }
    assert pv.staleness_stats([], [], current=5) == {}


def test_a_sample_without_versions_names_the_agent():
    with pytest.raises(ValueError, match="agent_func_path"):
        pv.sample_versions([SimpleNamespace(info={"reward": torch.tensor([1.0])})])
    info = {pv.VERSION_MIN_KEY: torch.tensor([1.0]), pv.VERSION_MAX_KEY: torch.tensor([2.0])}
    assert pv.sample_versions([SimpleNamespace(info=info)]) == ([1.0], [2.0])


class Engine:
    """An engine actor handle: ``__ray_call__.remote(fn, *args)`` runs ``fn(actor, *args)`` (as Ray does)."""

    def __init__(self, lag: bool = False) -> None:
        self.lag = lag
        self.__ray_call__ = SimpleNamespace(remote=self._call)

    def _call(self, fn: Any, *args: Any) -> int:
        acked = fn(self, *args)
        return acked - 1 if self.lag else acked


def test_trainer_hooks_track_versions_tag_engines_and_log_staleness(monkeypatch):
    events: list[Any] = []

    class Trainer:  # BasePPOTrainer's surface the hooks wrap
        def __init__(self) -> None:
            self.vllm_engines = [Engine(), Engine()]

        def init_checkpoint_states(self) -> dict:
            return {"global_step": 4}

        def train_step(self, samples: Any, global_step: int) -> tuple[dict, int]:
            self.broadcast_to_vllm()  # OpenRLHF broadcasts inside train_step, after the update
            return {"loss": 0.5}, global_step + 1

        def broadcast_to_vllm(self) -> None:
            events.append(("broadcast", pv.engine_version()))

    pv.install_trainer_hooks(Trainer)
    pv.install_trainer_hooks(Trainer)  # idempotent: wrapped once
    monkeypatch.setattr(pv, "broadcast_and_tag", _fake_ray_broadcast(pv.broadcast_and_tag))
    trainer = Trainer()
    trainer.init_checkpoint_states()
    trainer.broadcast_to_vllm()  # the resume broadcast: the checkpoint's version
    assert events == [("broadcast", 0)] and pv.engine_version() == 4

    def sample(low: float, high: float) -> Any:
        return SimpleNamespace(info={pv.VERSION_MIN_KEY: torch.tensor([low]), pv.VERSION_MAX_KEY: torch.tensor([high])})

    status, step = trainer.train_step([sample(4, 4), sample(3, 4)], 4)
    assert step == 5 and pv.engine_version() == 5  # the update's weights: version 5
    assert status["loss"] == 0.5 and status["async/staleness_max"] == 1.0 and status["async/staleness_min"] == 0.0
    assert status["async/mixed_version_samples"] == 0.5 and status["async/policy_version"] == 4.0

    trainer.vllm_engines = [Engine(), Engine(lag=True)]
    with pytest.raises(RuntimeError, match="acknowledged policy versions"):
        trainer.broadcast_to_vllm()


def _fake_ray_broadcast(real: Any) -> Any:
    # The hook calls broadcast_and_tag with ray.get; the fake engines return plain values.
    return lambda trainer, broadcast, get=None: real(trainer, broadcast, get=lambda refs: list(refs))


def experience(prompt: str, low: float, high: float) -> Any:
    info = {pv.VERSION_MIN_KEY: torch.tensor([low]), pv.VERSION_MAX_KEY: torch.tensor([high])}
    return SimpleNamespace(prompts=[prompt], info=info)


def test_groups_spanning_versions_are_kept_or_dropped_as_configured():
    from rstar_env_testkit.openrlhf_stubs import cpu_stub_modules

    with pytest.MonkeyPatch.context() as mp:
        for name, module in cpu_stub_modules().items():
            mp.setitem(sys.modules, name, module)
        from rstar_trainers.openrlhf.samples_generator import whole_version_groups

    batch = [experience("a", 0, 0), experience("a", 0, 0), experience("b", 0, 0), experience("b", 0, 1)]
    kept, stats = whole_version_groups(batch, group=2, allow_mixed=False, partial=True)
    assert kept == batch[:2] and (stats.groups, stats.mixed, stats.dropped) == (2, 1, 1)
    kept, stats = whole_version_groups(batch, group=2, allow_mixed=True, partial=True)
    assert kept == batch and (stats.mixed, stats.dropped) == (1, 0)
    # Two samples of one version each, but different versions: the group is split across versions too.
    split = [experience("c", 1, 1), experience("c", 2, 2)]
    assert whole_version_groups(split, group=2, allow_mixed=False, partial=True)[1].dropped == 1
    # Without partial rollouts, OpenRLHF's lock keeps a batch on one version: a split group is a broken contract.
    with pytest.raises(RuntimeError, match="lock did not hold"):
        whole_version_groups(split, group=2, allow_mixed=True, partial=False)


class StreamingEngine:
    """OpenRLHF's engine actor as the agent sees it, with ``llm`` a vLLM ``AsyncLLM`` stand-in that streams
    cumulative outputs token by token (the CPU engine's tokens), and a weight sync after ``sync_after`` tokens of
    the ``sync_turn``-th request: the engine's version moves from 0 to 1 mid-turn."""

    def __init__(self, cpu_engine: Any, *, sync_turn: int, sync_after: int) -> None:
        self.cpu = cpu_engine
        self.sync_turn, self.sync_after = sync_turn, sync_after
        self.requests = 0
        self.llm = SimpleNamespace(generate=self._stream)

    async def _stream(self, prompt: Any, params: Any, request_id: str):
        self.requests += 1
        whole = await self.cpu.generate(prompt["prompt_token_ids"], params)
        out = whole.outputs[0]
        for n in range(1, len(out.token_ids) + 1):
            if self.requests == self.sync_turn and n == self.sync_after + 1:
                pv.set_engine_version(None, 1)  # paused, synced, resumed: the rest is the new weights'
            partial = SimpleNamespace(
                token_ids=out.token_ids[:n], text=out.text, finish_reason=out.finish_reason, logprobs=out.logprobs[:n]
            )
            yield SimpleNamespace(prompt_token_ids=whole.prompt_token_ids, outputs=[partial])
            await asyncio.sleep(0)


@pytest.mark.parametrize(("sync_turn", "sync_after"), [(1, 5), (2, 0)], ids=["mid-turn", "between-turns"])
def test_each_token_carries_the_version_that_generated_it(tiny_llama, echo_plugins, monkeypatch, sync_turn, sync_after):
    from rstar_env_testkit import openrlhf_stubs as testing
    from rstar_env_testkit.openrlhf_stubs import cpu_stub_modules
    from rstar_trainers.openrlhf import agent_func

    for name in ("vllm", "vllm.inputs", "vllm.utils"):  # TokensPrompt and random_uuid, as the stand-ins give them
        monkeypatch.setitem(sys.modules, name, cpu_stub_modules()[name])
    model, tokenizer = tiny_llama
    cpu = testing.CPUEngine(model, tokenizer, script=make_script(tokenizer, {1: TOOL_CALL, 2: ANSWER}))
    engine = StreamingEngine(cpu, sync_turn=sync_turn, sync_after=sync_after)
    executor = agent_func.AgentExecutor(run_config=run_config(max_new_tokens_per_turn=200, max_response_tokens=1024))
    result = asyncio.run(
        executor.execute("What is 6 * 7?", "42", sampling(testing, logprobs=1), 2048, tokenizer, engine)
    )

    (s1, e1), (s2, e2) = result["action_ranges"]
    first, second = result[pv.TOKEN_VERSIONS_KEY]
    if sync_turn == 1:  # the tool-call turn was paused after 5 tokens and finished on the new weights
        assert first == [[0, 5], [1, e1 - s1 - 5]] and second == [[1, e2 - s2]]
    else:
        assert first == [[0, e1 - s1]] and second == [[1, e2 - s2]]
    logs = result["extra_logs"]
    assert (logs[pv.VERSION_MIN_KEY], logs[pv.VERSION_MAX_KEY]) == (0.0, 1.0)
    # The episode went on from where it stopped: the tool call, its output and the answer, masks intact.
    obs = result["observation_tokens"]
    assert tokenizer.decode(obs[s1:e1]) == TOOL_CALL and tokenizer.decode(obs[s2:e2]) == ANSWER
    assert "forty-two" in tokenizer.decode(obs[e1:s2]) and result["reward"] == 1.0
    assert len(result["rollout_log_probs"]) == len(obs)


def test_hooks_reach_a_trainer_whose_class_was_not_patched(monkeypatch):
    """The sync trainer's Ray actor can hold OpenRLHF's unpatched class: the RoC generator it builds finds it up the
    stack and wraps the instance's methods instead."""
    monkeypatch.setattr(pv, "broadcast_and_tag", _fake_ray_broadcast(pv.broadcast_and_tag))
    found = []

    class Generator:
        def __init__(self) -> None:
            found.append(pv.calling_trainer())

    class Trainer:
        def __init__(self) -> None:
            self.vllm_engines = [Engine()]
            self.generator = Generator()

        def init_checkpoint_states(self) -> dict:
            return {"global_step": 0}

        def train_step(self, samples: Any, global_step: int) -> tuple[dict, int]:
            self.broadcast_to_vllm()
            return {}, global_step + 1

        def broadcast_to_vllm(self) -> None:
            pass

    trainer = Trainer()
    assert found == [trainer]
    assert pv.install_on_trainer(trainer) and not pv.install_on_trainer(trainer)  # once
    trainer.init_checkpoint_states()
    info = {pv.VERSION_MIN_KEY: torch.tensor([0.0]), pv.VERSION_MAX_KEY: torch.tensor([0.0])}
    status, _ = trainer.train_step([SimpleNamespace(info=info)], 0)
    assert status["async/staleness_max"] == 0.0 and pv.engine_version() == 1
    assert not hasattr(Trainer, "_rstar_versioned")  # the class itself untouched
