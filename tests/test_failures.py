"""System failures (``env_error``, ``policy_error``) end one episode, unscored, and never count as answers."""

from __future__ import annotations

import asyncio
import json

import pytest

from rstar_env.rollout.evaluate import evaluate, read_trajectories
from rstar_env.rollout.metrics import summarize
from rstar_env.rollout.policy import Generation
from rstar_env.testing import answer, tool_call
from rstar_env.trajectory import Trajectory

PROBLEM = {"problem": "What is 6 * 7?", "answer": "42"}


class RaisingReward:
    name = "raising_test"

    async def score(self, response, answer):
        raise RuntimeError("reward plugin bug")


def test_a_reward_that_raises_ends_the_episode_as_env_error_unscored(math_env, echo_plugins):
    env = math_env(tools=["echo"], reward=RaisingReward())
    env.reset(options=PROBLEM)
    obs, reward, terminated, truncated, info = env.step(answer(42))
    traj = info["trajectory"]
    assert (obs, reward, terminated, truncated) == ("", 0.0, False, True)
    assert traj.end_reason == "env_error" and traj.failed and traj.reward_result is None
    assert "reward plugin bug" in info["error"] and "raising_test" in traj.error
    assert summarize([traj])["pass@1"] is None


def test_abort_records_the_failure_and_round_trips(math_env, echo_plugins):
    env = math_env(tools=["echo"], reward="exact_test")
    env.reset(options=PROBLEM)
    env.step(tool_call("echo", text="x"))
    *_, truncated, info = env.abort("policy_error", "HTTP 503 after 3 attempts")
    traj = info["trajectory"]
    assert truncated and traj.end_reason == "policy_error" and traj.error == "HTTP 503 after 3 attempts"
    assert Trajectory.from_dict(json.loads(json.dumps(traj.to_dict()))) == traj
    with pytest.raises(ValueError, match="env_error"):
        env.reset(options=PROBLEM)
        env.abort("answer", "no")


class FlakyPolicy:
    """Fails every generation while ``down``; otherwise answers each problem correctly at once."""

    tokenizer = None

    def __init__(self, down: bool) -> None:
        self.down = down

    async def generate(self, requests):
        if self.down:
            return [Generation("", finish_reason="error", metadata={"error": "connection refused"}) for _ in requests]
        return [Generation(answer(r.trajectory.answer)) for r in requests]

    async def aclose(self):
        pass


def test_an_outage_is_not_scored_and_a_rerun_retries_it(tmp_path, echo_plugins):
    rows = [{"id": f"p{i}", "problem": f"{i} + 0", "answer": str(i)} for i in range(4)]
    out = tmp_path / "eval.jsonl"
    opts = {"tools": ["echo"], "reward": "exact_test"}
    summary = asyncio.run(evaluate(FlakyPolicy(down=True), rows, samples=2, out=out, width=3, **opts))
    assert summary["policy_errors"] == 8 and summary["scored"] == 0 and summary["pass@1"] is None
    assert summary["problems"] == 4
    assert all(t.end_reason == "policy_error" and "connection refused" in t.error for t in read_trajectories(out))

    summary = asyncio.run(evaluate(FlakyPolicy(down=False), rows, samples=2, out=out, width=3, **opts))
    assert summary["resumed"] == 0 and summary["policy_errors"] == 0
    assert summary["scored"] == 8 and summary["pass@1"] == 1.0 and summary["episodes"] == 8


def test_summary_leaves_failures_out_of_every_rate():
    ok = Trajectory(problem="a", answer="1", id="a", end_reason="answer", reward=1.0)
    failed = Trajectory(problem="a", answer="1", id="a", end_reason="env_error", error="boom")
    s = summarize([ok, failed])
    assert s["pass@1"] == 1.0 and s["mean_reward"] == 1.0 and s["scored"] == 1 and s["episodes"] == 2
    assert s["env_errors"] == 1 and s["policy_errors"] == 0 and s["samples_per_problem"] == 1
