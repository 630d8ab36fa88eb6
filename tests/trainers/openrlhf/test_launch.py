"""The launcher: every stage config's command is accepted by the installed OpenRLHF's real parser."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("openrlhf")

from rstar_env.config import ConfigError, load_config
from rstar_trainers.openrlhf import launch
from rstar_trainers.openrlhf.cli_args import OpenRLHFArgsError, check_args, openrlhf_parser
from rstar_trainers.openrlhf.config import trainer_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
RL_STAGES = {"stage1_8k": 8192, "stage2_12k": 12288, "stage3_hard": 12288}


@pytest.mark.parametrize("stage", sorted(RL_STAGES))
def test_rl_stage_command_is_accepted_by_openrlhf(stage):
    plan = launch.plan_launch(CONFIGS / f"{stage}.yaml")
    assert plan.command[:3] == ["ray", "job", "submit"]
    sep = plan.command.index("--")
    assert plan.command[sep + 1 :] == ["python", "-m", "rstar_trainers.openrlhf.train", *plan.flags]
    runtime_env = json.loads(plan.command[plan.command.index("--runtime-env-json") + 1])
    assert runtime_env["worker_process_setup_hook"] == "rstar_trainers.openrlhf.patch.worker_setup"
    assert runtime_env["env_vars"]["RSTAR_ENV_CONFIG"] == str((CONFIGS / f"{stage}.yaml").resolve())

    args = check_args("train_ppo_ray", plan.flags)  # OpenRLHF's parser and its start-up validation
    assert args.algo.advantage.estimator == "group_norm"
    assert args.algo.kl.init_coef == 0 and not args.algo.kl.use_loss  # no KL, no reference model
    assert tuple(args.actor.eps_clip_low_high) == (0.2, 0.28)
    assert args.rollout.n_samples_per_prompt == 16 and args.actor.adam.lr == 1e-6
    assert args.rollout.temperature == 1.0 and args.actor.loss_agg_mode == "token-mean"
    assert args.data.max_len == 2048 + RL_STAGES[stage]
    assert args.data.input_key == "problem" and args.data.label_key == "answer"
    assert args.train.agent_func_path.endswith("trainers/openrlhf/agent_func.py")  # editable or installed
    assert args.reward.remote_url == ["agent"]  # what OpenRLHF sets for an agent function
    assert args.vllm.num_engines * args.vllm.tensor_parallel_size == args.actor.num_nodes * args.actor.num_gpus_per_node
    assert args.train.colocate_all and args.vllm.enable_sleep and args.ds.enable_sleep
    assert args.ds.zero_stage == 3 and args.ds.packing_samples
    assert args.critic.model_name_or_path is None  # group_norm: no critic
    assert Path(args.data.prompt_dataset).is_absolute() and Path(args.ckpt.output_dir).is_absolute()


def test_stage_datasets_and_models_chain():
    runs = {s: load_config(CONFIGS / f"{s}.yaml") for s in RL_STAGES}
    sft = trainer_config(load_config(CONFIGS / "sft.yaml"))
    assert sft.model == "Qwen/Qwen3-14B-Base"
    assert trainer_config(runs["stage1_8k"]).model == f"{sft.output_dir}/model"
    assert trainer_config(runs["stage2_12k"]).model == "runs/stage1/model"
    assert trainer_config(runs["stage3_hard"]).model == "runs/stage2/model"
    assert runs["stage3_hard"].dataset.source == "runs/stage2/hard.jsonl"
    for run in runs.values():
        cfg = trainer_config(run)
        assert (cfg.group_size, cfg.oversample, cfg.lr, cfg.temperature) == (16, 2, 1e-6, 1.0)
        assert run.sampler.name == "roc" and run.tools[0].options == {
            "timeout_s": 4,
            "stateful": False,
            "backend": "ray",
        }
        assert run.env.max_length == cfg.max_response_tokens and 5 <= run.env.max_turns <= 10


def test_sft_command_is_accepted_by_openrlhf_and_renders_like_the_env():
    plan = launch.plan_launch(CONFIGS / "sft.yaml")
    assert plan.command[0] == "deepspeed" and "openrlhf.cli.train_sft" in plan.command
    args = check_args("train_sft", plan.flags)
    assert args.data.multiturn and args.data.apply_chat_template and args.data.input_key == "messages"
    assert args.model.model_name_or_path == "Qwen/Qwen3-14B-Base" and args.ds.zero_stage == 3

    # The template OpenRLHF will use renders a tool conversation exactly as the env does.
    from jinja2 import Template

    from rstar_env.format import get_chat_format

    fmt = get_chat_format("chatml")
    messages = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "call"},
        {"role": "tool", "content": "<tool_response>\n1\n</tool_response>"},
        {"role": "assistant", "content": "done"},
    ]
    rendered = Template(args.data.tokenizer_chat_template).render(messages=messages, add_generation_prompt=False)
    expected = fmt.render_prompt("S", "Q") + "call" + fmt.render_feedback("call", ["1"]) + "done" + fmt.turn_end
    assert rendered == expected
    prefix = Template(args.data.tokenizer_chat_template).render(messages=messages[:2], add_generation_prompt=True)
    assert prefix == fmt.render_prompt("S", "Q")


def test_parser_rejects_what_openrlhf_would():
    parser = openrlhf_parser("train_ppo_ray")
    assert "--rollout.n_samples_per_prompt" in parser._option_string_actions
    with pytest.raises(OpenRLHFArgsError, match=r"no flag named --rollout\.n_samples$"):
        check_args("train_ppo_ray", ["--rollout.n_samples", "16"])  # a prefix argparse would have accepted
    with pytest.raises(OpenRLHFArgsError, match="invalid choice"):
        check_args("train_ppo_ray", ["--algo.advantage.estimator", "grpo"])
    with pytest.raises(OpenRLHFArgsError, match="requires n_samples_per_prompt"):
        check_args("train_ppo_ray", ["--algo.advantage.estimator", "group_norm"])


def test_config_errors_name_the_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "trainer: {backend: openrlhf, cluster: {actor_num_nodes: 1, actor_gpus_per_node: 8, vllm_num_engines: 2}}\n"
    )
    with pytest.raises(ConfigError, match="colocate_all needs"):
        launch.plan_launch(path)
    path.write_text("env: {max_length: 100}\ntrainer: {backend: openrlhf}\n")
    with pytest.raises(ConfigError, match=r"env.max_length \(100 chars\)"):
        launch.plan_launch(path)
    path.write_text("trainer: {backend: local}\n")
    with pytest.raises(ConfigError, match="launch openrlhf"):
        launch.plan_launch(path)


def test_extra_args_and_working_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths in a config are relative to where one launches
    config = tmp_path / "run.yaml"
    config.write_text(
        "trainer:\n  backend: openrlhf\n  group_size: 4\n  prompts_per_step: 8\n  kl_coef: 0.001\n"
        "  async_train: true\n  prompt_data: data/p.jsonl\n"
        f"  cluster: {{working_dir: {tmp_path}, address: 'http://head:8265', no_wait: true,"
        " runtime_env: {pip: [sympy], env_vars: {A: '1'}}}\n"
        "  extra_args: {vllm.enforce_eager: true, ckpt.max_num: 5}\n"
    )
    plan = launch.plan_launch(config)
    command = plan.command
    assert command[command.index("--address") + 1] == "http://head:8265" and "--no-wait" in command
    assert command[command.index("--working-dir") + 1] == str(tmp_path)
    env = json.loads(command[command.index("--runtime-env-json") + 1])
    assert env["pip"] == ["sympy"] and env["env_vars"]["A"] == "1"
    assert env["env_vars"]["RSTAR_ENV_CONFIG"] == "run.yaml"  # relative to the uploaded working dir
    assert plan.prompt_data is None  # named by the config: not written by the launcher
    args = check_args("train_ppo_ray", plan.flags)
    assert args.vllm.enforce_eager and args.ckpt.max_num == 5
    assert args.algo.kl.init_coef == 0.001 and args.algo.kl.use_loss and args.algo.kl.estimator == "k3"
    assert args.train.async_enable and not args.vllm.enable_sleep  # OpenRLHF refuses sleep in async mode
    assert args.data.prompt_dataset == "data/p.jsonl"  # inside the working dir: relative, as the job sees it


def test_cli_dry_run_prints_and_submits_nothing(monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("dry run must not run anything"))
    result = CliRunner().invoke(launch.command, ["--config", str(CONFIGS / "stage1_8k.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    line = result.stdout.strip().splitlines()[-1]
    assert shlex.split(line) == launch.plan_launch(CONFIGS / "stage1_8k.yaml").command
    assert "accepted by OpenRLHF's train_ppo_ray parser" in result.stderr


def test_cli_submits_after_writing_prompts(tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    config.write_text(f"dataset: 'arithmetic:n=5'\ntrainer: {{backend: openrlhf, output_dir: {tmp_path / 'out'}}}\n")
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda cmd, check: ran.append(cmd) or subprocess.CompletedProcess(cmd, 0))
    result = CliRunner().invoke(launch.command, ["--config", str(config)])
    assert result.exit_code == 0, result.output
    (command,) = ran
    assert command[:3] == ["ray", "job", "submit"]
    rows = [json.loads(line) for line in (tmp_path / "out" / "prompts.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and set(rows[0]) == {"problem", "answer", "id"}
    assert command[command.index("--data.prompt_dataset") + 1] == str(tmp_path / "out" / "prompts.jsonl")


def test_tested_versions_match_the_constraints_file_and_differences_are_reported():
    from pathlib import Path

    from rstar_trainers.openrlhf.versions import TESTED, version_warnings

    lines = (Path(__file__).resolve().parents[3] / "scripts" / "openrlhf-constraints.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    assert pins == TESTED
    assert version_warnings({**TESTED, "torch": "2.13.0+cpu"}) == []
    warnings = version_warnings({**TESTED, "ray": "2.55.0", "peft": None})
    assert warnings == [
        "ray 2.55.0 is installed; the OpenRLHF integration was tested with 2.60.0",
        "peft is not installed here (tested: 0.18.1)",
    ]
