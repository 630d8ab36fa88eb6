"""The loop watchdog's machinery (its public face is :mod:`rstar_env.watchdog`, its owner the runtime)."""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("rstar_env.watchdog")

DEFAULT_BLOCK_THRESHOLD_S = 2.0
"""The watchdog's threshold when ``RSTAR_ENV_LOOP_BLOCK_S`` is not set."""


@dataclass(frozen=True)
class Incident:
    """The loop did not run for ``seconds`` while ``task`` held it (``ongoing``: not over when recorded).

    ``plugin`` names the plugin whose call held the loop (``"tool 'calculator'"``), or is ``None`` when no plugin
    call did (machine load, garbage collection, the caller's own code).
    """

    task: str
    seconds: float
    ongoing: bool
    plugin: str | None = None


def _threshold_from_env() -> float:
    raw = os.environ.get("RSTAR_ENV_LOOP_BLOCK_S", "")
    try:
        return max(float(raw), 0.0) if raw.strip() else DEFAULT_BLOCK_THRESHOLD_S
    except ValueError:
        log.warning("RSTAR_ENV_LOOP_BLOCK_S=%r is not a number of seconds; using %g", raw, DEFAULT_BLOCK_THRESHOLD_S)
        return DEFAULT_BLOCK_THRESHOLD_S


class _Watched:
    __slots__ = ("beat", "blocked_since", "culprit", "plugin", "reported")

    def __init__(self) -> None:
        self.beat = time.monotonic()
        self.reported = False
        self.blocked_since = 0.0
        self.culprit = ""
        self.plugin: str | None = None


class Watchdog:
    """Names the plugin that blocks an event loop running plugin calls (see :mod:`rstar_env.watchdog`).

    Each watched loop runs a heartbeat (a timer callback a few times a second) and one daemon thread checks them.
    A stall longer than the threshold is recorded as an :class:`Incident`. Only a plugin can be told to act, so
    only a stall held by a plugin's call (a task given to :meth:`attribute`) is a warning, once per plugin; any
    other stall (machine load, garbage collection, the caller's own code) is logged at debug level.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Watched] = weakref.WeakKeyDictionary()
        self._plugins: weakref.WeakKeyDictionary[asyncio.Task[Any], str] = weakref.WeakKeyDictionary()
        self._incidents: collections.deque[Incident] = collections.deque(maxlen=100)
        self._warned: set[str] = set()
        self._threshold_s = _threshold_from_env()
        self._stop: threading.Event | None = None  # set: the checking thread ends; None: no thread yet

    def configure(self, threshold_s: float) -> None:
        """Report a watched loop blocked for more than ``threshold_s`` seconds (``0``: never)."""
        if threshold_s < 0:
            raise ValueError(f"threshold_s must be >= 0, got {threshold_s!r}")
        self._threshold_s = float(threshold_s)

    def incidents(self) -> list[Incident]:
        """The latest incidents (at most 100), oldest first."""
        with self._lock:
            return list(self._incidents)

    def watch(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Watch ``loop`` (default: the running one). Cheap and idempotent; call it from the loop's thread."""
        if self._threshold_s <= 0:
            return
        loop = loop or asyncio.get_running_loop()
        with self._lock:
            if loop in self._loops:
                return
            state = self._loops[loop] = _Watched()
            if self._stop is None:
                self._stop = threading.Event()
                threading.Thread(target=self._run, args=(self._stop,), name="rstar-env-watchdog", daemon=True).start()
        ref = weakref.ref(loop)

        def beat() -> None:
            watched = ref()
            # A loop forgotten by reset() (or watched anew since) ends this heartbeat: one per loop.
            if watched is None or watched.is_closed() or self._loops.get(watched) is not state:
                return
            state.beat = time.monotonic()
            watched.call_later(self._interval(), beat)

        loop.call_soon(beat)

    def attribute(self, task: asyncio.Task[Any], plugin: str) -> None:
        """Record that ``task`` is a call of ``plugin`` (e.g. ``"tool 'calculator'"``): a stall it causes is the
        plugin's, and warned about by that name."""
        with self._lock:
            self._plugins[task] = plugin

    def reset(self) -> None:
        """Stop the checking thread and forget watched loops, plugin calls, incidents and the plugins already
        warned about. The threshold stays."""
        with self._lock:
            stop, self._stop = self._stop, None
            self._loops = weakref.WeakKeyDictionary()
            self._plugins = weakref.WeakKeyDictionary()
            self._incidents.clear()
            self._warned.clear()
        if stop is not None:
            stop.set()

    def _after_fork_in_child(self) -> None:
        # The checking thread is gone and the lock may be held; the child's loops are watched from their first
        # plugin call. Incidents and the plugins already warned about stay: the child continues the parent's log.
        self._lock = threading.Lock()
        self._stop = None
        self._loops = weakref.WeakKeyDictionary()
        self._plugins = weakref.WeakKeyDictionary()

    def _interval(self) -> float:
        return min(0.25, max(self._threshold_s / 4, 0.01))

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self._interval()):
            self._check()

    def _holder(self, loop: asyncio.AbstractEventLoop) -> tuple[str, str | None]:
        # The task the loop is running now, and its plugin. Read from this thread: a plain lookup, only to name it.
        try:
            task = asyncio.current_task(loop)
        except RuntimeError:
            task = None
        if task is None:
            return "code outside any task", None
        with self._lock:
            return task.get_name(), self._plugins.get(task)

    def _check(self) -> None:
        threshold = self._threshold_s
        now = time.monotonic()
        with self._lock:
            watched = list(self._loops.items())
        for loop, state in watched:
            if loop.is_closed() or not loop.is_running():
                continue
            lag = now - state.beat
            if threshold > 0 and lag > threshold and not state.reported:
                state.culprit, state.plugin = self._holder(loop)
                state.reported, state.blocked_since = True, state.beat
                self._record(Incident(state.culprit, lag, ongoing=True, plugin=state.plugin))
            elif state.reported and lag <= self._interval() * 2:
                state.reported = False
                total = state.beat - state.blocked_since
                self._record(Incident(state.culprit, total, ongoing=False, plugin=state.plugin))

    def _record(self, incident: Incident) -> None:
        plugin, first = incident.plugin, False
        with self._lock:
            self._incidents.append(incident)
            if plugin is not None and incident.ongoing and plugin not in self._warned:
                self._warned.add(plugin)
                first = True
        if first:
            log.warning(
                "the %s plugin blocks the rstar-env event loop (%.1f s so far, in its task %r), and every env of "
                "this process waits for it. An async plugin must not block: do blocking or CPU-bound work in a "
                "plain (def) method, which runs in a thread, or with asyncio.to_thread. Said once per plugin; "
                "rstar_env.watchdog.incidents() lists every stall",
                incident.plugin,
                incident.seconds,
                incident.task,
            )
        elif not incident.ongoing:
            log.debug("the rstar-env event loop was blocked for %.1f s by %s", incident.seconds, incident.task)
        elif incident.plugin is None:
            # Not a plugin's doing: nothing a user can change, so not a warning.
            log.debug(
                "the rstar-env event loop has not run for %.1f s (held by %s, not a plugin call: machine load, "
                "garbage collection or the caller's own code)",
                incident.seconds,
                incident.task,
            )
        else:
            log.debug(
                "the %s plugin blocks the rstar-env event loop again (%.1f s so far)", incident.plugin, incident.seconds
            )
