"""Evaluation metrics and the resumable evaluation loop, with a scripted policy."""

from __future__ import annotations

import asyncio
import json

import pytest

from rstar_env.rollout.evaluate import EvalResumeError, evaluate, model_identity, read_trajectories
from rstar_env.rollout.metrics import has_answer_format, pass_at_k, summarize
from rstar_env.rollout.policy import Generation
from rstar_env.testing import answer, tool_call
from rstar_env.trajectory import RewardResult, ToolCall, ToolResult, Trajectory, Turn


class OraclePolicy:
    """Answers correctly on even samples after one echo call, wrongly on odd ones."""

    tokenizer = None

    def __init__(self):
        self.calls = 0

    async def generate(self, requests):
        self.calls += len(requests)
        out = []
        for r in requests:
            t = r.trajectory
            sample = t.metadata.get("sample_hint", 0)
            if not t.turns:
                out.append(Generation(tool_call("echo", text=t.answer)))
            else:
                out.append(Generation(answer(t.answer if sample == 0 else "wrong")))
        return out

    async def aclose(self):
        pass


def traj(reward: float, calls: list[str | None], final: str, pid: str = "p") -> Trajectory:
    tool_calls = [ToolCall("r", "python", {}, ToolResult("x", e)) for e in calls]
    return Trajectory(
        problem=pid,
        answer="1",
        id=pid,
        turns=[Turn("call", tool_calls), Turn(final)],
        reward=reward,
        reward_result=RewardResult(reward),
        end_reason="answer",
    )


def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 2) == 0.0
    assert pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(4, 3, 2) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_summary_figures_by_hand():
    good = answer(1)
    trajectories = [
        traj(1.0, [None, "timeout"], good, "a"),
        traj(0.0, ["exception", "bad_call"], "no answer", "a"),
        traj(1.0, [None], good, "b"),
        traj(1.0, [], good + good, "b"),
    ]
    s = summarize(trajectories)
    assert s["problems"] == 2 and s["samples_per_problem"] == 2
    assert s["pass@1"] == 0.75
    assert s["pass@2"] == 1.0
    assert s["tool_calls_per_episode"] == 5 / 4
    assert s["tool_error_ratio"] == 3 / 5
    assert s["tool_error_ratio_correct"] == 1 / 3
    assert s["answer_format_rate"] == 0.5  # the wrong one has no block; the last has two
    assert s["tool_errors_by_kind"] == {"timeout": 1, "exception": 1, "bad_call": 1}
    assert not has_answer_format(Trajectory(problem="p", answer="1"))


def test_evaluate_writes_and_resumes(tmp_path, echo_plugins):
    rows = [{"problem": f"p{i}", "answer": str(i), "id": f"id{i}"} for i in range(3)]
    out = tmp_path / "eval.jsonl"
    options = {"tools": ["echo"], "reward": "exact_test", "max_turns": 3}
    policy = OraclePolicy()
    summary = asyncio.run(evaluate(policy, rows[:2], samples=2, out=out, width=3, **options))
    assert summary["episodes"] == 4 and summary["pass@1"] == 1.0 and summary["resumed"] == 0
    assert summary["tool_calls_per_episode"] == 1.0
    assert len(read_trajectories(out)) == 4
    first_calls = policy.calls
    # A killed run leaves a half-written line: it is skipped with a warning, and the rest resumes.
    with out.open("a") as handle:
        handle.write('{"problem": "trunc')
    with pytest.warns(UserWarning, match="skipping an unreadable trajectory"):
        summary = asyncio.run(evaluate(policy, rows, samples=2, out=out, width=3, **options))
    assert summary["resumed"] == 4 and summary["episodes"] == 6 and summary["problems"] == 3
    assert policy.calls - first_calls == 2 * 2  # only id2's two samples ran, two turns each
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines() if line.startswith('{"id"')]
    assert sorted(ids) == ["id0", "id0", "id1", "id1", "id2", "id2"]


def test_resume_covers_only_this_runs_selection(tmp_path, echo_plugins):
    rows = [{"problem": f"p{i}", "answer": str(i), "id": f"id{i}"} for i in range(3)]
    out = tmp_path / "eval.jsonl"
    options = {"tools": ["echo"], "reward": "exact_test", "max_turns": 3}
    policy = OraclePolicy()
    asyncio.run(evaluate(policy, rows, samples=2, out=out, width=3, **options))
    calls = policy.calls
    # --limit 2 on a file holding three problems: two problems' episodes, none run again.
    summary = asyncio.run(evaluate(policy, rows[:2], samples=1, out=out, width=3, **options))
    assert summary["episodes"] == 2 and summary["problems"] == 2 and summary["resumed"] == 2
    assert policy.calls == calls
    # The same ids for other problems (another dataset) are not this run's episodes: they run.
    other = [{"problem": f"q{i}", "answer": str(i), "id": f"id{i}"} for i in range(2)]
    summary = asyncio.run(evaluate(policy, other, samples=1, out=out, width=3, **options))
    assert summary["resumed"] == 0 and summary["episodes"] == 2 and policy.calls > calls


def test_resume_never_crosses_models(tmp_path, echo_plugins):
    rows = [{"problem": f"p{i}", "answer": str(i), "id": f"id{i}"} for i in range(2)]
    out = tmp_path / "eval.jsonl"
    options = {"tools": ["echo"], "reward": "exact_test", "max_turns": 3}
    a, b = {"model": "model-a", "hash": "aaaa"}, {"model": "model-b", "hash": "bbbb"}
    asyncio.run(evaluate(OraclePolicy(), rows, out=out, model=a, **options))
    assert all(t.metadata["model"] == a for t in read_trajectories(out))
    before = out.read_text()
    with pytest.raises(EvalResumeError, match=r"'model-a' \(weights aaaa\).*'model-b' \(weights bbbb\)"):
        asyncio.run(evaluate(OraclePolicy(), rows, out=out, model=b, **options))
    assert out.read_text() == before  # nothing ran, nothing was written
    # Same name, other weights (a directory retrained in place): another model too.
    with pytest.raises(EvalResumeError):
        asyncio.run(evaluate(OraclePolicy(), rows, out=out, model={"model": "model-a", "hash": "cccc"}, **options))
    summary = asyncio.run(evaluate(OraclePolicy(), rows, out=out, model=a, **options))
    assert summary["resumed"] == 2


def test_model_identity_hashes_weights_and_config(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(b"weights-1")
    (model / "tokenizer.json").write_text("{}")
    first = model_identity(str(model))
    assert first["model"] == str(model) and len(first["hash"]) == 16
    (model / "tokenizer.json").write_text('{"x": 1}')  # not weights or config
    assert model_identity(str(model)) == first
    (model / "model.safetensors").write_bytes(b"weights-2")
    assert model_identity(str(model))["hash"] != first["hash"]
    served = model_identity(served_model="m", endpoints=["http://h:1/v1"])
    assert served == {"model": "m", "endpoint": "http://h:1/v1"}
