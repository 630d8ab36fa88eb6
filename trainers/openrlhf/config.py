"""The ``trainer`` section of a run config for ``backend: openrlhf``.

One YAML file describes a run for either trainer; the shared sections (``env``, ``tools``, ``reward``,
``sampler``, ``dataset``) mean the same here as for the local trainer. This module validates the ``trainer``
section. Two stages share the backend:

``stage: rl`` (default): GRPO-RoC with OpenRLHF's Ray PPO trainer (vLLM rollouts, DeepSpeed training)::

    trainer:
      backend: openrlhf
      model: Qwen/Qwen3-14B-Base
      group_size: 16          # G: kept and trained on per prompt (OpenRLHF's n_samples_per_prompt)
      oversample: 2           # rolled out per prompt = G * oversample = 2G; the sampler plugin keeps G
      max_response_tokens: 8192
      cluster: {actor_num_nodes: 2, actor_gpus_per_node: 8, vllm_num_engines: 16}

``stage: sft``: OpenRLHF's SFT trainer on chat data converted by :mod:`rstar_trainers.openrlhf.convert`.

The RL hyperparameters (``group_size``, ``oversample``, ``prompts_per_step``, ``lr``, ``clip_low``, ``clip_high``,
``kl_coef``, ``entropy_coef``, ``temperature``, ``top_p``, ``max_response_tokens``...) are one model shared with
the local trainer, :class:`~rstar_trainers.hyperparams.RLHyperparameters`; the keys every trainer section shares
(``backend``, ``stage``, ``model``, ``output_dir``, ``seed``, the sampling keys) are
:class:`~rstar_env.config.TrainerSettings`, which both stages' models extend as the local trainer's do.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from rstar_env.config import ConfigError, RunConfig, TrainerSettings, validation_error_message
from rstar_trainers.hyperparams import RLHyperparameters

DEFAULT_MODEL = "Qwen/Qwen3-14B-Base"
"""The base model of the rStar2-Agent report."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ClusterConfig(_Model):
    """Where and how the job runs on the Ray cluster."""

    address: str | None = None
    """Ray dashboard address for ``ray job submit --address`` (e.g. ``http://head:8265``); ``None`` leaves it to
    ``RAY_ADDRESS`` or Ray's default."""
    working_dir: str | None = None
    """Uploaded as the job's ``--working-dir``; the config and dataset paths are then given relative to it."""
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    """Merged into the job's runtime env (``pip``, ``py_modules``, more ``env_vars``...)."""
    no_wait: bool = False
    """Return as soon as the job is submitted instead of streaming its logs."""

    actor_num_nodes: PositiveInt = 1
    actor_gpus_per_node: PositiveInt = 8
    vllm_num_engines: PositiveInt = 8
    vllm_tensor_parallel_size: PositiveInt = 1
    vllm_gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    vllm_enable_prefix_caching: bool = True
    colocate_all: bool = True
    """Actor, reference (if any) and vLLM engines share the same GPUs, taking turns (sleep mode)."""
    enable_sleep: bool = True
    """vLLM and DeepSpeed sleep while the other works (needs ``colocate_all``; ignored in async mode)."""

    @model_validator(mode="after")
    def _colocation_fits(self) -> ClusterConfig:
        gpus = self.actor_num_nodes * self.actor_gpus_per_node
        engines = self.vllm_num_engines * self.vllm_tensor_parallel_size
        if self.colocate_all and gpus != engines:
            # OpenRLHF asserts the same at start-up, after the cluster has been reserved: say it here instead.
            raise ValueError(
                f"colocate_all needs vllm_num_engines * vllm_tensor_parallel_size ({engines}) == "
                f"actor_num_nodes * actor_gpus_per_node ({gpus})"
            )
        return self


class DeepSpeedConfig(_Model):
    zero_stage: Literal[0, 1, 2, 3] = 3
    packing_samples: bool = True
    """Pack sequences without padding (needs flash-attention on the cluster)."""
    gradient_checkpointing: bool = True
    adam_offload: bool = False
    param_dtype: Literal["bf16", "fp16"] = "bf16"
    attn_implementation: str = "flash_attention_2"


class EvalConfig(_Model):
    dataset: str | None = None
    """A jsonl with the same fields as the training prompts (``problem``, ``answer``); ``None``: no evaluation."""
    steps: int = -1
    """Evaluate every N steps (-1: never)."""
    n_samples_per_prompt: PositiveInt = 4
    temperature: NonNegativeFloat = 0.6


class CorrectionConfig(_Model):
    """OpenRLHF's train/rollout mismatch correction (``--algo.advantage.is_correction_*``) on the per-token ratio
    ``pi_train / pi_rollout`` of the engine's log-probs: ``level: token, mode: clip`` is TIS, ``level: token, mode:
    mask`` ICEPOP, ``level: seq, mode: mask`` the sequence mask; ``gating: binary_kl`` or ``tv`` gates a divergence
    instead of the ratio (then ``threshold`` is one upper bound). Only generated tokens count: tool output has no
    engine log-prob and is masked out of the loss."""

    level: Literal["token", "seq"] = "token"
    mode: Literal["mask", "clip"] = "mask"
    gating: Literal["ratio", "binary_kl", "tv"] = "ratio"
    threshold: list[NonNegativeFloat] = Field(default_factory=lambda: [0.5, 5.0], min_length=1, max_length=2)
    """``[low, high]`` bounds on the gated statistic, or ``[high]`` alone (low 0)."""

    @model_validator(mode="after")
    def _consistent(self) -> CorrectionConfig:
        if self.mode == "clip" and (self.level == "seq" or self.gating != "ratio"):
            raise ValueError("mode clip needs level token and gating ratio (only a token's ratio can be clamped)")
        if self.gating != "ratio" and len(self.threshold) != 1:
            raise ValueError(f"gating {self.gating} takes one upper bound: threshold [delta]")
        return self


class OpenRLHFRLConfig(RLHyperparameters, TrainerSettings):
    """GRPO-RoC on OpenRLHF. Each step rolls out ``group_size * oversample`` trajectories for each of
    ``prompts_per_step`` prompts, the sampler plugin keeps ``group_size`` of each group (or drops it), and
    OpenRLHF's ``group_norm`` estimator computes advantages on exactly the kept ``group_size``. The RL
    hyperparameters are :class:`~rstar_trainers.hyperparams.RLHyperparameters` (shared with the local trainer):
    ``group_size`` is OpenRLHF's ``--rollout.n_samples_per_prompt``, ``prompts_per_step`` its
    ``--rollout.batch_size``. The keys every trainer section shares are :class:`~rstar_env.config.TrainerSettings`:
    its ``max_new_tokens`` is this trainer's ``max_new_tokens_per_turn`` (either name, one setting) and its
    ``eval_temperature`` the ``eval`` section's ``temperature``."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["openrlhf"] = "openrlhf"
    stage: Literal["rl"] = "rl"
    model: str = DEFAULT_MODEL
    """A Hugging Face model name or a path every node can read (the SFT stage's output, for the RL stages)."""
    output_dir: str = "runs/openrlhf"
    seed: int = 42

    refill: bool = False
    """When the sampler drops groups, roll out fresh prompts until the step has ``prompts_per_step`` kept groups
    (off: train on the groups that survived, as the reference implementation does)."""
    engine_capacity_tokens: PositiveInt | None = None
    """KV-cache tokens per vLLM engine for the shared rollout queue (``None``: read from each engine's cache config,
    else ``engine_max_prompts`` decides); see :mod:`rstar_trainers.openrlhf.engine_queue`."""
    engine_max_prompts: PositiveInt = 64
    """Prompts (each with all its samples) in flight per engine when its KV capacity is unknown."""
    train_batch_size: PositiveInt | None = None
    """Samples per optimizer step; ``None``: ``prompts_per_step * group_size`` (one on-policy update per step)."""
    micro_train_batch_size: PositiveInt = 1
    micro_rollout_batch_size: PositiveInt = 2
    max_epochs: PositiveInt = 1
    num_episodes: PositiveInt = 1
    async_train: bool = False
    """OpenRLHF's async trainer (rollouts of step t+1 overlap training of step t); see docs/cluster.md."""
    async_queue_size: PositiveInt = 1
    """Batches the async generator may roll out ahead of the trainer (staleness up to this many versions, plus one
    with ``partial_rollouts``)."""
    partial_rollouts: bool = False
    """OpenRLHF's ``--train.partial_rollout_enable`` (needs ``async_train``): a weight sync pauses generation and
    episodes in flight go on with the new weights; each token's policy version is recorded."""
    allow_mixed_version_groups: bool = False
    """With ``partial_rollouts``, a prompt's group can contain tokens of several policy versions: keep such groups
    (true) or drop them before the sampler sees them (false, the default). Counted either way
    (``roc/mixed_version_groups``)."""
    tis_cap: PositiveFloat | None = None
    """Truncated importance sampling, as the local trainer's ``tis_cap``: each generated token's policy term is
    weighted by ``min(pi_train / pi_rollout, tis_cap)`` (OpenRLHF's ``is_correction`` token level, clip mode,
    threshold ``[tis_cap]``). Exclusive with ``is_correction``."""
    is_correction: CorrectionConfig | None = None
    """Any of OpenRLHF's mismatch corrections (see :class:`CorrectionConfig`); ``None``: off."""
    dynamic_batch: bool = False
    max_tokens_per_gpu: PositiveInt | None = None

    lr_scheduler: str = "constant_with_warmup"
    lr_warmup_ratio: NonNegativeFloat = 0.0

    max_prompt_tokens: PositiveInt = 2048
    """The rendered prompt (system prompt with the tool schemas + problem)."""
    max_new_tokens_per_turn: PositiveInt | None = None
    """Cap on one assistant turn; ``None``: a turn may use what the length budget leaves. ``max_new_tokens`` (the
    local trainer's name) sets the same cap."""
    stop: list[str] = Field(default_factory=list)
    """Extra stop strings; ``</tool_call>`` and the chat format's end-of-turn marker are always stop strings."""

    agent_func_path: str | None = None
    """The agent file OpenRLHF loads on every vLLM engine; ``None``: this package's ``agent_func.py`` (the same
    install path on every node)."""
    prompt_data: str | None = None
    """Where the cluster reads the prompts (jsonl with ``problem``/``answer``). ``None``: the launcher writes the
    ``dataset`` section's problems (with its presets and filters) to ``{output_dir}/prompts.jsonl``."""
    eval: EvalConfig = Field(default_factory=EvalConfig)
    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)

    save_steps: int = -1
    save_hf: bool = True
    save_trajectories: bool = True
    """Append every step's rollouts to ``output_dir/trajectories.jsonl`` (input of ``rstar-env filter-hard``)."""
    tensorboard: bool = True
    wandb_project: str | None = None
    extra_args: dict[str, Any] = Field(default_factory=dict)
    """More OpenRLHF flags, dotted names without the dashes: ``{"vllm.enforce_eager": true}``. ``true`` is a
    bare flag, ``false``/``null`` omit it, a list is several values."""

    @property
    def max_len(self) -> int:
        """OpenRLHF's ``--data.max_len``: prompt + response tokens."""
        return self.max_prompt_tokens + self.max_response_tokens

    @model_validator(mode="after")
    def _one_setting_per_name(self) -> OpenRLHFRLConfig:
        # TrainerSettings' names for what this trainer also names its own way: one setting, never two meanings.
        turn, given = self.max_new_tokens_per_turn, self.max_new_tokens
        if turn is not None and given is not None and turn != given:
            raise ValueError(
                f"max_new_tokens ({given}) and max_new_tokens_per_turn ({turn}) are one setting (the cap on one "
                "assistant turn) with two values: keep one of them"
            )
        self.max_new_tokens_per_turn = self.max_new_tokens = _first(turn, given)
        if self.eval_temperature is not None:
            if "temperature" in self.eval.model_fields_set and self.eval.temperature != self.eval_temperature:
                raise ValueError(
                    f"eval_temperature ({self.eval_temperature}) and eval.temperature ({self.eval.temperature}) are "
                    "one setting with two values: keep one of them"
                )
            self.eval = self.eval.model_copy(update={"temperature": self.eval_temperature})
        self.eval_temperature = self.eval.temperature
        if self.eval_max_new_tokens is not None:
            raise ValueError(
                "eval_max_new_tokens is not read by the OpenRLHF trainer: its evaluation turns are capped by "
                "max_new_tokens_per_turn; leave it unset (rstar-env eval --max-new-tokens sets it for a later eval)"
            )
        return self

    @model_validator(mode="after")
    def _check(self) -> OpenRLHFRLConfig:
        if self.group_size < 2:
            raise ValueError("group_size must be at least 2: group_norm advantages of a group of 1 are all 0")
        if self.clip_low > 1 or self.clip_high > 10:
            raise ValueError(f"clip_low/clip_high look wrong ({self.clip_low}, {self.clip_high})")
        if self.partial_rollouts and not self.async_train:
            raise ValueError("partial_rollouts needs async_train: true (OpenRLHF pauses the async generator's engines)")
        if self.tis_cap is not None and self.is_correction is not None:
            raise ValueError("tis_cap and is_correction both set: tis_cap is is_correction {level: token, mode: clip}")
        if self.correction is not None and self.top_p != 1.0:
            raise ValueError(
                f"mismatch correction needs top_p 1 (got {self.top_p}): vLLM's log-probs are then of the truncated "
                "distribution and the trainer's are not, so the weights would correct top-p, not the mismatch"
            )
        return self

    @property
    def correction(self) -> CorrectionConfig | None:
        """The mismatch correction in effect (``tis_cap`` spelled out), or ``None``."""
        if self.tis_cap is not None:
            return CorrectionConfig(level="token", mode="clip", gating="ratio", threshold=[self.tis_cap])
        return self.is_correction


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


class OpenRLHFSFTConfig(TrainerSettings):
    """The non-reasoning SFT stage (tool-call format and instruction following) with OpenRLHF's SFT trainer.

    ``dataset`` is a jsonl of ``{"messages": [...]}`` rows in our tool-call format, as written by
    ``python -m rstar_trainers.openrlhf.convert``. Only assistant turns are trained on (OpenRLHF's multiturn
    mode); the chat template is set to the env's chat format, so SFT and RL render conversations identically.
    The keys every trainer section shares are :class:`~rstar_env.config.TrainerSettings`'s, with this stage's
    defaults (its sampling keys are for ``rstar-env eval`` and ``chat`` of the trained model).
    """

    backend: Literal["openrlhf"] = "openrlhf"
    stage: Literal["sft"]
    model: str = DEFAULT_MODEL
    dataset: str
    eval_dataset: str | None = None
    output_dir: str = "runs/sft"
    seed: int = 42

    max_len: PositiveInt = 8192
    lr: PositiveFloat = 5e-6
    lr_scheduler: str = "cosine_with_min_lr"
    lr_warmup_ratio: NonNegativeFloat = 0.03
    max_epochs: PositiveInt = 2
    train_batch_size: PositiveInt = 128
    micro_train_batch_size: PositiveInt = 2

    num_nodes: PositiveInt = 1
    gpus_per_node: PositiveInt = 8
    hostfile: str | None = None
    """DeepSpeed hostfile for several nodes."""
    deepspeed: DeepSpeedConfig = Field(default_factory=DeepSpeedConfig)

    save_steps: int = -1
    save_hf: bool = True
    tensorboard: bool = True
    wandb_project: str | None = None
    extra_args: dict[str, Any] = Field(default_factory=dict)


OpenRLHFConfig = OpenRLHFRLConfig | OpenRLHFSFTConfig


def trainer_config(run: RunConfig, **overrides: Any) -> OpenRLHFConfig:
    """Validate ``run.trainer`` for the OpenRLHF backend (``overrides`` that are not None replace keys).

    Raises :class:`~rstar_env.config.ConfigError` naming the key for anything wrong, including an ``env`` section
    that contradicts the trainer (the OpenRLHF backend always counts the length budget in tokens).
    """
    data = {**run.trainer, **{k: v for k, v in overrides.items() if v is not None}}
    backend = data.get("backend")
    if backend != "openrlhf":
        raise ConfigError(
            f"trainer.backend is {backend!r}: `rstar-env launch openrlhf` needs `trainer: {{backend: openrlhf, ...}}` "
            "(use `rstar-env train` for the local trainer)"
        )
    stage = data.get("stage", "rl")
    model: type[BaseModel] = OpenRLHFSFTConfig if stage == "sft" else OpenRLHFRLConfig
    try:
        cfg = model.model_validate(data)
    except ValidationError as exc:
        title = "invalid trainer section for backend openrlhf:"
        raise ConfigError(validation_error_message(exc, title, prefix="trainer.", model=model)) from None
    if isinstance(cfg, OpenRLHFRLConfig):
        env = run.env
        if env.max_length is not None and (env.length_unit != "tokens" or env.max_length != cfg.max_response_tokens):
            raise ConfigError(
                f"env.max_length ({env.max_length} {env.length_unit}) contradicts trainer.max_response_tokens "
                f"({cfg.max_response_tokens}): the OpenRLHF backend budgets tokens; set env.max_length to "
                f"{cfg.max_response_tokens} with length_unit: tokens, or leave it out"
            )
    return cfg  # type: ignore[return-value]
