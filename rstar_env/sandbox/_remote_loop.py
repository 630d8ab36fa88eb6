"""A private event loop on a daemon thread: the async core shared by the ``e2b`` and ``ray`` backends.

Remote backends hold clients, sockets, semaphores and background tasks that belong to the loop that made them
(the E2B SDK's transports are cached per loop; asyncio primitives bind on first use). Callers, however, may use
one sandbox from any loop, from several loops in turn (every ``asyncio.run``), and from threads. So all of a
backend's own work runs on one loop that it owns, started on first use, and each public coroutine only hands its
work over (``run_coroutine_threadsafe``) and awaits the answer with ``asyncio.wrap_future``, which works on any
loop and forwards a caller's cancellation to the private task.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from . import ExecResult, SandboxError

T = TypeVar("T")

STOP_GRACE_S = 10.0
"""How long ``aclose`` waits for a backend's own shutdown (killing VMs, actors) before abandoning its loop."""


class LoopThread:
    """One event loop running forever on a daemon thread, started lazily and stopped once."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                started = threading.Event()

                def run() -> None:
                    asyncio.set_event_loop(loop)
                    loop.call_soon(started.set)
                    loop.run_forever()
                    # Cancel what is left (background refreshers, fire-and-forget clean-ups), then close.
                    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
                    for task in pending:
                        task.cancel()
                    with contextlib.suppress(Exception):
                        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                    loop.close()

                self._thread = threading.Thread(target=run, name=self.name, daemon=True)
                self._thread.start()
                started.wait()
                self._loop = loop
            return self._loop

    def in_loop(self) -> bool:
        """True when called from the private loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop())

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the private loop and await it from the caller's loop (whichever it is)."""
        if self.in_loop():  # already on the private loop (a backend calling itself): no hop
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self) -> None:
        with self._lock:
            loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(loop.stop)
        if threading.current_thread() is not thread:
            thread.join(timeout=STOP_GRACE_S)


class LoopSandbox(abc.ABC):
    """Base of the remote backends: the :class:`~rstar_env.sandbox.Sandbox` protocol over a private loop.

    Subclasses implement the coroutines ``_start``, ``_execute``, ``_close_session`` and ``_shutdown``; they
    always run on the private loop, so they may use asyncio primitives freely (create them in ``_start``).
    """

    def __init__(self, *, timeout_s: float, max_output_bytes: int) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if max_output_bytes <= 0:
            raise ValueError("max_output_bytes must be positive")
        self.timeout_s = float(timeout_s)
        self.max_output_bytes = int(max_output_bytes)
        self._runner = LoopThread(f"rstar-{type(self).__name__}")
        self._state_lock = threading.Lock()
        self._started: concurrent.futures.Future[None] | None = None
        self._closed = False
        self._owner = os.getpid()

    # ------------------------------------------------------------------------------------------- subclass API

    @abc.abstractmethod
    async def _start(self) -> None:
        """Acquire the backend (runs once, on the private loop)."""

    @abc.abstractmethod
    async def _execute(self, code: str, stdin: str, session: str | None, timeout_s: float) -> ExecResult:
        """One call (on the private loop). Never raises for what the code does."""

    @abc.abstractmethod
    async def _close_session(self, session: str) -> None:
        """Forget ``session`` after its pending calls (on the private loop)."""

    @abc.abstractmethod
    async def _shutdown(self) -> None:
        """Release everything (on the private loop); called once, after the last call was refused."""

    # ------------------------------------------------------------------------------------------- protocol

    async def execute(
        self, code: str, *, stdin: str = "", session: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        """Run ``code`` (see :mod:`rstar_env.sandbox`). Raises :class:`SandboxError` once closed or when the
        backend cannot start; every other failure is an :class:`ExecResult`."""
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        if timeout <= 0:
            raise ValueError("timeout_s must be positive")
        await self._ensure_started()
        work = self._execute(code, stdin, session, timeout)
        try:
            future = self._runner.submit(work)
        except RuntimeError:  # the private loop stopped between the check and the hand-over: closed meanwhile
            work.close()
            raise SandboxError(f"{type(self).__name__} is closed") from None
        try:
            if session is None:
                return await asyncio.wrap_future(future)
            # A session call runs to its end even if its caller gives up (as with the local backend): cutting it
            # midway would leave the session's interpreter in an unknown state for the calls queued behind it.
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if self._closed and (task is None or not task.cancelling()):  # cut by aclose, not by our caller
                return ExecResult("", "", "crash", f"{type(self).__name__} was closed during the call", 0.0)
            raise

    async def close_session(self, session: str) -> None:
        """End ``session`` once the calls made before this one are done; unknown sessions are a no-op."""
        if self._closed or self._started is None or os.getpid() != self._owner:
            return  # in a forked child the session is the parent's: nothing of it is here to end
        await self._runner.run(self._close_session(session))

    async def aclose(self) -> None:
        """End every session, release the backend and stop the private loop. Idempotent."""
        if os.getpid() != self._owner:
            self._closed = True  # a forked copy: the loop, its thread and the backend are the parent's
            return
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if started is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.wrap_future(self._runner.submit(self._shutdown())), STOP_GRACE_S)
        await asyncio.to_thread(self._runner.stop)

    async def __aenter__(self) -> LoopSandbox:
        await self._ensure_started()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"{type(self).__name__} is closed")
        if os.getpid() != self._owner:
            # Its private loop runs on a thread of the parent, which a fork does not copy: a call would wait forever.
            raise SandboxError(
                f"this {type(self).__name__} was created in process {self._owner} and cannot be used in a forked "
                "child: create the sandbox in the child, or start children with the 'spawn' method"
            )

    async def _ensure_started(self) -> None:
        started = self._started
        if started is not None and started.done() and not started.cancelled() and started.exception() is None:
            self._check_open()
            return  # the common case: no hop, so calls keep the order in which they were made
        with self._state_lock:
            self._check_open()
            failed = (
                self._started is not None
                and self._started.done()
                and (self._started.cancelled() or self._started.exception() is not None)
            )
            if self._started is None or failed:
                self._started = self._runner.submit(self._start())  # a failed start is tried again next call
            started = self._started
        # Shielded: a caller that gives up must not cancel a start that other callers share.
        await asyncio.shield(asyncio.wrap_future(started))
