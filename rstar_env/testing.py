"""Helpers for env-level unit tests of your own plugins, also loaded as a pytest plugin (``pytest11``).

Build actions, play a scripted episode, assert on the Trajectory::

    from rstar_env.testing import answer, play, python_call

    def test_my_tool(math_env):                       # fixture: builds envs, closes them after the test
        env = math_env(tools=["python", "my_tool"])
        traj = play(env, [python_call("print(6 * 7)"), answer(42)], problem="6*7?", answer="42")
        assert traj.reward == 1.0
        assert traj.turns[0].tool_calls[0].result.text == "42"

Nothing here needs a model: a scripted policy is a list of action strings (or a function of the last
observation), which is what an env-level test wants. Reward plugins and samplers are tested without an env::

    from rstar_env.testing import make_group, score, select

    assert score("my_reward", "<answer>\\boxed{42}</answer>", "42").reward == 1.0
    assert select("my_sampler", make_group([1, 1, 0, 0], turns=[1, 3, 2, 2]), keep=2) == [0, 2]
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rstar_env.format import format_tool_call
from rstar_env.trajectory import RewardResult, Trajectory

ScriptStep = str | Callable[[str], str]
"""An action, or a function from the last observation to the action (to react to tool output)."""


def tool_call(name: str, text_before: str = "", **arguments: Any) -> str:
    """An action that calls tool ``name`` with ``arguments`` (hermes format), after some reasoning text."""
    call = format_tool_call(name, arguments)
    return f"{text_before}\n{call}" if text_before else call


def python_call(code: str, *, stdin: str | None = None, text_before: str = "") -> str:
    """An action that runs ``code`` with the ``python`` tool."""
    arguments: dict[str, Any] = {"code": code}
    if stdin is not None:
        arguments["stdin"] = stdin
    return tool_call("python", text_before, **arguments)


def raw_tool_call(body: str) -> str:
    """An action whose tool-call block holds ``body`` verbatim (to test malformed calls)."""
    return f"<tool_call>\n{body}\n</tool_call>"


def answer(value: Any, text_before: str = "So the answer is") -> str:
    """A final action with the answer in an ``<answer>`` block and ``\\boxed{}``."""
    return f"<answer>{text_before} \\boxed{{{value}}}.</answer>"


def play(
    env: Any,
    script: Sequence[ScriptStep],
    *,
    problem: str | None = None,
    answer: str | None = None,
    seed: int | None = None,
) -> Trajectory:
    """Reset ``env`` (on ``problem``/``answer`` when given) and step through ``script`` until the episode ends.

    Returns the final Trajectory. Raises ``AssertionError`` if the script runs out before the episode ends, so a
    test never passes on an episode that silently went on.
    """
    options = None if problem is None else {"problem": problem, "answer": answer if answer is not None else ""}
    obs, info = env.reset(seed=seed, options=options)
    for i, step in enumerate(script):
        action = step(obs) if callable(step) else step
        obs, _, terminated, truncated, info = env.step(action)
        if terminated or truncated:
            if i != len(script) - 1:
                raise AssertionError(f"the episode ended at step {i + 1} of {len(script)} ({info['end_reason']})")
            return info["trajectory"]
    raise AssertionError(f"the script ({len(script)} actions) ended before the episode did")


async def aplay(
    env: Any, script: Sequence[ScriptStep], *, problem: str, answer: str, seed: int | None = None
) -> Trajectory:
    """:func:`play` through ``areset``/``astep`` (for async tests and for many episodes at once)."""
    unwrapped = getattr(env, "unwrapped", env)
    obs, info = await unwrapped.areset(seed=seed, options={"problem": problem, "answer": answer})
    for i, step in enumerate(script):
        action = step(obs) if callable(step) else step
        obs, _, terminated, truncated, info = await unwrapped.astep(action)
        if terminated or truncated:
            if i != len(script) - 1:
                raise AssertionError(f"the episode ended at step {i + 1} of {len(script)} ({info['end_reason']})")
            return info["trajectory"]
    raise AssertionError(f"the script ({len(script)} actions) ended before the episode did")


def assert_tool_errors(trajectory: Trajectory, expected: dict[str, int]) -> None:
    """Assert the trajectory's tool errors by kind, e.g. ``{"bad_call": 1}`` (``{}``: no errors)."""
    got = trajectory.tool_error_counts()
    if got != expected:
        calls = [(c.name, c.error, c.result.text[:80]) for c in trajectory.tool_calls]
        raise AssertionError(f"tool errors {got} != expected {expected}; calls: {json.dumps(calls)}")


# -- reward plugins and samplers ---------------------------------------------------------------------------------
def score(reward: Any, response: str, gold: str, **options: Any) -> RewardResult:
    """Score ``response`` against the gold answer with ``reward`` (a reward plugin instance, or a registered name
    built with ``options``), synchronously, checking that it returns a :class:`~rstar_env.trajectory.RewardResult`."""
    from rstar_env import aio
    from rstar_env.plugins import invoke, load_reward

    plugin = load_reward(reward, **options) if isinstance(reward, str) else reward
    try:
        result = aio.run_sync(invoke(plugin.score, response, gold))
    finally:
        if isinstance(reward, str) and hasattr(plugin, "aclose"):
            aio.run_sync(plugin.aclose())
    if not isinstance(result, RewardResult):
        raise AssertionError(f"{plugin.name!r}.score returned {type(result).__name__}, not RewardResult")
    return result


@dataclass(frozen=True)
class Summary:
    """What a sampler sees of one trajectory (:class:`~rstar_env.sampler.TrajectorySummary`), built directly."""

    reward: float = 0.0
    num_tool_calls: int = 1
    num_tool_errors: int = 0
    num_answer_blocks: int = 1
    num_assistant_turns: int = 1


def make_group(
    rewards: Sequence[float],
    *,
    tool_calls: int | Sequence[int] = 1,
    tool_errors: int | Sequence[int] = 0,
    answer_blocks: int | Sequence[int] = 1,
    turns: int | Sequence[int] = 1,
) -> list[Summary]:
    """A group of summaries, one per reward; each other field is one value for all or a sequence, one per item::

    make_group([1, 1, 0, 0], tool_errors=[0, 2, 0, 1], turns=3)
    """
    n = len(rewards)

    def each(value: int | Sequence[int], field: str) -> list[int]:
        if isinstance(value, int):
            return [value] * n
        if len(value) != n:
            raise ValueError(f"{field} has {len(value)} values for {n} rewards")
        return list(value)

    columns = zip(
        rewards,
        each(tool_calls, "tool_calls"),
        each(tool_errors, "tool_errors"),
        each(answer_blocks, "answer_blocks"),
        each(turns, "turns"),
        strict=True,
    )
    return [Summary(float(r), c, e, b, t) for r, c, e, b, t in columns]


def select(sampler: Any, group: Sequence[Any], keep: int, *, seed: int = 0, **options: Any) -> list[int] | None:
    """Run ``sampler`` (an instance, or a registered name built with ``options``) on ``group`` as the trainers do:
    its output validated by :func:`~rstar_env.sampler.checked_select` (``None`` when it drops the group)."""
    from rstar_env.plugins import load_sampler
    from rstar_env.sampler import checked_select

    plugin = load_sampler(sampler, **options) if isinstance(sampler, str) else sampler
    return checked_select(plugin, group, keep, np.random.default_rng(seed))


def make_env(**options: Any) -> Any:
    """``MathToolEnv`` unwrapped (no gymnasium wrappers), for tests that need ``astep``."""
    from rstar_env.env import MathToolEnv

    return MathToolEnv(**options)


# -- pytest plugin -----------------------------------------------------------------------------------------------
try:
    import pytest
except ImportError:  # the helpers above work without pytest
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def math_env() -> Iterator[Callable[..., Any]]:
        """A factory of ``MathToolEnv`` (same options as ``gymnasium.make``); every env it built is closed after
        the test."""
        built: list[Any] = []

        def factory(**options: Any) -> Any:
            env = make_env(**options)
            built.append(env)
            return env

        yield factory
        for env in built:
            env.close()


__all__ = [
    "Summary",
    "answer",
    "aplay",
    "assert_tool_errors",
    "make_env",
    "make_group",
    "play",
    "python_call",
    "raw_tool_call",
    "score",
    "select",
    "tool_call",
]
