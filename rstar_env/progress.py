"""The one progress reporter of rstar-env's commands and trainers: progress bars on a terminal, plain lines in a log.

A command or trainer reports ``update(key, done, total, description, text)`` for each long phase (no display code
in it); :class:`RunProgress` turns those calls into rich progress bars on a terminal, or into plain, throttled
lines when the output is not a terminal (CI logs, a file): a phase's start and end, every ``every_s`` seconds, at
every ``every_fraction`` of its total if asked, and a heartbeat whenever nothing was printed for ``heartbeat_s``,
so a log never goes quiet for long. A line reads ``description: done/total (percent%)  text  elapsed time``.
Rows of a table (:class:`StepTable`) are printed above the bars.
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
    text: str = ""
    task: TaskID | None = None


class RunProgress:
    """Progress bars (terminal) or log lines (anything else) for the phases a command or trainer reports.

    Use as a context manager; pass :meth:`update` to a trainer as its ``on_progress`` and print table rows with
    :meth:`print` (they appear above the bars). ``plain`` forces log lines (default: when ``console`` is not a
    terminal); ``transient`` bars vanish when the run ends (a trainer's), else they stay (an evaluation's).
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        plain: bool | None = None,
        every_s: float = 10.0,
        heartbeat_s: float = 25.0,
        every_fraction: float | None = None,
        transient: bool = True,
    ) -> None:
        self.console = console or Console(stderr=True)
        self.plain = (not self.console.is_terminal) if plain is None else plain
        self.every_s = every_s
        self.heartbeat_s = heartbeat_s
        self.every_fraction = every_fraction
        self.transient = transient
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
                TextColumn("{task.fields[text]}"),
                TimeElapsedColumn(),
                console=self.console,
                transient=self.transient,
            )
            self._bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._bars is not None:
            self._bars.stop()

    def update(self, key: str, done: int, total: int, description: str = "", text: str = "") -> None:
        """Report progress of phase ``key``: ``done`` of ``total``, with ``text`` (e.g. pass@1 so far) on its line.
        A phase that restarts (``done`` back to 0) starts its clock again."""
        now = time.monotonic()
        description = description or key
        with self._lock:
            phase = self._phases.get(key)
            restarted = phase is None or done < phase.done or done == 0
            if restarted:
                task = phase.task if phase is not None else None
                phase = self._phases[key] = _Phase(description, done, total, now, 0.0, text, task)
            assert phase is not None
            crossed = self._crossed(phase.done, done, total) and not restarted
            finished = done >= total and (restarted or phase.done < total)  # once, not again on a repeat
            phase.description, phase.done, phase.total, phase.text = description, done, total, text
            self._current = key
            if self._bars is not None:
                if phase.task is None:
                    phase.task = self._bars.add_task(description, total=total, text=text)
                if done == 0:
                    self._bars.reset(phase.task, total=total, description=description)
                visible = done < total or not self.transient
                self._bars.update(
                    phase.task, completed=done, total=total, description=description, text=text, visible=visible
                )
                return
            if finished or done == 0 or crossed or now - phase.printed >= self.every_s:
                phase.printed = now
                self._emit(_line(phase, now))

    def _crossed(self, before: int, done: int, total: int) -> bool:
        """Whether ``before -> done`` crosses a multiple of ``every_fraction`` of ``total``."""
        if not self.every_fraction or total <= 0:
            return False
        step = max(total * self.every_fraction, 1.0)
        return math.floor(done / step) > math.floor(before / step)

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
                    self._emit(_line(phase, now) + " (still working)")
                else:
                    self._emit("still working")


def _line(phase: _Phase, now: float) -> str:
    percent = 100 * phase.done / phase.total if phase.total > 0 else 100.0
    text = f"  {phase.text}" if phase.text else ""
    clock = seconds(now - phase.started)
    return f"{phase.description}: {phase.done}/{phase.total} ({percent:.0f}%){text}  elapsed {clock}"


def seconds(s: float) -> str:
    """A duration for a person: ``42 s`` under two minutes, else ``3.5 min``."""
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


# -- tables printed through the reporter --------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    header: tuple[str, str]
    """Two header lines (a name, then what it is of)."""
    key: str
    width: int
    format: str = ".3g"


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


__all__ = ["Column", "ProgressCallback", "RunProgress", "StepTable", "seconds", "table_header", "table_row"]
