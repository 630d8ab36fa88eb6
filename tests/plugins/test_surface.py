"""The plugin author's surface: one import place, options declared once, optional per-episode close, plain
(def) methods run off the event loop under their time limit, and a watchdog that names a plugin blocking it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
import typing
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field

from rstar_env import plugin, watchdog
from rstar_env.config import ConfigError, load_config
from rstar_env.plugin import (
    EpisodeContext,
    PluginError,
    RewardResult,
    ToolResult,
    function_schema,
    load_reward,
    load_tool,
    register,
    unregister,
)
from rstar_env.runtime import runtime
from rstar_env.testing import answer, make_env, play, tool_call

PROBLEM = {"problem": "What is 6 * 7?", "answer": "42"}


@pytest.fixture
def registered():
    added: list[type] = []

    def add(*classes: type) -> None:
        for cls in classes:
            register(cls)
            added.append(cls)

    yield add
    for cls in added:
        unregister(cls)


def test_one_import_place_has_what_a_plugin_author_needs():
    for name in (
        "hookimpl",
        "register",
        "load_tool",
        "load_reward",
        "load_sampler",
        "Tool",
        "Reward",
        "Sampler",
        "ToolResult",
        "RewardResult",
        "EpisodeContext",
        "function_schema",
        "TrajectorySummary",
        "PluginError",
        "invoke",
        "extract_answer",
    ):
        assert hasattr(plugin, name), name
        assert name in plugin.__all__, name
    assert plugin.extract_answer("<answer>so \\boxed{42}.</answer>") == "42"  # how a verifier reads an answer
    # The old places still work and are the same objects.
    from rstar_env.plugins import hookimpl
    from rstar_env.tool import EpisodeContext as OldContext

    assert plugin.hookimpl is hookimpl and plugin.EpisodeContext is OldContext


def test_loaders_and_env_attributes_are_typed_by_the_protocols(echo_plugins):
    assert typing.get_type_hints(load_tool)["return"] is plugin.Tool
    assert typing.get_type_hints(load_reward)["return"] is plugin.Reward
    assert typing.get_type_hints(plugin.load_sampler)["return"] is plugin.Sampler
    # What the env holds is what the protocols describe, whether it was given by name or as an instance.
    echo_tool, exact_reward = echo_plugins
    for tools, reward in ((["echo"], "exact_test"), ([echo_tool()], exact_reward())):
        env = make_env(tools=tools, reward=reward)
        try:
            assert list(env.tools) == ["echo"] and isinstance(env.tools["echo"], plugin.Tool), env.tools
            assert isinstance(env.reward_fn, plugin.Reward), env.reward_fn
        finally:
            env.close()


class ModelOptions(BaseModel):
    prefix: str = ">"
    repeat: int = Field(1, ge=1)


class ModelTool:
    """Options declared once, as a pydantic model the constructor receives; no close()."""

    name: ClassVar[str] = "model_tool"
    options_model: ClassVar[type[BaseModel]] = ModelOptions
    schema: ClassVar[dict[str, Any]] = function_schema("model_tool", "echo", {"text": {"type": "string"}}, ["text"])

    def __init__(self, options: ModelOptions) -> None:
        self.options = options

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        return ToolResult(self.options.prefix + arguments["text"] * self.options.repeat)


@dataclasses.dataclass
class DataclassOptions:
    case_sensitive: bool = False
    tags: list[str] = dataclasses.field(default_factory=list)


class NoInitReward:
    """A dataclass options_model and no constructor: the instance gets ``self.options``."""

    name: ClassVar[str] = "no_init_reward"
    options_model: ClassVar[type] = DataclassOptions
    options: DataclassOptions

    def score(self, response: str, answer: str) -> RewardResult:  # plain def: runs in a thread
        same = response == answer if self.options.case_sensitive else response.lower() == answer.lower()
        return RewardResult(float(same), response, "match" if same else "mismatch")


@dataclasses.dataclass
class DataclassSampler:
    """A dataclass plugin: its fields are its options, validated by type."""

    name: ClassVar[str] = "dataclass_sampler"
    keep_first: bool = True
    weight: float = 1.0

    def select(self, group, keep, rng):
        return list(range(keep)) if self.keep_first else None


def test_options_declared_once_in_three_forms(registered):
    registered(ModelTool, NoInitReward, DataclassSampler)
    tool = load_tool("model_tool", repeat=2)
    assert isinstance(tool.options, ModelOptions) and (tool.options.prefix, tool.options.repeat) == (">", 2)
    reward = load_reward("no_init_reward", case_sensitive=True)
    assert reward.options == DataclassOptions(case_sensitive=True, tags=[])
    sampler = plugin.load_sampler("dataclass_sampler", weight="0.5")  # validated and converted by type
    assert sampler.weight == 0.5 and sampler.keep_first is True

    with pytest.raises(PluginError, match=r"has no option\(s\) 'repat'; its options are: prefix, repeat"):
        load_tool("model_tool", repat=2)
    with pytest.raises(PluginError, match="repeat: Input should be greater than or equal to 1"):
        load_tool("model_tool", repeat=0)
    with pytest.raises(PluginError, match="case_sensitive"):
        load_reward("no_init_reward", case_sensitive="maybe")
    with pytest.raises(PluginError, match="weight"):
        plugin.load_sampler("dataclass_sampler", weight="heavy")
    with pytest.raises(ConfigError, match="has no option"):  # at config load, before anything is built
        load_config({"tools": [{"name": "model_tool", "options": {"colour": "red"}}]})


def test_a_tool_without_close_and_a_sync_reward_play_an_episode(registered, echo_plugins):
    registered(ModelTool, NoInitReward)
    env = make_env(tools=[{"name": "model_tool", "options": {"prefix": "#"}}], reward="no_init_reward")
    try:
        traj = play(env, [tool_call("model_tool", text="hi"), "42"], **PROBLEM)
    finally:
        env.close()
    assert traj.turns[0].tool_calls[0].result.text == "#hi"
    assert traj.reward == 1.0 and traj.end_reason == "answer"


class SlowSyncTool:
    """Blocking work in a plain def: runs in a thread, so the loop goes on and the time limit holds. It blocks until
    the test releases it (30 s at most, so a broken test does not hang), never for a set time."""

    name: ClassVar[str] = "slow_sync"
    call_timeout_s: ClassVar[float] = 0.5
    schema: ClassVar[dict[str, Any]] = function_schema("slow_sync", "blocks", {}, [])
    threads: ClassVar[set[str]] = set()
    release: ClassVar[threading.Event] = threading.Event()

    def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        type(self).threads.add(threading.current_thread().name)
        type(self).release.wait(30)
        return ToolResult("slept")

    def close(self, episode: EpisodeContext) -> None:  # a plain close runs in a thread too
        type(self).threads.add(threading.current_thread().name)


def test_a_sync_call_runs_in_a_thread_under_its_time_limit_without_stalling_other_envs(registered, echo_plugins):
    registered(SlowSyncTool)
    SlowSyncTool.release.clear()
    slow = make_env(tools=["slow_sync"], reward="exact_test")
    fast = make_env(tools=["echo"], reward="exact_test")
    blocked_at_end: dict[str, bool] = {}  # was the slow tool's thread still blocked when each step returned?

    async def step(env, name, action):
        await env.areset(options=PROBLEM)
        _, _, _, _, info = await env.astep(action)
        blocked_at_end[name] = not SlowSyncTool.release.is_set()
        return info["trajectory"].turns[0].tool_calls[0].result

    async def scenario():
        return await asyncio.gather(
            step(slow, "slow", tool_call("slow_sync")), step(fast, "fast", tool_call("echo", text="x"))
        )

    try:
        slow_result, fast_result = asyncio.run(scenario())
    finally:
        SlowSyncTool.release.set()  # the thread ends now
        slow.close()
        fast.close()
    # Both steps ended while the slow tool's thread was still blocked: call_timeout_s ended the slow call, not the
    # tool, and the other env's call was not held behind it. Nothing here depends on how long anything took.
    assert slow_result.error == "timeout" and fast_result.text == "x", (slow_result, fast_result)
    assert blocked_at_end == {"slow": True, "fast": True}
    assert SlowSyncTool.threads and all(name.startswith("rstar-env-plugin") for name in SlowSyncTool.threads)


class BlockingAsyncTool:
    """What a plugin must not do: block the event loop inside async def."""

    name: ClassVar[str] = "blocker"
    schema: ClassVar[dict[str, Any]] = function_schema("blocker", "blocks", {}, [])

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        time.sleep(1.2)
        return ToolResult("done")


def test_the_watchdog_names_a_plugin_that_blocks_the_loop(registered, echo_plugins, caplog):
    registered(BlockingAsyncTool)
    runtime().watchdog.reset()  # warned once per plugin: forget an earlier warning about this one
    watchdog.configure(0.3)
    env = make_env(tools=["blocker"], reward="exact_test")
    try:
        with caplog.at_level(logging.WARNING, logger="rstar_env.watchdog"):
            play(env, [tool_call("blocker"), answer(42)], **PROBLEM)
            for _ in range(300):  # the all-clear is logged once the loop beats again (30 s at most: a hang guard)
                if any(i.task == "tool 'blocker' call" and not i.ongoing for i in watchdog.incidents()):
                    break
                time.sleep(0.1)
    finally:
        env.close()
        watchdog.configure(2.0)
    messages = [r.getMessage() for r in caplog.records if r.name == "rstar_env.watchdog"]
    assert any("the tool 'blocker' plugin blocks the rstar-env event loop" in m for m in messages), messages
    totals = [i for i in watchdog.incidents() if i.task == "tool 'blocker' call" and not i.ongoing]
    # The 1.2 s block is measured as at least the 0.3 s beat's resolution below it; the upper bound only catches a
    # nonsense reading (a loaded machine stretches the block), not a slow one.
    assert totals and 0.9 < totals[-1].seconds < 60, totals
