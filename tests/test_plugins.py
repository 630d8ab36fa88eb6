"""Plugin discovery: built-ins through entry points, run-time registration, a real installed third-party package."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import ClassVar

import pytest

from rstar_env.plugins import PluginError, PluginRegistry, get_registry, list_plugins, load_tool, register, unregister
from rstar_env.testing import answer, play, tool_call

PKG_PLUGIN = textwrap.dedent(
    '''
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
    '''
)


@pytest.fixture(scope="module")
def installed_package(tmp_path_factory):
    """Build and pip-install a tiny plugin package (entry point in [project.entry-points.rstar_env])."""
    src = tmp_path_factory.mktemp("src")
    (src / "shout_plugin").mkdir()
    (src / "shout_plugin" / "__init__.py").write_text(PKG_PLUGIN)
    (src / "pyproject.toml").write_text(textwrap.dedent(
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
    ))
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(src)],
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
