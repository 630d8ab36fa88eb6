"""Env-level tests: scripted actions through reset/step, asserting on the Trajectory."""

from __future__ import annotations

import asyncio

import gymnasium
import pytest

from rstar_env.testing import answer, aplay, assert_tool_errors, play, raw_tool_call, tool_call

PROBLEM = {"problem": "What is 6 * 7?", "answer": "42"}


@pytest.fixture
def env(math_env, echo_plugins):
    return math_env(tools=["echo"], reward="exact_test", max_turns=4)


def test_tool_response_is_visible_and_answer_scores(env):
    obs, info = env.reset(options=PROBLEM)
    assert "What is 6 * 7?" in obs and '"name": "echo"' in obs
    assert info["trajectory"].turns == []
    obs, reward, terminated, truncated, info = env.step(tool_call("echo", "let me check", text="forty-two"))
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert "<tool_response>\nforty-two\n</tool_response>" in obs
    obs, reward, terminated, truncated, info = env.step(answer(42))
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    traj = info["trajectory"]
    assert traj.end_reason == "answer" and traj.final_answer == "42"
    assert traj.num_tool_calls == 1 and traj.num_tool_errors == 0
    assert traj.turns[0].feedback == env.chat_format.render_feedback(traj.turns[0].action, ["forty-two"])


def test_wrong_answer_scores_zero(env):
    traj = play(env, [answer(41)], **PROBLEM)
    assert traj.reward == 0.0 and traj.end_reason == "answer" and traj.reward_result.reason == "mismatch"


@pytest.mark.parametrize(
    ("action", "needle"),
    [
        (raw_tool_call('{"name": "echo", "arguments": {"text": "x"'), "not valid JSON"),
        (tool_call("nope", text="x"), "unknown tool 'nope'; available tools: echo"),
        (tool_call("echo"), "missing required argument(s): text"),
        (tool_call("echo", text=5), "argument 'text' must be of type string, got int"),
        (raw_tool_call("[1, 2]"), "must be a JSON object"),
    ],
)
def test_bad_calls_become_tool_responses(env, action, needle):
    env.reset(options=PROBLEM)
    obs, _reward, terminated, truncated, info = env.step(action)
    assert not terminated and not truncated
    assert needle in obs
    traj = info["trajectory"]
    assert_tool_errors(traj, {"bad_call": 1})
    assert traj.turns[0].tool_calls[0].raw in action


def test_plugin_exception_is_a_crash_not_an_error(env):
    env.reset(options=PROBLEM)
    obs, *_, info = env.step(tool_call("echo", text="x", fail=True))
    assert "the echo tool failed (RuntimeError: asked to fail)" in obs
    assert_tool_errors(info["trajectory"], {"crash": 1})


def test_several_calls_in_one_turn_run_in_order(env):
    action = tool_call("echo", text="a") + tool_call("echo", text="b") + tool_call("nope", text="c")
    env.reset(options=PROBLEM)
    obs, *_, info = env.step(action)
    assert obs.index("\na\n") < obs.index("\nb\n") < obs.index("unknown tool")
    traj = info["trajectory"]
    assert [c.name for c in traj.turns[0].tool_calls] == ["echo", "echo", "nope"]
    assert_tool_errors(traj, {"bad_call": 1})


def test_calls_beyond_the_cap_are_counted(math_env, echo_plugins):
    env = math_env(tools=["echo"], reward="exact_test", max_tool_calls_per_turn=2)
    env.reset(options=PROBLEM)
    obs, *_, info = env.step("".join(tool_call("echo", text=str(i)) for i in range(3)))
    assert "limit is 2" in obs
    assert info["trajectory"].num_tool_calls == 3
    assert_tool_errors(info["trajectory"], {"bad_call": 1})


def test_turn_limit_truncates_and_scores_last_action(env):
    script = [tool_call("echo", text=str(i)) for i in range(3)] + [tool_call("echo", text="x") + answer(42)]
    traj = play(env, script, **PROBLEM)
    assert traj.end_reason == "max_turns" and traj.truncated
    assert traj.num_assistant_turns == 4 and traj.reward == 1.0


def test_turn_limit_without_answer_scores_zero(env):
    obs, info = env.reset(options=PROBLEM)
    for i in range(4):
        obs, reward, terminated, truncated, info = env.step(tool_call("echo", text=str(i)))
    assert (obs, reward, terminated, truncated) == ("", 0.0, False, True)
    assert info["trajectory"].end_reason == "max_turns"


def test_empty_action_ends_the_episode_cleanly(env):
    traj = play(env, [""], **PROBLEM)
    assert traj.end_reason == "answer" and traj.reward == 0.0 and traj.final_answer is None


def test_very_long_action_hits_the_length_budget(math_env, echo_plugins):
    env = math_env(tools=["echo"], reward="exact_test", max_length=1000)
    traj = play(env, ["x" * 5000 + answer(42)], **PROBLEM)
    assert traj.end_reason == "length" and traj.reward == 0.0 and traj.truncated


def test_tool_feedback_counts_toward_the_budget(math_env, echo_plugins):
    env = math_env(tools=[{"name": "echo", "options": {"prefix": "y" * 400}}], reward="exact_test", max_length=300)
    env.reset(options=PROBLEM)
    *_, terminated, truncated, info = env.step(tool_call("echo", text="short"))
    assert truncated and not terminated and info["trajectory"].end_reason == "length"
    assert info["trajectory"].num_tool_calls == 1  # the call ran; its output overflowed


def test_non_ascii_round_trips(env):
    text = "π ≈ 3.14159, 中文, émoji 🎲"
    traj = play(env, [tool_call("echo", "Voilà:", text=text), answer(42, "Réponse")], **PROBLEM)
    assert traj.turns[0].tool_calls[0].result.text == text
    assert text in traj.turns[0].feedback and traj.reward == 1.0


def test_episode_end_closes_tool_sessions(env):
    tool = env.tools["echo"]
    env.reset(options=PROBLEM)
    env.step(tool_call("echo", text="a"))
    assert tool.closed == []
    env.step(answer(42))
    assert len(tool.closed) == 1
    env.reset(options=PROBLEM)
    env.step(tool_call("echo", text="a"))
    env.reset(options=PROBLEM)  # abandoning an episode closes it too
    assert len(tool.closed) == 2


def test_step_after_end_or_before_reset_raises(env):
    with pytest.raises(gymnasium.error.ResetNeeded):
        env.step("x")
    play(env, [answer(42)], **PROBLEM)
    with pytest.raises(gymnasium.error.ResetNeeded, match="episode has ended"):
        env.step("x")


def test_non_string_action_is_a_type_error(env):
    env.reset(options=PROBLEM)
    with pytest.raises(TypeError, match="assistant's text"):
        env.step(42)


def test_reset_options_must_name_problem_and_answer(env):
    with pytest.raises(ValueError, match="need 'problem' and 'answer'"):
        env.reset(options={"question": "x"})


def test_info_does_not_share_objects_between_steps(env):
    _, info0 = env.reset(options=PROBLEM)
    _, *_, info1 = env.step(tool_call("echo", text="a"))
    info1["trajectory"].turns.clear()
    _, *_, info2 = env.step(answer(42))
    assert info0["trajectory"] is not info2["trajectory"] and len(info2["trajectory"].turns) == 2


def test_token_ids_from_the_policy_are_recorded(math_env, echo_plugins):
    env = math_env(tools=["echo"], reward="exact_test", max_length=10, length_unit="tokens")
    env.reset(options=PROBLEM)
    *_, info = env.step(answer(42), token_ids=[1, 2, 3], logprobs=[-0.1, -0.2, -0.3])
    turn = info["trajectory"].turns[0]
    assert turn.action_token_ids == [1, 2, 3] and turn.action_tokens == 3 and turn.action_logprobs[2] == -0.3


def test_token_budget_without_counts_says_how_to_fix(math_env, echo_plugins):
    env = math_env(tools=["echo"], reward="exact_test", max_length=10, length_unit="tokens")
    env.reset(options=PROBLEM)
    with pytest.raises(ValueError, match="give MathToolEnv a tokenizer"):
        env.step(answer(42))


def test_many_episodes_concurrently_through_the_async_api(math_env, echo_plugins):
    envs = [math_env(tools=["echo"], reward="exact_test") for _ in range(8)]

    async def run_all():
        return await asyncio.gather(
            *(
                aplay(e, [tool_call("echo", text=str(i)), answer(i)], problem="p", answer=str(i))
                for i, e in enumerate(envs)
            )
        )

    trajectories = asyncio.run(run_all())
    assert [t.reward for t in trajectories] == [1.0] * 8
    assert [t.turns[0].tool_calls[0].result.text for t in trajectories] == [str(i) for i in range(8)]


def test_tool_instances_are_shared_not_closed(math_env, echo_plugins):
    echo_cls, _ = echo_plugins
    shared = echo_cls(prefix=">")
    env = math_env(tools=[shared], reward="exact_test")
    traj = play(env, [tool_call("echo", text="a"), answer(1)], problem="p", answer="1")
    assert traj.turns[0].tool_calls[0].result.text == ">a"
    assert env.tools["echo"] is shared


def test_duplicate_tool_names_are_rejected(math_env, echo_plugins):
    with pytest.raises(ValueError, match="two tools are named 'echo'"):
        math_env(tools=["echo", {"name": "echo", "options": {"prefix": "x"}}], reward="exact_test")


def test_render_ansi(math_env, echo_plugins):
    env = math_env(tools=["echo"], reward="exact_test", render_mode="ansi")
    env.reset(options=PROBLEM)
    env.step(tool_call("echo", text="hello"))
    assert env.render().endswith("<|im_start|>assistant\n") and "hello" in env.render()
