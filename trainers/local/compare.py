"""``rstar-env compare``: GRPO against GRPO-RoC from the same SFT checkpoint, same seeds, data and steps.

For each seed, both arms train from the same weights with the same config except the sampler: ``grpo`` keeps a
uniform seeded G of the 2G rollouts, ``roc`` keeps them by Resample-on-Correct. The same seed gives both arms the
same problem order and the same first rollouts (the arms diverge once their updates differ).

Per step, what is plotted comes from each step's rollouts **before** selection (``metrics.jsonl``):
``tool_error_ratio_correct`` (tool calls with an error / all tool calls, within trajectories with reward > 0: the
paper's Figure 4), ``reward`` and ``response_tokens``. Output under ``OUT``: ``grpo-seedS/`` and ``roc-seedS/`` (each
a full training run: metrics.jsonl, TensorBoard, checkpoints, eval.json), ``compare.json`` (every arm's metrics),
``compare.png`` and ``compare.md`` (the table). A rerun resumes every arm from its checkpoints.
"""

from __future__ import annotations

import gc
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import fmean, pstdev
from typing import Any

from rstar_env.config import RunConfig
from rstar_trainers.local.config import LocalTrainerConfig
from rstar_trainers.local.logging import read_metrics

ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"name": "grpo", "options": {}},
    "roc": {"name": "roc", "options": {"mode": "topk"}},
}
PANELS: list[tuple[str, str]] = [
    ("tool_error_ratio_correct", "tool-error ratio in correct trajectories (before selection)"),
    ("reward", "reward (strict)"),
    ("response_tokens", "response length (tokens)"),
]


def arm_dir(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm}-seed{seed}"


def run_compare(
    run: RunConfig,
    settings: LocalTrainerConfig,
    *,
    out: str | Path,
    model: str,
    seeds: Sequence[int],
    steps: int,
    on_step: Callable[[str, int, dict[str, Any]], None] | None = None,
    model_and_tokenizer: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """Train every (arm, seed) for ``steps`` steps from ``model``; then write the figure, table and metrics.
    Returns the summary written to ``compare.json``. ``model_and_tokenizer``: loaded weights to start every arm
    from (each arm trains a copy) instead of loading ``model``."""
    import copy

    from rstar_trainers.local.trainer import LocalTrainer

    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        for arm, sampler in ARMS.items():
            arm_run = run.model_copy(deep=True)
            arm_run.sampler = type(run.sampler).model_validate(sampler)
            arm_settings = settings.model_copy(update={
                "seed": seed, "steps": steps, "model": model, "output_dir": str(arm_dir(root, arm, seed)),
                "sft": None, "save_model": False, "save_trajectories": False, "eval_at_start": False,
            })
            loaded = None
            if model_and_tokenizer is not None:
                loaded = (copy.deepcopy(model_and_tokenizer[0]), model_and_tokenizer[1])
            trainer = LocalTrainer(arm_run, arm_settings, model_and_tokenizer=loaded)
            try:
                trainer.train(on_step=None if on_step is None else lambda m, a=arm, s=seed: on_step(a, s, m))
            finally:
                trainer.close()
                del trainer
                gc.collect()
    return write_report(root, seeds)


def _series(rows: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for r in rows:
        value = r.get(key)
        out.append(float("nan") if value is None else float(value))
    return out


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return fmean(kept) if kept else float("nan")


def write_report(root: Path, seeds: Sequence[int]) -> dict[str, Any]:
    """``compare.json``, ``compare.md`` and ``compare.png`` from the arms' ``metrics.jsonl``."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {arm: {} for arm in ARMS}
    for arm in ARMS:
        for seed in seeds:
            rows = [r for r in read_metrics(arm_dir(root, arm, seed)) if "reward" in r]
            runs[arm][seed] = rows
    summary: dict[str, Any] = {"seeds": list(seeds), "arms": {}}
    for arm, by_seed in runs.items():
        entry: dict[str, Any] = {"metrics": {str(s): rows for s, rows in by_seed.items()}}
        for key, _ in PANELS:
            per_seed = [_mean(_series(rows, key)) for rows in by_seed.values()]
            last = [_mean(_series(rows[len(rows) // 2 :], key)) for rows in by_seed.values()]
            entry[key] = {"mean_all_steps": _mean(per_seed), "mean_second_half": _mean(last),
                          "spread_second_half": pstdev([v for v in last if not math.isnan(v)]) if len(last) > 1
                          else 0.0, "per_seed_second_half": last}
        for name in ("tool_calls_per_trajectory", "accuracy"):
            entry[name] = {"mean_second_half": _mean(
                [_mean(_series(rows[len(rows) // 2 :], name)) for rows in by_seed.values()])}
        summary["arms"][arm] = entry
    (root / "compare.json").write_text(json.dumps(summary, indent=1))
    (root / "compare.md").write_text(markdown_table(summary))
    plot_compare(runs, root / "compare.png")
    return summary


def markdown_table(summary: dict[str, Any]) -> str:
    """One row per arm: each plotted quantity over all steps and over the second half (mean ± spread of seeds)."""
    head = ["arm", *(f"{k} (all / 2nd half)" for k, _ in PANELS), "tool calls / traj (2nd half)",
            "accuracy (2nd half)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, entry in summary["arms"].items():
        cells = [arm]
        for key, _ in PANELS:
            e = entry[key]
            cells.append(f"{e['mean_all_steps']:.3f} / {e['mean_second_half']:.3f} ± {e['spread_second_half']:.3f}")
        cells.append(f"{entry['tool_calls_per_trajectory']['mean_second_half']:.2f}")
        cells.append(f"{entry['accuracy']['mean_second_half']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    seeds = ", ".join(map(str, summary["seeds"]))
    lines.append("")
    lines.append(f"Seeds {seeds}; ± is the spread (population std) of the per-seed second-half means.")
    return "\n".join(lines) + "\n"


def plot_compare(runs: dict[str, dict[int, list[dict[str, Any]]]], path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'rstar-env[local]'") from exc
    colors = {"grpo": "tab:blue", "roc": "tab:red"}
    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.2))
    for ax, (key, title) in zip(axes, PANELS, strict=True):
        for arm, by_seed in runs.items():
            width = max((len(rows) for rows in by_seed.values()), default=0)
            for rows in by_seed.values():  # each seed thin, their mean thick
                ax.plot([r["step"] for r in rows], _series(rows, key), color=colors[arm], alpha=0.25, lw=1)
            mean = [_mean([_series(rows, key)[i] for rows in by_seed.values() if i < len(rows)]) for i in range(width)]
            ax.plot(range(1, width + 1), mean, color=colors[arm], lw=2.2, marker="o", ms=3,
                    label=f"{'GRPO-RoC' if arm == 'roc' else 'GRPO'} (mean of {len(by_seed)} seeds)")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
