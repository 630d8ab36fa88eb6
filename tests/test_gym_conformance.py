"""What a gymnasium user reaches for: the registered env with its checker, the standard wrappers (token ids and
TimeLimit through them), pickle and deepcopy, and no sandbox process outliving its env."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle
import subprocess
import sys
import textwrap
import threading
import warnings

import gymnasium
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.wrappers import RecordEpisodeStatistics

from rstar_env import ENV_ID, TokenAction
from rstar_env.env import MathToolEnv
from rstar_env.testing import answer, tool_call
from rstar_env.wrappers import EnvAPI, ScoredTimeLimit

PROBLEM = {"problem": "What is 6 * 7?", "answer": "42"}


@pytest.fixture
def make(echo_plugins):
    built = []

    def factory(**options):
        env = gymnasium.make(ENV_ID, **{"tools": ["echo"], "reward": "exact_test", **options})
        built.append(env)
        return env

    yield factory
    for env in built:
        env.close()


def test_registered_env_runs_gymnasiums_checker_and_passes_it(make):
    env = make(dataset="arithmetic:n=20")
    assert "PassiveEnvChecker" in str(env)  # registered with the checker on
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checker warns on any fault of the first reset and step
        env.reset(seed=0)
        env.step(tool_call("echo", text="x"))
    check_env(env.unwrapped, skip_render_check=True)


def test_token_ids_pass_through_gymnasium_wrappers(make):
    env = RecordEpisodeStatistics(make(max_episode_steps=5))  # TimeLimit, OrderEnforcing, checker, and one more
    env.reset(options=PROBLEM)
    ids, lps = [11, 12, 13], [-0.5, -0.25, -0.125]
    _, _, _, _, info = env.step(TokenAction(tool_call("echo", text="hi"), token_ids=ids, logprobs=lps))
    turn = info["trajectory"].turns[0]
    assert (turn.action_token_ids, turn.action_logprobs, turn.action_tokens) == (ids, lps, 3)
    assert type(turn.action) is str and turn.action == tool_call("echo", text="hi")
    _, reward, terminated, _, info = env.step(TokenAction(answer(42), token_ids=[7]))
    assert (reward, terminated, info["trajectory"].turns[1].action_token_ids) == (1.0, True, [7])


def test_env_api_wrapper_gives_token_keywords_and_the_async_api_through_make(make):
    env = EnvAPI(make(max_episode_steps=2))
    assert "TimeLimit" in str(env)
    env.reset(options=PROBLEM)
    _, _, _, _, info = env.step(tool_call("echo", text="hi"), token_ids=[5, 6], logprobs=[-0.1, -0.2])
    assert (info["trajectory"].turns[0].action_token_ids, info["trajectory"].turns[0].action_logprobs) == (
        [5, 6],
        [-0.1, -0.2],
    )
    with pytest.raises(ValueError, match="pass them once"):
        env.step(TokenAction("x", token_ids=[1]), token_ids=[2])

    async def episode():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():  # the caller's loop keeps running while the wrapped env steps on its own thread
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        await env.areset(options=PROBLEM)
        first = await env.astep(tool_call("echo", text="x"), token_ids=[1])
        second = await env.astep(tool_call("echo", text="y") + answer(42))  # TimeLimit counts astep: cut here
        stop.set()
        await task
        return first, second, ticks

    first, second, ticks = asyncio.run(episode())
    assert first[4]["trajectory"].turns[0].action_token_ids == [1] and not first[3]
    assert (second[1], second[3], second[4]["end_reason"]) == (1.0, True, "time_limit")
    assert ticks > 0


def test_token_action_and_keywords_must_agree(math_env, echo_plugins):
    env = math_env(tools=["echo"], reward="exact_test")
    env.reset(options=PROBLEM)
    with pytest.raises(ValueError, match="token_ids were passed both"):
        env.step(TokenAction(answer(42), token_ids=[1]), token_ids=[2])
    with pytest.raises(ValueError, match="one logprob per generated token"):
        TokenAction("x", token_ids=[1, 2], logprobs=[0.0])


@pytest.mark.parametrize("how", ["env option", "reset option", "ScoredTimeLimit", "EnvAPI over make"])
def test_time_limit_truncation_is_scored_and_named(make, how):
    options = dict(PROBLEM)
    if how == "env option":
        env = MathToolEnv(tools=["echo"], reward="exact_test", max_episode_steps=2)
    elif how == "reset option":
        env = make()
        options["max_episode_steps"] = 2
    elif how == "ScoredTimeLimit":
        env = ScoredTimeLimit(make(), 2)
    else:
        env = EnvAPI(make(max_episode_steps=2))  # reads the limit of the TimeLimit that make added, from its spec
    env.reset(options=options)
    _, _, _, truncated, info = env.step(tool_call("echo", text="x"))
    assert not truncated and info["end_reason"] is None
    # The cut step holds a tool call and an answer: scored by the env's rules, like the turn limit.
    _, reward, terminated, truncated, info = env.step(tool_call("echo", text="y") + answer(42))
    assert (reward, terminated, truncated, info["end_reason"]) == (1.0, False, True, "time_limit")
    assert info["trajectory"].reward_result.reason == "match" and info["trajectory"].truncated
    env.reset(options=options)  # a new episode starts from a fresh count
    _, _, _, truncated, info = env.step(tool_call("echo", text="x"))
    assert not truncated and info["end_reason"] is None
    env.close()


def test_a_reset_option_limits_that_episode_only(make):
    env = make().unwrapped
    env.reset(options={**PROBLEM, "max_episode_steps": 1})
    assert env.time_limit == 1
    env.reset(options=PROBLEM)
    assert env.time_limit is None
    with pytest.raises(ValueError, match=r"max_episode_steps.*positive int"):
        env.reset(options={**PROBLEM, "max_episode_steps": 0})


@pytest.mark.parametrize("limit", [1, 2])
def test_gym_make_max_episode_steps_is_scored_as_time_limit(make, limit):
    # The way every gymnasium user limits an episode: the env finds the TimeLimit make put around it, so the step
    # that TimeLimit cuts is scored by the env's rules, not cut unscored from outside.
    env = make(max_episode_steps=limit)
    for _ in range(2):  # a second episode is limited the same way
        env.reset(options=PROBLEM)
        assert env.unwrapped.time_limit == limit
        for _ in range(limit - 1):
            _, _, _, truncated, info = env.step(tool_call("echo", text="x"))
            assert not truncated and info["end_reason"] is None
        _, reward, terminated, truncated, info = env.step(tool_call("echo", text="y") + answer(42))
        assert (reward, terminated, truncated, info["end_reason"]) == (1.0, False, True, "time_limit")
        assert info["trajectory"].reward_result.reason == "match"
    env.close()


def test_gym_make_step_limit_and_a_smaller_reset_option(make):
    env = make(max_episode_steps=3)
    env.reset(options={**PROBLEM, "max_episode_steps": 1})
    assert env.unwrapped.time_limit == 1
    _, _, _, truncated, info = env.step(tool_call("echo", text="x"))
    assert (truncated, info["end_reason"]) == (True, "time_limit")
    env.close()


def test_async_api_after_a_scored_reset_keeps_the_time_limit(make):
    env = ScoredTimeLimit(make(), 1)
    env.reset(options=PROBLEM)
    obs, _, _, truncated, info = env.unwrapped.step(tool_call("echo", text="x"))
    assert (truncated, info["end_reason"], obs) == (True, "time_limit", "")

    async def episode():
        await env.unwrapped.areset(options={**PROBLEM, "max_episode_steps": 1})  # areset reads it as reset does
        return await env.unwrapped.astep(tool_call("echo", text="x"))

    _, _, _, truncated, info = asyncio.run(episode())
    assert (truncated, info["end_reason"]) == (True, "time_limit")


def test_dropped_env_frees_its_sandbox_pool_under_pytest():
    """``del env; gc.collect()`` in a test function frees the env and every process of its sandbox pool."""
    import gc
    import time
    import weakref

    psutil = pytest.importorskip("psutil")
    me = psutil.Process()

    def alive() -> set[int]:
        pids = set()
        for p in me.children(recursive=True):
            try:
                if p.status() != psutil.STATUS_ZOMBIE:
                    pids.add(p.pid)
            except psutil.NoSuchProcess:
                pass
        return pids

    before = alive()
    env = gymnasium.make(ENV_ID, tools=["python"], reward="math")
    env.reset(options={"problem": "p", "answer": "1"})
    assert "4913" in env.step(tool_call("python", code="17 ** 3"))[0]
    started = alive() - before
    assert started, "the sandbox pool did not start"
    ref = weakref.ref(env.unwrapped)
    del env
    gc.collect()
    assert ref() is None, f"the env is still referenced by: {[type(r).__name__ for r in gc.get_referrers(ref())]}"
    deadline = time.monotonic() + 20
    while alive() & started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive() & started, f"{len(alive() & started)} of the pool's {len(started)} processes outlived it"


def test_pickle_and_deepcopy_keep_config_dataset_and_seed_state(make):
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(50)]
    env = make(dataset=rows, max_turns=3, max_length=5000)
    env.reset(seed=3)
    clones = [pickle.loads(pickle.dumps(env)), copy.deepcopy(env)]
    following = env.reset()[1]["trajectory"].problem  # the original's next unseeded draw
    for clone in clones:
        inner = clone.unwrapped
        assert (inner.settings.max_turns, inner.settings.max_length) == (3, 5000)
        assert len(inner._dataset) == 50 and inner.tools["echo"] is not env.unwrapped.tools["echo"]
        assert clone.reset()[1]["trajectory"].problem == following  # the random state was copied
        for seed in (0, 7):
            assert clone.reset(seed=seed)[0] == env.reset(seed=seed)[0]
        clone.close()
    env.close()  # the copies were independent: closing the original leaves a fresh copy working
    fresh = copy.deepcopy(env)
    fresh.reset(options=PROBLEM)
    assert "hi" in fresh.step(tool_call("echo", text="hi"))[0]
    fresh.close()


def test_a_copy_does_not_carry_the_running_episode(make):
    env = make()
    env.reset(options=PROBLEM)
    clone = copy.deepcopy(env.unwrapped)
    with pytest.raises(gymnasium.error.ResetNeeded):
        clone.step(answer(42))
    clone.close()


def test_unpicklable_plugin_instance_says_to_pass_it_by_name(echo_plugins):
    echo_tool, _ = echo_plugins
    tool = echo_tool()
    tool.lock = threading.Lock()
    env = MathToolEnv(tools=[tool], reward="exact_test")
    with pytest.raises(TypeError, match=r"'echo' plugin was given as an instance .* Pass plugins by name"):
        pickle.dumps(env)
    env.close()


# A fresh interpreter, so the count sees only this env's sandbox pool (not one another test left warm).
_PROCESSES = textwrap.dedent(
    """
    import copy, gc, json, time
    import gymnasium, psutil, rstar_env
    from rstar_env.testing import tool_call

    me = psutil.Process()
    def count():
        alive = 0
        for p in me.children(recursive=True):
            try:
                alive += p.status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:  # exited between the listing and the look
                pass
        return alive
    def settle(target, timeout=20.0):
        end = time.monotonic() + timeout
        while count() > target and time.monotonic() < end:
            time.sleep(0.05)
        return count()
    def run(env, code):
        env.reset(options={"problem": "p", "answer": "1"})
        return env.step(tool_call("python", code=code))[0]

    out = {"base": count()}
    env = gymnasium.make("rstar_env/MathTool-v0", tools=["python"], reward="math")
    out["first"] = "4913" in run(env, "17 ** 3")
    out["running"] = count()
    clone = copy.deepcopy(env)
    env.close()
    env.close()  # idempotent
    out["clone_after_close"] = "4913" in run(clone, "17 ** 3")
    clone.close()
    out["after_close"] = settle(out["base"])
    dropped = gymnasium.make("rstar_env/MathTool-v0", tools=["python"], reward="math")
    run(dropped, "1 + 1")
    out["dropped_running"] = count()
    del dropped
    gc.collect()
    out["after_gc"] = settle(out["base"])
    print(json.dumps(out))
    """
)


def test_no_sandbox_process_outlives_its_env():
    done = subprocess.run([sys.executable, "-c", _PROCESSES], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["first"] and out["clone_after_close"], out
    assert out["running"] > out["base"] and out["dropped_running"] > out["base"], out  # the pool did start
    assert out["after_close"] == out["base"], f"processes left after close(): {out}"
    assert out["after_gc"] == out["base"], f"processes left after the env was garbage-collected: {out}"


def test_bench_gym_measures_the_checker_side_by_side(echo_plugins):
    from rstar_env.bench.gym import run

    result = run(steps=16, rounds=1)
    assert set(result["steps_per_s"]) == {"checked", "unchecked", "bare"}
    assert all(rate > 0 for rate in result["steps_per_s"].values())
    ratio = result["steps_per_s"]["checked"] / result["steps_per_s"]["unchecked"]
    assert result["ratio_checked_over_unchecked"] == pytest.approx(ratio)
