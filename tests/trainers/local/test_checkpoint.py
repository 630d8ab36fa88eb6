"""Which checkpoints a local trainer keeps (``trainer.keep_checkpoints``), without a model."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from rstar_env.config import ConfigError
from rstar_trainers.local.checkpoint import (
    read_checkpoint,
    refuse_finished_run,
    remove_checkpoints,
    write_checkpoint,
)
from rstar_trainers.local.config import LocalSFTConfig, LocalTrainerConfig


def saved(root):
    return sorted(p.name for p in root.glob("step_*"))


@pytest.mark.parametrize(
    ("keep", "left"),
    [
        ("last", ["step_000003"]),
        ("none", ["step_000003"]),
        ("all", ["step_000001", "step_000002", "step_000003"]),
        (2, ["step_000002", "step_000003"]),
    ],
)
def test_keep_checkpoints_while_running(tmp_path, keep, left):
    for step in (1, 2, 3):
        write_checkpoint(tmp_path, step, {"step": step}, keep)
    assert saved(tmp_path) == left
    assert read_checkpoint(tmp_path)["step"] == 3


def test_a_finished_run_without_checkpoints_is_not_restarted(tmp_path):
    write_checkpoint(tmp_path / "checkpoints", 4, {"step": 4}, "none")
    refuse_finished_run(tmp_path, tmp_path / "checkpoints")  # a checkpoint to resume from: fine
    remove_checkpoints(tmp_path / "checkpoints", 4, tmp_path / "model")
    assert saved(tmp_path / "checkpoints") == [] and read_checkpoint(tmp_path / "checkpoints") is None
    with pytest.raises(ConfigError, match=r"step 4.*model.*keep_checkpoints: none.*--fresh"):
        refuse_finished_run(tmp_path, tmp_path / "checkpoints")


def test_defaults_and_bad_values():
    assert LocalTrainerConfig().keep_checkpoints == "last"  # a finished RL run can be continued (more steps)
    assert LocalSFTConfig().keep_checkpoints == "none"  # a finished SFT stage is never resumed
    assert LocalTrainerConfig(keep_checkpoints=3).keep_checkpoints == 3
    with pytest.raises(ValueError, match="keep_checkpoints"):
        LocalTrainerConfig(keep_checkpoints="some")
