"""Plugin discovery: built-ins through entry points, run-time registration, a real installed third-party package."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any, ClassVar, Protocol

import pytest
from pydantic import BaseModel, ConfigDict, Field

from rstar_env.config import ConfigError, load_config
from rstar_env.plugins import PluginError, PluginRegistry, get_registry, list_plugins, load_tool, register, unregister
from rstar_env.testing import answer, play, tool_call
from rstar_env.tool import function_schema, schema_problem, tool_schema, validate_arguments
from rstar_env.trajectory import ToolResult

PKG_PLUGIN = textwrap.dedent(
    """
    from rstar_env.plugins import hookimpl
    from rstar_env.tool import function_schema
    from rstar_env.trajectory import RewardResult, ToolResult


    class Shout:
        name = "shout"
        schema = function_schema("shout", "Upper-case text.", {"text": {"type": "string"}}, ["text"])

        async def call(self, arguments, episode):
            return ToolResult(arguments["text"].upper())

        async def close(self, episode):
            pass


    class Always:
        name = "always_one"

        async def score(self, response, answer):
            return RewardResult(1.0, None, "always")


    @hookimpl
    def rstar_env_tools():
        return [Shout]


    @hookimpl
    def rstar_env_rewards():
        return [Always]
    """
)


@pytest.fixture(scope="module")
def installed_package(tmp_path_factory):
    """Build and pip-install a tiny plugin package (entry point in [project.entry-points.rstar_env])."""
    src = tmp_path_factory.mktemp("src")
    (src / "shout_plugin").mkdir()
    (src / "shout_plugin" / "__init__.py").write_text(PKG_PLUGIN)
    (src / "pyproject.toml").write_text(
        textwrap.dedent(
            """
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "shout-plugin"
        version = "1.0"

        [project.entry-points.rstar_env]
        shout = "shout_plugin"
        """
        )
    )
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
    )
    sys.path.insert(0, str(target))
    yield target
    sys.path.remove(str(target))
    for name in [m for m in sys.modules if m.startswith("shout_plugin")]:
        del sys.modules[name]


def test_builtins_come_from_our_own_entry_points():
    tools = {i.name: i for i in list_plugins("tool")}
    assert tools["python"].source == "rstar-env"
    assert tools["python"].cls.__module__ == "rstar_plugins.tools.python"


def test_installed_package_is_discovered_and_usable(installed_package, math_env):
    registry = PluginRegistry()  # a fresh scan of entry points, as a new process would do
    tools = registry.plugins("tool")
    assert tools["shout"].source == "shout-plugin"
    assert registry.plugins("reward")["always_one"].source == "shout-plugin"
    shout = registry.build("tool", "shout", {})
    reward = registry.build("reward", "always_one", {})
    env = math_env(tools=[shout], reward=reward)
    traj = play(env, [tool_call("shout", text="hey"), answer("x")], problem="p", answer="y")
    assert traj.turns[0].tool_calls[0].result.text == "HEY" and traj.reward == 1.0


def test_runtime_registration_and_unknown_names(echo_plugins):
    assert "echo" in get_registry().plugins("tool")
    with pytest.raises(PluginError) as err:
        load_tool("nope")
    message = str(err.value)
    assert "unknown tool 'nope'" in message
    assert "echo (from runtime)" in message and "python (from rstar-env)" in message


def test_bad_options_name_the_plugin(echo_plugins):
    with pytest.raises(PluginError, match=r"tool 'echo' .* rejects options \['colour'\]"):
        load_tool("echo", colour="red")


def test_register_is_idempotent_and_usable_as_a_decorator(echo_plugins):
    echo_cls, _ = echo_plugins
    assert register(echo_cls) is echo_cls
    assert [i.name for i in list_plugins("tool")].count("echo") == 1


def test_name_clash_is_refused_and_rolled_back(echo_plugins):
    class OtherEcho:
        name: ClassVar[str] = "echo"

        async def call(self, arguments, episode): ...

    with pytest.raises(PluginError, match="two tool plugins are named 'echo'"):
        register(OtherEcho)
    assert get_registry().plugins("tool")["echo"].cls is echo_plugins[0]


def test_a_class_of_unknown_kind_is_refused():
    class Nothing:
        name = "nothing"

    with pytest.raises(PluginError, match="cannot tell what kind of plugin"):
        register(Nothing)


def test_a_plugin_without_a_name_is_refused():
    class Nameless:
        async def score(self, response, answer): ...

    with pytest.raises(PluginError, match="has no string `name`"):
        register(Nameless)
    unregister(Nameless)
    assert "nothing" not in get_registry().plugins("tool")


def test_hookimpl_objects_register_too():
    from rstar_env.plugins import hookimpl

    class Sampler:
        name = "first_k"

        def select(self, group, keep, rng):
            return list(range(keep)) if len(group) >= keep else None

    class Provider:
        @hookimpl
        def rstar_env_samplers(self):
            return [Sampler]

    provider = Provider()
    register(provider)
    try:
        assert get_registry().plugins("sampler")["first_k"].source == "runtime"
    finally:
        unregister(provider)
    assert "first_k" not in get_registry().plugins("sampler")


class _EchoArguments(BaseModel):
    text: str


class _Clock(Protocol):  # not runtime-checkable: pydantic cannot check it, so the parameter accepts anything
    def now(self) -> float: ...


class TypedTool:
    """A third-party tool with a plain keyword constructor and no options model."""

    name: ClassVar[str] = "typed_tool"
    schema: ClassVar[dict[str, Any]] = tool_schema(name, "Echo.", _EchoArguments)

    def __init__(
        self, timeout: float = 1.0, label=None, *, retries: int = 0, clock: _Clock | None = None, **extra: Any
    ) -> None:
        self.timeout, self.label, self.retries, self.clock, self.extra = timeout, label, retries, clock, extra

    def call(self, arguments: dict[str, Any], episode: Any) -> ToolResult:
        return ToolResult(arguments["text"])


class StrictTool(TypedTool):
    name: ClassVar[str] = "strict_tool"
    schema: ClassVar[dict[str, Any]] = tool_schema(name, "Echo.", _EchoArguments)

    def __init__(self, timeout: float = 1.0) -> None:  # no **kwargs: unknown keys are refused
        super().__init__(timeout)


@pytest.fixture
def typed_tools():
    register(TypedTool)
    register(StrictTool)
    yield
    unregister(TypedTool)
    unregister(StrictTool)


def test_a_plain_constructors_options_are_validated_by_its_annotations_at_load(typed_tools):
    with pytest.raises(ConfigError, match=r"tools\[0\]\.options\.timeout: Input should be a valid number.*'abc'"):
        load_config({"tools": [{"name": "typed_tool", "options": {"timeout": "abc"}}]})
    with pytest.raises(ConfigError, match=r"tools\[1\]\.options\.retries: Input should be a valid integer"):
        load_config({"tools": ["python", {"name": "typed_tool", "options": {"retries": 1.5}}]})
    with pytest.raises(ConfigError, match=r"tools\[0\]\.options: .*rejects options \['colour'\]"):
        load_config({"tools": [{"name": "strict_tool", "options": {"colour": "red"}}]})
    # Unannotated and uncheckable parameters accept anything; **extra accepts unknown keys.
    load_config({"tools": [{"name": "typed_tool", "options": {"label": [1, 2], "clock": "any", "colour": "red"}}]})


def test_a_plain_constructor_gets_its_options_converted_by_type(typed_tools):
    tool = load_tool("typed_tool", timeout="2.5", retries="3", label=7, colour="red")
    assert (tool.timeout, tool.retries, tool.label, tool.extra) == (2.5, 3, 7, {"colour": "red"})
    with pytest.raises(PluginError, match=r"tool 'typed_tool' .* rejects its options: timeout: Input should be"):
        load_tool("typed_tool", timeout=[1])


class _CalcArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expression: str = Field(description="e.g. 1 + 2")
    precision: int | None = Field(None, description="digits")


def test_tool_schema_is_derived_from_an_arguments_model_and_checked_as_written_by_hand():
    schema = tool_schema("calc", "Evaluate.", _CalcArguments)
    assert schema == {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate.",
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "e.g. 1 + 2"},
                    "precision": {"type": ["integer", "null"], "description": "digits"},
                },
                "required": ["expression"],
                "additionalProperties": False,
            },
        },
    }
    assert schema_problem(schema, "calc") is None
    assert tool_schema("t", "d", _EchoArguments) == function_schema("t", "d", {"text": {"type": "string"}}, ["text"])
    assert validate_arguments(schema, {"expression": "1"}) is None
    assert validate_arguments(schema, {"expression": "1", "precision": None}) is None
    assert validate_arguments(schema, {}) == "missing required argument(s): expression"
    assert validate_arguments(schema, {"expression": 1}) == "argument 'expression' must be of type string, got int"
    wrong = validate_arguments(schema, {"expression": "1", "precision": "2"})
    assert wrong == "argument 'precision' must be of type integer or null, got str"
    assert "unknown argument(s): colour" in validate_arguments(schema, {"expression": "1", "colour": 1})


def test_the_env_checks_arguments_against_a_derived_schema(typed_tools, math_env):
    env = math_env(tools=["typed_tool"], reward="format")
    traj = play(
        env,
        [tool_call("typed_tool"), tool_call("typed_tool", text=3), tool_call("typed_tool", text="hi"), answer("x")],
        problem="p",
        answer="x",
    )
    calls = [turn.tool_calls[0] for turn in traj.turns[:3]]
    assert [c.error for c in calls] == ["bad_call", "bad_call", None]
    assert "missing required argument(s): text" in calls[0].result.text and calls[2].result.text == "hi"


# -- the registry belongs to the runtime; hooks are called through pluggy ----------------------------------------
def test_the_process_registry_is_the_runtimes_and_can_be_swapped_for_a_block():
    from rstar_env.plugins import use_registry
    from rstar_env.runtime import runtime

    process = get_registry()
    assert runtime().component("plugins", PluginRegistry) is process
    own = PluginRegistry(load_entrypoints=False)
    with use_registry(own):
        assert get_registry() is own
        assert list_plugins("tool") == []  # checked against the registry in use, not the process's
    assert get_registry() is process and "python" in process.plugins("tool")


def test_a_forked_child_registers_although_a_parent_thread_held_the_registry_lock(echo_plugins):
    import threading

    from .._forked import in_forked_child

    registry = get_registry()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with registry._lock:
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()

    class Late:
        name = "late"
        schema = function_schema("late", "late", {}, [])

        async def call(self, arguments: dict[str, Any], episode: Any) -> ToolResult:
            return ToolResult("late")

    def child() -> list[str]:
        register(Late)  # the parent's holder thread does not exist here: its copy of the lock must not block
        return sorted(get_registry().plugins("tool"))

    try:
        names = in_forked_child(child, timeout_s=20)
    finally:
        release.set()
        holder.join()
    assert "late" in names and "late" not in get_registry().plugins("tool")


def test_hooks_are_called_through_pluggy_so_a_wrapper_hookimpl_works():
    from types import SimpleNamespace

    from rstar_env.plugins import hookimpl

    class Wrapped:
        name = "wrapped"
        schema = function_schema("wrapped", "w", {}, [])

        async def call(self, arguments: dict[str, Any], episode: Any) -> ToolResult:
            return ToolResult("w")

    @hookimpl(wrapper=True)
    def rstar_env_tools():  # a pluggy wrapper: adds one more result to the implementations' (a list per impl)
        found = yield
        return [*found, [Wrapped]]

    provider = SimpleNamespace(rstar_env_tools=rstar_env_tools)
    registry = PluginRegistry(load_entrypoints=False)
    registry.register(provider)
    assert registry.plugins("tool")["wrapped"].cls is Wrapped
