"""The python tool through the env: the standard gymnasium checks and real episodes on the local sandbox."""

from __future__ import annotations

import asyncio

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env

import rstar_env  # noqa: F401  (registers the env)
from rstar_env.testing import answer, assert_tool_errors, play, python_call
from rstar_plugins.tools.python import PythonTool, truncate_middle

PROBLEM = {"problem": "What is 17 * 23 - 45?", "answer": "346"}

pytestmark = pytest.mark.usefixtures("module_python_pool")


def test_check_env_passes():
    env = gymnasium.make("rstar_env/MathTool-v0")
    try:
        check_env(env.unwrapped, skip_render_check=True)
    finally:
        env.close()


def test_full_episode_with_the_python_tool(math_env):
    env = math_env(tools=["python"], reward="math", max_turns=4)
    traj = play(env, [python_call("17 * 23 - 45"), answer(346)], **PROBLEM)
    call = traj.turns[0].tool_calls[0]
    assert call.result.text == "346" and call.error is None
    assert "<tool_response>\n346\n</tool_response>" in traj.turns[0].feedback
    assert traj.reward == 1.0 and traj.reward_result.reason in ("exact", "verified")


def test_wrong_answer_scores_zero_with_the_math_reward(math_env):
    env = math_env(tools=["python"], reward="math")
    traj = play(env, [answer(345)], **PROBLEM)
    assert traj.reward == 0.0 and traj.reward_result.reason == "mismatch"


def test_python_errors_are_structured(math_env):
    env = math_env(tools=[{"name": "python", "options": {"timeout_s": 1}}], reward="math", max_turns=5)
    script = [
        python_call("1 / 0"),
        python_call("while True: pass"),
        python_call("import os; os.kill(os.getpid(), 9)"),
        python_call("print('ok')"),
        answer(346),
    ]
    traj = play(env, script, **PROBLEM)
    first, second, third, fourth = (t.tool_calls[0] for t in traj.turns[:4])
    assert first.error == "exception" and "ZeroDivisionError" in first.result.text
    assert second.error == "timeout" and "time limit" in second.result.text
    assert third.error == "crash"
    assert fourth.error is None and fourth.result.text == "ok"
    assert_tool_errors(traj, {"exception": 1, "timeout": 1, "crash": 1})


def test_stateful_sessions_live_for_one_episode(math_env):
    env = math_env(tools=[{"name": "python", "options": {"stateful": True}}], reward="math")
    traj = play(env, [python_call("x = 41"), python_call("x + 1"), answer(42)], problem="p", answer="42")
    assert traj.turns[1].tool_calls[0].result.text == "42"
    # A new episode gets a fresh interpreter.
    traj = play(env, [python_call("x"), answer(1)], problem="p", answer="1")
    assert traj.turns[0].tool_calls[0].error == "exception" and "NameError" in traj.turns[0].tool_calls[0].result.text


def test_stdin_argument(math_env):
    env = math_env(tools=["python"], reward="math")
    traj = play(env, [python_call("print(int(input()) * 2)", stdin="21"), answer(42)], problem="p", answer="42")
    assert traj.turns[0].tool_calls[0].result.text == "42"


def test_output_is_cut_with_head_and_tail(math_env):
    env = math_env(tools=[{"name": "python", "options": {"max_output_chars": 200}}], reward="math")
    traj = play(env, [python_call("for i in range(1000): print(i)"), answer(1)], problem="p", answer="1")
    text = traj.turns[0].tool_calls[0].result.text
    assert text.startswith("0\n1\n2") and text.endswith("998\n999") and "characters cut" in text
    assert len(text) < 260


def test_envs_share_one_sandbox_per_setting():
    a, b = PythonTool(timeout_s=2), PythonTool(timeout_s=2)
    other = PythonTool(timeout_s=2, sandbox_options={"memory_mb": 512})
    try:
        assert a.sandbox is b.sandbox
        assert other.sandbox is not a.sandbox
    finally:
        for tool in (a, b, other):  # a share left open would keep the pool for every later test of the process
            asyncio.run(tool.aclose())
    assert a._sandbox is None and b._sandbox is None


def test_truncate_middle():
    assert truncate_middle("abc", 10) == "abc"
    cut = truncate_middle("a" * 50 + "b" * 50, 20)
    assert cut.startswith("a" * 10) and cut.endswith("b" * 10) and "[80 characters cut]" in cut


def test_bad_tool_options_are_errors():
    with pytest.raises(ValueError, match=r"timeout_s: Input should be greater than 0 \(got 0\)"):
        PythonTool(timeout_s=0)
    with pytest.raises(ValueError, match=r"max_output_chars: Input should be greater than or equal to 64"):
        PythonTool(max_output_chars=10)
    with pytest.raises(ValueError, match=r"backend: unknown sandbox backend 'docker'; choose one of e2b, local"):
        PythonTool(backend="docker")
    with pytest.raises(TypeError, match=r"'timeout': no such option; the options are .*timeout_s"):
        PythonTool(timeout=2)


def test_options_model_and_keywords_build_the_same_tool():
    from rstar_plugins.tools.python import PythonOptions

    by_model = PythonTool(PythonOptions(stateful=True, timeout_s=2))
    by_keywords = PythonTool(stateful=True, timeout_s=2)
    assert by_model.options == by_keywords.options and by_model.schema == by_keywords.schema
    assert (by_keywords.stateful, by_keywords.timeout_s) == (True, 2.0)
    # Keywords override the model's values, and are validated as well.
    assert PythonTool(PythonOptions(timeout_s=2), timeout_s=3).timeout_s == 3.0
    with pytest.raises(ValueError, match="timeout_s"):
        PythonTool(PythonOptions(timeout_s=2), timeout_s=-3)
