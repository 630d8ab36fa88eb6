"""Checkpoint directories shared by the local trainers: ``checkpoints/step_NNNNNN/state.pt`` plus ``latest``.

A checkpoint directory exists only once it is complete (written under a temporary name, then renamed), so a run
killed while saving resumes from the previous one.
"""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rstar_env.config import ConfigError


def global_rng_state() -> dict[str, Any]:
    """The process-wide generators a resumed run must restore (torch, numpy, python)."""
    return {"torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(), "python_rng": random.getstate()}


def restore_global_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch_rng"])
    np.random.set_state(state["numpy_rng"])
    random.setstate(state["python_rng"])


def training_state(model: Any, optimizer: Any, step: int, cursor: Any) -> dict[str, Any]:
    """What every local trainer's checkpoint holds: weights, optimizer, step, data position (``cursor.epoch``,
    ``cursor.position``) and the global generators; a trainer adds its own extras."""
    return {
        "step": step,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "cursor": (cursor.epoch, cursor.position),
        **global_rng_state(),
    }


def restore_training_state(state: dict[str, Any], model: Any, optimizer: Any) -> tuple[int, tuple[int, int]]:
    """Load :func:`training_state`'s part of ``state`` into ``model``, ``optimizer`` and the global generators;
    returns the step and the data position."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    restore_global_rng(state)
    return state["step"], tuple(state["cursor"])


def checkpoints_kept(keep: str | int) -> int | None:
    """How many checkpoints a ``keep_checkpoints`` setting keeps while a run goes on (``None``: all)."""
    if keep == "all":
        return None
    return 1 if keep in ("last", "none") else int(keep)


def write_checkpoint(root: Path, step: int, state: dict[str, Any], keep: str | int) -> Path:
    """Save ``state`` as step ``step`` under ``root``; keep the newest checkpoints ``keep`` says
    (:data:`~rstar_trainers.local.config.KeepCheckpoints`). The new one is complete before an old one goes."""
    path = root / f"step_{step:06d}"
    tmp = path.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / "state.pt")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    (root / "latest").write_text(path.name)
    count = checkpoints_kept(keep)
    if count is not None:
        for old in sorted(root.glob("step_*"))[:-count]:
            shutil.rmtree(old, ignore_errors=True)
    return path


FINISHED = "finished.json"
"""Left in a checkpoint directory whose checkpoints were removed (``keep_checkpoints: none``): what ran, where the
final model is, so a rerun says so instead of starting over."""


def remove_checkpoints(root: Path, step: int, model: Path) -> None:
    """Remove every checkpoint under ``root`` (a finished run, ``keep_checkpoints: none``), leaving a note."""
    import json

    if root.exists():
        for path in root.iterdir():
            if path.name != FINISHED:
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    root.mkdir(parents=True, exist_ok=True)
    (root / FINISHED).write_text(json.dumps({"step": step, "model": str(model)}))


def finished_without_checkpoints(root: Path) -> dict[str, Any] | None:
    """The note :func:`remove_checkpoints` left, when ``root`` has no checkpoint to resume from."""
    import json

    note = root / FINISHED
    if (root / "latest").exists() or not note.exists():
        return None
    return json.loads(note.read_text())


def read_checkpoint(root: Path) -> dict[str, Any] | None:
    """The latest checkpoint's state under ``root``, or ``None`` when there is none."""
    latest = root / "latest"
    if not latest.exists():
        return None
    return torch.load(root / latest.read_text().strip() / "state.pt", weights_only=False)


def release_memory() -> None:
    """Hand freed heap memory back to the OS. glibc keeps what the allocator's threads freed in per-thread arenas,
    so without this the resident size of a training process creeps up by a step's temporaries every step."""
    import contextlib
    import ctypes
    import gc
    import sys

    gc.collect()
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):  # not glibc (musl): nothing to trim
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def peak_rss_gib() -> float:
    """This process's peak resident memory so far, in GiB (logged each step: where a run's memory goes)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20


def save_pretrained(model: Any, tokenizer: Any, out: Path) -> Path:
    """Write the model and its tokenizer as a Hugging Face directory ``out / "model"`` (what `eval --model` loads)."""
    from rstar_env.rollout.local import without_library_bars

    path = out / "model"
    with without_library_bars():  # its "Writing model shards" bar would break our progress lines
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
    return path


def refuse_finished_run(out: Path, checkpoints: Path) -> None:
    """A finished run whose checkpoints were removed cannot resume; starting over silently would overwrite it."""
    note = finished_without_checkpoints(checkpoints)
    if note is not None:
        raise ConfigError(
            f"{out} holds a finished run (step {note['step']}; its model is in {note['model']}) whose checkpoints "
            "were removed (trainer.keep_checkpoints: none), so it cannot be continued. Pass --fresh to train it "
            "again, or set another trainer.output_dir."
        )


class Checkpointed:
    """Save and resume, written once for the local trainers (SFT and RL): the model, the optimizer, the step, the
    data cursor and the global RNGs in ``output_dir/checkpoints``, plus what a trainer adds in :meth:`extra_state`
    and takes back in :meth:`restore_extra_state` (a scheduler, the sampler's and the policy's streams). A resumed
    run's metrics (and other logs, :meth:`truncate_logs`) lose the steps after the checkpoint."""

    out: Path
    model: Any
    tokenizer: Any
    optimizer: Any
    step: int
    cursor: Any
    cfg: Any
    logger: Any

    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoints"

    def extra_state(self) -> dict[str, Any]:
        """What this trainer checkpoints besides the common state."""
        return {}

    def restore_extra_state(self, state: dict[str, Any]) -> None:
        """Take back what :meth:`extra_state` saved."""

    def truncate_logs(self) -> None:
        """Drop what the logs hold of steps after the one resumed from."""
        self.logger.truncate_after(self.step)

    def save(self) -> Path:
        """Write a checkpoint of everything a resumed run needs; keep the newest ``keep_checkpoints``."""
        state = training_state(self.model, self.optimizer, self.step, self.cursor)
        return write_checkpoint(
            self.checkpoint_dir, self.step, {**state, **self.extra_state()}, self.cfg.keep_checkpoints
        )

    def resume(self) -> bool:
        """Load the latest checkpoint under ``output_dir``, if any."""
        state = read_checkpoint(self.checkpoint_dir)
        if state is None:
            refuse_finished_run(self.out, self.checkpoint_dir)
            return False
        self.step, cursor = restore_training_state(state, self.model, self.optimizer)
        self.cursor = type(self.cursor)(*cursor)
        self.restore_extra_state(state)
        self.truncate_logs()
        return True

    def save_model(self) -> Path:
        return save_pretrained(self.model, self.tokenizer, self.out)
