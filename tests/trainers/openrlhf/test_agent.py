"""Our AgentExecutor driven by OpenRLHF's real MultiTurnAgentExecutor.execute, with the real SmolLM2 on CPU.

The engine is :class:`rstar_env_testkit.openrlhf_stubs.CPUEngine` (OpenRLHF's engine interface, a local model).
Turns can be scripted so the small model calls a tool on cue; scripted tokens are still scored by the model.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from typing import Any, ClassVar

import pytest

from rstar_env.config import load_config
from rstar_env.plugins import register, unregister
from rstar_env.tool import EpisodeContext, function_schema
from rstar_env.trajectory import ToolResult

# Looked up, not imported: importing OpenRLHF (torch, transformers, ...) at collection cost every pytest-xdist
# worker seconds, for tests that run in one of them.
for _package in ("openrlhf", "torch"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"{_package} is not installed (the openrlhf extra)", allow_module_level=True)

TOOL_CALL = '<tool_call>\n{"name": "echo", "arguments": {"text": "forty-two"}}\n</tool_call>'
SLOW_CALL = '<tool_call>\n{"name": "slow", "arguments": {"text": "zzz"}}\n</tool_call>'
ANSWER = "The tool agrees.<answer>\\boxed{42}</answer><|im_end|>"


class SlowTool:
    """Blocks its thread (time.sleep inside an async call): a badly written plugin."""

    name: ClassVar[str] = "slow"
    schema = function_schema("slow", "Sleep, then echo.", {"text": {"type": "string"}}, ["text"])
    seconds: ClassVar[float] = 1.0
    sleeping: ClassVar[int] = 0  # calls inside their sleep now

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        type(self).sleeping += 1
        try:
            time.sleep(self.seconds)
        finally:
            type(self).sleeping -= 1
        return ToolResult(arguments["text"])

    async def close(self, episode: EpisodeContext) -> None:
        return None


@pytest.fixture
def plugins(echo_plugins):
    register(SlowTool)
    yield
    unregister(SlowTool)


@pytest.fixture
def agent():
    from rstar_env_testkit import openrlhf_stubs
    from rstar_trainers.openrlhf import agent_func

    return agent_func, openrlhf_stubs


def run_config(tools=("echo",), **trainer: Any):
    return load_config(
        {
            # A short system prompt: every CPU prefill of the prompt costs seconds.
            "env": {"max_turns": 3, "system_prompt": "Solve it. Answer in <answer>\\boxed{}</answer>."},
            "tools": list(tools),
            "reward": "exact_test",
            "trainer": {"backend": "openrlhf", "max_prompt_tokens": 1024, "max_response_tokens": 256, **trainer},
        }
    )


def turn_index(tokenizer, ids: list[int]) -> int:
    """Which assistant turn the engine is asked for (1 = first), read from the context."""
    return tokenizer.decode(ids).count("<|im_start|>assistant")


def make_script(tokenizer, turns: dict[int, str]):
    return lambda ids: turns.get(turn_index(tokenizer, ids))


def sampling(testing, logprobs=None):
    # What OpenRLHF's SamplesGenerator builds; logprobs=1 is what it asks for with off-policy correction on.
    return testing.StubSamplingParams(
        temperature=1.0, top_p=1.0, max_tokens=None, min_tokens=1, skip_special_tokens=False, logprobs=logprobs
    )


def experience_of(result):
    """The Experience OpenRLHF's own SamplesGenerator builds from an executor result (its real code)."""
    import importlib

    from rstar_env_testkit.openrlhf_stubs import cpu_stub_modules

    saved = {name: sys.modules.get(name) for name in cpu_stub_modules()}
    dropped = {n: m for n, m in sys.modules.items() if n.startswith("openrlhf.trainer")}
    try:
        for name in dropped:
            del sys.modules[name]
        sys.modules.update(cpu_stub_modules())
        sg = importlib.import_module("openrlhf.trainer.ppo_utils.samples_generator")
        generator = object.__new__(sg.SamplesGenerator)  # the method reads no state
        return generator._process_response_into_experience(result, max_len=10_000)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        for name in [n for n in sys.modules if n.startswith("openrlhf.trainer")]:
            del sys.modules[name]
        sys.modules.update(dropped)


def test_tool_turn_is_masked_and_rewards_and_logs_arrive(smollm2, plugins, agent):
    agent_func, testing = agent
    model, tokenizer = smollm2
    trajectories = []

    class Recording(agent_func.AgentExecutor):
        async def execute(self, *args, **kwargs):
            result = await super().execute(*args, **kwargs)
            trajectories.append(agent_func._EPISODE.get())  # None: the episode context does not leak
            return result

    executor = Recording(run_config=run_config(max_new_tokens_per_turn=48))
    engine = testing.CPUEngine(model, tokenizer, script=make_script(tokenizer, {1: TOOL_CALL, 2: ANSWER}))
    captured = []
    original = agent_func.AgentInstance.aclose

    async def capture(self):
        captured.append(self.trajectory)
        await original(self)

    agent_func.AgentInstance.aclose = capture
    try:
        result = asyncio.run(
            executor.execute("What is 6 * 7?", "42", sampling(testing, logprobs=1), 2048, tokenizer, engine)
        )
    finally:
        agent_func.AgentInstance.aclose = original

    assert trajectories == [None]
    assert result["reward"] == 1.0 and float(result["scores"]) == 1.0
    logs = result["extra_logs"]
    assert logs["num_tool_calls"] == 1 and logs["num_tool_errors"] == 0, captured[0].tool_calls
    assert logs["num_assistant_turns"] == 2 and logs["num_answer_blocks"] == 1
    assert logs["end_answer"] == 1 and logs["end_length"] == 0 and logs["tool_errors_bad_call"] == 0

    obs = result["observation_tokens"]
    (s1, e1), (s2, e2) = result["action_ranges"]
    assert 0 < s1 < e1 < s2 < e2 == len(obs)
    action1, feedback, action2 = (tokenizer.decode(obs[a:b]) for a, b in ((s1, e1), (e1, s2), (s2, e2)))
    assert action1 == TOOL_CALL and action2 == ANSWER
    assert (
        feedback == "<|im_end|>\n<|im_start|>user\n<tool_response>\nforty-two\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )

    # OpenRLHF's own mask: exactly the generated ids, never the tool output.
    exp = experience_of(result)
    mask = exp.action_mask[0].tolist()  # aligned with sequences[1:]
    trained = [obs[i + 1] for i, m in enumerate(mask) if m]
    assert trained == obs[s1:e1] + obs[s2:e2]
    assert not any(mask[i - 1] for i in range(e1, s2))
    assert "<tool_response>" not in tokenizer.decode(trained)
    # Rollout log-probs: the engine's on the actions, 0 on the prompt and the feedback.
    logprobs = result["rollout_log_probs"]
    assert len(logprobs) == len(obs)
    assert all(lp == 0.0 for lp in logprobs[:s1] + logprobs[e1:s2]) and all(lp < 0 for lp in logprobs[s1:e1])

    # Token-level truth: the env's trajectory holds the very ids the engine produced.
    (traj,) = captured
    assert traj.turns[0].action_token_ids == obs[s1:e1] and traj.turns[1].action_token_ids == obs[s2:e2]
    assert traj.turns[0].feedback_token_ids == obs[e1:s2]
    assert traj.turns[0].action_logprobs == pytest.approx(logprobs[s1:e1])

    # Every turn asked the engine for at most the per-turn cap, with our stop strings kept in the output.
    for _, params in engine.calls:
        assert params["max_tokens"] <= 48 and params["include_stop_str_in_output"] is True
        assert "</tool_call>" in params["stop"] and "<|im_end|>" in params["stop"]


def test_real_model_episodes_run_concurrently_without_blocking_the_loop(smollm2, plugins, agent):
    """Two episodes at once: a blocking tool on the first turn, then SmolLM2 samples freely (in a worker thread,
    as vLLM generates outside the loop). The caller's event loop (vLLM's, in production) keeps ticking while the
    tool sleeps on the env's own loop."""
    agent_func, testing = agent
    model, tokenizer = smollm2
    cfg = run_config(tools=("echo", "slow"), max_new_tokens_per_turn=32)  # the scripted call is 29 tokens
    cfg.env.max_turns = 2
    executor = agent_func.AgentExecutor(run_config=cfg)
    engine = testing.CPUEngine(model, tokenizer, seed=3, script=make_script(tokenizer, {1: SLOW_CALL}))

    async def main():
        beats_while_the_tool_slept, stop = 0, asyncio.Event()

        async def heartbeat():
            nonlocal beats_while_the_tool_slept
            while not stop.is_set():
                await asyncio.sleep(0.01)
                beats_while_the_tool_slept += SlowTool.sleeping > 0

        beat = asyncio.create_task(heartbeat())
        results = await asyncio.gather(
            *(
                executor.execute(f"What is {i} + 1?", str(i + 1), sampling(testing), 2048, tokenizer, engine)
                for i in range(2)
            )
        )
        stop.set()
        await beat
        return results, beats_while_the_tool_slept

    results, beats = asyncio.run(main())
    # Counted, not timed: the caller's loop went on beating while the tool blocked the env's loop (a stalled caller
    # loop would count none).
    assert beats > 0, "the caller's loop stalled while the tool slept"
    keys = set(results[0]["extra_logs"])
    for result in results:
        assert set(result["extra_logs"]) == keys  # OpenRLHF stacks these per key across the batch
        assert result["extra_logs"]["num_tool_calls"] >= 1
        assert result["extra_logs"]["tool_seconds"] >= SlowTool.seconds * 0.9
        ranges = result["action_ranges"]
        assert len(ranges) == result["extra_logs"]["num_assistant_turns"] >= 2
        flat = [i for r in ranges for i in r]
        assert flat == sorted(flat) and flat[-1] <= len(result["observation_tokens"])
        # The free turns are SmolLM2's own samples, within the per-turn cap.
        assert all(0 < b - a <= 32 for a, b in ranges[1:])
        assert result["reward"] in (0.0, 1.0)


def test_length_budget_overrun_ends_the_episode_with_reward_zero(smollm2, plugins, agent):
    agent_func, testing = agent
    model, tokenizer = smollm2
    executor = agent_func.AgentExecutor(run_config=run_config(max_response_tokens=60, max_new_tokens_per_turn=None))
    long_answer = "Let me think about this for quite a while before answering. " * 4 + ANSWER
    engine = testing.CPUEngine(model, tokenizer, script=make_script(tokenizer, {1: TOOL_CALL, 2: long_answer}))
    result = asyncio.run(executor.execute("What is 6 * 7?", "42", sampling(testing), 4096, tokenizer, engine))
    assert result["reward"] == 0.0
    assert result["extra_logs"]["end_length"] == 1.0 and result["extra_logs"]["num_assistant_turns"] == 2
    (_, first), (_, second) = engine.calls
    (s1, e1), (s2, e2) = result["action_ranges"]
    used = (e1 - s1) + (s2 - e1)  # the first action and its feedback count toward the budget
    assert first["max_tokens"] == 61  # budget + 1: an overrun is visible to the env
    assert second["max_tokens"] == 60 - used + 1 == e2 - s2


def test_agent_file_reads_config_from_environment(tmp_path, monkeypatch, plugins, agent):
    agent_func, _ = agent
    from rstar_trainers.openrlhf.runtime import CONFIG_ENV, config_path

    path = tmp_path / "run.yaml"
    path.write_text("tools: [echo]\nreward: exact_test\ntrainer: {backend: openrlhf, stop: ['</answer>']}\n")
    monkeypatch.setenv(CONFIG_ENV, str(path))
    executor = agent_func.AgentExecutor()  # what OpenRLHF does: no arguments
    assert executor.runtime.stop == ["</tool_call>", "<|im_end|>", "</answer>"]
    assert agent_func.AgentExecutor().runtime is executor.runtime  # one runtime (shared plugins) per process
    monkeypatch.delenv(CONFIG_ENV)
    (tmp_path / "rstar_env.yaml").write_text(path.read_text())
    assert config_path(tmp_path / "agent_func.py") == tmp_path / "rstar_env.yaml"


def test_agent_file_loads_the_way_openrlhf_loads_it(tmp_path, monkeypatch, plugins, agent):
    """OpenRLHF's ``_load_agent_executor`` executes the file as a module absent from ``sys.modules`` (a
    ``@dataclass`` there fails); this is its code, minus the vLLM import of the module that holds it."""
    import importlib.util

    agent_func, _ = agent
    path = tmp_path / "run.yaml"
    path.write_text("tools: [echo]\nreward: exact_test\ntrainer: {backend: openrlhf}\n")
    monkeypatch.setenv("RSTAR_ENV_CONFIG", str(path))
    spec = importlib.util.spec_from_file_location("agent_module", agent_func.__file__)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert "agent_module" not in sys.modules
    from openrlhf.utils.agent import AgentExecutorBase

    assert issubclass(module.AgentExecutor, AgentExecutorBase)
    assert module.AgentExecutor().runtime.stop[0] == "</tool_call>"
