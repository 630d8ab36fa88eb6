"""Run coroutines from synchronous code, whatever the caller's thread or event loop (``rstar_env.aio``).

Public for trainers, tools and scripts that drive envs from synchronous code: :func:`run_sync` runs a coroutine on
the shared background loop and returns its result; :func:`on_background_loop` says whether the caller is on it;
:func:`spawn_on_background` starts a task there without waiting.

``MathToolEnv.step`` is a thin wrapper over ``astep``. ``asyncio.run`` would fail inside a running loop (Jupyter,
an async trainer) and would build a new loop per step, so synchronous calls go to one long-lived loop on a daemon
thread. Sandboxes and reward plugins never bind to a loop, so they work from this loop and the caller's alike.

The loop is the process runtime's (:meth:`rstar_env.runtime.Runtime.loop`); these functions are its public face.
It survives ``fork``: a forked child (a ``multiprocessing`` worker, gymnasium's ``AsyncVectorEnv`` with the
``fork`` context) inherits the parent's loop object but not its thread, so waiting on it would hang forever. The
runtime forgets it at fork time and the child starts its own on first use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from rstar_env.runtime import runtime

T = TypeVar("T")


def on_background_loop() -> bool:
    """Whether the caller runs on the background loop's thread (where ``run_sync`` must not be called)."""
    return runtime().on_loop()


async def run_on_background(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` run on the background loop: the caller's loop (vLLM's, say) only waits on a future, so work
    that blocks inside ``coro`` never stalls it."""
    loop = runtime().loop()
    if asyncio.get_running_loop() is loop:
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion and return its result (exceptions propagate)."""
    loop = runtime().loop()
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        coro.close()
        raise RuntimeError("run_sync() was called from inside the rstar-env loop; await the coroutine instead")
    return asyncio.run_coroutine_threadsafe(coro, loop).result()


def spawn_on_background(coro: Coroutine[Any, Any, Any]) -> None:
    """Start ``coro`` on the background loop without waiting for it (for cleanup from a finalizer)."""
    loop = runtime().loop()
    if on_background_loop():
        loop.create_task(coro)
    else:
        asyncio.run_coroutine_threadsafe(coro, loop)
