"""A watchdog that names the plugin that blocks an event loop running plugin calls.

All envs of a process share one background event loop (:mod:`rstar_env.aio`), so one plugin that blocks it
(``time.sleep``, or heavy CPU work inside ``async def``) stalls every episode, and no time limit can interrupt it.
Each watched loop runs a cheap heartbeat (a timer callback a few times a second); one daemon thread checks the
heartbeats. A loop that has not run its heartbeat for longer than the threshold is an incident, kept in
:func:`incidents` with the task that held the loop and the seconds.

Only what a user can act on is a warning: when a plugin's call holds the loop (plugin calls run as tasks attributed
to their plugin, e.g. ``tool 'calculator'``), the ``rstar_env.watchdog`` logger warns once per plugin, naming it.
A stall that no plugin call holds (machine load, garbage collection, the caller's own code) is logged at debug
level only, as are later stalls of a plugin already named and the total of each stall once the loop runs again.

The threshold is ``RSTAR_ENV_LOOP_BLOCK_S`` (seconds, default 2; ``0`` turns the watchdog off), or
:func:`configure`. Loops are watched from the first plugin call made on them. The watchdog itself is the process
runtime's (:attr:`rstar_env.runtime.Runtime.watchdog`); these functions are its public face.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rstar_env.runtime import Incident, runtime


def configure(threshold_s: float) -> None:
    """Report a watched loop blocked for more than ``threshold_s`` seconds (``0``: never)."""
    runtime().watchdog.configure(threshold_s)


def incidents() -> list[Incident]:
    """The latest incidents (at most 100), oldest first."""
    return runtime().watchdog.incidents()


def watch(loop: asyncio.AbstractEventLoop | None = None) -> None:
    """Watch ``loop`` (default: the running one). Cheap and idempotent; call it from the loop's thread."""
    runtime().watchdog.watch(loop)


def attribute(task: asyncio.Task[Any], plugin: str) -> None:
    """Record that ``task`` runs a call of ``plugin`` (e.g. ``"tool 'calculator'"``), so that a stall it causes
    is warned about under that name."""
    runtime().watchdog.attribute(task, plugin)


__all__ = ["Incident", "attribute", "configure", "incidents", "watch"]
