"""Calling a plugin's method without holding the shared event loop.

All envs of a process share one background event loop (:mod:`rstar_env.aio`). A plugin method written as ``async
def`` runs on it and must not block; a plain ``def`` method runs in a thread of this module's pool, so blocking or
CPU-bound plugin code cannot stall other episodes and the caller's time limit (``asyncio.wait_for``) holds.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_threads: ThreadPoolExecutor | None = None
_threads_lock = threading.Lock()
PLUGIN_THREADS = 64
"""Threads for plain (non-async) plugin methods. A call past its time limit keeps its thread until it returns (a
thread cannot be stopped), so there are more than a process runs calls at once."""


def _plugin_threads() -> ThreadPoolExecutor:
    global _threads
    with _threads_lock:
        if _threads is None:
            _threads = ThreadPoolExecutor(max_workers=PLUGIN_THREADS, thread_name_prefix="rstar-env-plugin")
        return _threads


def _forget_threads_after_fork() -> None:
    global _threads, _threads_lock
    _threads, _threads_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_threads_after_fork)


async def invoke(method: Callable[..., Any], *args: Any) -> Any:
    """Call a plugin method and return its result: a coroutine function is awaited on the running loop; a plain
    function runs in a thread (and an awaitable it returns is then awaited), so blocking or CPU-bound plugin code
    never holds the event loop that every env of the process shares."""
    if inspect.iscoroutinefunction(method):
        return await method(*args)
    result = await asyncio.get_running_loop().run_in_executor(_plugin_threads(), lambda: method(*args))
    if inspect.isawaitable(result):
        result = await result
    return result


__all__ = ["PLUGIN_THREADS", "invoke"]
