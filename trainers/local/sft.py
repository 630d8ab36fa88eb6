"""Supervised fine-tuning on one machine (``trainer.stage: sft``): the paper's non-reasoning SFT stage, which teaches
the tool-call and answer format before RL.

Conversations are tokenized exactly as the env lays out an episode
(:func:`rstar_env.rollout.sft_data.sft_tokens`): the loss
is on assistant tokens only; the prompt, the tool responses and the chat markers the env writes are masked. One
step is ``train_batch_size`` conversations (a seeded permutation per epoch, the position checkpointed), in
micro-batches of ``micro_train_batch_size``, averaged per token over the whole batch (so accumulation is exact).

Memory: logits are computed only at the positions the loss reads (the hidden states there go through the output
layer, not the whole sequence), so a 49k-word vocabulary costs nothing for the prompt and tool tokens.

Checkpoints hold model, optimizer, scheduler, data position and every random generator; a resumed run continues
exactly as an uninterrupted one would. Ctrl-C saves a checkpoint before exiting.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rstar_env import threads
from rstar_env.config import RunConfig
from rstar_env.data import DataError, load_dataset
from rstar_env.rollout.sft_data import SFTTokens, generate_tool_sft, parse_tool_sft_spec, sft_tokens
from rstar_trainers.local.checkpoint import (
    Checkpointed,
    peak_rss_gib,
    release_memory,
    remove_checkpoints,
)
from rstar_trainers.local.config import LocalSFTConfig
from rstar_trainers.local.heldout import evaluate_model, record_held_out
from rstar_trainers.local.logging import MetricsLogger
from rstar_trainers.local.loss import masked_token_logprobs
from rstar_trainers.local.trainer import DataCursor, prepare_training


def lr_factor(name: str, step: int, total: int, warmup: int, min_ratio: float = 0.1) -> float:
    """The learning-rate multiplier at ``step`` (0-based) of ``total``: linear warm-up over ``warmup`` steps, then
    constant, linear to 0, cosine to 0, or cosine to ``min_ratio`` (OpenRLHF's ``cosine_with_min_lr``: 10%)."""
    if name != "constant" and warmup and step < warmup:
        return (step + 1) / warmup
    if name in ("constant", "constant_with_warmup"):
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if name == "linear":
        return 1.0 - progress
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cosine if name == "cosine" else min_ratio + (1.0 - min_ratio) * cosine


def masked_token_loss(model: Any, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Summed cross-entropy of ``ids[:, 1:]`` where ``mask[:, 1:]`` is 1; logits are built only at those positions
    (:func:`~rstar_trainers.local.loss.masked_token_logprobs`)."""
    logp, _ = masked_token_logprobs(model, ids, attention, mask)
    return -logp.sum()


class SFTTrainer(Checkpointed):
    """Local SFT. Build it from the run config and its SFT section, then :meth:`train`."""

    def __init__(
        self,
        run: RunConfig,
        settings: LocalSFTConfig,
        *,
        resume: bool = True,
        model_and_tokenizer: tuple[Any, Any] | None = None,
        examples: list[SFTTokens] | None = None,
        on_progress: Callable[[str, int, int, str], None] | None = None,
    ) -> None:
        """``model_and_tokenizer``: weights to train instead of loading ``settings.model``; ``examples``:
        tokenized conversations instead of reading ``settings.dataset``; ``on_progress(key, done, total,
        description)``: progress of the data generation, the steps and the held-out evaluation."""
        self.run = run
        self.on_progress = on_progress
        self.cfg = settings
        threads.configure(settings.threads)
        self.out = Path(settings.output_dir)
        loading = self._reporter("model", f"loading {settings.model}") if model_and_tokenizer is None else None
        if loading is not None:
            loading(0, 1)
        self.model, self.tokenizer, self.optimizer = prepare_training(settings, model_and_tokenizer)
        if loading is not None:
            loading(1, 1)
        self.examples = examples if examples is not None else self.load_examples()
        if not self.examples:
            raise DataError(f"the SFT dataset {settings.dataset!r} has no conversation with an assistant token")
        self.total_steps = math.ceil(len(self.examples) * settings.max_epochs / settings.train_batch_size)
        warmup = round(self.total_steps * settings.lr_warmup_ratio)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_factor(settings.lr_scheduler, s, self.total_steps, warmup)
        )
        self.cursor = DataCursor()
        self.step = 0
        self.logger = MetricsLogger(
            self.out,
            tensorboard=settings.tensorboard,
            wandb_project=settings.wandb_project,
            config={"run": run.model_dump(), "trainer": settings.model_dump()},
        )
        if resume:
            self.resume()

    # -- data --------------------------------------------------------------------------------------------------------
    def load_examples(self) -> list[SFTTokens]:
        """Tokenize ``dataset`` (generated, or a jsonl of ``{"messages"}`` rows) in the env's chat format."""
        spec = parse_tool_sft_spec(self.cfg.dataset)
        if spec is not None:
            rows = generate_tool_sft(**spec, config=self.run, on_done=self._reporter("sft-data", "SFT data: examples"))
        else:
            path = Path(self.cfg.dataset)
            if not path.is_file():
                raise DataError(f"SFT dataset {self.cfg.dataset!r} is neither a file nor a 'toolsft:...' spec")
            rows = []
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as exc:
                        raise DataError(f"{path}:{n}: not JSON ({exc})") from None
        examples = []
        for n, row in enumerate(rows, 1):
            if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
                raise DataError(f"SFT row {n} of {self.cfg.dataset!r} has no 'messages' list")
            try:
                tokens = sft_tokens(row["messages"], self.tokenizer, self.run.env.chat_format)
            except ValueError as exc:
                raise DataError(f"SFT row {n} of {self.cfg.dataset!r}: {exc}") from None
            tokens = SFTTokens(tokens.input_ids[: self.cfg.max_len], tokens.loss_mask[: self.cfg.max_len])
            if sum(tokens.loss_mask[1:]):
                examples.append(tokens)
        return examples

    def _reporter(self, key: str, description: str) -> Callable[[int, int], None] | None:
        report = self.on_progress
        if report is None:
            return None
        return lambda done, total: report(key, done, total, description)

    # -- the loop ----------------------------------------------------------------------------------------------------
    def train(self, max_steps: int | None = None, on_step: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Train to the end of ``max_epochs`` (or ``max_steps`` more steps); Ctrl-C saves a checkpoint, then
        re-raises. At the end: save the model (``save_hf``) and evaluate on ``eval_dataset``."""
        target = self.total_steps if max_steps is None else min(self.total_steps, self.step + max_steps)
        stepped = self._reporter("sft-steps", "SFT steps")
        try:
            while self.step < target:
                if stepped is not None:
                    stepped(self.step, self.total_steps)
                metrics = self.train_step()
                if stepped is not None:
                    stepped(self.step, self.total_steps)
                if on_step is not None:
                    on_step(metrics)
                if self.cfg.save_steps > 0 and self.step % self.cfg.save_steps == 0:
                    self.save()
        except KeyboardInterrupt:
            self.save()
            raise
        finally:
            self.logger.flush()
        self.save()
        if self.step >= self.total_steps:
            if self.cfg.eval_dataset:
                record_held_out(self.out, "eval", self.step, self.logger, self.evaluate)
            if self.cfg.save_hf:
                self.save_model()

    def train_step(self) -> dict[str, Any]:
        started = time.perf_counter()
        self.model.train()
        batch = self.cursor.take(self.cfg.train_batch_size, len(self.examples), self.cfg.seed)
        batch.sort(key=lambda i: len(self.examples[i].input_ids))  # similar lengths together: less padding
        total_tokens = sum(sum(self.examples[i].loss_mask[1:]) for i in batch)
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for lo in range(0, len(batch), self.cfg.micro_train_batch_size):
            micro = batch[lo : lo + self.cfg.micro_train_batch_size]
            ids, attention, mask = self._batch([self.examples[i] for i in micro])
            if str(self.cfg.device).startswith("cpu"):
                threads.adapt()  # the cores other programs leave free (rstar_env.threads)
            loss = masked_token_loss(self.model, ids, attention, mask) / total_tokens
            loss.backward()
            loss_sum += loss.item()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.max_grad_norm)
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)  # gradients are dead weight until the next step
        self.scheduler.step()
        self.step += 1
        release_memory()
        elapsed = time.perf_counter() - started
        metrics = {
            "step": self.step,
            "stage": "sft",
            "loss": loss_sum,
            "grad_norm": float(grad_norm),
            "lr": lr,
            "train/conversations": float(len(batch)),
            "train/trained_tokens": float(total_tokens),
            "train/tokens": float(sum(len(self.examples[i].input_ids) for i in batch)),
            "data/epoch": self.cursor.epoch,
            "time/step_s": elapsed,
            "mem/peak_rss_gib": peak_rss_gib(),
        }
        self.logger.log(metrics, self.step)
        return metrics

    def _batch(self, examples: list[SFTTokens]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        width = max(len(e.input_ids) for e in examples)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(examples), width), pad, dtype=torch.long)
        attention = torch.zeros((len(examples), width), dtype=torch.long)
        mask = torch.zeros((len(examples), width), dtype=torch.long)
        for row, e in enumerate(examples):  # right padding: positions 0..n-1, as in generation
            ids[row, : len(e.input_ids)] = torch.tensor(e.input_ids)
            attention[row, : len(e.input_ids)] = 1
            mask[row, : len(e.loss_mask)] = torch.tensor(e.loss_mask)
        device = self.cfg.device
        return ids.to(device), attention.to(device), mask.to(device)

    def evaluate(self, limit: int | None = None) -> dict[str, float]:
        """Roll the model out on ``eval_dataset`` in the run's env: tool-call share, answer-format share, pass@1."""
        rows = load_dataset(self.cfg.eval_dataset, limit=limit)
        report, _ = evaluate_model(
            self.model,
            self.tokenizer,
            self.run,
            list(rows),
            max_new_tokens=self.cfg.eval_max_new_tokens,
            max_response_tokens=self.cfg.max_len,
            temperature=self.cfg.eval_temperature,
            seed=self.cfg.seed,
            device=self.cfg.device,
            on_done=self._reporter("held-out", "SFT held-out episodes"),
        )
        return report

    # -- checkpoints -------------------------------------------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self.step >= self.total_steps

    def extra_state(self) -> dict[str, Any]:
        return {"scheduler": self.scheduler.state_dict()}

    def restore_extra_state(self, state: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state["scheduler"])

    def close(self) -> None:
        self.logger.close()


def run_sft_stage(
    run: RunConfig,
    settings: LocalSFTConfig,
    *,
    max_steps: int | None = None,
    on_step: Callable[[dict[str, Any]], None] | None = None,
    on_progress: Callable[[str, int, int, str], None] | None = None,
) -> tuple[Path | None, dict[str, float]]:
    """Run (or resume, or find finished) the SFT stage in ``settings.output_dir``.

    Returns ``(model directory or None while unfinished, held-out report)``. A finished stage (``done.json``) is
    not loaded again: a rerun of an SFT -> RL config goes straight on with RL. The trainer's memory is released
    before returning, so RL does not hold two models.
    """
    out = Path(settings.output_dir)
    done = out / "done.json"
    if done.exists():
        record = json.loads(done.read_text())
        return Path(record["model"]), record.get("eval", {})
    trainer = SFTTrainer(run, settings, on_progress=on_progress)
    try:
        trainer.train(max_steps=max_steps, on_step=on_step)
        if not trainer.finished:
            return None, {}
        report = json.loads((out / "eval.json").read_text()) if (out / "eval.json").exists() else {}
        model_dir = out / "model"
        if not settings.save_hf:
            model_dir = trainer.save_model()
        done.write_text(json.dumps({"model": str(model_dir), "steps": trainer.step, "eval": report}, indent=2))
        if settings.keep_checkpoints == "none":  # a rerun goes by done.json and the model: nothing to resume
            remove_checkpoints(trainer.checkpoint_dir, trainer.step, model_dir)
        return model_dir, report
    finally:
        trainer.close()
        del trainer
        release_memory()


def run_sft_stage_isolated(run: RunConfig, settings: LocalSFTConfig) -> tuple[Path | None, dict[str, float]]:
    """:func:`run_sft_stage` in a child process (spawned), printing each step's row: everything the stage
    allocated (weights, AdamW moments, allocator arenas) goes back to the OS with the child, so the RL stage that
    follows never holds two models' worth of memory."""
    if (Path(settings.output_dir) / "done.json").exists():
        return run_sft_stage(run, settings)
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(_sft_child, (run, settings))


def _sft_child(run: RunConfig, settings: LocalSFTConfig) -> tuple[Path | None, dict[str, float]]:
    _die_with_parent()
    from rstar_trainers.local.progress import SFT_COLUMNS, RunProgress, StepTable

    with RunProgress() as progress:
        return run_sft_stage(run, settings, on_step=StepTable(progress, SFT_COLUMNS).add, on_progress=progress.update)


def _die_with_parent() -> None:
    """A killed parent takes the SFT child with it (Linux): the pool's own cleanup never runs on SIGKILL/SIGTERM,
    and an orphaned child would keep training and writing into the run directory."""
    import contextlib
    import ctypes
    import os
    import signal
    import sys

    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before the line above ran
            os._exit(1)
