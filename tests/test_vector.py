"""The vector env with a scripted policy: lockstep steps, concurrency of tool calls, autoreset."""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import gymnasium
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from rstar_env.plugins import register, unregister
from rstar_env.testing import answer, tool_call
from rstar_env.tool import EpisodeContext, function_schema
from rstar_env.trajectory import ToolResult


class SleepTool:
    """Waits (up to ``seconds``) until ``meet`` calls have arrived, and counts how many ran at once: calls that run
    one at a time never meet, and the count says so without a clock."""

    name: ClassVar[str] = "sleep"
    schema = function_schema(
        "sleep", "Sleep.", {"seconds": {"type": "number"}, "meet": {"type": "integer"}}, ["seconds"]
    )
    arrived: ClassVar[int] = 0
    running: ClassVar[int] = 0
    most_at_once: ClassVar[int] = 0

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        cls = type(self)
        cls.arrived += 1
        cls.running += 1
        cls.most_at_once = max(cls.most_at_once, cls.running)
        try:
            for _ in range(int(arguments["seconds"] * 100)):
                if cls.arrived >= arguments.get("meet", 1):
                    break
                await asyncio.sleep(0.01)
        finally:
            cls.running -= 1
        return ToolResult(f"slept {arguments['seconds']}")

    async def close(self, episode: EpisodeContext) -> None:
        pass


@pytest.fixture
def vec(echo_plugins):
    register(SleepTool)
    envs = gymnasium.make_vec(
        "rstar_env/MathTool-v0",
        num_envs=16,
        vectorization_mode="vector_entry_point",
        tools=["sleep", "echo"],
        reward="exact_test",
        max_turns=3,
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
    SleepTool.arrived = SleepTool.most_at_once = 0
    obs, _rewards, term, trunc, _infos = vec.step([tool_call("sleep", seconds=10, meet=16)] * 16)
    assert all("slept 10" in o for o in obs)
    assert SleepTool.most_at_once == 16, f"{SleepTool.most_at_once} of 16 tool calls ran at once"
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


def make_vec(n: int = 3, **options: Any):
    return gymnasium.make_vec("rstar_env/MathTool-v0", num_envs=n, vectorization_mode="vector_entry_point",
                              **{"tools": ["echo"], "reward": "exact_test", "max_turns": 3, **options})  # fmt: skip


def test_unknown_reset_options_are_refused(echo_plugins):
    vec = make_vec()
    with pytest.raises(ValueError, match=r"unknown reset option\(s\) 'row'.*takes 'rows'.*'reset_mask'"):
        vec.reset(options={"row": ROWS[:3]})
    with pytest.raises(ValueError, match="has 2 rows for 3 sub-envs"):
        vec.reset(options={"rows": ROWS[:2]})
    with pytest.raises(ValueError, match=r"boolean array of shape \(3,\)"):
        vec.reset(options={"reset_mask": [1, 0, 1]})
    with pytest.raises(ValueError, match="selects no sub-env"):
        vec.reset(options={"reset_mask": np.zeros(3, dtype=bool)})
    # The README's `{"problem": ..., "answer": ...}` placeholder, run as written, is refused, not "Ellipsis".
    with pytest.raises(ValueError, match=r"options\['rows'\]\[0\]: the problem \(field 'problem'\) is `\.\.\.`"):
        vec.reset(options={"rows": [{"problem": ..., "answer": ...}] * 3})
    with pytest.raises(ValueError, match=r"options\['rows'\]\[2\]: the answer field 'answer' is `\.\.\.`"):
        vec.reset(options={"rows": [*ROWS[:2], {"problem": "q", "answer": ...}]})
    vec.close()


def test_reset_mask_resets_only_the_masked_sub_envs(echo_plugins):
    vec = make_vec()
    vec.reset(options={"rows": ROWS[:3]})
    obs, *_ = vec.step([tool_call("echo", text=f"t{i}") for i in range(3)])
    mask = np.array([False, True, False])
    new_obs, infos = vec.reset(options={"reset_mask": mask, "rows": [None, ROWS[9], None]})
    assert new_obs[0] == obs[0] and new_obs[2] == obs[2]  # kept their episode and last observation
    assert "p9" in new_obs[1] and infos["_trajectory"].tolist() == [False, True, False]
    _, rewards, terminated, _, infos = vec.step([answer(0), answer(9), answer(5)])
    assert rewards.tolist() == [1.0, 1.0, 0.0] and terminated.all()
    assert [t.num_assistant_turns for t in infos["trajectory"]] == [2, 1, 2]  # episodes 0 and 2 went on
    vec.close()


def test_autoreset_modes_are_selectable_and_stated(echo_plugins):
    for mode in AutoresetMode:
        vec = make_vec(autoreset_mode=mode)
        assert vec.metadata["autoreset_mode"] is mode
        vec.close()
    vec = make_vec(autoreset_mode="same_step")
    assert vec.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP
    vec.close()
    with pytest.raises(ValueError, match=r"unknown autoreset_mode 'later'.*AutoresetMode.DISABLED"):
        make_vec(autoreset_mode="later")


def test_same_step_autoreset_returns_the_new_prompt_and_the_final_one(echo_plugins):
    vec = make_vec(autoreset_mode=AutoresetMode.SAME_STEP, dataset=[{"problem": "drawn", "answer": "1"}])
    vec.reset(options={"rows": ROWS[:3]})
    obs, rewards, terminated, _, infos = vec.step([answer(0), tool_call("echo", text="x"), answer(7)])
    assert terminated.tolist() == [True, False, True] and rewards.tolist() == [1.0, 0.0, 0.0]
    assert "drawn" in obs[0] and "drawn" in obs[2] and "x" in obs[1]  # the next episodes' prompts, at once
    assert infos["_final_obs"].tolist() == [True, False, True] and infos["final_obs"][0] == ""
    assert infos["final_info"]["trajectory"][0].final_answer == "0"  # gymnasium nests final_info per key
    assert infos["trajectory"][0].turns == [] and infos["trajectory"][0].problem == "drawn"
    _, rewards, terminated, _, _ = vec.step([answer(1)] * 3)  # no action is swallowed by a reset
    assert rewards.tolist() == [1.0, 1.0, 1.0] and terminated.all()
    vec.close()


def test_disabled_autoreset_needs_reset_mask(echo_plugins):
    vec = make_vec(autoreset_mode=AutoresetMode.DISABLED)
    vec.reset(options={"rows": ROWS[:3]})
    vec.step([answer(0), tool_call("echo", text="x"), tool_call("echo", text="y")])
    with pytest.raises(gymnasium.error.ResetNeeded, match=r"sub-env\(s\) \[0\] have ended.*reset_mask"):
        vec.step([answer(0)] * 3)
    assert vec.envs[1].trajectory.num_assistant_turns == 1  # nothing was stepped by the refused call
    obs, _ = vec.reset(options={"reset_mask": np.array([True, False, False]), "rows": [ROWS[4], None, None]})
    assert "p4" in obs[0]
    _, rewards, terminated, _, _ = vec.step([answer(4), answer(1), answer(2)])
    assert rewards.tolist() == [1.0, 1.0, 1.0] and terminated.all()
    vec.close()


def test_max_episode_steps_reaches_the_sub_envs(echo_plugins):
    vec = make_vec(max_episode_steps=1)
    vec.reset(options={"rows": ROWS[:3]})
    _, _, _, truncated, infos = vec.step([tool_call("echo", text="x")] * 3)
    assert truncated.all() and list(infos["end_reason"]) == ["time_limit"] * 3
    vec.close()


def test_sub_envs_share_rows_given_in_memory(echo_plugins):
    rows = [{"problem": f"q{i}", "answer": str(i)} for i in range(5)]
    vec = make_vec(dataset=rows)
    assert all(env._dataset is vec.envs[0]._dataset for env in vec.envs)
    obs, _ = vec.reset(seed=1)
    assert all("<|im_start|>user\nq" in o for o in obs)
    vec.close()
