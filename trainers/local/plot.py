"""``rstar-env plot RUN_DIR``: training curves from ``metrics.jsonl`` to a PNG."""

from __future__ import annotations

from pathlib import Path

from rstar_trainers.local.logging import read_metrics

PANELS: list[tuple[str, list[str]]] = [
    ("reward / accuracy", ["reward", "accuracy"]),
    ("tool-error ratio", ["tool_error_ratio", "tool_error_ratio_correct"]),
    ("tool calls per trajectory", ["tool_calls_per_trajectory"]),
    ("response tokens", ["response_tokens"]),
    ("groups", ["groups_kept", "groups_dropped"]),
    ("loss / grad norm", ["loss", "grad_norm"]),
    ("entropy", ["entropy"]),
    ("seconds per step", ["time/generation_s", "time/tools_and_reward_s", "time/train_s"]),
]


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw the run's curves; returns the PNG's path (``RUN_DIR/curves.png`` by default)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'rstar-env[local]'") from exc
    rows = read_metrics(run_dir)
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no steps yet")
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(2, 4, figsize=(18, 8))
    for ax, (title, keys) in zip(axes.flat, PANELS, strict=True):
        for key in keys:
            values = [r.get(key) for r in rows]
            if any(v is not None for v in values):
                ax.plot(steps, [float("nan") if v is None else v for v in values], marker="o", label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(f"rstar-env training: {Path(run_dir).name}")
    fig.tight_layout()
    path = Path(out) if out else Path(run_dir) / "curves.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
