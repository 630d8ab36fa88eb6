"""What a local training run shows: its per-step tables and end summary, printed through rstar-env's one
progress reporter (:mod:`rstar_env.progress`; :class:`RunProgress`, :class:`StepTable` and :class:`Column` are
re-exported here, their old import place).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rstar_env.progress import (
    Column,
    ProgressCallback,
    RunProgress,
    StepTable,
    table_header,
    table_row,
)
from rstar_env.progress import seconds as _seconds

RL_COLUMNS: Sequence[Column] = (
    Column(("step", ""), "step", 5, "d"),
    Column(("reward", "mean"), "reward", 7, ".3f"),
    Column(("calls per", "trajectory"), "tool_calls_per_trajectory", 10, ".2f"),
    Column(("tool err", "per call"), "tool_error_ratio", 8, ".3f"),
    Column(("tool err per", "call, correct"), "tool_error_ratio_correct", 13, ".3f"),
    Column(("groups", "kept"), "groups_kept", 6, ".0f"),
    Column(("response", "tokens"), "response_tokens", 8, ".0f"),
    Column(("loss", ""), "loss", 9, ".3g"),
    Column(("grad", "norm"), "grad_norm", 7, ".3g"),
    Column(("seconds", "step"), "time/step_s", 7, ".1f"),
)
"""One RL step per row, within 100 columns. ``accuracy`` is left out: under a 0/1 reward it equals ``reward``."""

SFT_COLUMNS: Sequence[Column] = (
    Column(("step", ""), "step", 5, "d"),
    Column(("loss", "per token"), "loss", 9, ".4f"),
    Column(("grad", "norm"), "grad_norm", 8, ".3g"),
    Column(("learning", "rate"), "lr", 9, ".3g"),
    Column(("trained", "tokens"), "train/trained_tokens", 8, ".0f"),
    Column(("seconds", "step"), "time/step_s", 7, ".1f"),
)

COMPARE_COLUMNS: Sequence[Column] = (
    Column(("arm/", "seed"), "arm", 8, "s"),
    *(
        c
        for c in RL_COLUMNS
        if c.key
        in ("step", "reward", "tool_calls_per_trajectory", "tool_error_ratio_correct", "response_tokens", "time/step_s")
    ),
)
"""One arm's RL step per row of ``rstar-env compare`` (``arm``: e.g. ``roc/0``), within 80 columns."""

RL_LEGEND = "tool err per call: failed tool calls / tool calls; 'correct': in trajectories that scored only"


# -- the weight sync's check -----------------------------------------------------------------------------------------
def sync_ok(before: float, after: float, dtype: str = "float32") -> bool:
    """Whether a weight sync took: after it the engine's log-probs of the probe are within the numerics of the two
    engines of the trainer's (1e-3 in float32, 5e-2 in half precision), or ten times closer than before it."""
    tolerance = 1e-3 if dtype == "float32" else 5e-2
    return after <= max(tolerance, before / 10)


def sync_line(checks: Sequence[tuple[float, float]], dtype: str = "float32") -> str | None:
    """One line on the vLLM engine's weight syncs so far: how many, whether each took (``None`` without any)."""
    if not checks:
        return None
    failed = [i for i, (before, after) in enumerate(checks) if not sync_ok(before, after, dtype)]
    worst = max(after for _, after in checks)
    if failed:
        return (
            f"weight sync: {len(failed)} of {len(checks)} did not take: the vLLM engine's log-probs of a probe text "
            f"stayed {worst:.1e} from the trained model's (see engine.log in the run directory)"
        )
    return (
        f"weight sync: {len(checks)} checked, the vLLM engine runs the trained weights (probe log-probs within "
        f"{worst:.0e} of the trained model's)"
    )


# -- the end summary ----------------------------------------------------------------------------------------------
HELD_OUT_KEYS = ("pass@1", "tool_call_share", "answer_format_share", "tool_calls_per_trajectory", "tool_error_ratio")


def summary_lines(
    *,
    model: str | None,
    run_dir: str,
    eval_before: Mapping[str, float] | None,
    eval_after: Mapping[str, float] | None,
    eval_path: str | None,
    seconds: float,
    peak_gib: float,
    steps: int,
    sft_model: str | None = None,
) -> list[str]:
    """The lines that end a run: where things are, held-out before/after, time and memory."""
    lines = []
    if sft_model:
        lines.append(f"SFT model:        {sft_model}")
    lines.append(
        f"model:            {model}" if model else f"model:            not saved (checkpoints in {run_dir}/checkpoints)"
    )
    lines.append(f"metrics:          {run_dir}/metrics.jsonl  (curves: rstar-env plot {run_dir})")
    if eval_path:
        lines.append(f"held-out report:  {eval_path}")
    if eval_after or eval_before:
        lines.append(f"{'held-out':<28}{'before':>8}{'after':>8}")
        for key in HELD_OUT_KEYS:
            before = (eval_before or {}).get(key)
            after = (eval_after or {}).get(key)
            if before is None and after is None:
                continue
            lines.append(f"  {key:<26}{_cell(before):>8}{_cell(after):>8}")
        gain = paired_gain(eval_before, eval_after)
        if gain is not None:
            lines.append(gain)
    lines.append(f"steps:            {steps}   total time {_seconds(seconds)}   peak memory {peak_gib:.2f} GiB")
    return lines


def paired_gain(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> str | None:
    """The held-out pass@1 change with its 95% t-interval, paired episode by episode (both reports roll out the
    same problems with the same seeds, so each episode's difference is one observation); ``None`` without both
    reports' ``rewards`` of one length."""
    from rstar_trainers.local.compare import t_interval

    a, b = (before or {}).get("rewards"), (after or {}).get("rewards")
    if not a or not b or len(a) != len(b):
        return None
    mean, low, high = t_interval([y - x for x, y in zip(a, b, strict=True)])
    if low != low:  # one episode: no spread to estimate
        return f"  pass@1 change {mean:+.3f} over {len(a)} held-out episodes (no interval)"
    return f"  pass@1 change {mean:+.3f}, 95% CI [{low:+.3f}, {high:+.3f}], paired over {len(a)} held-out episodes"


_SHORT = {
    "pass@1": "pass@1",
    "tool_call_share": "used the tool",
    "answer_format_share": "answer format",
    "tool_calls_per_trajectory": "calls/traj",
}


def held_out_line(label: str, report: Mapping[str, float]) -> str:
    """One line (within 100 columns) of a held-out report's main figures; the whole report is in its JSON file."""
    parts = [f"{name} {report[k]:.3g}" for k, name in _SHORT.items() if k in report]
    return f"{label}: " + "  ".join(parts)


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def peak_memory_gib() -> float:
    """Peak resident memory of this process and of its finished children (the SFT stage runs in one), in GiB."""
    import resource
    import sys

    scale = 2**30 if sys.platform == "darwin" else 2**20
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / scale


__all__ = [
    "COMPARE_COLUMNS",
    "HELD_OUT_KEYS",
    "RL_COLUMNS",
    "RL_LEGEND",
    "SFT_COLUMNS",
    "Column",
    "ProgressCallback",
    "RunProgress",
    "StepTable",
    "held_out_line",
    "paired_gain",
    "peak_memory_gib",
    "summary_lines",
    "sync_line",
    "sync_ok",
    "table_header",
    "table_row",
]
