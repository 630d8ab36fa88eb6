"""Single-machine GRPO-RoC: roll out with the model being trained, keep G of 2G per prompt, update.

One step:

1. draw ``prompts_per_step`` problems (a seeded permutation per epoch; the position is checkpointed);
2. roll out ``group_size * oversample`` trajectories per problem through the vector env with the model itself
   (token ids, sampling log-probs and action masks recorded; tool output masked out);
3. the sampler plugin keeps ``group_size`` per prompt or drops the group (``roc`` by default);
4. advantages are group-normalised over the kept trajectories only;
5. ``updates_per_step`` AdamW steps on the token-level clipped loss, with gradient accumulation over micro-batches
   and gradient clipping.

Checkpoints hold model, optimizer, every random generator, the step and the data position, so a resumed run
continues exactly as an uninterrupted one would. Ctrl-C saves a checkpoint before exiting.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import random
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean
from typing import Any

import numpy as np
import torch

from rstar_env import threads
from rstar_env.config import RunConfig, load_config
from rstar_env.data import load_dataset
from rstar_env.plugins import load_sampler
from rstar_env.rollout.collect import jobs_for, trajectory_tokens
from rstar_env.rollout.dispatch import DispatchPolicy, EngineSpec, engine_stats_metrics
from rstar_env.rollout.local import TransformersPolicy, autocast, check_dtype, load_model, without_library_bars
from rstar_env.rollout.metrics import summarize
from rstar_env.rollout.policy import SamplingParams
from rstar_env.sampler import checked_select
from rstar_env.trajectory import Trajectory
from rstar_env.vector import MathToolVectorEnv
from rstar_trainers.local.checkpoint import (
    Checkpointed,
    peak_rss_gib,
    release_memory,
    remove_checkpoints,
)
from rstar_trainers.local.config import LocalTrainerConfig, trainer_config
from rstar_trainers.local.heldout import collect_reporting, evaluate_model, record_held_out
from rstar_trainers.local.logging import MetricsLogger, truncate_jsonl
from rstar_trainers.local.loss import clipped_policy_loss, group_advantages, masked_token_logprobs


@dataclass
class Sample:
    """One kept trajectory, ready for the loss."""

    input_ids: list[int]
    action_mask: list[int]
    advantage: float
    logprobs: list[float]
    """The sampler's log-prob of each generated token (aligned with ``input_ids``; 0 elsewhere)."""


@dataclass
class DataCursor:
    """Where the trainer is in the dataset: epoch and position in that epoch's seeded permutation."""

    epoch: int = 0
    position: int = 0

    def take(self, n: int, size: int, seed: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            order = np.random.default_rng([seed, self.epoch]).permutation(size)
            grab = order[self.position : self.position + n - len(out)].tolist()
            out += grab
            self.position += len(grab)
            if self.position >= size:
                self.epoch, self.position = self.epoch + 1, 0
        return out


class LocalTrainer(Checkpointed):
    """GRPO-RoC on one machine. Build it from a run config, then :meth:`train`."""

    def __init__(
        self,
        run: RunConfig,
        settings: LocalTrainerConfig,
        *,
        resume: bool = True,
        model_and_tokenizer: tuple[Any, Any] | None = None,
        on_progress: Callable[[str, int, int, str], None] | None = None,
    ) -> None:
        """``model_and_tokenizer``: weights to train instead of loading ``settings.model`` (the trainer owns them
        from then on); ``on_progress``: see :attr:`on_progress` (here also the model's loading)."""
        self.run = run
        self.cfg = settings
        threads.configure(settings.threads)
        self.out = Path(settings.output_dir)
        self.on_progress: Callable[[str, int, int, str], None] | None = on_progress
        """``(key, done, total, description)`` as rollouts, updates and held-out episodes finish (progress)."""
        loading = self._reporter("model", f"loading {settings.model}") if model_and_tokenizer is None else None
        if loading is not None:
            loading(0, 1)
        self.model, self.tokenizer, self.optimizer = prepare_training(settings, model_and_tokenizer)
        if loading is not None:
            loading(1, 1)
        self.model.train()
        self.reference = None
        if settings.kl_coef > 0:
            self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        sampling = SamplingParams(settings.temperature, settings.top_p, settings.max_new_tokens, settings.seed)
        self.policy: Any = self._rollout_engine(run.policy.engine, sampling)
        # Rollouts go through the dispatcher, as eval's do: one local engine here (its micro-batching queue sees
        # every request at once), with the same per-engine figures in the metrics.
        self.rollout_policy = DispatchPolicy([EngineSpec(self.policy, "local", max_concurrency=1 << 20)])
        spec = run.dataset
        self.dataset = load_dataset(spec.source, **spec.model_dump(exclude={"source"}))
        self.sampler = load_sampler(run.sampler.name, **run.sampler.options)
        self.sampler_rng = np.random.default_rng(settings.seed)
        self.cursor = DataCursor()
        self.step = 0
        self.env = MathToolVectorEnv(
            min(settings.rollout_width, settings.prompts_per_step * settings.rollouts_per_prompt),
            config=run,
            tokenizer=self.tokenizer,
            max_length=settings.max_response_tokens,
            length_unit="tokens",
        )
        self.logger = MetricsLogger(
            self.out,
            tensorboard=settings.tensorboard,
            wandb_project=settings.wandb_project,
            config={"run": run.model_dump(), "trainer": settings.model_dump()},
        )
        if resume:
            self.resume()

    @classmethod
    def from_config(cls, path: str | Path | dict[str, Any] | RunConfig, **overrides: Any) -> LocalTrainer:
        run = load_config(path)
        resume = overrides.pop("resume", True)
        return cls(run, trainer_config(run, **overrides), resume=resume)

    # -- the loop ----------------------------------------------------------------------------------------------------
    def train(
        self,
        max_steps: int | None = None,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        on_eval: Callable[[str, dict[str, float]], None] | None = None,
        on_progress: Callable[[str, int, int, str], None] | None = None,
    ) -> None:
        """Train until ``steps`` (or ``max_steps`` more steps). Ctrl-C saves a checkpoint, then re-raises.
        ``on_eval(name, report)`` sees each held-out report (``eval_start``, ``eval``) as it is written;
        ``on_progress`` (see :attr:`on_progress`) the progress within steps and held-out evaluations."""
        if on_progress is not None:
            self.on_progress = on_progress
        target = self.cfg.steps if max_steps is None else min(self.cfg.steps, self.step + max_steps)
        if self.cfg.eval_at_start and self.step == 0:
            self._held_out("eval_start", on_eval)
        try:
            while self.step < target:
                metrics = self.train_step()
                if on_step is not None:
                    on_step(metrics)
                if self.cfg.save_every and self.step % self.cfg.save_every == 0:
                    self.save()
        except KeyboardInterrupt:
            self.save()
            raise
        finally:
            self.logger.flush()
        self.save()
        if self.step >= self.cfg.steps:
            self._held_out("eval", on_eval)
            if self.cfg.save_model:
                model = self.save_model()
                if self.cfg.keep_checkpoints == "none":  # the final model stays; nothing is left to resume
                    remove_checkpoints(self.checkpoint_dir, self.step, model)

    def _held_out(self, name: str, on_eval: Callable[[str, dict[str, float]], None] | None) -> None:
        if self.cfg.eval_dataset:
            record_held_out(self.out, name, self.step, self.logger, self.evaluate, on_eval)

    def evaluate(self, dataset: str | None = None) -> dict[str, float]:
        """Roll the current weights out once on each held-out problem (``eval_dataset``) with the training
        limits and ``eval_temperature``; the report of :func:`~rstar_trainers.local.heldout.tool_use_summary`."""
        rows = list(load_dataset(dataset or self.cfg.eval_dataset))
        vllm = self.separate_rollout_engine
        if vllm:
            self._sync_rollout_weights()
        report, _ = evaluate_model(
            self.model,
            self.tokenizer,
            self.run,
            rows,
            max_new_tokens=self.cfg.eval_max_new_tokens or self.cfg.max_new_tokens,  # as `rstar-env eval` reads it
            max_response_tokens=self.cfg.max_response_tokens,
            temperature=self.cfg.temperature if self.cfg.eval_temperature is None else self.cfg.eval_temperature,
            seed=self.cfg.seed + 10_000,
            width=self.cfg.rollout_width,
            batch_size=self.cfg.generation_batch_size,
            device=self.cfg.device,
            dtype=self.cfg.dtype,
            on_done=self._reporter("held-out", "held-out episodes"),
            engine=self.policy if vllm else None,
        )
        return report

    def _reporter(self, key: str, description: str) -> Callable[[int, int], None] | None:
        report = self.on_progress
        if report is None:
            return None
        return lambda done, total: report(key, done, total, description)

    def _rollout_engine(self, engine: str, sampling: SamplingParams) -> Any:
        """The rollout policy the config's ``policy.engine`` names: our sampling loop on the trained model itself,
        or a vLLM engine loaded from a copy of its weights (``output_dir/rollout_weights``, refreshed before each
        step's rollouts by :meth:`_sync_rollout_weights`)."""
        from rstar_env.rollout.vllm import VLLMPolicy, choose_engine

        chosen, note = choose_engine(engine)
        if note:
            print(note, flush=True)
        self._rollout_step = 0  # the weights it starts from (a resumed run's step differs: synced then)
        self.sync_check: dict[str, float] = {}
        """The last weight sync's check (``sync/probe_gap_before``, ``sync/probe_gap_after``), reported with the
        step that follows it."""
        self.separate_rollout_engine = chosen == "vllm"
        """Whether rollouts come from a separate copy of the weights (vLLM: its own kernels and numerics) rather
        than the trained model itself: :meth:`update` then takes the old policy from a teacher-forced pass and logs
        the engine's log-prob mismatch."""
        if chosen == "vllm":
            folder = self.out / "rollout_weights"
            with without_library_bars():
                self.model.save_pretrained(folder)
                self.tokenizer.save_pretrained(folder)
            # vLLM's own output (its log, warnings, per-load bars) goes to the run's engine log, not the terminal.
            return VLLMPolicy(folder, sampling=sampling, dtype=self.cfg.dtype, log_file=self.out / "engine.log")
        return TransformersPolicy(
            self.model,
            tokenizer=self.tokenizer,
            batch_size=self.cfg.generation_batch_size,
            device=self.cfg.device,
            dtype=self.cfg.dtype,
            sampling=sampling,
        )

    def _sync_rollout_weights(self) -> None:
        """Give a vLLM rollout engine the weights of this step (after an update or a resume); the transformers
        policy samples from the trained model itself and needs nothing."""
        if self._rollout_step == self.step or not self.separate_rollout_engine:
            return
        folder = self.out / "rollout_weights"
        with without_library_bars():
            self.model.save_pretrained(folder)
        probe = self._sync_probe()
        before = self._probe_gap(probe)
        self.policy.update_weights(folder)
        after = self._probe_gap(probe)
        self._rollout_step = self.step
        # Our own check that the engine now runs the trained weights: its log-probs of a fixed text, against the
        # trained model's, before and after the load (vLLM's reload logs warnings that do not mean it failed).
        self.sync_check = {"sync/probe_gap_before": before, "sync/probe_gap_after": after}

    def _sync_probe(self) -> list[int]:
        text = "Solve 12 * 7. The python tool prints 84, so the answer is <answer>\\boxed{84}</answer>."
        return list(self.tokenizer(text)["input_ids"])

    def _probe_gap(self, probe: list[int]) -> float:
        """The largest difference between the rollout engine's and the trained model's log-prob of a token of
        ``probe``."""
        engine = torch.tensor(self.policy.prompt_logprobs(probe))
        ids = torch.tensor([probe], device=self.cfg.device)
        training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad(), autocast(self.cfg.dtype, self.cfg.device):
                logits = self.model(ids).logits[0, :-1].float()
        finally:
            self.model.train(training)
        mine = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:, None])[:, 0].cpu()
        return float((engine - mine).abs().max())

    def train_step(self) -> dict[str, Any]:
        self._sync_rollout_weights()
        started = time.perf_counter()
        rows = [self.dataset[i] for i in self.cursor.take(self.cfg.prompts_per_step, len(self.dataset), self.cfg.seed)]
        jobs = jobs_for(rows, self.cfg.rollouts_per_prompt)
        gen_before = self.policy.seconds_generating
        self.model.eval()
        engines_before = self.rollout_policy.stats()
        # Every request's sampling stream is seeded from (this step's seed, problem, sample, turn): a rerun, or the
        # other arm of a comparison at the same weights, draws the same tokens whatever the tool timing.
        trajectories = asyncio.run(
            collect_reporting(
                self.rollout_policy,
                jobs,
                self.env,
                self._reporter("rollout", f"step {self.step + 1}: rollouts"),
                seed=rollout_seed(self.cfg.seed, self.step),
            )
        )
        rollout_s = time.perf_counter() - started
        generation_s = self.policy.seconds_generating - gen_before

        groups: dict[str, list[Trajectory]] = defaultdict(list)
        for job, trajectory in zip(jobs, trajectories, strict=True):
            groups[str(job.row.get("id"))].append(trajectory)
        samples, selection = self.select(list(groups.values()))

        train_started = time.perf_counter()
        updating = self._reporter("update", f"step {self.step + 1}: updating the weights")
        if updating is not None:
            updating(0, 1)
        update = self.update(samples) if samples else {"loss": 0.0, "grad_norm": 0.0, "skipped_update": 1.0}
        if updating is not None:
            updating(1, 1)
        train_s = time.perf_counter() - train_started
        release_memory()
        self.step += 1
        if self.cfg.save_trajectories and (
            not self.cfg.save_trajectories_steps or self.step <= self.cfg.save_trajectories_steps
        ):
            self._save_trajectories(trajectories)
        metrics = {
            "step": self.step,
            **rollout_metrics(list(groups.values()), selection, self.cfg.group_size, sampler=self.sampler),
            **update,
            "lr": self.optimizer.param_groups[0]["lr"],
            "time/rollout_s": rollout_s,
            "time/generation_s": generation_s,
            "time/tools_and_reward_s": max(rollout_s - generation_s, 0.0),
            "time/train_s": train_s,
            "time/step_s": time.perf_counter() - started,
            "mem/peak_rss_gib": peak_rss_gib(),
            "data/epoch": self.cursor.epoch,
            **engine_stats_metrics(_step_stats(engines_before, self.rollout_policy.stats())),
            **self.sync_check,
        }
        self.sync_check = {}
        self.logger.log(metrics, self.step)
        return metrics

    def select(self, groups: Sequence[list[Trajectory]]) -> tuple[list[Sample], list[list[int] | None]]:
        """Apply the sampler to each group and turn the kept trajectories into loss samples."""
        kept, selection = select_groups(
            self.sampler, groups, self.cfg.group_size, self.sampler_rng, self.cfg.advantage_eps
        )
        samples = []
        for trajectory, advantage in kept:
            tokens = trajectory_tokens(trajectory)
            samples.append(Sample(tokens.input_ids, tokens.action_mask, advantage, tokens.logprobs))
        return samples, selection

    def update(self, samples: list[Sample]) -> dict[str, float]:
        """``updates_per_step`` optimizer steps over mini-batches of ``samples``.

        The old policy of the clipped ratio is the sampler's log-probs when our own loop sampled from the trained
        model at temperature 1 without top-p; otherwise (a separate rollout engine, another temperature or top-p,
        or ``tis_cap``) the trained model's own log-probs before any update: with one update per step those of the
        update's forward pass itself (the weights do not change before its only optimizer step), else a
        teacher-forced pass first. With a separate engine the engine-against-trainer gap (``logprob_gap/*``) is
        logged every step; with ``tis_cap`` each generated token's policy term is weighted by
        ``min(exp(old - sampler), tis_cap)`` (``tis/*`` metrics)."""
        self.model.train()
        order = np.random.default_rng([self.cfg.seed, self.step]).permutation(len(samples)).tolist()
        minibatches = [order[i :: self.cfg.updates_per_step] for i in range(self.cfg.updates_per_step)]
        untempered = self.cfg.temperature == 1.0 and self.cfg.top_p == 1.0
        # A separate engine's log-probs come from other kernels on another copy of the weights: taken as the old
        # policy they would start the ratio away from 1 by that mismatch alone (verl #2953, TRL #4530).
        forced_old = not untempered or self.separate_rollout_engine or self.cfg.tis_cap is not None
        wants_forced = forced_old or (self.cfg.logprob_gap and untempered)
        # One mini-batch: the update's own forward pass is the teacher-forced pass (a third less work per step).
        own_pass = wants_forced and sum(1 for b in minibatches if b) == 1
        forced: list[torch.Tensor | None] = [None] * len(samples)
        old: list[torch.Tensor | None] = [None] * len(samples)
        weights: list[torch.Tensor] | None = None
        with torch.no_grad():  # the old policy's log-probs, before any update of this step
            if wants_forced and not own_pass:
                forced = list(self._per_sample_logprobs(self.model, samples))
            if not forced_old:
                # Sampling at temperature 1 without top-p draws from the model's own distribution, so the sampler's
                # log-probs are the old policy's (tests/rollout/test_local.py checks they match a forward pass).
                old = [torch.tensor(s.logprobs[1:], device=self.cfg.device) for s in samples]
            elif not own_pass:
                old = list(forced)
            if self.cfg.tis_cap is not None and not own_pass:
                weights = tis_weights(old, samples, self.cfg.tis_cap)[0]  # type: ignore[arg-type]
            ref = self._per_sample_logprobs(self.reference, samples) if self.reference is not None else None
        totals: dict[str, list[float]] = defaultdict(list)
        for batch in minibatches:
            if not batch:
                continue
            self.optimizer.zero_grad(set_to_none=True)
            total_tokens = sum(sum(samples[i].action_mask[1:]) for i in batch)
            if total_tokens == 0:
                continue
            # Similar lengths together: less padding in each micro-batch.
            batch = sorted(batch, key=lambda i: len(samples[i].input_ids))
            for lo in range(0, len(batch), self.cfg.micro_batch_size):
                micro = batch[lo : lo + self.cfg.micro_batch_size]
                self._adapt_threads()
                parts, rows = self._micro_loss(
                    [samples[i] for i in micro],
                    [old[i] for i in micro],
                    [ref[i] for i in micro] if ref else None,
                    total_tokens,
                    [weights[i] for i in micro] if weights is not None else None,
                )
                parts.loss.backward()
                if own_pass:
                    for i, row in zip(micro, rows, strict=True):
                        forced[i] = row
                for key in ("policy", "kl", "entropy", "clip_fraction"):
                    totals[key].append(getattr(parts, key))
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)  # free the gradients before the next rollout
            totals["grad_norm"].append(float(grad_norm))
        scored = [i for i, f in enumerate(forced) if f is not None]  # own pass: samples of a batch with no tokens
        teacher_forced = [forced[i] for i in scored]
        gap: dict[str, float] = {}
        tis: dict[str, float] = {}
        if teacher_forced and untempered:  # at another temperature the gap would measure the temperature
            gap = logprob_gap(teacher_forced, [samples[i] for i in scored], self.cfg.clip_high)  # type: ignore[arg-type]
        if teacher_forced and self.cfg.tis_cap is not None:
            tis = tis_weights(teacher_forced, [samples[i] for i in scored], self.cfg.tis_cap)[1]  # type: ignore[arg-type]
        return {
            "loss": sum(totals["policy"]) / max(len(minibatches), 1),
            "entropy": sum(totals["entropy"]) / max(len(minibatches), 1),
            "kl": sum(totals["kl"]) / max(len(minibatches), 1),
            "clip_fraction": sum(totals["clip_fraction"]) / max(len(minibatches), 1),
            "grad_norm": fmean(totals["grad_norm"]) if totals["grad_norm"] else 0.0,
            "train/samples": float(len(samples)),
            "train/action_tokens": float(sum(sum(s.action_mask) for s in samples)),
            **gap,
            **tis,
        }

    def _batch(self, samples: Sequence[Sample]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = max(len(s.input_ids) for s in samples)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(samples), width), pad, dtype=torch.long)
        attention = torch.zeros((len(samples), width), dtype=torch.long)
        action = torch.zeros((len(samples), width), dtype=torch.long)
        for row, s in enumerate(samples):  # right padding: positions are 0..n-1 as in generation
            n = len(s.input_ids)
            ids[row, :n] = torch.tensor(s.input_ids)
            attention[row, :n] = 1
            action[row, :n] = torch.tensor(s.action_mask)
        device = self.cfg.device
        return ids.to(device), attention.to(device), action.to(device)

    def _adapt_threads(self) -> None:
        if str(self.cfg.device).startswith("cpu"):
            threads.adapt()

    def _per_sample_logprobs(self, model: Any, samples: Sequence[Sample]) -> list[torch.Tensor]:
        """Each sample's next-token log-probs (length ``len(input_ids) - 1``), computed in micro-batches."""
        order = sorted(range(len(samples)), key=lambda i: len(samples[i].input_ids))
        out: list[torch.Tensor] = [torch.empty(0)] * len(samples)
        for lo in range(0, len(order), self.cfg.micro_batch_size):
            micro = order[lo : lo + self.cfg.micro_batch_size]
            ids, attention, action = self._batch([samples[i] for i in micro])
            self._adapt_threads()
            with autocast(self.cfg.dtype, self.cfg.device):
                logp, _ = masked_token_logprobs(model, ids, attention, action)
            for row, i in enumerate(micro):
                out[i] = logp[row, : len(samples[i].input_ids) - 1]
        return out

    def _micro_loss(
        self,
        samples: Sequence[Sample],
        old: Sequence[torch.Tensor | None],
        ref: Sequence[torch.Tensor] | None,
        total_tokens: int,
        weights: Sequence[torch.Tensor] | None = None,
    ) -> tuple[Any, list[torch.Tensor]]:
        """The loss parts of one micro-batch, and each sample's next-token log-probs of this pass (detached). An
        ``old`` of ``None`` means this pass is the old policy (no update yet this step): the ratio is then exactly
        1 and ``tis_cap``'s weights come from this pass too."""
        ids, attention, action = self._batch(samples)
        with autocast(self.cfg.dtype, self.cfg.device):
            logp, entropy = masked_token_logprobs(
                self.model, ids, attention, action, entropy_grad=self.cfg.entropy_coef > 0
            )
        width = logp.shape[1]
        rows = [logp[r, : len(s.input_ids) - 1].detach() for r, s in enumerate(samples)]
        if any(o is None for o in old):
            old = rows
            if self.cfg.tis_cap is not None:
                weights = tis_weights(rows, samples, self.cfg.tis_cap)[0]
        old_t = torch.stack([_pad_to(o, width) for o in old])  # type: ignore[arg-type]
        ref_t = torch.stack([_pad_to(r, width) for r in ref]) if ref else None
        weights_t = torch.stack([_pad_to(w, width) for w in weights]).to(logp.device) if weights else None
        advantages = torch.tensor([s.advantage for s in samples], device=logp.device)
        parts = clipped_policy_loss(
            logp,
            old_t,
            advantages,
            action[:, 1:],
            total_tokens=total_tokens,
            clip_low=self.cfg.clip_low,
            clip_high=self.cfg.clip_high,
            ref_logp=ref_t,
            kl_coef=self.cfg.kl_coef,
            entropy=entropy,
            entropy_coef=self.cfg.entropy_coef,
            token_weights=weights_t,
        )
        return parts, rows

    def _save_trajectories(self, trajectories: Sequence[Trajectory]) -> None:
        with (self.out / "trajectories.jsonl").open("a", encoding="utf-8") as handle:
            for t in trajectories:
                record = t.to_dict()
                record["metadata"] = {**record["metadata"], "step": self.step}
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")

    # -- checkpoints (save, resume: :class:`~rstar_trainers.local.checkpoint.Checkpointed`) ------------------------
    def extra_state(self) -> dict[str, Any]:
        return {"sampler_rng": self.sampler_rng.bit_generator.state, "policy_rng": self.policy.rng_state()}

    def restore_extra_state(self, state: dict[str, Any]) -> None:
        self.sampler_rng.bit_generator.state = state["sampler_rng"]
        self.policy.set_rng_state(state["policy_rng"])

    def truncate_logs(self) -> None:
        super().truncate_logs()
        truncate_jsonl(self.out / "trajectories.jsonl", lambda row: row["metadata"].get("step", 0) <= self.step)

    def close(self) -> None:
        self.env.close()
        self.logger.close()
        if hasattr(self.policy, "close"):  # a vLLM engine's process
            self.policy.close()


def select_groups(
    sampler: Any, groups: Sequence[Sequence[Trajectory]], keep: int, rng: np.random.Generator, eps: float = 1e-6
) -> tuple[list[tuple[Trajectory, float]], list[list[int] | None]]:
    """``(kept trajectory, advantage)`` pairs and the sampler's raw selection per group. Advantages are normalised
    over each group's kept trajectories only, as GRPO-RoC prescribes."""
    kept: list[tuple[Trajectory, float]] = []
    selection: list[list[int] | None] = []
    for group in groups:
        # A group with an episode the system failed (env_error, policy_error) is dropped whole: its failures are
        # not the model's, and the survivors alone would skew the group's advantages.
        chosen = None if any(t.failed for t in group) else checked_select(sampler, group, keep, rng)
        selection.append(chosen)
        if chosen:
            advantages = group_advantages([group[i].reward for i in chosen], eps)
            kept += [(group[i], a) for i, a in zip(chosen, advantages, strict=True)]
    return kept, selection


def rollout_metrics(
    groups: Sequence[Sequence[Trajectory]], selection: Sequence[list[int] | None], keep: int, *, sampler: Any = None
) -> dict[str, float]:
    """Reward, accuracy, tool use and the sampler's group statistics of one step's rollouts."""
    from rstar_plugins.samplers.stats import batch_stats  # what the paper plots: kept vs dropped positives

    trajectories = [t for group in groups for t in group]
    summary = summarize(trajectories, correct_threshold=0.0)
    lengths = [t.response_tokens or 0 for t in trajectories]

    def figure(key: str) -> float:  # a step whose every episode failed has no scored figure
        value = summary.get(key)
        return float("nan") if value is None else float(value)

    metrics = {
        "reward": figure("mean_reward"),
        "accuracy": figure("pass@1"),
        "tool_calls_per_trajectory": figure("tool_calls_per_episode"),
        "tool_error_ratio": figure("tool_error_ratio"),
        "tool_error_ratio_correct": figure("tool_error_ratio_correct"),
        "response_tokens": fmean(lengths),
        "response_tokens_max": float(max(lengths)),
        "truncated_ratio": summary["end_reasons"].get("length", 0) / len(trajectories),
        "groups_kept": float(sum(s is not None for s in selection)),
        "groups_dropped": float(sum(s is None for s in selection)),
        "groups_failed": float(sum(any(t.failed for t in group) for group in groups)),
        "env_errors": float(summary["env_errors"]),
        "policy_errors": float(summary["policy_errors"]),
    }
    stats = batch_stats(groups, list(selection), keep, sampler=sampler)  # the sampler's own penalty terms
    metrics.update({f"sampler/{k}": float(v) for k, v in stats.items()})
    return metrics


def rollout_seed(seed: int, step: int) -> int:
    """The run seed of one step's sampling streams: a hash of (trainer seed, step), so steps never share streams."""
    return int.from_bytes(hashlib.blake2b(f"rl-step\x1f{seed}\x1f{step}".encode(), digest_size=8).digest(), "big") >> 1


def logprob_gap(
    teacher_forced: Sequence[torch.Tensor], samples: Sequence[Sample], clip_high: float
) -> dict[str, float]:
    """How far the sampler's log-probs are from a teacher-forced pass of the same weights on the same ids, over
    every generated token: mean ``|delta|``, max, and the share of tokens whose ratio ``exp(delta)`` falls outside
    ``[1 / (1 + clip_high), 1 + clip_high]`` (those the clipped loss treats as off-policy)."""
    deltas = []
    for forced, sample in zip(teacher_forced, samples, strict=True):
        mask = torch.tensor(sample.action_mask[1:], dtype=torch.bool)
        sampled = torch.tensor(sample.logprobs[1:], dtype=torch.float32)
        deltas.append((forced.detach().float().cpu() - sampled)[mask])
    delta = torch.cat(deltas) if deltas else torch.empty(0)
    if delta.numel() == 0:
        return {}
    bound = float(np.log1p(clip_high))
    return {
        "logprob_gap/mean_abs": float(delta.abs().mean()),
        "logprob_gap/max_abs": float(delta.abs().max()),
        "logprob_gap/outside_clip": float((delta.abs() > bound).float().mean()),
        "logprob_gap/tokens": float(delta.numel()),
    }


def tis_weights(
    trainer_logp: Sequence[torch.Tensor], samples: Sequence[Sample], cap: float
) -> tuple[list[torch.Tensor], dict[str, float]]:
    """Truncated importance-sampling weights: per next-token position of each sample, ``min(exp(trainer -
    sampler), cap)`` on generated tokens and 1 elsewhere (on ``trainer_logp``'s device, no gradient); with their mean
    over generated tokens (``tis/weight_mean``) and the share of those whose raw weight exceeded ``cap``
    (``tis/capped_share``)."""
    weights: list[torch.Tensor] = []
    kept: list[torch.Tensor] = []
    capped: list[torch.Tensor] = []
    for forced, sample in zip(trainer_logp, samples, strict=True):
        device = forced.device
        mask = torch.tensor(sample.action_mask[1:], dtype=torch.bool, device=device)
        sampled = torch.tensor(sample.logprobs[1:], dtype=torch.float32, device=device)
        raw = torch.exp(forced.detach().float() - sampled)
        weight = torch.where(mask, raw.clamp(max=cap), torch.ones_like(raw))
        weights.append(weight)
        kept.append(weight[mask].cpu())
        capped.append((raw[mask] > cap).cpu())
    flat = torch.cat(kept) if kept else torch.empty(0)
    if flat.numel() == 0:
        return weights, {}
    return weights, {
        "tis/weight_mean": float(flat.mean()),
        "tis/capped_share": float(torch.cat(capped).float().mean()),
    }


def _pad_to(t: torch.Tensor, width: int) -> torch.Tensor:
    return t if t.shape[0] == width else torch.nn.functional.pad(t, (0, width - t.shape[0]))


def prepare_training(settings: Any, model_and_tokenizer: tuple[Any, Any] | None) -> tuple[Any, Any, Any]:
    """What both local trainers start with: the output directory, every generator seeded, the model (given, or
    loaded from ``settings.model``) with gradient checkpointing as configured, and its AdamW optimizer."""
    Path(settings.output_dir).mkdir(parents=True, exist_ok=True)
    _seed_everything(settings.seed)
    check_device(settings.device)
    check_dtype(getattr(settings, "dtype", "float32"), settings.device)
    if model_and_tokenizer is not None:
        model, tokenizer = model_and_tokenizer
        model.to(settings.device)
    else:
        # float32 master weights whatever the compute dtype (autocast): a 1e-6 update vanishes in bfloat16.
        model, tokenizer = load_model(settings.model, device=settings.device, cache=False)
    # foreach=False: the fused multi-tensor update would hold temporaries the size of all parameters at once.
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, betas=settings.adam_betas, weight_decay=settings.weight_decay, foreach=False
    )
    if settings.gradient_checkpointing:
        _enable_checkpointing(model)
    return model, tokenizer, optimizer


def check_device(device: str) -> str:
    """``device`` if torch can use it here; otherwise a clear error."""
    try:
        kind = torch.device(device).type
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not a torch device ({exc}): use cpu, cuda or cuda:N") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device {device!r}: this torch build ({torch.__version__}) sees no CUDA GPU; use cpu, "
            "or install a CUDA build of torch"
        )
    if kind == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: MPS is not available here; use cpu")
    return device


def _enable_checkpointing(model: Any) -> None:
    """Gradient checkpointing for training forward passes; generation (``use_cache``) is unaffected because
    transformers only checkpoints in training mode."""
    if getattr(model, "supports_gradient_checkpointing", False):
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name is deprecated
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _step_stats(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """This step's share of the dispatcher's running totals (requests, failed, busy time per engine)."""
    return [
        {**a, **{k: a[k] - b[k] for k in ("requests", "failed", "busy_s", "marked_down")}}
        for b, a in zip(before, after, strict=True)
    ]
