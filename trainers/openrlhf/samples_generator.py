"""GRPO-RoC inside OpenRLHF: roll out 2G per prompt, let the sampler plugin keep G, before advantages.

OpenRLHF has no hook for per-group down-sampling. Its ``SamplesGenerator._generate_vllm`` dispatches each prompt to
a vLLM engine, which returns that prompt's ``n`` rollouts together, and appends them to the batch as one
consecutive run of ``n`` experiences; the experience maker later reshapes rewards to ``(-1,
n_samples_per_prompt)`` for ``group_norm``. :class:`RocSamplesGenerator` overrides ``_generate_vllm``: it asks for
``group_size * oversample`` rollouts per prompt, cuts the result into those consecutive groups, and replaces each
with the ``group_size`` the sampler plugin selects (or nothing, when the sampler drops the group). With
``--rollout.n_samples_per_prompt`` set to ``group_size``, ``group_norm`` then sees exactly G per prompt.

Evaluation is left alone (``generate_eval_samples`` rolls out ``eval.n_samples_per_prompt`` and keeps them all).
The async trainer uses the same class (see :mod:`rstar_trainers.openrlhf.patch` for how it gets into the Ray
actors).

The sampler reads the summary attributes of :class:`_Record`: ``reward`` is the experience's reward (what
advantages are computed from); the tool-call counts come from the agent's ``extra_logs``, which OpenRLHF copies
into ``experience.info`` (see :mod:`rstar_trainers.openrlhf.agent_func`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from openrlhf.trainer.ppo_utils import samples_generator as _openrlhf_sg

from rstar_env.config import RunConfig
from rstar_env.plugins import load_sampler
from rstar_trainers.openrlhf.config import OpenRLHFRLConfig, trainer_config
from rstar_trainers.openrlhf.patch import ORIGINAL_ATTR
from rstar_trainers.openrlhf.runtime import load_run_config

logger = logging.getLogger(__name__)

# Derive from OpenRLHF's own class even when the module attribute has already been replaced by our patch.
_BaseSamplesGenerator: type = _openrlhf_sg.__dict__.get(ORIGINAL_ATTR) or _openrlhf_sg.SamplesGenerator

SUMMARY_KEYS = ("num_tool_calls", "num_tool_errors", "num_answer_blocks", "num_assistant_turns")
"""What the agent must put in ``extra_logs`` for the sampler (``reward`` comes from the experience itself)."""


@dataclass(frozen=True)
class _Record:
    """The sampler's view of one experience (see :class:`rstar_env.sampler.TrajectorySummary`)."""

    reward: float
    num_tool_calls: int
    num_tool_errors: int
    num_answer_blocks: int
    num_assistant_turns: int

    @classmethod
    def from_experience(cls, experience: Any) -> _Record:
        reward = experience.rewards if experience.rewards is not None else experience.info.get("reward")
        if reward is None:
            raise ValueError("an experience has no reward: RoC needs the agent executor's rewards")
        missing = [k for k in SUMMARY_KEYS if k not in experience.info]
        if missing:
            raise ValueError(
                f"experience info lacks {missing}: RoC reads the tool-call statistics that "
                "rstar_trainers.openrlhf.agent_func puts in extra_logs; is --train.agent_func_path ours?"
            )
        counts = {k: int(_scalar(experience.info[k])) for k in SUMMARY_KEYS}
        return cls(reward=float(_scalar(reward)), **counts)


def _scalar(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.reshape(-1)[0].item())
    if isinstance(value, list | tuple):
        return float(value[0])
    return float(value)


@dataclass
class GroupStats:
    """What one call of the RoC selection did (logged, and added to each kept experience's ``info``)."""

    groups: int = 0
    kept: int = 0
    dropped: int = 0
    rollouts: int = 0

    @property
    def drop_rate(self) -> float:
        return self.dropped / self.groups if self.groups else 0.0


def select_groups(
    experiences: Sequence[Any], *, rollouts_per_prompt: int, keep: int, sampler: Any, rng: np.random.Generator
) -> tuple[list[Any], GroupStats]:
    """Down-sample each prompt's consecutive ``rollouts_per_prompt`` experiences to the sampler's ``keep``.

    ``experiences`` must be whole groups in OpenRLHF's order (one prompt's rollouts consecutive); a group whose
    prompts differ, or a trailing partial group, means that contract broke, and raises rather than silently
    training on mixed groups. Returns the kept experiences (group order and, inside a group, the sampler's index
    order) and the counts.
    """
    if len(experiences) % rollouts_per_prompt:
        raise ValueError(
            f"{len(experiences)} experiences are not whole groups of {rollouts_per_prompt}: "
            "OpenRLHF's rollout order is not what RoC expects"
        )
    stats = GroupStats(rollouts=len(experiences))
    kept: list[Any] = []
    for start in range(0, len(experiences), rollouts_per_prompt):
        group = experiences[start : start + rollouts_per_prompt]
        prompts = {tuple(e.prompts) for e in group}
        if len(prompts) != 1:
            raise ValueError(f"rollouts {start}..{start + rollouts_per_prompt - 1} mix prompts: not one group")
        stats.groups += 1
        chosen = sampler.select([_Record.from_experience(e) for e in group], keep, rng)
        if chosen is None:
            stats.dropped += 1
            continue
        if len(chosen) != keep or len(set(chosen)) != keep:
            raise ValueError(f"sampler {getattr(sampler, 'name', sampler)!r} returned {chosen}, not {keep} indices")
        stats.kept += 1
        kept.extend(group[i] for i in chosen)
    return kept, stats


class RocSamplesGenerator(_BaseSamplesGenerator):  # type: ignore[misc, valid-type]
    """OpenRLHF's samples generator with GRPO-RoC group down-sampling for training batches.

    Constructed by OpenRLHF with its usual arguments; the run config comes from ``$RSTAR_ENV_CONFIG`` (or
    ``run_config=``, for tests). ``sampler`` and ``trainer.{group_size, oversample, refill, seed}`` are read from it.
    """

    def __init__(self, *args: Any, run_config: RunConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        run = run_config if run_config is not None else load_run_config()
        settings = trainer_config(run)
        if not isinstance(settings, OpenRLHFRLConfig):
            raise TypeError("the RoC samples generator needs an RL config (trainer.stage: rl)")
        self.settings = settings
        self.sampler = load_sampler(run.sampler.name, **run.sampler.options)
        self.rng = np.random.default_rng(settings.seed)
        self.last_stats = GroupStats()
        self._evaluating = False
        n = self.args.rollout.n_samples_per_prompt
        if n != settings.group_size:
            raise ValueError(
                f"--rollout.n_samples_per_prompt is {n} but trainer.group_size is {settings.group_size}: "
                "group_norm must see the kept group size (the launcher sets the flag from the config)"
            )

    @torch.no_grad()
    def generate_eval_samples(self, **generate_kwargs: Any) -> Any:
        # Evaluation keeps every rollout (pass@k needs them all): no oversampling, no selection.
        self._evaluating = True
        try:
            return super().generate_eval_samples(**generate_kwargs)
        finally:
            self._evaluating = False

    def _generate_vllm(self, dataloader_iter: Any, num_prompts: int, dynamic_filtering: Any, **generate_kwargs: Any):
        if self._evaluating or (self.settings.oversample == 1 and self.sampler.name == "grpo"):
            return super()._generate_vllm(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        keep = self.settings.group_size
        rollouts = self.settings.rollouts_per_prompt
        generate_kwargs = {**generate_kwargs, "n_samples_per_prompt": rollouts}
        kept_all: list[Any] = []
        total = GroupStats()
        consumed_all = 0
        wanted = num_prompts
        while True:
            experiences, consumed, exhausted = super()._generate_vllm(
                dataloader_iter, wanted, dynamic_filtering, **generate_kwargs
            )
            consumed_all += consumed
            kept, stats = select_groups(
                experiences, rollouts_per_prompt=rollouts, keep=keep, sampler=self.sampler, rng=self.rng
            )
            kept_all.extend(kept)
            for field in ("groups", "kept", "dropped", "rollouts"):
                setattr(total, field, getattr(total, field) + getattr(stats, field))
            have = len(kept_all) // keep
            if not self.settings.refill or exhausted or have >= num_prompts or not experiences:
                break
            wanted = num_prompts - have
        self.last_stats = total
        # The same numbers on every kept sample: OpenRLHF averages info over the batch for its logs.
        for experience in kept_all:
            experience.info["roc/drop_rate"] = torch.tensor([total.drop_rate])
            experience.info["roc/kept_groups"] = torch.tensor([float(total.kept)])
            experience.info["roc/rollouts"] = torch.tensor([float(total.rollouts)])
        logger.info(
            "RoC (%s): %d groups of %d rollouts, kept %d x %d, dropped %d",
            self.sampler.name, total.groups, rollouts, total.kept, keep, total.dropped,
        )
        return kept_all, consumed_all, exhausted
