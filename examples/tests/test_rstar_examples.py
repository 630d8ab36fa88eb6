"""Tests of the example plugins, written as a plugin author would: through the registry, the env and the
``rstar_env.testing`` helpers. Run by CI (``scripts/setup.sh --dev`` installs the package)."""

from __future__ import annotations

import asyncio
import time

import pytest

from rstar_env.config import ConfigError, load_config
from rstar_env.plugins import list_plugins
from rstar_env.testing import answer, assert_tool_errors, make_group, play, score, select, tool_call


def test_registered_through_the_entry_point():
    sources = {(i.kind, i.name): i.source for i in list_plugins()}
    assert sources[("tool", "calculator")] == "rstar-env-examples"
    assert sources[("reward", "exact_match")] == "rstar-env-examples"
    assert sources[("sampler", "keep_shortest")] == "rstar-env-examples"


def test_calculator_in_an_episode(math_env):
    env = math_env(tools=["calculator"], reward="exact_match")
    traj = play(
        env,
        [
            tool_call("calculator", expression="(3 + 4) * 6"),
            tool_call("calculator", expression="2 ** 1000"),
            tool_call("calculator", expr="1"),
            answer(42),
        ],
        problem="What is (3 + 4) * 6?",
        answer="42",
    )
    assert traj.turns[0].tool_calls[0].result.text == "42"
    assert "exponent 1000 is larger than 100" in traj.turns[1].tool_calls[0].result.text
    assert_tool_errors(traj, {"exception": 1, "bad_call": 1})  # the wrong argument name is the env's bad_call
    assert traj.reward == 1.0


def test_calculator_schema_and_options_are_declared_once():
    from rstar_examples import Calculator

    function = Calculator.schema["function"]
    assert function["name"] == Calculator.name  # derived: the name is written once
    assert function["parameters"] == {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. (3 + 4) * 2"}},
        "required": ["expression"],
    }
    with pytest.raises(ConfigError, match=r"tools\[0\]\.options\.max_digits: Input should be less than or equal to"):
        load_config({"tools": [{"name": "calculator", "options": {"max_digits": 10**6}}]})


def test_exact_match_scores_and_options():
    assert score("exact_match", answer("Paris"), "paris").reward == 1.0
    assert score("exact_match", answer("Paris"), "paris", case_sensitive=True).reward == 0.0
    result = score("exact_match", "no answer here", "paris")
    assert (result.reward, result.reason) == (0.0, "no_answer")
    with pytest.raises(ConfigError, match="has no option"):
        load_config({"reward": {"name": "exact_match", "options": {"case_sensitiv": True}}})


def test_keep_shortest_keeps_the_fewest_turns_and_drops_no_signal_groups():
    group = make_group([1, 0, 1, 0], turns=[3, 1, 2, 4], tool_errors=[0, 0, 1, 0])
    assert select("keep_shortest", group, keep=2) == [1, 2]
    assert select("keep_shortest", make_group([1, 1, 1, 1]), keep=2) is None
    assert select("keep_shortest", make_group([1, 0]), keep=3) is None


@pytest.mark.parametrize(
    "expression",
    [
        "(((9**99)**99)**99)**99",
        "9**99*9**99*9**99*9**99*9**99*9**99*9**99*9**99*9**99*9**99*9**99*9**99",
        "((10**99)**10)**10",
    ],
)
def test_calculator_refuses_huge_results_at_once(expression):
    from rstar_examples import Calculator

    start = time.perf_counter()
    result = Calculator().evaluate(expression)
    assert time.perf_counter() - start < 0.5
    assert result.error == "exception" and "more than 1000 digits" in result.text


def test_nested_powers_do_not_stall_another_env(math_env):
    # Two envs on one event loop: the nested power must not hold the other env's steps.
    slow = math_env(tools=["calculator"], reward="exact_match")
    other = math_env(tools=["calculator"], reward="exact_match")

    async def episode(env, expression):
        await env.areset(options={"problem": "p", "answer": "1"})
        start = time.perf_counter()
        _, _, _, _, info = await env.astep(tool_call("calculator", expression=expression))
        return time.perf_counter() - start, info["trajectory"].turns[0].tool_calls[0].result

    async def both():
        return await asyncio.gather(episode(slow, "(((9**99)**99)**99)**99"), episode(other, "6 * 7"))

    (slow_s, slow_result), (other_s, other_result) = asyncio.run(both())
    assert slow_result.error == "exception" and slow_s < 2.0
    assert other_result.text == "42" and other_s < 2.0
