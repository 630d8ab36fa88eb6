"""Per-request sampling streams: the same seed gives the same trajectories, whatever the batch composition and the
tool timing (tool turns included)."""

from __future__ import annotations

import asyncio
import random
from typing import Any, ClassVar

import pytest

from rstar_env.plugins import register, unregister
from rstar_env.rollout.collect import collect, jobs_for, stream_seed
from rstar_env.rollout.policy import Generation, Request, SamplingParams
from rstar_env.testing import python_call, tool_call
from rstar_env.tool import EpisodeContext, function_schema
from rstar_env.trajectory import ToolResult

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from rstar_env.rollout.local import TransformersPolicy  # noqa: E402


class JitterEcho:
    """Echoes its text after a random delay (not seeded): tool timing differs between runs."""

    name: ClassVar[str] = "jitter_echo"
    schema = function_schema("jitter_echo", "Echo the text back, slowly.", {"text": {"type": "string"}}, ["text"])

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        await asyncio.sleep(random.random() * 0.03)
        return ToolResult(arguments["text"])

    async def close(self, episode: EpisodeContext) -> None:
        pass


class ToolTurns:
    """Wraps a token-level policy: its first ``tool_turns`` turns are the model's sampled tokens followed by a tool
    call whose argument depends on what was sampled, so tool output and later contexts follow the draws."""

    def __init__(self, inner: TransformersPolicy, make_call: Any, tool_turns: int = 2) -> None:
        self.inner, self.tokenizer, self.make_call, self.tool_turns = inner, inner.tokenizer, make_call, tool_turns
        self.seeds: list[int | None] = []

    async def generate(self, requests: list[Request]) -> list[Generation]:
        self.seeds += [r.seed for r in requests]
        out = await self.inner.generate(requests)
        for request, generation in zip(requests, out, strict=True):
            if len(request.trajectory.turns) < self.tool_turns:
                call = "\n" + self.make_call(sum(generation.token_ids) % 997)
                ids = self.tokenizer.encode(call, add_special_tokens=False)
                generation.text += call
                generation.token_ids = [*generation.token_ids, *ids]
                generation.logprobs = [*generation.logprobs, *[0.0] * len(ids)]
                generation.finish_reason = "tool_call"
        return out

    async def aclose(self) -> None:
        pass


def _signature(trajectories: list[Any]) -> list[tuple[Any, ...]]:
    """Everything that must repeat: ids of every action and feedback, texts, tool outputs, reward, end."""
    return [
        (
            t.metadata["sample"],
            t.problem,
            t.end_reason,
            t.reward,
            tuple(
                (
                    tuple(turn.action_token_ids),
                    tuple(turn.feedback_token_ids or ()),
                    tuple(c.result.text for c in turn.tool_calls),
                )
                for turn in t.turns
            ),
        )
        for t in trajectories
    ]


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return tiny_llama


@pytest.fixture
def jitter_tool():
    register(JitterEcho)
    yield
    unregister(JitterEcho)


def test_stream_seed_is_stable_and_distinct():
    assert stream_seed(0, "id:a", 0, 0) == stream_seed(0, "id:a", 0, 0)
    seeds = {stream_seed(s, p, k, t) for s in (0, 1) for p in ("id:a", "id:b") for k in (0, 1) for t in (0, 1)}
    assert len(seeds) == 16
    assert all(0 <= s < 2**63 for s in seeds)
    # Fixed across processes and Python versions (no hash() randomisation): pin one value.
    assert stream_seed(7, "id:x", 3, 1) == 4612086489732189686


def test_each_row_draws_from_its_own_stream_whatever_the_batch(tiny):
    model, tokenizer = tiny
    contexts = [
        tokenizer.encode(f"<|im_start|>user\nWhat is {n} + {n}?<|im_end|>\n<|im_start|>assistant\n") for n in range(6)
    ]
    requests = [Request(None, c, None, seed=100 + i) for i, c in enumerate(contexts)]  # type: ignore[arg-type]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=20)

    def ids(batch_size: int, order: list[int]) -> dict[int, list[int]]:
        policy = TransformersPolicy(model, tokenizer=tokenizer, sampling=sampling, batch_size=batch_size)
        out = policy.generate_sync([requests[i] for i in order])
        return {i: g.token_ids for i, g in zip(order, out, strict=True)}

    alone = {}
    for i in range(6):
        alone.update(ids(1, [i]))
    assert ids(6, list(range(6))) == alone
    assert ids(4, [5, 2, 0, 3, 1, 4]) == alone
    assert ids(3, [1, 3]) == {1: alone[1], 3: alone[3]}
    assert len({tuple(v) for v in alone.values()}) == 6  # the streams differ
    other = TransformersPolicy(model, tokenizer=tokenizer, sampling=sampling)
    reseeded = other.generate_sync([Request(None, contexts[0], None, seed=999)])  # type: ignore[arg-type]
    assert reseeded[0].token_ids != alone[0]


def test_same_seed_same_trajectories_whatever_batching_and_tool_timing(tiny, jitter_tool):
    """Multi-turn episodes with tool calls of random latency: batch size 1 or 8, 2 or 6 episodes in flight, the
    trajectories are the same; another seed gives others."""
    model, tokenizer = tiny
    rows = [{"problem": f"What is {n} + 1?", "answer": str(n + 1), "id": f"p{n}"} for n in range(3)]

    def run(batch_size: int, width: int, seed: int = 5) -> list[Any]:
        inner = TransformersPolicy(
            model,
            tokenizer=tokenizer,
            batch_size=batch_size,
            batch_window_s=0.001,
            sampling=SamplingParams(temperature=1.0, max_new_tokens=12),
        )
        policy = ToolTurns(inner, lambda n: tool_call("jitter_echo", text=str(n)))
        trajectories = asyncio.run(
            collect(
                policy,
                jobs_for(rows, samples=2),
                width=width,
                seed=seed,
                tools=["jitter_echo"],
                reward="math",
                max_turns=3,
            )
        )
        assert all(s is not None for s in policy.seeds)
        return trajectories

    first = run(batch_size=8, width=6)
    assert all(len(t.turns) == 3 and len(t.turns[0].tool_calls) == 1 for t in first)
    assert _signature(run(batch_size=1, width=2)) == _signature(first)
    assert _signature(run(batch_size=3, width=6)) == _signature(first)
    assert _signature(run(batch_size=8, width=6, seed=6)) != _signature(first)


def test_sampling_params_seed_is_the_default_run_seed(tiny, jitter_tool):
    model, tokenizer = tiny
    rows = [{"problem": "What is 1 + 1?", "answer": "2", "id": "q"}]

    def run(seed: int) -> list[Any]:
        policy = TransformersPolicy(model, tokenizer=tokenizer, sampling=SamplingParams(max_new_tokens=8, seed=seed))
        return asyncio.run(
            collect(policy, jobs_for(rows, samples=3), width=3, tools=["jitter_echo"], reward="math", max_turns=1)
        )

    assert _signature(run(1)) == _signature(run(1))
    assert _signature(run(1)) != _signature(run(2))


@pytest.mark.slow
def test_smollm2_multi_turn_python_tool_runs_repeat(smollm2):
    """The real model and the real Python tool (sandboxed, with a random sleep in the code): two runs with one seed
    and different batching give identical trajectories, tool turns included."""
    pytest.importorskip("rstar_env.sandbox.local")
    model, tokenizer = smollm2
    rows = [
        {"problem": "What is 17 * 3?", "answer": "51", "id": "m1"},
        {"problem": "What is 2 ** 10?", "answer": "1024", "id": "m2"},
    ]
    code = "import random, time\ntime.sleep(random.random() * 0.05)\nprint({n} * 2)"

    def run(batch_size: int, width: int) -> list[Any]:
        inner = TransformersPolicy(
            model,
            tokenizer=tokenizer,
            batch_size=batch_size,
            sampling=SamplingParams(temperature=1.0, max_new_tokens=24),
        )
        policy = ToolTurns(inner, lambda n: python_call(code.format(n=n)))
        return asyncio.run(
            collect(
                policy,
                jobs_for(rows, samples=1),
                width=width,
                seed=11,
                max_turns=3,
                max_length=400,
                length_unit="tokens",
            )
        )

    first = run(batch_size=2, width=2)  # both episodes' turns batched together
    assert len(first) == 2 and all(len(t.turns) >= 2 and t.turns[0].tool_calls for t in first)
    assert any(c.result.text.strip().isdigit() for t in first for c in t.turns[0].tool_calls)  # the tool ran
    assert _signature(run(batch_size=1, width=1)) == _signature(first)  # one at a time


# -- paired arms in the trainer and `compare` ---------------------------------------------------------------------
class ParityReward:
    """Reward 1 when the response has an even number of characters: mixed groups from a random model."""

    name: ClassVar[str] = "parity_test"

    async def score(self, response: str, answer: str) -> Any:
        from rstar_env.trajectory import RewardResult

        return RewardResult(float(len(response) % 2 == 0), None, "parity")


@pytest.fixture
def parity_reward():
    register(ParityReward)
    yield
    unregister(ParityReward)


def tiny_run(tmp_path: Any, reward: str = "parity_test", **trainer: Any) -> Any:
    import json

    from rstar_env.config import load_config

    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(
            json.dumps({"problem": f"What is {n} + 2?", "answer": str(n + 2), "id": f"r{n}"}) + "\n" for n in range(4)
        )
    )
    return load_config(
        {
            "env": {"max_turns": 1},
            "tools": [],
            "reward": reward,
            "sampler": "roc",
            "dataset": str(data),
            "trainer": {
                "output_dir": str(tmp_path / "run"),
                "steps": 2,
                "prompts_per_step": 2,
                "group_size": 4,
                "oversample": 2,
                "lr": 1e-3,
                "max_new_tokens": 9,
                "max_response_tokens": 10,
                "seed": 0,
                "tensorboard": False,
                "save_model": False,
                "logprob_gap": True,
                **trainer,
            },
        }
    )


def test_t_interval_matches_the_textbook():
    from rstar_trainers.local.compare import t_interval

    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and mean - low == pytest.approx(high - mean)
    assert high - mean == pytest.approx(4.302653 * 1.0 / 3**0.5, rel=1e-5)  # t(0.975, 2) * s / sqrt(n)
    assert t_interval([0.5])[1] != t_interval([0.5])[1]  # one seed: no interval (NaN)


@pytest.mark.parametrize(
    ("p", "df", "table"),
    [
        (0.975, 1, 12.706205),
        (0.975, 2, 4.302653),
        (0.975, 3, 3.182446),
        (0.975, 4, 2.776445),
        (0.975, 9, 2.262157),
        (0.975, 30, 2.042272),
        (0.05, 5, -2.015048),
        (0.5, 7, 0.0),
    ],
)
def test_t_quantile_matches_the_table(p, df, table):
    from rstar_trainers.local.compare import t_quantile

    assert t_quantile(p, df) == pytest.approx(table, rel=1e-6, abs=1e-9)


def test_compare_in_parallel_processes_gives_what_one_process_gives(tmp_path, tiny):
    """``jobs=2``: the arms train in processes of their own (forked from a fork server, loading the model from its
    directory) with the same results."""
    import json

    from rstar_trainers.local.compare import run_compare
    from rstar_trainers.local.config import trainer_config

    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    # An installed plugin, so the children load it too; "format" starts no verifier pool (as "math" would, per process).
    run = tiny_run(tmp_path, reward="format", logprob_gap=False)
    settings = trainer_config(run, steps=1, prompts_per_step=1)
    results = {}
    for jobs in (1, 2):
        out = tmp_path / f"jobs{jobs}"
        seen, progress = [], []
        run_compare(
            run,
            settings,
            out=out,
            model=str(tmp_path / "model"),
            seeds=[3],
            steps=1,
            jobs=jobs,
            on_step=lambda arm, seed, m, seen=seen: seen.append((arm, seed, m["step"])),
            on_progress=lambda *update, progress=progress: progress.append(update),
        )
        assert sorted(seen) == [("grpo", 3, 1), ("roc", 3, 1)]
        # Each arm's progress within its step reaches the caller, from the child processes too, named by arm.
        for arm in ("grpo/3", "roc/3"):
            rollouts = [
                (done, total)
                for key, done, total, description in progress
                if key.startswith(arm + " ") and "rollouts" in description
            ]
            assert rollouts and rollouts[-1] == (8, 8), (arm, progress)
        results[jobs] = {
            arm: json.loads((out / f"{arm}-seed3" / "metrics.jsonl").read_text().splitlines()[0])
            for arm in ("grpo", "roc")
        }
        assert json.loads((out / "compare.json").read_text())["paired_step1"] == {"3": {"identical": 8, "of": 8}}
    for arm in ("grpo", "roc"):
        assert results[1][arm]["response_tokens"] == results[2][arm]["response_tokens"]


def test_compare_command_pairs_the_arms_and_shows_progress_a_narrow_table_and_an_interval(
    tmp_path, tiny, parity_reward
):
    """`rstar-env compare` with two seeds: both arms draw the same step-1 rollouts, the report gives each seed's
    difference and an interval, and what a user reads while it runs is per-arm progress within steps (a CPU step
    takes minutes), one table row per arm and step within 80 columns, then the paired difference."""
    pytest.importorskip("matplotlib")
    import json

    import yaml
    from click.testing import CliRunner

    from rstar_env.cli import main

    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    run = tiny_run(tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run.model_dump(mode="json", exclude_none=True)))
    result = CliRunner().invoke(
        main,
        [
            "compare",
            "--config",
            str(config),
            "--sft-model",
            str(tmp_path / "model"),
            "--seeds",
            "0,1",
            "--steps",
            "1",
            "--output-dir",
            str(tmp_path / "cmp"),
        ],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = lines.index(next(line for line in lines if line.split()[:2] == ["arm/", "step"]))
    assert all(len(line) <= 80 for line in lines[header : header + 2])
    rows = [
        line.split()
        for line in lines
        if line.split()[:1] in (["grpo/0"], ["roc/0"], ["grpo/1"], ["roc/1"]) and line.split()[1].isdigit()
    ]
    assert sorted(r[0] for r in rows) == ["grpo/0", "grpo/1", "roc/0", "roc/1"] and all(r[1] == "1" for r in rows)
    assert all(len(r) == 7 for r in rows)
    assert all(len(line) <= 80 for line in lines if line.split()[:1] == ["roc/0"] and line.split()[1].isdigit())
    for arm in ("grpo/0", "roc/1"):
        assert any(line.startswith(f"{arm} step 1: rollouts: 16/16") for line in lines), result.output
    assert "paired difference RoC - GRPO" in result.output

    cmp = tmp_path / "cmp"
    summary = json.loads((cmp / "compare.json").read_text())
    # Common random numbers: both arms drew the same step-1 rollouts, token for token.
    assert summary["paired_step1"] == {"0": {"identical": 16, "of": 16}, "1": {"identical": 16, "of": 16}}
    first = {
        arm: json.loads((cmp / f"{arm}-seed0" / "metrics.jsonl").read_text().splitlines()[0]) for arm in ("grpo", "roc")
    }
    assert first["grpo"]["reward"] == first["roc"]["reward"]
    paired = summary["paired"]["reward"]["all_steps"]
    assert set(paired["per_seed"]) == {"0", "1"}
    low, high = paired["ci95"]
    assert low <= paired["mean"] <= high
    # float32: the sampler's log-probs are a teacher-forced pass's to rounding.
    assert first["roc"]["logprob_gap/mean_abs"] < 1e-4 and first["roc"]["logprob_gap/outside_clip"] == 0.0
    text = (cmp / "compare.md").read_text()
    assert "Paired difference RoC - GRPO" in text and "95% CI" in text
    csv = (cmp / "per_step.csv").read_text().splitlines()
    assert csv[0].startswith("seed,step,arm,tool_error_ratio_correct") and len(csv) == 1 + 2 * 2  # seeds x arms x steps
    assert (cmp / "roc_check.json").exists() and (cmp / "compare.png").exists()


def test_ctrl_c_stops_parallel_arms_with_checkpoints_and_no_tracebacks(tmp_path, tiny):
    """Ctrl-C (SIGINT to the terminal's whole process group) during `compare --jobs 2`: the two arms training save
    a checkpoint and stop, the arms not started never start, nothing prints a traceback, and the exit status says
    interrupted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    model, tokenizer = tiny
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    # An installed plugin, so the children load it too; "format" starts no verifier pool (as "math" would, per process).
    run = tiny_run(tmp_path, reward="format", logprob_gap=False)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(run.model_dump(mode="json", exclude_none=True)))
    out = tmp_path / "cmp"
    log = tmp_path / "log.txt"
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "rstar_env.cli",
                "compare",
                "--config",
                str(config),
                "--sft-model",
                str(tmp_path / "model"),
                "--seeds",
                "0,1,2",
                "--steps",
                "500",
                "--jobs",
                "2",
                "--output-dir",
                str(out),
            ],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 240
            # Both arms past their first step: an arm still loading its model has nothing to checkpoint.
            while time.monotonic() < deadline and proc.poll() is None:
                if all(f"{arm}/0 step 2: rollouts" in log.read_text() for arm in ("grpo", "roc")):
                    break
                time.sleep(0.2)
            assert proc.poll() is None, log.read_text()
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=120) == 130, log.read_text()
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert "Traceback" not in text and "interrupted" in text, text
    started = [d for d in out.iterdir() if d.name.endswith("-seed0")]
    assert sorted(d.name for d in started) == ["grpo-seed0", "roc-seed0"]
    assert all((d / "checkpoints" / "latest").exists() for d in started), text  # saved on the way out
    assert not any((out / f"{arm}-seed{seed}").exists() for arm in ("grpo", "roc") for seed in (1, 2))
