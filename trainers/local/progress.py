"""What a local training run shows while it works: progress of each long phase, a per-step table, an end summary.

The trainers only call ``on_progress(key, done, total, description)`` (no display code in them); :class:`RunProgress`
turns those calls into rich progress bars on a terminal, or into plain, throttled log lines when the output is not a
terminal (CI logs), with a heartbeat line whenever a phase has been silent for ``heartbeat_s``, so a log never goes
quiet for long.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

ProgressCallback = Callable[[str, int, int, str], None]
"""``(key, done, total, description)``: a phase (``key``) has ``done`` of ``total`` units finished."""


@dataclass
class _Phase:
    description: str
    done: int
    total: int
    started: float
    printed: float
    task: TaskID | None = None


class RunProgress:
    """Progress bars (terminal) or log lines (anything else) for the phases a trainer reports.

    Use as a context manager; pass :meth:`update` to the trainer as its ``on_progress`` and print table rows with
    :meth:`print` (they appear above the bars). ``plain`` forces log lines (default: when ``console`` is not a
    terminal).
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        plain: bool | None = None,
        every_s: float = 10.0,
        heartbeat_s: float = 25.0,
    ) -> None:
        self.console = console or Console(stderr=True)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.every_s = every_s
        self.heartbeat_s = heartbeat_s
        self._phases: dict[str, _Phase] = {}
        self._current: str | None = None
        self._lock = threading.Lock()
        self._last_output = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bars: Progress | None = None

    def __enter__(self) -> RunProgress:
        if self.plain:
            self._thread = threading.Thread(target=self._heartbeat, name="progress-heartbeat", daemon=True)
            self._thread.start()
        else:
            self._bars = Progress(
                TextColumn("{task.description}"),
                BarColumn(bar_width=30),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1)
        if self._bars is not None:
            self._bars.stop()

    def update(self, key: str, done: int, total: int, description: str = "") -> None:
        """Report progress of phase ``key``; a phase that restarts (``done`` back to 0) starts its clock again."""
        now = time.monotonic()
        description = description or key
        with self._lock:
            phase = self._phases.get(key)
            if phase is None or done < phase.done or done == 0:
                task = phase.task if phase is not None else None
                phase = self._phases[key] = _Phase(description, done, total, now, 0.0, task)
            phase.description, phase.done, phase.total = description, done, total
            self._current = key
            if self._bars is not None:
                if phase.task is None:
                    phase.task = self._bars.add_task(description, total=total)
                if done == 0:
                    self._bars.reset(phase.task, total=total, description=description)
                self._bars.update(
                    phase.task, completed=done, total=total, description=description, visible=done < total
                )
                return
            finished = done >= total
            if finished or done == 0 or now - phase.printed >= self.every_s:
                phase.printed = now
                self._emit(f"{description}: {done}/{total} ({_seconds(now - phase.started)})")

    def print(self, text: str) -> None:
        """A line of output (a table row), above the bars."""
        with self._lock:
            self._emit(text)

    def _emit(self, text: str) -> None:
        self._last_output = time.monotonic()
        (self._bars.console if self._bars is not None else self.console).print(
            text, markup=False, highlight=False, soft_wrap=True
        )

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(self.heartbeat_s, 5.0)):
            with self._lock:
                now = time.monotonic()
                if now - self._last_output < self.heartbeat_s:
                    continue
                phase = self._phases.get(self._current) if self._current else None
                if phase is None or phase.done >= phase.total:  # another phase may still run (parallel arms)
                    phase = next((p for p in reversed(self._phases.values()) if p.done < p.total), None)
                if phase is not None and phase.done < phase.total:
                    self._emit(
                        f"{phase.description}: {phase.done}/{phase.total} "
                        f"({_seconds(now - phase.started)}, still working)"
                    )
                else:
                    self._emit("still working")


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


# -- the per-step tables ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    header: tuple[str, str]
    """Two header lines (a name, then what it is of)."""
    key: str
    width: int
    format: str = ".3g"


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


def table_header(columns: Sequence[Column]) -> list[str]:
    return ["  ".join(f"{c.header[line]:>{c.width}}" for c in columns).rstrip() for line in (0, 1)]


def table_row(columns: Sequence[Column], metrics: Mapping[str, Any]) -> str:
    cells = []
    for c in columns:
        value = metrics.get(c.key)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            cells.append(f"{'-':>{c.width}}")
        elif c.format == "s":
            cells.append(f"{value!s:>{c.width}}")
        elif c.format == "d":
            cells.append(f"{int(value):>{c.width}d}")
        else:
            cells.append(f"{value:>{c.width}{c.format}}")
    return "  ".join(cells)


class StepTable:
    """A per-step table printed through ``progress``; pass :meth:`add` as a trainer's ``on_step``.

    The header (and ``legend``) goes out with the first row, not when the run starts: what a run prints before its
    first step (model loading, a held-out evaluation, the step's progress lines) would otherwise stand between the
    header and the rows it names. :meth:`add` may be called from several threads (parallel arms).
    """

    def __init__(self, progress: RunProgress, columns: Sequence[Column], legend: str | None = None) -> None:
        self.progress = progress
        self.columns = columns
        self.legend = legend
        self._started = False
        self._lock = threading.Lock()

    def add(self, metrics: Mapping[str, Any]) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                for line in (*table_header(self.columns), *([self.legend] if self.legend else [])):
                    self.progress.print(line)
            self.progress.print(table_row(self.columns, metrics))


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
