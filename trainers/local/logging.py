"""Per-step metrics: always JSONL (``metrics.jsonl``), TensorBoard and wandb when available and asked for."""

from __future__ import annotations

import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any


class MetricsLogger:
    def __init__(
        self, out: Path, *, tensorboard: bool = True, wandb_project: str | None = None, config: dict | None = None
    ) -> None:
        self.path = out / "metrics.jsonl"
        self._writer: Any = None
        self._wandb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(out / "tensorboard"))
            except ImportError:
                warnings.warn(
                    "TensorBoard logging is off: `tensorboard` is not installed (pip install 'rstar-env[local]'); "
                    "metrics still go to metrics.jsonl",
                    stacklevel=2,
                )
        if wandb_project:
            try:
                import wandb
            except ImportError:
                warnings.warn(
                    f"wandb_project={wandb_project!r} but wandb is not installed (pip install wandb)", stacklevel=2
                )
            else:
                self._wandb = wandb.init(project=wandb_project, config=config, dir=str(out))

    def log(self, metrics: dict[str, Any], step: int) -> None:
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(metrics) + "\n")
        numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and k != "step"}
        if self._writer is not None:
            for key, value in numeric.items():
                self._writer.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def truncate_after(self, step: int) -> None:
        """Forget metrics of steps after ``step`` (a resumed run redoes them)."""
        truncate_jsonl(self.path, lambda row: row.get("step", 0) <= step)

    def flush(self) -> None:
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def truncate_jsonl(path: Path, keep: Callable[[dict[str, Any]], bool]) -> None:
    """Rewrite a JSONL file with only the rows ``keep`` accepts (unreadable lines are dropped)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            if line.strip() and keep(json.loads(line)):
                kept.append(line)
        except json.JSONDecodeError:
            continue
    path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist: is {run_dir} a training run directory?")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
