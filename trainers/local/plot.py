"""``rstar-env plot RUN_DIR``: a training run's curves from ``metrics.jsonl`` (and its held-out reports) to a PNG.

Only panels with data are drawn (an SFT run has no reward, an RL run no learning-rate schedule to speak of), each
with its y-axis labelled; loss and gradient norm get panels of their own (their scales differ by orders of
magnitude). When the run has held-out reports (``eval_start.json`` before, ``eval.json`` after), a panel compares
them: the run's headline.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rstar_trainers.local.logging import read_metrics


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...]
    ylabel: str


PANELS: tuple[Panel, ...] = (
    Panel("reward", ("reward", "accuracy"), "mean reward"),
    Panel("tool-error ratio", ("tool_error_ratio", "tool_error_ratio_correct"), "failed calls / calls"),
    Panel("tool calls per trajectory", ("tool_calls_per_trajectory",), "calls"),
    Panel("response length", ("response_tokens",), "tokens"),
    Panel("groups", ("groups_kept", "groups_dropped"), "groups per step"),
    Panel("loss", ("loss",), "loss"),
    Panel("gradient norm", ("grad_norm",), "norm (before clipping)"),
    Panel("entropy", ("entropy",), "nats per token"),
    Panel("learning rate", ("lr",), "learning rate"),
    Panel("time per step", ("time/generation_s", "time/tools_and_reward_s", "time/train_s", "time/step_s"), "seconds"),
)

LABELS = {
    "tool_error_ratio": "all trajectories",
    "tool_error_ratio_correct": "correct trajectories",
    "time/generation_s": "generation",
    "time/tools_and_reward_s": "tools and reward",
    "time/train_s": "update",
    "time/step_s": "whole step",
    "groups_kept": "kept",
    "groups_dropped": "dropped",
}
HELD_OUT = ("pass@1", "tool_call_share", "answer_format_share")


def _series(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float("nan") if not isinstance(r.get(key), int | float) else float(r[key]) for r in rows]


def _has_data(values: list[float]) -> bool:
    return any(not math.isnan(v) for v in values)


def _read(path: Path) -> dict[str, float] | None:
    return json.loads(path.read_text()) if path.exists() else None


def panels_with_data(rows: list[dict[str, Any]]) -> list[tuple[Panel, list[str]]]:
    """Each panel that has data, with the keys to draw in it. ``accuracy`` is drawn only where it differs from
    ``reward`` (under a 0/1 reward they are the same curve); the whole step's time only when no breakdown exists."""
    out = []
    for panel in PANELS:
        keys = [k for k in panel.keys if _has_data(_series(rows, k))]
        if "accuracy" in keys and _series(rows, "accuracy") == _series(rows, "reward"):
            keys.remove("accuracy")
        if "time/step_s" in keys and len(keys) > 1:
            keys.remove("time/step_s")
        if keys:
            out.append((panel, keys))
    return out


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw the run's curves; returns the PNG's path (``RUN_DIR/curves.png`` by default)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FuncFormatter, MaxNLocator
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'rstar-env[local]'") from exc
    run_dir = Path(run_dir)
    # metrics.jsonl also holds the held-out reports' rows (keys eval/..., eval_start/...): not training steps.
    rows = [
        r
        for r in read_metrics(run_dir)
        if any(not k.startswith(("eval/", "eval_start/")) for k in r if k not in ("step", "stage"))
    ]
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no steps yet")
    steps = [r["step"] for r in rows]
    drawn = panels_with_data(rows)
    before, after = _read(run_dir / "eval_start.json"), _read(run_dir / "eval.json")
    held_out = before is not None or after is not None
    count = len(drawn) + held_out
    columns = min(4, count)
    lines = math.ceil(count / columns)
    fig, axes = plt.subplots(lines, columns, figsize=(4.5 * columns, 3.6 * lines), squeeze=False)
    flat = list(axes.flat)
    for ax, (panel, keys) in zip(flat, drawn, strict=False):
        for key in keys:
            ax.plot(steps, _series(rows, key), marker="o", markersize=3, label=LABELS.get(key, key))
        ax.set_title(panel.title)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(panel.ylabel)
        if panel.keys == ("lr",):  # each tick its own value: a constant lr on a "1e-5" offset axis reads as ~0
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: scientific(value)))
        ax.grid(alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=8)
    if held_out:
        _draw_held_out(flat[len(drawn)], before, after)
    for ax in flat[count:]:
        ax.set_visible(False)
    fig.suptitle(f"rstar-env training: {run_dir.name}")
    fig.tight_layout()
    path = Path(out) if out else run_dir / "curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def scientific(value: float) -> str:
    """A tick value written whole in scientific notation, trailing zeros dropped: ``2e-05``, ``1.5e-04``, ``0``."""
    if value == 0:
        return "0"
    mantissa, _, exponent = f"{value:.3e}".partition("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{exponent}"


def _draw_held_out(ax: Any, before: dict[str, float] | None, after: dict[str, float] | None) -> None:
    """Held-out figures before and after training, side by side (a report that does not exist is left out)."""
    keys = [k for k in HELD_OUT if (before and k in before) or (after and k in after)]
    width = 0.38
    for offset, (label, report) in ((-width / 2, ("before", before)), (width / 2, ("after", after))):
        if report is None:
            continue
        values = [report.get(k, float("nan")) for k in keys]
        bars = ax.bar([i + offset for i in range(len(keys))], values, width, label=label)
        ax.bar_label(bars, fmt="%.2f", fontsize=7)
    ax.set_xticks(range(len(keys)), [k.replace("_", " ") for k in keys], fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("share of held-out episodes")
    ax.set_title(
        "held-out: before vs after"
        if before is not None and after is not None
        else f"held-out: {'after' if after is not None else 'before'} training"
    )
    ax.legend(fontsize=8)
