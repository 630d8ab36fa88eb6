"""A private event loop on a daemon thread: the async core shared by the ``e2b`` and ``ray`` backends.

Remote backends hold clients, sockets, semaphores and background tasks that belong to the loop that made them
(the E2B SDK's transports are cached per loop; asyncio primitives bind on first use). Callers, however, may use
one sandbox from any loop, from several loops in turn (every ``asyncio.run``), and from threads. So all of a
backend's own work runs on one loop that it owns, started on first use, and each public coroutine only hands its
work over (``run_coroutine_threadsafe``) and awaits the answer with ``asyncio.wrap_future``, which works on any
loop and forwards a caller's cancellation to the private task.

Why a loop of its own and not the runtime's background loop (:mod:`rstar_env.aio`), which is also one loop on a
daemon thread: plugin calls run on that loop, and an ``async`` plugin that blocks it would freeze what a remote
backend must keep doing on time (E2B's keep-alive refreshes before VMs expire, ray's batch window and call
deadlines), so one bad plugin would turn into lost VMs and timed-out calls in every env. And the private loop's
lifetime is the sandbox's: ``aclose`` stops it, which cancels every task the backend left behind, a clean-up a loop
shared with envs could not do. The loop thread comes from the runtime
(:meth:`~rstar_env.runtime.Runtime.private_loop`, the same :class:`~rstar_env.runtime.LoopThread` as the
background loop), which marks it as the parent's in a forked child, so a stray use there fails instead of hanging.
"""

from __future__ import annotations

import abc
import asyncio
import concurrent.futures
import contextlib
import os
import threading

from ..runtime import runtime
from . import ExecResult, SandboxError

STOP_GRACE_S = 10.0
"""How long ``aclose`` waits for a backend's own shutdown (killing VMs, actors) before abandoning its loop."""


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
        self._runner = runtime().private_loop(f"rstar-{type(self).__name__}")
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
        await asyncio.to_thread(self._runner.stop, STOP_GRACE_S)

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
