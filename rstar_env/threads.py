"""Torch's CPU threads on a machine shared with other programs.

Torch runs each operation on all the cores it sees, and its threads wait for one another at the end of every
operation. Beside another CPU-bound program that is the worst choice: one of torch's threads is off its core for a
time slice while the others wait, at every one of the thousands of small operations that generating a token takes.
Measured on a 2-core machine with SmolLM2-135M (docs/benchmarks.md#threads): generation 107.9 tok/s with 2 threads
and 77.1 with 1 when idle, but 28.7 with 2 threads and 70.6 with 1 beside one busy process; a training micro-step
6.5 s / 9.7 s idle and 15.3 s / 9.8 s beside it.

So rstar-env sizes torch's thread pool to the cores that other programs leave free: :func:`adapt`, called where
the work happens (each generated token's batch, each training micro-batch), measures at most once a second how much
CPU time processes outside this one and its children took on the cores this process may run on (``/proc/stat``
minus this process tree's own time), and sets the calling thread's torch threads to the cores left. Idle, that is
every core (torch's own default); beside one busy program on 2 cores, 1.

``trainer.threads`` (or the environment variable ``RSTAR_ENV_THREADS``) fixes the count instead: a number, or
``auto`` (the default). ``OMP_NUM_THREADS``, when set, caps what ``auto`` chooses. Sandbox workers run
single-threaded regardless (their own limit), and a vLLM engine sizes its own threads.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass

ENV_VAR = "RSTAR_ENV_THREADS"
INTERVAL_S = 1.0
"""The shortest time between two measurements: reading /proc costs about a millisecond."""


@dataclass(frozen=True)
class Sample:
    """CPU time (clock ticks) at one moment: all work on our cores, and this process tree's own."""

    at: float
    busy: int
    own: int


def _cores() -> list[int]:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def _busy_ticks(cores: list[int]) -> int:
    wanted = {f"cpu{c}" for c in cores}
    total = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if name in wanted:
                # user nice system idle iowait irq softirq steal: everything but idle and iowait is work
                values = [int(v) for v in fields[:8]]
                total += sum(values) - values[3] - values[4]
    return total


def _own_ticks() -> int:
    from rstar_env.proctree import descendants

    me = os.getpid()
    total = 0
    for pid in (me, *descendants(me)):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # utime stime cutime cstime: children that ended count through their parent
        total += sum(int(v) for v in fields[11:15])
    return total


def sample(cores: list[int]) -> Sample:
    return Sample(time.monotonic(), _busy_ticks(cores), _own_ticks())


def others_busy(before: Sample, after: Sample) -> float:
    """Cores kept busy by other programs between two samples (0 when nothing else ran)."""
    seconds = after.at - before.at
    if seconds <= 0:
        return 0.0
    ticks = (after.busy - before.busy) - (after.own - before.own)
    return max(0.0, ticks / os.sysconf("SC_CLK_TCK") / seconds)


def free_cores(cores: int, busy_elsewhere: float) -> int:
    """Threads for ``cores`` cores of which other programs keep ``busy_elsewhere`` busy: at least 1."""
    return max(1, min(cores, int(cores - busy_elsewhere + 0.5)))


def _setting() -> int | None:
    """A fixed count from ``RSTAR_ENV_THREADS``, or ``None`` for ``auto``."""
    raw = os.environ.get(ENV_VAR, "auto").strip().lower()
    if raw in ("", "auto"):
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{ENV_VAR}={raw!r}: use 'auto' (the default) or a number of threads of at least 1")
    return value


class CoreShare:
    """How many torch threads this process should run now (see the module docstring); one per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._cores = _cores()
        self._cap = len(self._cores)
        omp = os.environ.get("OMP_NUM_THREADS", "").strip()
        if omp.isdigit() and int(omp) > 0:
            self._cap = min(self._cap, int(omp))
        self._last: Sample | None = None
        self._threads = self._cap
        self._pid = os.getpid()

    def threads(self) -> int:
        fixed = _setting()
        if fixed is not None:
            return fixed
        if self._cap == 1:
            return 1
        with self._lock:
            if self._pid != os.getpid():  # a forked child measures afresh
                self._reset()
            now = time.monotonic()
            if self._last is not None and now - self._last.at < INTERVAL_S:
                return self._threads
            try:
                current = sample(self._cores)
            except (OSError, ValueError):  # no /proc (not Linux): torch's default
                return self._threads
            if self._last is not None:
                self._threads = free_cores(self._cap, others_busy(self._last, current))
            self._last = current
            return self._threads


_SHARE = CoreShare()
_applied = threading.local()


def adapt() -> int:
    """Set the calling thread's torch intra-op threads to the cores other programs leave free (see the module
    docstring); returns the count. Cheap between measurements; a no-op where torch is not imported."""
    threads = _SHARE.threads()
    torch = sys.modules.get("torch")
    # Per thread: torch.set_num_threads sets the OpenMP pool of the thread that calls it, not of the others.
    if torch is not None and getattr(_applied, "threads", None) != threads:
        torch.set_num_threads(threads)
        _applied.threads = threads
    return threads


def configure(threads: int | str | None) -> None:
    """``trainer.threads``: a number fixes the count for this process and the ones it starts (through
    ``RSTAR_ENV_THREADS``); ``"auto"`` (or ``None``) leaves the environment's setting, measuring by default."""
    if threads is not None and str(threads).strip().lower() != "auto":
        os.environ[ENV_VAR] = str(int(threads))
    _setting()  # a bad value fails here, at configuration


__all__ = ["ENV_VAR", "CoreShare", "adapt", "configure", "free_cores", "others_busy"]
