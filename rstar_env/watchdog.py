"""A watchdog that names whatever blocks an event loop that runs plugin calls.

All envs of a process share one background event loop (:mod:`rstar_env.aio`), so one plugin that blocks it
(``time.sleep``, or heavy CPU work inside ``async def``) stalls every episode, and no time limit can interrupt it.
Each watched loop runs a cheap heartbeat (a timer callback a few times a second); one daemon thread checks the
heartbeats. When a loop has not run its heartbeat for longer than the threshold, the watchdog logs a warning on the
``rstar_env.watchdog`` logger naming the task that holds the loop (plugin calls run as tasks named after the
plugin, e.g. ``tool 'calculator' call``) and the seconds so far, and logs again with the total when the loop runs
again. Incidents are also kept in :func:`incidents`.

The threshold is ``RSTAR_ENV_LOOP_BLOCK_S`` (seconds, default 2; ``0`` turns the watchdog off), or
:func:`configure`. Loops are watched from the first plugin call made on them.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass

log = logging.getLogger("rstar_env.watchdog")

_DEFAULT_THRESHOLD_S = 2.0


@dataclass(frozen=True)
class Incident:
    """The loop did not run for ``seconds`` while ``task`` held it (``ongoing``: not over when recorded)."""

    task: str
    seconds: float
    ongoing: bool


def _threshold_from_env() -> float:
    raw = os.environ.get("RSTAR_ENV_LOOP_BLOCK_S", "")
    try:
        return max(float(raw), 0.0) if raw.strip() else _DEFAULT_THRESHOLD_S
    except ValueError:
        log.warning("RSTAR_ENV_LOOP_BLOCK_S=%r is not a number of seconds; using %g", raw, _DEFAULT_THRESHOLD_S)
        return _DEFAULT_THRESHOLD_S


class _Watched:
    __slots__ = ("beat", "blocked_since", "culprit", "reported")

    def __init__(self) -> None:
        self.beat = time.monotonic()
        self.reported = False
        self.blocked_since = 0.0
        self.culprit = ""


_lock = threading.Lock()
_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watched] = weakref.WeakKeyDictionary()
_incidents: collections.deque[Incident] = collections.deque(maxlen=100)
_threshold_s = _threshold_from_env()
_thread: threading.Thread | None = None


def configure(threshold_s: float) -> None:
    """Log when a watched loop is blocked for more than ``threshold_s`` seconds (``0``: never)."""
    global _threshold_s
    if threshold_s < 0:
        raise ValueError(f"threshold_s must be >= 0, got {threshold_s!r}")
    _threshold_s = float(threshold_s)


def incidents() -> list[Incident]:
    """The latest incidents (at most 100), oldest first."""
    with _lock:
        return list(_incidents)


def _interval() -> float:
    return min(0.25, max(_threshold_s / 4, 0.01))


def watch(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Watch ``loop`` (default: the running one). Cheap and idempotent; call it from the loop's thread."""
    if _threshold_s <= 0:
        return
    loop = loop or asyncio.get_running_loop()
    with _lock:
        if loop in _loops:
            return
        state = _loops[loop] = _Watched()
        _start_thread()
    ref = weakref.ref(loop)

    def beat() -> None:
        watched = ref()
        if watched is None or watched.is_closed():
            return
        state.beat = time.monotonic()
        watched.call_later(_interval(), beat)

    loop.call_soon(beat)


def _start_thread() -> None:
    global _thread
    if _thread is not None and _thread.is_alive():
        return
    _thread = threading.Thread(target=_run, name="rstar-env-watchdog", daemon=True)
    _thread.start()


def _holder(loop: asyncio.AbstractEventLoop) -> str:
    # The task the loop is running now. Read from this thread: a plain lookup, only used to name it.
    try:
        task = asyncio.current_task(loop)
    except RuntimeError:
        task = None
    return "code outside any task" if task is None else task.get_name()


def _run() -> None:
    while True:
        time.sleep(_interval())
        threshold = _threshold_s
        now = time.monotonic()
        with _lock:
            watched = list(_loops.items())
        for loop, state in watched:
            if loop.is_closed() or not loop.is_running():
                continue
            lag = now - state.beat
            if threshold > 0 and lag > threshold and not state.reported:
                state.reported, state.blocked_since, state.culprit = True, state.beat, _holder(loop)
                with _lock:
                    _incidents.append(Incident(state.culprit, lag, ongoing=True))
                log.warning(
                    "the rstar-env event loop has not run for %.1f s: %s is blocking it, and every env of this "
                    "process waits. An async plugin must not block: do blocking or CPU-bound work in a plain "
                    "(def) call/score, which runs in a thread, or with asyncio.to_thread",
                    lag, state.culprit,
                )
            elif state.reported and lag <= _interval() * 2:
                state.reported = False
                total = state.beat - state.blocked_since
                with _lock:
                    _incidents.append(Incident(state.culprit, total, ongoing=False))
                log.warning("the rstar-env event loop was blocked for %.1f s by %s", total, state.culprit)


def _forget_after_fork() -> None:
    # The thread does not survive fork; the child's loops start their own watch on first use.
    global _thread, _lock, _loops
    _thread = None
    _lock = threading.Lock()
    _loops = weakref.WeakKeyDictionary()


os.register_at_fork(after_in_child=_forget_after_fork)
