"""The RL hyperparameters both trainers share: one model, so a name means the same thing, with the same default,
whichever backend runs the config.

The local trainer (:class:`~rstar_trainers.local.config.LocalTrainerConfig`) and the OpenRLHF one
(:class:`~rstar_trainers.openrlhf.config.OpenRLHFRLConfig`) extend :class:`RLHyperparameters` with their own keys
(devices, cluster, checkpoints). Only the scale differs between them: a subclass may lower ``group_size`` and
``prompts_per_step`` for a CPU run, never rename or re-mean a field.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator


class RLHyperparameters(BaseModel):
    """GRPO-RoC: each step rolls out ``group_size * oversample`` trajectories for each of ``prompts_per_step``
    prompts; the sampler keeps ``group_size`` of each group; advantages are computed on the kept ones."""

    model_config = ConfigDict(extra="forbid")

    group_size: PositiveInt = 16
    """G: trajectories kept (and trained on) per prompt."""
    oversample: PositiveInt = 2
    """Rollouts per prompt = ``group_size * oversample`` (the paper: 2G = 32 -> G = 16). 1 turns RoC off."""
    prompts_per_step: PositiveInt = 64
    """Prompts rolled out per step."""

    lr: PositiveFloat = 1e-6
    weight_decay: NonNegativeFloat = 0.0
    max_grad_norm: PositiveFloat = 1.0
    clip_low: NonNegativeFloat = 0.2
    clip_high: NonNegativeFloat = 0.28
    """Clip-higher: the ratio is clipped to ``[1 - clip_low, 1 + clip_high]``."""
    kl_coef: NonNegativeFloat = 0.0
    """KL loss to the initial weights (k3 estimator); 0 (the default, as in the paper) loads no reference model."""
    entropy_coef: NonNegativeFloat = 0.0
    """Entropy bonus; 0 (the default) computes no entropy gradient."""

    temperature: NonNegativeFloat = 1.0
    top_p: float = Field(1.0, gt=0, le=1)
    max_response_tokens: PositiveInt = 8192
    """The env's length budget in tokens (actions and tool output); a trajectory cut by it scores 0."""

    @field_validator("clip_low")
    @classmethod
    def _clip_low_below_one(cls, value: float) -> float:
        if value >= 1:
            raise ValueError(f"clip_low must be below 1 (the ratio is clipped at 1 - clip_low), got {value}")
        return value

    @property
    def rollouts_per_prompt(self) -> int:
        return self.group_size * self.oversample
