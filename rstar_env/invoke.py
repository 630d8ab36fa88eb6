"""Calling a plugin's method without holding the shared event loop.

All envs of a process share one background event loop (:mod:`rstar_env.aio`). A plugin method written as ``async
def`` runs on it and must not block; a plain ``def`` method runs in a thread of the runtime's plugin pool
(:meth:`rstar_env.runtime.Runtime.plugin_threads`), so blocking or CPU-bound plugin code cannot stall other
episodes and the caller's time limit (``asyncio.wait_for``) holds.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from rstar_env.runtime import PLUGIN_THREADS, runtime


async def invoke(method: Callable[..., Any], *args: Any) -> Any:
    """Call a plugin method and return its result: a coroutine function is awaited on the running loop; a plain
    function runs in a thread (and an awaitable it returns is then awaited), so blocking or CPU-bound plugin code
    never holds the event loop that every env of the process shares."""
    if inspect.iscoroutinefunction(method):
        return await method(*args)
    result = await asyncio.get_running_loop().run_in_executor(runtime().plugin_threads(), lambda: method(*args))
    if inspect.isawaitable(result):
        result = await result
    return result


__all__ = ["PLUGIN_THREADS", "invoke"]
