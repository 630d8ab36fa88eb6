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
    return {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "cursor": (cursor.epoch, cursor.position), **global_rng_state()}


def restore_training_state(state: dict[str, Any], model: Any, optimizer: Any) -> tuple[int, tuple[int, int]]:
    """Load :func:`training_state`'s part of ``state`` into ``model``, ``optimizer`` and the global generators;
    returns the step and the data position."""
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    restore_global_rng(state)
    return state["step"], tuple(state["cursor"])


def write_checkpoint(root: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Save ``state`` as step ``step`` under ``root``; keep the newest ``keep`` checkpoints."""
    path = root / f"step_{step:06d}"
    tmp = path.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / "state.pt")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    (root / "latest").write_text(path.name)
    for old in sorted(root.glob("step_*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


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
    path = out / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
