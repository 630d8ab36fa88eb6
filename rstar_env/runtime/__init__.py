"""The process-wide runtime: one owner for everything the envs of a process share (``rstar_env.runtime``).

:func:`runtime` returns the process's one :class:`Runtime`. It holds, each started on first use:

* the **background event loop**, on a daemon thread, where synchronous callers run coroutines
  (:mod:`rstar_env.aio`, with ``run_sync`` and friends, is its public face);
* the **plugin threads**, where plain (``def``) plugin methods run (:func:`rstar_env.invoke.invoke`);
* the **loop watchdog** (:mod:`rstar_env.watchdog` is its public face);
* the **shared sandboxes**: sandboxes counted by reference under their settings, so the tools of every env share
  one warm pool per settings (the ``python`` tool's);
* the **private loops** of the remote sandbox backends (:meth:`Runtime.private_loop`);
* the **components** the layers above register with it, each built on first use (:meth:`Runtime.component`): the
  plugin registry (:func:`rstar_env.plugins.get_registry`) is one.

**Fork.** A forked child (a ``multiprocessing`` worker, gymnasium's ``AsyncVectorEnv`` with ``fork``) inherits all
of this but none of the threads behind it: waiting on the copied loop would hang forever, a copied lock may be held
by a thread that does not exist in the child, and the shared sandboxes' processes are the parent's. This package
registers rstar-env's one ``os.register_at_fork`` hook. In the child it gives the runtime fresh state (started
again on first use), marks the private loops as the parent's, then calls what components registered with
:meth:`Runtime.on_fork` (a sandbox drops its parent's threads and workers).

:meth:`Runtime.reset` closes and forgets the runtime's resources in a running process: for tests, and for a
program that must release them between phases.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from .loop_thread import LoopThread
from .loop_watchdog import Incident, Watchdog
from .shared_sandboxes import SharedSandboxes

log = logging.getLogger("rstar_env.runtime")

T = TypeVar("T")

PLUGIN_THREADS = 64
"""Threads for plain (non-async) plugin methods. A call past its time limit keeps its thread until it returns (a
thread cannot be stopped), so there are more than a process runs calls at once."""


class Runtime:
    """What every env of a process shares, started on first use (see :mod:`rstar_env.runtime`).

    Attributes:
        watchdog: the :class:`Watchdog` of the loops plugin calls run on.
        sandboxes: the :class:`SharedSandboxes` registry.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._loop: LoopThread | None = None
        self._threads: ThreadPoolExecutor | None = None
        self._private: weakref.WeakSet[LoopThread] = weakref.WeakSet()
        self._fork_callbacks: list[weakref.ref[Callable[[], None]]] = []
        self._prune_at = 64
        # Components of the layers above (the plugin registry), by key. Their own lock, re-entrant: building one
        # imports plugin modules, which may ask the runtime for its loop or another component.
        self._components: dict[str, Any] = {}
        self._components_lock = threading.RLock()
        self._building: set[str] = set()
        self.watchdog = Watchdog()
        self.sandboxes = SharedSandboxes()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The background event loop (started on first use)."""
        with self._lock:
            if self._loop is None:
                self._loop = LoopThread("rstar-env-loop")
            runner = self._loop
        return runner.loop()

    def on_loop(self) -> bool:
        """Whether the caller runs on the background loop's thread (never starts the loop)."""
        runner = self._loop
        return runner is not None and runner.in_loop()

    def plugin_threads(self) -> ThreadPoolExecutor:
        """The pool that runs plain (``def``) plugin methods (:data:`PLUGIN_THREADS` threads)."""
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=PLUGIN_THREADS, thread_name_prefix="rstar-env-plugin")
            return self._threads

    def private_loop(self, name: str) -> LoopThread:
        """A new :class:`LoopThread` for one owner (a remote sandbox), which stops it when it closes. In a forked
        child the runtime marks it as the parent's: using it there raises RuntimeError instead of hanging."""
        runner = LoopThread(name)
        with self._lock:
            self._private.add(runner)
        return runner

    def component(self, key: str, build: Callable[[], T]) -> T:
        """The process's one ``key`` component, built by ``build()`` on first use and kept for the life of the
        process (forked children included; :meth:`reset` keeps it, as it holds no resource to close).

        How a layer above the runtime (which imports nothing of rstar_env) puts its process state under the one
        owner: ``rstar_env.plugins`` keeps its registry as ``component("plugins", PluginRegistry)``. A component
        that holds a lock registers a fork callback (:meth:`on_fork`) that replaces it."""
        with self._components_lock:
            if key in self._components:
                return self._components[key]
            if key in self._building:
                raise RuntimeError(f"the runtime component {key!r} was asked for while it is being built")
            self._building.add(key)
            try:
                value = self._components[key] = build()
            finally:
                self._building.discard(key)
            return value

    def replace_component(self, key: str, value: Any) -> Any:
        """Put ``value`` in place of the ``key`` component (``None`` forgets it: the next use builds one anew) and
        return the one it replaces (``None`` if there was none). For tests and for a program that swaps one."""
        with self._components_lock:
            previous = self._components.pop(key, None)
            if value is not None:
                self._components[key] = value
            return previous

    def on_fork(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` in every forked child, right after the fork and the runtime's own fresh start.

        Held weakly: a bound method (``obj.method``, the usual case) is called while ``obj`` lives, a function
        while something else refers to it (a module-level function always). The callback runs before anything
        else of the child, with the parent's other threads gone: it must not wait on a lock or a thread, only
        drop or replace what belongs to the parent. An exception it raises is logged and the others still run.
        """
        ref = weakref.WeakMethod(callback) if inspect.ismethod(callback) else weakref.ref(callback)
        with self._lock:
            self._fork_callbacks.append(ref)
            if len(self._fork_callbacks) >= self._prune_at:  # drop the dead now and then, not on every call
                self._fork_callbacks = [r for r in self._fork_callbacks if r() is not None]
                self._prune_at = max(64, 2 * len(self._fork_callbacks))

    def reset(self) -> None:
        """Close and forget what this runtime holds, so that the next use starts from nothing, as in a new process.

        Closes every shared sandbox (whoever holds it: see :meth:`SharedSandboxes.close_all`), stops the background
        loop (its pending tasks are cancelled; the next ``run_sync`` starts a new one), lets the plugin threads
        finish their calls and end, and clears the watchdog's state (its threshold stays). Fork callbacks stay
        registered, and private loops stay with the sandboxes that own them. For tests, and for a program that must
        release all of it between phases. Blocking: call it from plain code, not from the background loop.
        """
        if self.on_loop():
            raise RuntimeError(
                "Runtime.reset() stops the background loop, so it cannot run on it: call it from "
                "synchronous code (or with asyncio.to_thread)"
            )
        self.sandboxes.close_all()
        with self._lock:
            runner, self._loop = self._loop, None
            threads, self._threads = self._threads, None
        if runner is not None:
            runner.stop()
        if threads is not None:
            threads.shutdown(wait=False)
        self.watchdog.reset()

    def _after_fork_in_child(self) -> None:
        # Runs in the child right after fork. Nothing here may wait: the parent's threads are gone, and a lock one
        # of them held stays held, so every lock is replaced, never taken.
        parent, self._pid = self._pid, os.getpid()
        self._lock = threading.Lock()
        self._components_lock = threading.RLock()
        self._building = set()
        self._loop, self._threads = None, None
        for runner in list(self._private):
            runner._disown(parent)
        self._private = weakref.WeakSet()
        self.watchdog._after_fork_in_child()
        self.sandboxes._after_fork_in_child()
        for ref in list(self._fork_callbacks):
            callback = ref()
            if callback is None:
                continue
            try:
                callback()
            except Exception:
                log.exception("a fork callback (%r) failed in the forked child %d", callback, self._pid)


_RUNTIME = Runtime()
os.register_at_fork(after_in_child=_RUNTIME._after_fork_in_child)


def runtime() -> Runtime:
    """The process's :class:`Runtime` (the same object for the life of the process, forked children included)."""
    return _RUNTIME


__all__ = [
    "PLUGIN_THREADS",
    "Incident",
    "LoopThread",
    "Runtime",
    "SharedSandboxes",
    "Watchdog",
    "runtime",
]
