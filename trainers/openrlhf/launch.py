"""``rstar-env launch openrlhf --config configs/stage1_8k.yaml [--dry-run]``: run a stage config on OpenRLHF.

For an RL stage (``trainer.stage: rl``) the launcher builds::

    ray job submit [--address A] [--working-dir W] --runtime-env-json '{...}' -- \\
        python -m rstar_trainers.openrlhf.train --actor.model_name_or_path ... --algo.advantage.estimator group_norm ...

The runtime env carries ``RSTAR_ENV_CONFIG`` (every worker reads the same YAML) and names
:func:`rstar_trainers.openrlhf.patch.worker_setup` as Ray's ``worker_process_setup_hook`` (the RoC samples
generator reaches the trainer actors). The flags are OpenRLHF 0.11's dotted names, derived from the config:
``group_norm`` advantages, no KL (no reference model), clip 0.2/0.28, ``n_samples_per_prompt = G``, the learning
rate, ``max_len`` = prompt + response tokens of the stage, the vLLM engines, colocation, the DeepSpeed ZeRO stage,
packing. For the SFT stage it builds ``deepspeed --module openrlhf.cli.train_sft ...`` (OpenRLHF's SFT trainer is a
DeepSpeed job, not a Ray one) in multiturn mode with the env's chat template.

The command is printed; without ``--dry-run`` the prompts are written (RL, unless ``trainer.prompt_data`` names
them) and the command runs. When OpenRLHF is importable here, the flags are first checked with its real parser.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from rstar_env.config import ConfigError, RunConfig, load_config
from rstar_trainers.openrlhf.config import OpenRLHFRLConfig, OpenRLHFSFTConfig, trainer_config
from rstar_trainers.openrlhf.patch import SETUP_HOOK
from rstar_trainers.openrlhf.runtime import CONFIG_ENV

TRAIN_MODULE = "rstar_trainers.openrlhf.train"
JOB_MARKER_ENV = "RSTAR_OPENRLHF_JOB"
"""Set in the job's runtime env: tells :mod:`rstar_trainers.openrlhf.train` the job already has our runtime env."""
OPENRLHF_ENV_VARS = {
    # What OpenRLHF's train_ppo_ray puts in its own ray.init(); ours runs first, so it has to carry them.
    "TOKENIZERS_PARALLELISM": "true",
    "NCCL_DEBUG": "WARN",
    "RAY_ENABLE_ZERO_COPY_TORCH_TENSORS": "1",
}


@dataclass
class LaunchPlan:
    """What the launcher will run."""

    stage: str
    command: list[str]
    """The whole command line (``ray job submit ... -- python -m ...`` or ``deepspeed ...``)."""
    script: str
    """``train_ppo_ray`` or ``train_sft``: whose parser the flags belong to."""
    flags: list[str]
    """The OpenRLHF flags alone (checked with its parser)."""
    prompt_data: Path | None = None
    """Where the launcher writes the prompts before submitting (RL without ``trainer.prompt_data``)."""
    env: dict[str, str] = field(default_factory=dict)

    def shell(self) -> str:
        return shlex.join(self.command)


def _flag(flags: list[str], name: str, value: Any) -> None:
    """Append ``--name value``; ``True`` is a bare switch, ``False``/``None`` nothing, a list several values."""
    if value is None or value is False:
        return
    flags.append(f"--{name}")
    if value is True:
        return
    if isinstance(value, list | tuple):
        flags.extend(str(v) for v in value)
    else:
        flags.append(str(value))


def _module_file(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ConfigError(f"cannot locate {module}")
    return Path(spec.origin)


def _cluster_path(path: str | Path, working_dir: str | None) -> str:
    """A path as a Ray worker sees it: relative to the uploaded working dir when it lies inside, else absolute."""
    resolved = Path(path).expanduser().resolve()
    if working_dir:
        try:
            return str(resolved.relative_to(Path(working_dir).expanduser().resolve()))
        except ValueError:
            pass
    return str(resolved)


def _is_hub_name(model: str) -> bool:
    """``owner/name`` that is not a local path: a Hugging Face hub id, passed through untouched."""
    return re.fullmatch(r"[\w.-]+/[\w.-]+", model) is not None and not Path(model).exists()


def _output_flags(cfg: OpenRLHFRLConfig | OpenRLHFSFTConfig, path: Callable[[str | Path], str]) -> list[str]:
    """Checkpoints, logs and pass-through flags: the same for every stage."""
    out = Path(cfg.output_dir)
    flags: list[str] = []
    _flag(flags, "ckpt.output_dir", path(out / "model"))
    _flag(flags, "ckpt.path", path(out / "checkpoints"))
    _flag(flags, "ckpt.save_steps", cfg.save_steps)
    _flag(flags, "ckpt.save_hf", cfg.save_hf)
    if cfg.tensorboard:
        _flag(flags, "logger.tensorboard_dir", path(out / "tensorboard"))
    if cfg.wandb_project:
        _flag(flags, "logger.wandb.project", cfg.wandb_project)
    for name, value in cfg.extra_args.items():
        _flag(flags, name.lstrip("-"), value)
    return flags


def rl_flags(
    run: RunConfig,
    cfg: OpenRLHFRLConfig,
    *,
    prompt_data: str,
    agent_func_path: str,
    path: Callable[[str | Path], str] = str,
) -> list[str]:
    """OpenRLHF ``train_ppo_ray`` flags for an RL stage; ``path`` maps a local path to what the cluster sees."""
    c, ds, ev = cfg.cluster, cfg.deepspeed, cfg.eval
    flags: list[str] = []
    add = lambda name, value: _flag(flags, name, value)  # noqa: E731 (a local shorthand)
    add("actor.model_name_or_path", cfg.model if _is_hub_name(cfg.model) else path(cfg.model))
    add("train.agent_func_path", agent_func_path)
    add("data.prompt_dataset", prompt_data)
    add("data.input_key", "problem")
    add("data.label_key", "answer")
    add("data.max_len", cfg.max_len)
    # GRPO-RoC: G kept per prompt (the RoC generator rolls out G * oversample), group-normalised advantages.
    add("rollout.n_samples_per_prompt", cfg.group_size)
    add("rollout.batch_size", cfg.prompts_per_step)
    add("rollout.micro_batch_size", cfg.micro_rollout_batch_size)
    add("rollout.temperature", cfg.temperature)
    add("rollout.top_p", cfg.top_p)
    add("algo.advantage.estimator", "group_norm")
    if cfg.kl_coef > 0:
        add("algo.kl.init_coef", cfg.kl_coef)
        add("algo.kl.use_loss", True)
        add("algo.kl.estimator", "k3")
        add("ref.num_nodes", c.actor_num_nodes)
        add("ref.num_gpus_per_node", c.actor_gpus_per_node)
    else:
        add("algo.kl.init_coef", 0)  # 0: OpenRLHF starts no reference model
    add("actor.eps_clip_low_high", [cfg.clip_low, cfg.clip_high])
    add("actor.loss_agg_mode", "token-mean")
    add("actor.entropy_coef", cfg.entropy_coef or None)  # 0: no flag, OpenRLHF's own "no entropy term"
    add("actor.adam.lr", cfg.lr)
    add("actor.adam.weight_decay", cfg.weight_decay)
    add("actor.lr_scheduler", cfg.lr_scheduler)
    add("actor.lr_warmup_ratio", cfg.lr_warmup_ratio)
    add("actor.max_norm", cfg.max_grad_norm)
    add("train.batch_size", cfg.train_batch_size or cfg.prompts_per_step * cfg.group_size)
    add("train.micro_batch_size", cfg.micro_train_batch_size)
    add("train.max_epochs", cfg.max_epochs)
    add("train.num_episodes", cfg.num_episodes)
    add("train.seed", cfg.seed)
    add("train.async_enable", cfg.async_train)
    if cfg.async_train:
        add("train.async_queue_size", cfg.async_queue_size)
    add("train.partial_rollout_enable", cfg.partial_rollouts)
    correction = cfg.correction
    if correction is not None:
        add("algo.advantage.is_correction_level", correction.level)
        add("algo.advantage.is_correction_mode", correction.mode)
        add("algo.advantage.is_correction_gating", correction.gating)
        add("algo.advantage.is_correction_threshold", correction.threshold)
    add("train.dynamic_batch_enable", cfg.dynamic_batch)
    add("train.max_tokens_per_gpu", cfg.max_tokens_per_gpu)
    # Cluster layout.
    add("actor.num_nodes", c.actor_num_nodes)
    add("actor.num_gpus_per_node", c.actor_gpus_per_node)
    add("vllm.num_engines", c.vllm_num_engines)
    add("vllm.tensor_parallel_size", c.vllm_tensor_parallel_size)
    add("vllm.gpu_memory_utilization", c.vllm_gpu_memory_utilization)
    add("vllm.enable_prefix_caching", c.vllm_enable_prefix_caching)
    add("train.colocate_all", c.colocate_all)
    sleep = c.colocate_all and c.enable_sleep and not cfg.async_train  # OpenRLHF refuses sleep in async mode
    add("vllm.enable_sleep", sleep)
    add("ds.enable_sleep", sleep)
    # DeepSpeed.
    add("ds.zero_stage", ds.zero_stage)
    add("ds.param_dtype", ds.param_dtype)
    add("ds.attn_implementation", ds.attn_implementation)
    add("ds.packing_samples", ds.packing_samples)
    add("ds.adam_offload", ds.adam_offload)
    add("actor.gradient_checkpointing_enable", ds.gradient_checkpointing)
    # Evaluation, checkpoints, logs.
    if ev.dataset:
        add("eval.dataset", path(ev.dataset))
        add("eval.steps", ev.steps)
        add("eval.n_samples_per_prompt", ev.n_samples_per_prompt)
        add("eval.temperature", ev.temperature)
    return flags + _output_flags(cfg, path)


def chat_template(run: RunConfig) -> str:
    """A Jinja chat template that renders messages exactly as the env does (its chat format's markers), so SFT
    data and RL rollouts look the same to the model; tool results are the messages our converter writes."""
    from rstar_env.format import get_chat_format

    fmt = get_chat_format(run.env.chat_format)
    starts = {
        "system": fmt.system_start,
        "user": fmt.user_start,
        "assistant": fmt.assistant_start,
        "tool": fmt.tool_start,
    }
    branches = "".join(
        f"{'{%- if' if i == 0 else '{%- elif'} message['role'] == {role!r} %}}{{{{ {start!r} }}}}"
        for i, (role, start) in enumerate(starts.items())
    )
    return (
        "{%- for message in messages %}" + branches + "{%- endif %}"
        f"{{{{ message['content'] + {fmt.turn_end!r} }}}}"
        "{%- endfor %}"
        f"{{%- if add_generation_prompt %}}{{{{ {fmt.assistant_start!r} }}}}{{%- endif %}}"
    )


def sft_flags(run: RunConfig, cfg: OpenRLHFSFTConfig) -> list[str]:
    """OpenRLHF ``train_sft`` flags for the SFT stage (multiturn: loss on assistant turns only)."""
    ds = cfg.deepspeed
    flags: list[str] = []
    add = lambda name, value: _flag(flags, name, value)  # noqa: E731
    add("model.model_name_or_path", cfg.model)
    add("data.dataset", cfg.dataset)
    add("eval.dataset", cfg.eval_dataset)
    add("data.input_key", "messages")
    add("data.multiturn", True)
    add("data.apply_chat_template", True)
    add("data.tokenizer_chat_template", chat_template(run))
    add("data.max_len", cfg.max_len)
    add("adam.lr", cfg.lr)
    add("lr_scheduler", cfg.lr_scheduler)
    add("lr_warmup_ratio", cfg.lr_warmup_ratio)
    add("train.max_epochs", cfg.max_epochs)
    add("train.batch_size", cfg.train_batch_size)
    add("train.micro_batch_size", cfg.micro_train_batch_size)
    add("train.seed", cfg.seed)
    add("ds.zero_stage", ds.zero_stage)
    add("ds.param_dtype", ds.param_dtype)
    add("ds.attn_implementation", ds.attn_implementation)
    add("ds.packing_samples", ds.packing_samples)
    add("ds.adam_offload", ds.adam_offload)
    add("model.gradient_checkpointing_enable", ds.gradient_checkpointing)
    return flags + _output_flags(cfg, str)


def plan_launch(config: str | Path, *, python: str = "python") -> LaunchPlan:
    """Build the command for a stage config (nothing is written or run)."""
    run = load_config(config)
    cfg = trainer_config(run)
    if isinstance(cfg, OpenRLHFSFTConfig):
        flags = sft_flags(run, cfg)
        command = ["deepspeed"]
        if cfg.hostfile:
            command += ["--hostfile", cfg.hostfile]
        command += [
            "--num_nodes",
            str(cfg.num_nodes),
            "--num_gpus",
            str(cfg.gpus_per_node),
            "--module",
            "openrlhf.cli.train_sft",
            *flags,
        ]
        return LaunchPlan(stage="sft", command=command, script="train_sft", flags=flags)

    c = cfg.cluster
    prompt_file = Path(cfg.prompt_data) if cfg.prompt_data else Path(cfg.output_dir) / "prompts.jsonl"
    agent = cfg.agent_func_path or _module_file("rstar_trainers.openrlhf.agent_func")

    def path(p: str | Path) -> str:
        # The driver and the actors run in the job's directory, not where we launch from: no relative paths.
        return _cluster_path(p, c.working_dir)

    flags = rl_flags(run, cfg, prompt_data=path(prompt_file), agent_func_path=path(agent), path=path)
    env_vars = {**OPENRLHF_ENV_VARS, CONFIG_ENV: _cluster_path(config, c.working_dir), JOB_MARKER_ENV: "1"}
    runtime_env = dict(c.runtime_env)
    runtime_env["env_vars"] = {**env_vars, **runtime_env.get("env_vars", {})}
    runtime_env["worker_process_setup_hook"] = SETUP_HOOK
    command = ["ray", "job", "submit"]
    if c.address:
        command += ["--address", c.address]
    if c.working_dir:
        command += ["--working-dir", c.working_dir]
    command += ["--runtime-env-json", json.dumps(runtime_env, sort_keys=True)]
    if c.no_wait:
        command.append("--no-wait")
    command += ["--", python, "-m", TRAIN_MODULE, *flags]
    return LaunchPlan(
        stage="rl",
        command=command,
        script="train_ppo_ray",
        flags=flags,
        prompt_data=None if cfg.prompt_data else prompt_file,
        env=runtime_env["env_vars"],
    )


def write_prompts(run: RunConfig, path: Path) -> int:
    """Write the ``dataset`` section's problems (presets, filters and all) as OpenRLHF prompt rows."""
    from rstar_env.data import load_dataset

    spec = run.dataset
    dataset = load_dataset(spec.source, **spec.model_dump(exclude={"source"}))
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for row in dataset:
            f.write(json.dumps({"problem": row.problem, "answer": row.answer, "id": row.id}, ensure_ascii=False))
            f.write("\n")
    return len(dataset)


def check_plan(plan: LaunchPlan) -> list[str]:
    """Check the flags with the installed OpenRLHF's parser and validation; returns its warnings."""
    from rstar_trainers.openrlhf.cli_args import check_args

    return check_args(plan.script, plan.flags)._rstar_warnings  # type: ignore[arg-type]


@click.command("openrlhf")
@click.option(
    "--config",
    "config",
    required=True,
    type=click.Path(exists=True, dir_okay=False),
    help="A stage config with `trainer: {backend: openrlhf, ...}`.",
)
@click.option("--dry-run", is_flag=True, help="Print the command and exit without writing or submitting anything.")
@click.option(
    "--check/--no-check",
    default=True,
    show_default=True,
    help="Check the flags with OpenRLHF's own parser first (when openrlhf is installed here).",
)
@click.option("--python", default="python", show_default=True, help="The Python the job runs on the cluster.")
def command(config: str, dry_run: bool, check: bool, python: str) -> None:
    """Train a stage on a Ray cluster with OpenRLHF (vLLM rollouts, DeepSpeed training)."""
    try:
        plan = plan_launch(config, python=python)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    if check and importlib.util.find_spec("openrlhf") is not None:
        from rstar_trainers.openrlhf.cli_args import OpenRLHFArgsError

        try:
            for warning in check_plan(plan):
                click.echo(f"openrlhf: {warning}", err=True)
        except OpenRLHFArgsError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"# flags accepted by OpenRLHF's {plan.script} parser", err=True)
        from rstar_trainers.openrlhf.versions import version_warnings

        for warning in version_warnings():
            click.echo(f"# untested: {warning} (scripts/openrlhf-constraints.txt)", err=True)
    click.echo(plan.shell())
    if dry_run:
        return
    if plan.prompt_data is not None:
        count = write_prompts(load_config(config), plan.prompt_data)
        click.echo(f"# wrote {count} prompts to {plan.prompt_data}", err=True)
    result = subprocess.run(plan.command, check=False)
    if result.returncode:
        raise click.ClickException(f"{plan.command[0]} exited with status {result.returncode}")


def main(argv: list[str] | None = None) -> None:
    """``python -m rstar_trainers.openrlhf.launch --config ...``"""
    command.main(args=argv if argv is not None else sys.argv[1:], prog_name="rstar-env launch openrlhf")


if __name__ == "__main__":
    main()
