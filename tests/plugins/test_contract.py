"""The plugin contract, tried as a plugin author would: each mistake of issue 20 made in a throwaway distribution
that is really pip-installed, and what the user then sees (a working registry, a named error, a bounded time, an
``env_error`` count, no stale score)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
from click.testing import CliRunner

import rstar_env.plugins as plugins_module
from rstar_env.cli import main
from rstar_env.config import ConfigError, load_config
from rstar_env.plugins import PluginError, PluginLoadWarning, PluginRegistry, load_sampler, load_tool
from rstar_env.rollout.evaluate import evaluate, read_trajectories
from rstar_env.sampler import SamplerError, checked_select
from rstar_env.testing import answer, play, tool_call
from rstar_env.trajectory import Trajectory

CARELESS = textwrap.dedent(
    """
    import asyncio

    from pydantic import BaseModel

    from rstar_env.plugins import hookimpl
    from rstar_env.tool import function_schema
    from rstar_env.trajectory import RewardResult, ToolResult


    class Calculator:
        name = "adder"
        schema = function_schema("adder", "Evaluate a + b.", {"a": {"type": "number"}, "b": {"type": "number"}},
                                 ["a", "b"])

        async def call(self, arguments, episode):
            return ToolResult(str(arguments["a"] + arguments["b"]))

        async def close(self, episode):
            pass


    class StringSchema(Calculator):
        name = "string_schema"
        schema = "add two numbers"


    class OtherName(Calculator):
        name = "other_name"   # the schema still says "adder"


    class NoFunction(Calculator):
        name = "no_function"
        schema = {"type": "function", "name": "no_function"}


    class BadRequired(Calculator):
        name = "bad_required"
        schema = function_schema("bad_required", "x", {"a": {"type": "number"}}, ["a", "b"])


    class Sleepy(Calculator):
        name = "sleepy"
        schema = function_schema("sleepy", "Sleeps.", {}, [])

        woke = 0  # calls that slept their 30 s out: none, when the limit ends them

        async def call(self, arguments, episode):
            await asyncio.sleep(30)
            Sleepy.woke += 1
            return ToolResult("woke up")


    class Hasty(Sleepy):
        name = "hasty"
        schema = function_schema("hasty", "Sleeps, but asks for a short limit.", {}, [])
        call_timeout_s = 0.2


    class ExactOptions(BaseModel):
        case_sensitive: bool = True
        strip: bool = True


    class ExactMatch:
        name = "exact_careless"
        options_model = ExactOptions

        def __init__(self, case_sensitive, strip):
            self.case_sensitive, self.strip = case_sensitive, strip

        async def score(self, response, answer):
            got = response.rsplit("boxed{", 1)[-1].split("}", 1)[0] if "boxed{" in response else None
            if got is None:
                return RewardResult(0.0, None, "no_answer")
            a, b = (got, answer) if self.case_sensitive else (got.lower(), answer.lower())
            return RewardResult(float(a == b), got, "match" if a == b else "mismatch")


    class AlwaysOne:
        name = "always_one_careless"

        async def score(self, response, answer):
            return RewardResult(1.0, None, "always")


    class Raising:
        name = "raising"

        async def score(self, response, answer):
            raise RuntimeError("my reward plugin has a bug")


    class Blocking:
        name = "blocking"

        async def score(self, response, answer):
            await asyncio.sleep(30)
            return RewardResult(1.0, None, "late")


    class SyncBlocking:
        name = "sync_blocking"

        async def score(self, response, answer):
            import time

            time.sleep(0.5)  # blocks the event loop: cannot be interrupted, but is not scored
            return RewardResult(1.0, None, "late")


    class KeepAll:
        name = "keep_all"

        def select(self, group, keep, rng):
            return list(range(len(group)))


    class OutOfRange:
        name = "out_of_range"

        def select(self, group, keep, rng):
            return [len(group) + i for i in range(keep)]


    class KeepShortest:
        name = "fewest_turns"

        def select(self, group, keep, rng):
            order = sorted(range(len(group)), key=lambda i: group[i].num_assistant_turns)
            return order[:keep] if len(group) >= keep else []


    @hookimpl
    def rstar_env_tools():
        return [Calculator, StringSchema, OtherName, NoFunction, BadRequired, Sleepy, Hasty]


    @hookimpl
    def rstar_env_rewards():
        return [ExactMatch, AlwaysOne, Raising, Blocking, SyncBlocking]


    @hookimpl
    def rstar_env_samplers():
        return [KeepAll, OutOfRange, KeepShortest]
    """
)

BROKEN_HOOK = textwrap.dedent(
    """
    from rstar_env.plugins import hookimpl


    @hookimpl
    def rstar_env_tools():
        raise RuntimeError("cannot build my tool list")
    """
)


def _distribution(root, name: str, module: str, source: str, entry_points: dict[str, str]):
    src = root / name
    (src / module).mkdir(parents=True)
    (src / module / "__init__.py").write_text(source)
    eps = "\n".join(f'{key} = "{value}"' for key, value in entry_points.items())
    (src / "pyproject.toml").write_text(
        f'[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        f'[project]\nname = "{name}"\nversion = "1.0"\n\n[project.entry-points.rstar_env]\n{eps}\n'
    )
    return src


@pytest.fixture(scope="module")
def careless(tmp_path_factory):
    """Two pip-installed distributions: ``careless-plugins`` (valid entry point, mistaken plugins) and
    ``broken-plugins`` (one entry point naming a missing module, one whose hook raises). The process-wide
    registry is rescanned with them installed, as a new process would, and restored afterwards."""
    root = tmp_path_factory.mktemp("dists")
    good = _distribution(root, "careless-plugins", "careless_plugins", CARELESS, {"careless": "careless_plugins"})
    bad = _distribution(
        root,
        "broken-plugins",
        "broken_plugins",
        BROKEN_HOOK,
        {"missing": "broken_plugins_not_there.rstar", "raising_hook": "broken_plugins"},
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
            str(good),
            str(bad),
        ],
        check=True,
    )
    sys.path.insert(0, str(target))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fresh = PluginRegistry()
    with plugins_module.use_registry(fresh):
        yield [w for w in caught if issubclass(w.category, PluginLoadWarning)]
    sys.path.remove(str(target))
    for name in [m for m in sys.modules if m.startswith(("careless_plugins", "broken_plugins"))]:
        del sys.modules[name]


PROBLEM = {"problem": "What is 2 + 3?", "answer": "5"}


# -- 1. one broken entry point breaks nothing else -------------------------------------------------------------
def test_a_broken_entry_point_is_skipped_with_one_warning_naming_it(careless):
    messages = [str(w.message) for w in careless if "broken-plugins" in str(w.message)]
    assert len(messages) == 2
    missing = next(m for m in messages if "missing = broken_plugins_not_there.rstar" in m)
    assert "broken-plugins" in missing and "ModuleNotFoundError" in missing
    raising = next(m for m in messages if "raising_hook" in m)
    assert "broken-plugins" in raising and "cannot build my tool list" in raising
    registry = plugins_module.get_registry()
    assert {"python", "adder"} <= set(registry.plugins("tool"))
    assert registry.plugins("tool")["adder"].source == "careless-plugins"


def test_everything_else_keeps_working(careless, math_env):
    import gymnasium as gym

    env = gym.make("rstar_env/MathTool-v0", tools=["python", "adder"], reward="math")
    try:
        env.reset(options=PROBLEM)
        _, _, _, _, info = env.step(tool_call("adder", a=2, b=3))
        assert info["trajectory"].turns[0].tool_calls[0].result.text == "5"
    finally:
        env.close()


def test_plugins_command_lists_failures_and_check_fails(careless):
    listing = CliRunner().invoke(main, ["plugins"])
    assert listing.exit_code == 0, listing.output
    assert "failed to load" in listing.output and "broken-plugins" in listing.output
    assert "adder" in listing.output
    check = CliRunner().invoke(main, ["plugins", "--check", "--json"])
    assert check.exit_code == 1
    assert "plugin entry point(s) failed to load" in check.output and "raising_hook" in check.output


# -- 2. tool schemas are checked when the tool is built ---------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("string_schema", "schema must be a dict"),
        ("other_name", "'adder', but the plugin's name is 'other_name'"),
        ("no_function", "has no 'function' mapping"),
        ("bad_required", "required argument(s) 'b' are not among the properties ['a']"),
    ],
)
def test_a_bad_schema_is_refused_naming_the_tool(careless, math_env, name, problem):
    with pytest.raises(PluginError) as err:
        load_tool(name)
    assert f"tool {name!r}" in str(err.value) and problem in str(err.value)
    with pytest.raises(PluginError, match=name):
        math_env(tools=[name])
    cls = plugins_module.get_registry().get("tool", name)
    with pytest.raises(PluginError, match="invalid schema"):  # an instance passed to the env is checked too
        math_env(tools=[cls()])


# -- 3. a reward plugin that raises is a system failure, counted ---------------------------------------------------
class ScriptedPolicy:
    """Answers each problem with its gold answer (or ``text``), in one turn."""

    tokenizer = None

    def __init__(self, text: str | None = None) -> None:
        self.text = text

    async def generate(self, requests):
        from rstar_env.rollout.policy import Generation

        return [Generation(answer(self.text or r.trajectory.answer)) for r in requests]

    async def aclose(self):
        pass


ROWS = [{"id": f"p{i}", "problem": f"{i} + 0 = ?", "answer": f"Ans{i}"} for i in range(3)]


def test_a_raising_reward_ends_as_env_error_and_is_counted(careless, math_env, tmp_path):
    env = math_env(tools=["adder"], reward="raising")
    env.reset(options=PROBLEM)
    _, reward, _, truncated, info = env.step(answer(5))
    traj = info["trajectory"]
    assert truncated and traj.end_reason == "env_error" and traj.reward_result is None and reward == 0.0
    assert "my reward plugin has a bug" in info["error"]
    summary = asyncio.run(evaluate(ScriptedPolicy(), ROWS, out=tmp_path / "e.jsonl", tools=[], reward="raising"))
    assert summary["env_errors"] == 3 and summary["scored"] == 0
    assert summary["pass@1"] is None and summary["mean_reward"] is None


# -- 4. resume is keyed to what scored the records ---------------------------------------------------------------
def test_resume_rescoring_with_other_reward_settings_never_reports_stale_scores(careless, tmp_path):
    out = tmp_path / "eval.jsonl"
    policy = ScriptedPolicy()  # answers each gold answer ("Ans0", ...) as it is written
    run = lambda reward: asyncio.run(evaluate(policy, ROWS, out=out, tools=[], reward=reward))  # noqa: E731
    first = run("always_one_careless")
    assert first["pass@1"] == 1.0 and first["resumed"] == 0
    again = run("always_one_careless")
    assert again["resumed"] == 3 and again["rescored_stale"] == 0 and again["pass@1"] == 1.0
    # Another reward plugin: every record is run again, and only its scores are reported.
    other = run({"name": "exact_careless", "options": {"case_sensitive": True}})
    assert other["resumed"] == 0 and other["rescored_stale"] == 3 and other["pass@1"] == 1.0
    # The same reward plugin with other options is other settings too.
    policy.text = "ans0"  # now wrong for every row
    changed = run({"name": "exact_careless", "options": {"case_sensitive": True, "strip": False}})
    assert changed["resumed"] == 0 and changed["rescored_stale"] == 3 and changed["pass@1"] == 0.0
    keys = {tuple(sorted(t.metadata["settings"].items())) for t in read_trajectories(out)}
    assert len(keys) == 3 and all(dict(k)["reward"] in ("always_one_careless", "exact_careless") for k in keys)


# -- 5. sampler output is checked, naming the sampler ----------------------------------------------------------
def _group(n: int) -> list[Trajectory]:
    return [Trajectory(problem="p", answer="1", end_reason="answer", reward=float(i % 2)) for i in range(n)]


@pytest.mark.parametrize(
    ("name", "why"), [("keep_all", "4 indices, not 2"), ("out_of_range", "index 4 is out of range")]
)
def test_a_sampler_returning_bad_indices_is_named_at_the_first_group(careless, name, why):
    torch = pytest.importorskip("torch")
    del torch
    from rstar_trainers.local.trainer import select_groups

    sampler = load_sampler(name)
    with pytest.raises(SamplerError) as err:
        select_groups(sampler, [_group(4), _group(4)], 2, np.random.default_rng(0))
    assert f"sampler {name!r} returned" in str(err.value) and why in str(err.value)


def test_a_valid_sampler_and_an_empty_drop_pass(careless):
    sampler = load_sampler("fewest_turns")
    assert checked_select(sampler, _group(4), 2, np.random.default_rng(0)) == [0, 1]
    assert checked_select(sampler, _group(1), 2, np.random.default_rng(0)) is None  # [] drops the group


# -- 6. plugin names and options are checked when the config loads ---------------------------------------------------
def test_a_misspelt_name_fails_load_config_listing_the_registered(careless):
    with pytest.raises(ConfigError) as err:
        load_config({"sampler": "fewest_turnz"})
    message = str(err.value)
    assert "\n" not in message and "sampler: unknown sampler 'fewest_turnz'" in message
    assert "fewest_turns (from careless-plugins)" in message and "roc (from rstar-env)" in message


def test_options_are_validated_by_the_plugins_options_model(careless):
    with pytest.raises(ConfigError, match=r"reward.options: .*has no option\(s\) 'case_sensitve'"):
        load_config({"reward": {"name": "exact_careless", "options": {"case_sensitve": False}}})
    with pytest.raises(ConfigError, match=r"case_sensitive: Input should be a valid boolean"):
        load_config({"reward": {"name": "exact_careless", "options": {"case_sensitive": "sometimes"}}})
    with pytest.raises(ConfigError, match=r"tools\[0\].options: .*rejects options \['colour'\]"):
        load_config({"tools": [{"name": "adder", "options": {"colour": "red"}}]})
    cfg = load_config({"reward": {"name": "exact_careless", "options": {"case_sensitive": False}}})
    assert cfg.reward.options == {"case_sensitive": False}


@pytest.mark.parametrize("command", ["train", "eval", "chat"])
def test_commands_reject_a_misspelt_sampler_in_one_line_before_loading_a_model(careless, tmp_path, command):
    config = tmp_path / "run.yaml"
    config.write_text("sampler: fewest_turnz\ntrainer: {backend: local, model: /nonexistent}\n")
    model = [] if command == "train" else ["--model", "/nonexistent"]
    result = CliRunner().invoke(main, [command, "--config", str(config), *model], input="")
    assert result.exit_code == 1
    assert "Traceback" not in result.output and not isinstance(result.exception, PluginError)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown sampler 'fewest_turnz'" in lines[0]


# -- 7. every tool call and every scoring is bounded ----------------------------------------------------------
def test_a_slow_tool_is_stopped_as_a_timeout_tool_error(careless, math_env):
    env = math_env(tools=["sleepy", "hasty"], reward="exact_careless", tool_timeout_s=0.3)
    traj = play(env, [tool_call("sleepy"), tool_call("hasty"), answer(5)], problem="2+3?", answer="5")
    slow, hasty = traj.turns[0].tool_calls[0], traj.turns[1].tool_calls[0]
    assert slow.error == "timeout" and "did not answer within 0.3 s" in slow.result.text
    assert hasty.error == "timeout" and "within 0.2 s" in hasty.result.text  # the plugin asked for less
    assert traj.reward == 1.0
    # The tools sleep 30 s each: the limit, not the tool, ended the calls (cancelled, neither slept its time out).
    import careless_plugins

    assert careless_plugins.Sleepy.woke == 0


def test_a_blocking_reward_ends_the_episode_as_reward_timeout(careless, math_env):
    env = math_env(tools=[], reward="blocking", reward_timeout_s=0.3)
    env.reset(options=PROBLEM)
    _, reward, _, truncated, info = env.step(answer(5))
    assert truncated and info["end_reason"] == "env_error" and reward == 0.0
    assert info["error"].startswith("reward_timeout: the 'blocking' reward plugin did not finish within 0.3 s")
    assert info["trajectory"].reward_result is None


def test_a_reward_that_blocks_the_loop_is_not_scored_either(careless, math_env):
    env = math_env(tools=[], reward="sync_blocking", reward_timeout_s=0.2)
    env.reset(options=PROBLEM)
    *_, info = env.step(answer(5))
    assert info["end_reason"] == "env_error" and info["error"].startswith("reward_timeout")


def test_time_limits_are_config_options(careless):
    cfg = load_config({"env": {"tool_timeout_s": 5, "reward_timeout_s": 7}})
    assert (cfg.env.tool_timeout_s, cfg.env.reward_timeout_s) == (5, 7)
    assert load_config().env.tool_timeout_s <= 60
    with pytest.raises(ConfigError, match="tool_timeout_s"):
        load_config({"env": {"tool_timeout_s": 0}})


# -- 8. run-tool checks arguments as the env does ------------------------------------------------------------------
def test_run_tool_validates_arguments(careless):
    bad = CliRunner().invoke(main, ["run-tool", "adder", "--arguments", '{"a": 1, "c": 2}'])
    assert bad.exit_code == 1 and "adder: missing required argument(s): b" in bad.output
    assert not isinstance(bad.exception, KeyError)
    good = CliRunner().invoke(main, ["run-tool", "adder", "--arguments", '{"a": 1, "b": 2}'])
    assert good.exit_code == 0 and '"text": "3"' in good.output


def test_a_provider_with_a_misspelt_hook_or_a_non_class_is_refused_whole():
    from types import SimpleNamespace

    from rstar_env.plugins import hookimpl, register

    @hookimpl
    def rstar_env_tool():  # singular: no such hook
        return []

    with pytest.raises(PluginError, match="rstar_env_tool, which is no rstar_env hook"):
        register(SimpleNamespace(rstar_env_tool=rstar_env_tool))

    @hookimpl
    def rstar_env_rewards():
        return ["exact"]

    with pytest.raises(PluginError, match="is not a class"):
        register(SimpleNamespace(rstar_env_rewards=rstar_env_rewards))
    assert "exact" not in plugins_module.get_registry().plugins("reward")


def test_eval_exits_1_on_a_raising_reward_and_reruns_after_a_fix(careless, tmp_path):
    import json

    from rstar_env_testkit.replay_server import ReplayServer, reply

    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{i}", "problem": f"{i} + 7 - {i}?", "answer": "7"}) + "\n" for i in range(3))
    )
    out = tmp_path / "eval.jsonl"

    def run(reward: str):
        config = tmp_path / f"{reward}.yaml"
        config.write_text(f"tools: []\nreward: {reward}\n")
        with ReplayServer([], default=reply("<answer>\\boxed{7}</answer>")) as server:
            result = CliRunner().invoke(
                main,
                [
                    "eval",
                    "--served-model",
                    "m",
                    "--dataset",
                    str(data),
                    "--out",
                    str(out),
                    "--config",
                    str(config),
                    "--json",
                    "--endpoint",
                    server.base_url,
                ],
            )
        summary, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{") :])
        return result, summary

    result, summary = run("raising")
    assert result.exit_code == 1 and summary["env_errors"] == 3 and summary["pass@1"] is None
    result, summary = run("exact_careless")  # the reward plugin fixed: the failed episodes run again, and are scored
    assert result.exit_code == 0 and summary["env_errors"] == 0 and summary["pass@1"] == 1.0
    assert summary["resumed"] == 0 and summary["scored"] == 3
    result, summary = run("always_one_careless")  # another reward: nothing of the last run is reported as current
    assert result.exit_code == 0 and summary["rescored_stale"] == 3 and summary["resumed"] == 0
    assert "were run again" in " ".join(result.output.split())


def test_cancelling_a_step_cancels_the_tool_call_it_waits_for(careless, math_env):
    from rstar_env.testing import make_env

    async def scenario():
        env = make_env(tools=["sleepy"], reward="exact_careless")
        try:
            await env.areset(options=PROBLEM)
            step = asyncio.ensure_future(env.astep(tool_call("sleepy")))
            await asyncio.sleep(0.1)
            calls = [t for t in asyncio.all_tasks() if t is not step and t.get_name() == "tool 'sleepy' call"]
            assert len(calls) == 1
            step.cancel()
            with pytest.raises(asyncio.CancelledError):
                await step
            await asyncio.sleep(0)
            assert calls[0].done() and calls[0].cancelled()
        finally:
            await env.aclose()

    asyncio.run(scenario())
