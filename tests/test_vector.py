"""The vector env with a scripted policy: lockstep steps, concurrency of tool calls, autoreset."""

from __future__ import annotations

import asyncio
import time
from typing import Any, ClassVar

import gymnasium
import numpy as np
import pytest

from rstar_env.plugins import register, unregister
from rstar_env.testing import answer, tool_call
from rstar_env.tool import EpisodeContext, function_schema
from rstar_env.trajectory import ToolResult


class SleepTool:
    name: ClassVar[str] = "sleep"
    schema = function_schema("sleep", "Sleep.", {"seconds": {"type": "number"}}, ["seconds"])

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        await asyncio.sleep(arguments["seconds"])
        return ToolResult(f"slept {arguments['seconds']}")

    async def close(self, episode: EpisodeContext) -> None:
        pass


@pytest.fixture
def vec(echo_plugins):
    register(SleepTool)
    envs = gymnasium.make_vec(
        "rstar_env/MathTool-v0", num_envs=16, vectorization_mode="vector_entry_point",
        tools=["sleep", "echo"], reward="exact_test", max_turns=3,
    )
    yield envs
    envs.close()
    unregister(SleepTool)


ROWS = [{"problem": f"p{i}", "answer": str(i)} for i in range(16)]


def test_make_vec_shares_plugins(vec):
    first = vec.unwrapped.envs[0]
    assert all(e.tools["sleep"] is first.tools["sleep"] and e.reward_fn is first.reward_fn for e in vec.unwrapped.envs)
    assert vec.num_envs == 16 and len(vec.action_space) == 16


def test_tool_calls_of_all_episodes_overlap(vec):
    vec.reset(options={"rows": ROWS})
    start = time.perf_counter()
    obs, _rewards, term, trunc, _infos = vec.step([tool_call("sleep", seconds=0.5)] * 16)
    elapsed = time.perf_counter() - start
    assert all("slept 0.5" in o for o in obs)
    assert elapsed < 2.0, f"16 concurrent 0.5 s tool calls took {elapsed:.2f} s: they did not overlap"
    assert not term.any() and not trunc.any()


def test_rewards_terminations_and_autoreset(vec):
    vec.reset(options={"rows": ROWS})
    actions = [answer(i) if i % 2 == 0 else tool_call("echo", text="hi") for i in range(16)]
    obs, rewards, term, _trunc, infos = vec.step(actions)
    np.testing.assert_array_equal(rewards, [1.0 if i % 2 == 0 else 0.0 for i in range(16)])
    np.testing.assert_array_equal(term, [i % 2 == 0 for i in range(16)])
    assert infos["_trajectory"].all()
    assert infos["trajectory"][0].final_answer == "0" and infos["trajectory"][1].num_tool_calls == 1
    # NEXT_STEP autoreset: the finished sub-envs reset (action ignored); the others go on.
    obs, rewards, term, _trunc, infos = vec.step([answer(0)] * 16)
    assert "<|im_start|>system" in obs[0]  # a fresh prompt from the default dataset
    assert infos["trajectory"][0].turns == []
    assert term[1] and rewards[1] == 0.0  # p1's answer is 1, it answered 0
