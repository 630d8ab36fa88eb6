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

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from openrlhf.trainer.ppo_utils import samples_generator as _openrlhf_sg
from openrlhf.utils.logging_utils import init_logger

from rstar_env.config import RunConfig
from rstar_env.plugins import load_sampler
from rstar_env.sampler import checked_select
from rstar_env.trajectory import SYSTEM_FAILURES
from rstar_trainers.openrlhf.config import OpenRLHFRLConfig, trainer_config
from rstar_trainers.openrlhf.engine_queue import generate_vllm_shared_queue
from rstar_trainers.openrlhf.patch import ORIGINAL_ATTR
from rstar_trainers.openrlhf.policy_version import (
    TOKEN_VERSIONS_KEY,
    VERSION_MAX_KEY,
    VERSION_MIN_KEY,
    calling_trainer,
    install_on_trainer,
)
from rstar_trainers.openrlhf.runtime import load_run_config
from rstar_trainers.openrlhf.trajectory_log import TRAJECTORY_KEY, TrajectoryLog, resumed_step

logger = init_logger(__name__)  # OpenRLHF's handlers: a Ray worker prints only what they pass

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
    experience: Any = dataclasses.field(default=None, compare=False, repr=False)
    """The experience summarised (for the step's statistics and trajectory log; samplers never read it)."""

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
        return cls(reward=float(_scalar(reward)), **counts, experience=experience)


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


def system_failed(group: Sequence[Any]) -> bool:
    """Whether an episode of ``group`` ended in a failure of the system (``env_error``, ``policy_error``): not the
    model's doing, so the group is never trained on (its other episodes' advantages would be relative to it)."""
    return any(_scalar(e.info.get(f"end_{reason}", 0.0)) for e in group for reason in SYSTEM_FAILURES)


def without_failed_groups(experiences: Sequence[Any], group: int) -> tuple[list[Any], int]:
    """``experiences`` (whole groups of ``group``, consecutive) less the groups :func:`system_failed` names, and
    how many groups were dropped."""
    kept: list[Any] = []
    dropped = 0
    for start in range(0, len(experiences), group):
        members = experiences[start : start + group]
        if system_failed(members):
            dropped += 1
        else:
            kept.extend(members)
    return kept, dropped


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
        if system_failed(group):
            stats.dropped += 1  # the system failed an episode (env_error): never trained on, the group left whole
            continue
        chosen = checked_select(sampler, [_Record.from_experience(e) for e in group], keep, rng)
        if chosen is None:
            stats.dropped += 1
            continue
        stats.kept += 1
        kept.extend(group[i] for i in chosen)
    return kept, stats


@dataclass
class VersionStats:
    """Groups whose rollouts' tokens come from more than one policy version (possible only with partial
    rollouts: without them OpenRLHF's lock keeps a whole batch on one version)."""

    groups: int = 0
    mixed: int = 0
    dropped: int = 0


def whole_version_groups(
    experiences: Sequence[Any], *, group: int, allow_mixed: bool, partial: bool
) -> tuple[list[Any], VersionStats]:
    """Check that each prompt's consecutive ``group`` experiences were generated by one policy version.

    A group spanning versions is kept when ``allow_mixed`` (``trainer.allow_mixed_version_groups``), else dropped
    before the sampler sees it. Without ``partial`` rollouts such a group means the generation lock did not hold,
    and raises."""
    stats = VersionStats()
    kept: list[Any] = []
    for start in range(0, len(experiences), group):
        members = experiences[start : start + group]
        stats.groups += 1
        lows = [float(_scalar(e.info.get(VERSION_MIN_KEY, 0.0))) for e in members]
        highs = [float(_scalar(e.info.get(VERSION_MAX_KEY, 0.0))) for e in members]
        if min(lows) == max(highs):
            kept.extend(members)
            continue
        if not partial:
            raise RuntimeError(
                f"a group's rollouts come from policy versions {min(lows):g}..{max(highs):g} without partial "
                "rollouts: a weight sync overlapped generation (OpenRLHF's vLLM lock did not hold)"
            )
        stats.mixed += 1
        if allow_mixed:
            kept.extend(members)
        else:
            stats.dropped += 1
    return kept, stats


class _RecordingSampler:
    """The sampler plugin, recording every group it is shown and what it chose (for the step's statistics)."""

    def __init__(self, sampler: Any) -> None:
        self.inner = sampler
        self.groups: list[list[_Record]] = []
        self.selections: list[list[int] | None] = []

    def select(self, group: Sequence[Any], keep: int, rng: np.random.Generator) -> list[int] | None:
        chosen = self.inner.select(group, keep, rng)
        self.groups.append(list(group))
        self.selections.append(None if chosen is None else list(chosen))
        return chosen

    def take(self) -> tuple[list[list[_Record]], list[list[int] | None]]:
        groups, selections = self.groups, self.selections
        self.groups, self.selections = [], []
        return groups, selections

    def __getattr__(self, name: str) -> Any:  # name, error_penalty, ... of the plugin
        return getattr(self.inner, name)


STATS_PREFIX = "roc/"
"""OpenRLHF logs the mean of each ``info`` key; the sampler statistics go there under this prefix."""


class RocSamplesGenerator(_BaseSamplesGenerator):  # type: ignore[misc, valid-type]
    """OpenRLHF's samples generator with GRPO-RoC group down-sampling for training batches.

    Constructed by OpenRLHF with its usual arguments; the run config comes from ``$RSTAR_ENV_CONFIG`` (or
    ``run_config=``, for tests). ``sampler`` and ``trainer.{group_size, oversample, refill, seed, output_dir,
    save_trajectories}`` are read from it.

    Each training step it also logs the local trainer's group statistics
    (:func:`rstar_plugins.samplers.stats.batch_stats`: before selection ``all_pos/tool_error_ratio``, after it
    the kept and dropped positives and negatives) as ``roc/<key>`` in every kept experience's ``info`` (OpenRLHF
    logs their mean, which is the value) and in :attr:`last_step_stats`, and appends the step's rollouts to
    ``trajectories.jsonl`` (:mod:`rstar_trainers.openrlhf.trajectory_log`).
    """

    def __init__(self, *args: Any, run_config: RunConfig | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The policy-version hooks on the trainer building this generator (the sync trainer's actor, whose Ray actor
        # class holds copies of OpenRLHF's unpatched methods: see policy_version.install_on_trainer). No-op where
        # its methods are the hooks already.
        trainer = calling_trainer()
        if trainer is not None and install_on_trainer(trainer):
            logger.info("policy-version hooks installed on %s", type(trainer).__name__)
        run = run_config if run_config is not None else load_run_config()
        settings = trainer_config(run)
        if not isinstance(settings, OpenRLHFRLConfig):
            raise TypeError("the RoC samples generator needs an RL config (trainer.stage: rl)")
        self.settings = settings
        self.sampler = _RecordingSampler(load_sampler(run.sampler.name, **run.sampler.options))
        self.last_step_stats: dict[str, float] = {}
        self.trajectory_log: TrajectoryLog | None = None
        if settings.save_trajectories:
            ckpt_path = getattr(getattr(self.args, "ckpt", None), "path", None)
            # The launcher sets --ckpt.path to {output_dir}/checkpoints as the cluster sees it.
            out = Path(ckpt_path).parent if ckpt_path else Path(settings.output_dir)
            load = getattr(getattr(self.args, "ckpt", None), "load_enable", False)
            self.trajectory_log = TrajectoryLog(out, resume_from=resumed_step(ckpt_path) if load else 0)
        self.rng = np.random.default_rng(settings.seed)
        self.last_stats = GroupStats()
        self._evaluating = False
        self.version_stats = VersionStats()
        n = self.args.rollout.n_samples_per_prompt
        if n != settings.group_size:
            raise ValueError(
                f"--rollout.n_samples_per_prompt is {n} but trainer.group_size is {settings.group_size}: "
                "group_norm must see the kept group size (the launcher sets the flag from the config)"
            )

    def _generate_queued(self, *args: Any, **generate_kwargs: Any) -> Any:
        # OpenRLHF's _generate_vllm, with prompts fed to engines from one shared queue by free KV capacity.
        experiences, consumed, exhausted = generate_vllm_shared_queue(
            self,
            *args,
            capacity_tokens=self.settings.engine_capacity_tokens,
            max_prompts=self.settings.engine_max_prompts,
            **generate_kwargs,
        )
        if not self._evaluating and experiences:
            group = generate_kwargs.get("n_samples_per_prompt", self.args.rollout.n_samples_per_prompt)
            experiences, stats = whole_version_groups(
                experiences,
                group=group,
                allow_mixed=self.settings.allow_mixed_version_groups,
                partial=self.settings.partial_rollouts,
            )
            for field in ("groups", "mixed", "dropped"):
                setattr(self.version_stats, field, getattr(self.version_stats, field) + getattr(stats, field))
        return experiences, consumed, exhausted

    def _process_response_into_experience(self, response: Any, **generate_kwargs: Any) -> Any:
        experience = super()._process_response_into_experience(response, **generate_kwargs)
        # The agent's trajectory rides on the experience until the step is logged (then it is dropped, so that it
        # never travels to the training actors).
        setattr(experience, TRAJECTORY_KEY, response.get(TRAJECTORY_KEY))
        setattr(experience, TOKEN_VERSIONS_KEY, response.get(TOKEN_VERSIONS_KEY))
        return experience

    @torch.no_grad()
    def generate_samples(self, **generate_kwargs: Any) -> Any:
        self.sampler.take()
        self.version_stats = VersionStats()
        samples, *rest = super().generate_samples(**generate_kwargs)
        groups, selections = self.sampler.take()
        self._log_versions(samples)
        if not groups and samples:  # no selection ran (plain GRPO): every rollout is kept
            keep = self.args.rollout.n_samples_per_prompt
            records = [_Record.from_experience(e) for e in samples]
            groups = [records[i : i + keep] for i in range(0, len(records), keep)]
            selections = [list(range(len(g))) for g in groups]
        if groups:
            self._log_step(groups, selections, trains=bool(samples))
        return (samples, *rest)

    def _log_step(self, groups: list[list[_Record]], selections: list[list[int] | None], *, trains: bool) -> None:
        from rstar_plugins.samplers.stats import batch_stats

        keep = self.settings.group_size
        stats = batch_stats(groups, selections, keep, sampler=self.sampler.inner)
        self.last_step_stats = stats
        kept_flags = [
            i in set(sel or ()) for group, sel in zip(groups, selections, strict=True) for i in range(len(group))
        ]
        rolled = [record.experience for group in groups for record in group]
        for experience, kept in zip(rolled, kept_flags, strict=True):
            if kept:
                experience.info.update({f"{STATS_PREFIX}{k}": torch.tensor([float(v)]) for k, v in stats.items()})
        step = None
        if self.trajectory_log is not None:
            step = self.trajectory_log.write_step(rolled, kept_flags, trains=trains)
        for experience in rolled:
            for key in (TRAJECTORY_KEY, TOKEN_VERSIONS_KEY):
                if hasattr(experience, key):
                    delattr(experience, key)  # never shipped to the training actors
        logger.info(
            "RoC step %s: correct trajectories' tool-error ratio %.3f before selection, %.3f kept; positives "
            "kept %d of %d, negatives kept %d of %d; groups dropped %d of %d",
            step if step is not None else "-",
            stats.get("all_pos/tool_error_ratio", float("nan")),
            stats.get("kept_pos/tool_error_ratio", float("nan")),
            int(stats["positives_kept"]),
            int(stats["positives"]),
            int(stats["negatives_kept"]),
            int(stats["negatives"]),
            int(stats["groups_dropped"]),
            int(stats["groups"]),
        )

    def _log_versions(self, samples: Sequence[Any]) -> None:
        """The batch's policy versions and its groups that span several, in each kept sample's ``info`` (OpenRLHF
        logs the mean: the same value everywhere) and the log."""
        stats = self.version_stats
        if not samples:
            return
        lows = [_scalar(e.info.get(VERSION_MIN_KEY, 0.0)) for e in samples]
        highs = [_scalar(e.info.get(VERSION_MAX_KEY, 0.0)) for e in samples]
        values = {
            "mixed_version_groups": float(stats.mixed),
            "mixed_version_groups_dropped": float(stats.dropped),
        }
        for experience in samples:
            experience.info.update({f"{STATS_PREFIX}{k}": torch.tensor([v]) for k, v in values.items()})
        logger.info(
            "policy versions of the batch: %g..%g; groups spanning versions: %d of %d, %d of them dropped (%s)",
            min(lows),
            max(highs),
            stats.mixed,
            stats.groups,
            stats.dropped,
            "trainer.allow_mixed_version_groups keeps them"
            if self.settings.allow_mixed_version_groups
            else "trainer.allow_mixed_version_groups: false drops them",
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
        if self._evaluating:
            return self._generate_queued(dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs)
        if self.settings.oversample == 1 and self.sampler.name == "grpo":  # OpenRLHF's own GRPO groups, as they come
            experiences, consumed, exhausted = self._generate_queued(
                dataloader_iter, num_prompts, dynamic_filtering, **generate_kwargs
            )
            experiences, _ = without_failed_groups(experiences, self.settings.rollouts_per_prompt)
            return experiences, consumed, exhausted
        keep = self.settings.group_size
        rollouts = self.settings.rollouts_per_prompt
        generate_kwargs = {**generate_kwargs, "n_samples_per_prompt": rollouts}
        kept_all: list[Any] = []
        total = GroupStats()
        consumed_all = 0
        wanted = num_prompts
        while True:
            experiences, consumed, exhausted = self._generate_queued(
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
            self.sampler.name,
            total.groups,
            rollouts,
            total.kept,
            keep,
            total.dropped,
        )
        return kept_all, consumed_all, exhausted
