"""The sampler-only check, the log-prob gap metric, and the --device / --dtype / --set options."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rstar_env.cli import main
from rstar_env.trajectory import ToolCall, ToolResult, Trajectory, Turn


def traj(problem: str, reward: float, errors: int, calls: int, sample: int) -> Trajectory:
    tool_calls = [
        ToolCall("x", "python", {"code": "x"}, ToolResult("out", error="exception" if i < errors else None))
        for i in range(calls)
    ]
    turns = [
        Turn(action="<tool_call>...</tool_call>", tool_calls=tool_calls),
        Turn(action="<answer>\\boxed{1}</answer>"),
    ]
    return Trajectory(
        problem=problem,
        answer="1",
        turns=turns,
        reward=reward,
        end_reason="answer",
        id=problem,
        metadata={"sample": sample, "step": 1},
    )


def groups_with_fixable_errors() -> list[list[Trajectory]]:
    """Four mixed groups of 8: 4 positives (2 with one error in 2 calls, 2 clean single calls), 4 negatives."""
    out = []
    for p in range(4):
        group = [
            traj(f"p{p}", 1.0, 1, 2, 0),
            traj(f"p{p}", 1.0, 1, 2, 1),
            traj(f"p{p}", 1.0, 0, 1, 2),
            traj(f"p{p}", 1.0, 0, 1, 3),
        ]
        group += [traj(f"p{p}", 0.0, 1, 1, 4 + k) for k in range(4)]
        out.append(group)
    out.append([traj("easy", 1.0, 0, 1, k) for k in range(8)])  # all correct: no signal, not counted
    return out


def test_roc_check_sees_what_roc_removes():
    from rstar_trainers.local.roc_check import roc_check

    report = roc_check(groups_with_fixable_errors(), keep=4, draws=300, seed=0)
    assert report["mixed_groups"] == 4 and report["positives"] == 16 and report["positives_with_tool_error"] == 8
    # Before selection: 8 errors in 8 * 2 + 8 * 1 = 24 calls.
    assert report["error_ratio_positives_before_selection"] == pytest.approx(8 / 24)
    # keep 4 of 8 with 4 negatives: neg_keep = 2, pos_keep = 2; RoC's top-k keeps the two clean positives.
    assert report["roc_selected_error_ratio"] == 0.0
    # GRPO's uniform pick keeps errors: its mean is near the expected ratio, and clearly above RoC's.
    assert 0.15 < report["grpo_selected_error_ratio"] < 0.45
    assert report["difference"] < -0.15 and report["difference_p97.5"] <= 0.0
    assert report["relative_reduction"] == pytest.approx(1.0)


def test_roc_check_cli_reads_a_run_directory(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    with (run / "trajectories.jsonl").open("w") as handle:
        for group in groups_with_fixable_errors():
            for t in group:
                handle.write(json.dumps({**t.to_dict(), "metadata": t.metadata}) + "\n")
    result = CliRunner().invoke(
        main, ["roc-check", str(run), "--keep", "4", "--draws", "50", "--json-out", str(tmp_path / "r.json")]
    )
    assert result.exit_code == 0, result.output
    assert "GRPO-RoC 0.0000" in result.output and "difference RoC - GRPO: -" in result.output
    assert json.loads((tmp_path / "r.json").read_text())["mixed_groups"] == 4
    missing = CliRunner().invoke(main, ["roc-check", str(run), "--keep", "4", "--step", "2"])
    assert missing.exit_code != 0 and "no trajectories of step 2" in missing.output


def test_logprob_gap_counts_tokens_outside_the_clip_ratio():
    torch = pytest.importorskip("torch")
    from rstar_trainers.local.trainer import Sample, logprob_gap

    sample = Sample(
        input_ids=[1, 2, 3, 4, 5], action_mask=[0, 0, 1, 1, 1], advantage=1.0, logprobs=[0.0, 0.0, -1.0, -2.0, -3.0]
    )
    # Teacher-forced log-probs of tokens 1..4 (the first is a prompt token, masked out).
    forced = torch.tensor([-9.0, -1.0, -2.1, -3.5])
    gap = logprob_gap([forced], [sample], clip_high=0.28)
    assert gap["logprob_gap/tokens"] == 3
    assert gap["logprob_gap/mean_abs"] == pytest.approx((0.0 + 0.1 + 0.5) / 3, abs=1e-6)
    assert gap["logprob_gap/outside_clip"] == pytest.approx(1 / 3)  # |0.5| > log(1.28) = 0.247; 0.1 is inside


def test_device_and_dtype_errors_name_the_fix():
    pytest.importorskip("torch")
    from rstar_env.rollout.local import check_dtype
    from rstar_trainers.local.trainer import check_device

    with pytest.raises(ValueError, match="cpu, cuda or cuda:N"):
        check_device("gpu0")
    with pytest.raises(ValueError, match="float16 is for GPUs"):
        check_dtype("float16", "cpu")
    with pytest.raises(ValueError, match="dtype must be one of"):
        check_dtype("int8", "cpu")
    assert check_dtype("bfloat16", "cpu") == "bfloat16"


def test_train_and_compare_refuse_a_device_this_machine_lacks(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for command in (
        ["train", "--config", "configs/roc_effect.yaml"],
        ["compare", "--config", "configs/roc_effect.yaml", "--sft-model", str(tmp_path)],
    ):
        result = CliRunner().invoke(main, [*command, "--device", "cuda", "--output-dir", str(tmp_path / "o")])
        assert result.exit_code != 0 and "sees no CUDA GPU" in result.output, result.output
    bad = CliRunner().invoke(
        main,
        ["compare", "--config", "configs/roc_effect.yaml", "--sft-model", str(tmp_path), "--set", "prompts_per_step"],
    )
    assert bad.exit_code != 0 and "--set takes KEY=VALUE" in bad.output
    unknown = CliRunner().invoke(
        main,
        ["compare", "--config", "configs/roc_effect.yaml", "--sft-model", str(tmp_path), "--set", "promts_per_step=3"],
    )
    assert unknown.exit_code != 0 and "promts_per_step" in unknown.output


def test_roc_effect_config_validates():
    from rstar_env.config import load_config
    from rstar_trainers.local.config import trainer_config

    run = load_config("configs/roc_effect.yaml")
    settings = trainer_config(run)
    assert settings.rollouts_per_prompt == 16 and settings.logprob_gap and settings.save_trajectories_steps == 1
    assert run.env.max_turns == 5 and "fix=0.5" in settings.sft["dataset"]


def test_roc_effect_cpu_config_asks_the_same_question_at_a_cpu_size():
    """The CPU variant keeps what makes RoC's choice matter (SFT data, turns, tools, problems, sampler) and shrinks
    only what a step costs."""
    from rstar_env.config import load_config
    from rstar_trainers.local.config import trainer_config

    gpu, cpu = load_config("configs/roc_effect.yaml"), load_config("configs/roc_effect_cpu.yaml")
    g, c = trainer_config(gpu), trainer_config(cpu)
    assert cpu.env == gpu.env and cpu.tools == gpu.tools and cpu.reward == gpu.reward
    assert cpu.dataset == gpu.dataset and c.sft == g.sft
    assert c.rollouts_per_prompt * c.prompts_per_step < g.rollouts_per_prompt * g.prompts_per_step
    assert c.rollouts_per_prompt >= 2 * c.group_size >= 8  # several positives for RoC to choose among
    assert c.max_response_tokens >= 512 and c.save_trajectories_steps == 1 and c.output_dir != g.output_dir
