"""The async face of the process backends: a private thread pool, sessions, and the per-call flow.

Every backend method that blocks runs on the sandbox's own :class:`~._fair.FairExecutor` (``max_concurrency``
threads, clients served in turn) and is awaited with ``asyncio.wrap_future``. Nothing is bound to an event loop, so
one sandbox serves any loop, several loops in turn, and plain threads. The executor is also the back-pressure:
thousands of concurrent ``execute`` calls wait in its queues while at most ``max_concurrency`` workers run, and one
client's backlog delays another client's next call by at most one running call.

Before a call runs it is admitted by the backend's memory gate (:mod:`._admission`; the ``local`` backend's): a call
that does not fit waits, and past ``queue_timeout_s`` it is turned away as a failure of the system
(``ExecResult.system_failure``), never run.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from ..runtime import runtime
from . import ExecResult, SandboxError, _admission, _client, _fair

DEFAULT_QUEUE_TIMEOUT_S = 30.0
"""How long a call may wait for room in the pool before it is turned away (below the env's ``tool_timeout_s``,
60 s by default, so that the episode learns it was the system's failure, not a tool timeout)."""


class SessionRefused(SandboxError):
    """Raised by a backend's ``_spawn(session=True)`` when it has no room for another session; the message says
    why. The session's call then returns a system failure (``ExecResult.system_failure``), having run nothing, and
    the session's next call asks again. (The ``local`` backend waits for room instead: :mod:`._admission`.)"""


@dataclass(eq=False)  # hashed by identity: the memory gate keys its ledger by session
class _Session:
    """A named session: its worker, and a ticket queue that runs its calls one at a time in submission order
    (a plain lock would not: threads acquire it in no particular order)."""

    turn: threading.Condition = field(default_factory=threading.Condition)
    next_ticket: int = 0
    serving: int = 0
    worker: _client.Worker | None = None

    def take_ticket(self) -> int:
        ticket, self.next_ticket = self.next_ticket, self.next_ticket + 1
        return ticket

    def wait_turn(self, ticket: int) -> None:
        with self.turn:
            self.turn.wait_for(lambda: self.serving == ticket)

    def end_turn(self) -> None:
        with self.turn:
            self.serving += 1
            self.turn.notify_all()


class ThreadedSandbox(abc.ABC):
    """Base of the ``local`` and ``subprocess`` backends (see :mod:`rstar_env.sandbox` for the contract).

    Subclasses start workers (:meth:`_spawn`) and own the resources behind them (:meth:`_start`,
    :meth:`_shutdown`).

    Stateful sessions: calls with the same ``session`` run in one worker, one at a time, in the order they were
    made (a session call runs even if its caller is cancelled, to keep that order). A call that ends its worker
    (a timeout, the output limit, a crash) ends the session's state: the next call starts a fresh interpreter. If
    the worker died *between* calls, the next call returns ``crash`` ("its state is lost") without running, and
    the call after it starts a fresh interpreter (the loss is a failure of the system: ``system_failure``).

    Clients: ``execute(..., client=key)`` queues the call under ``key``; clients are served in turn
    (:class:`~._fair.FairExecutor`), at most ``max_per_client`` calls of one client running at once (None: no cap).
    Admission: a call waits for room in the backend's memory gate (:attr:`_gate`) for up to ``queue_timeout_s``.
    """

    def __init__(
        self,
        *,
        max_concurrency: int | None = None,
        timeout_s: float = 4.0,
        max_output_bytes: int = 1 << 20,
        cpu_s: float | None = None,
        queue_timeout_s: float = DEFAULT_QUEUE_TIMEOUT_S,
        max_per_client: int | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if not queue_timeout_s > 0:  # NaN fails this too
            raise ValueError(f"queue_timeout_s must be a positive number of seconds, got {queue_timeout_s!r}")
        if max_per_client is not None and max_per_client < 1:
            raise ValueError(f"max_per_client must be at least 1, or None for no cap; got {max_per_client!r}")
        self.max_concurrency = max(1, max_concurrency or os.cpu_count() or 1)
        self.timeout_s = float(timeout_s)
        self.max_output_bytes = int(max_output_bytes)
        self.cpu_s = cpu_s
        self.queue_timeout_s = float(queue_timeout_s)
        self.max_per_client = max_per_client
        self._gate = _admission.MemoryGate(None, None)
        """What a call must fit in before it runs; this base admits everything (``local`` sets a real one)."""
        self._executor: _fair.FairExecutor | None = None
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()
        self._closed = False
        # A fork (multiprocessing, AsyncVectorEnv) copies the sandbox into the child without its threads: the
        # runtime's one fork hook calls this copy's _after_fork_in_child there (held weakly, so no leak).
        runtime().on_fork(self._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        """In a forked child: start from no threads and no sessions, so that the copy works there on its own.

        The copied executor has no threads in the child (a call queued on it would never run), the copied lock may
        be held by a parent's thread, and the sessions' workers are the parent's. Subclasses drop what else of
        theirs belongs to the parent, then call this.
        """
        self._lock = threading.Lock()
        self._executor = None
        self._sessions = {}
        gate = getattr(self, "_gate", None)  # None if the fork came in the middle of __init__
        if gate is not None:  # the sessions it counts are the parent's
            self._gate = _admission.MemoryGate(gate.pool_mb, gate.memory_mb)

    # ------------------------------------------------------------------------------------------- subclass API

    @abc.abstractmethod
    def _start(self) -> None:
        """Acquire backend resources (idempotent; also called lazily by the first call)."""

    @abc.abstractmethod
    def _spawn(self, *, session: bool) -> _client.Worker:
        """Start a worker for one call (``session=False``) or for a session. Raises SandboxError if it cannot."""

    @abc.abstractmethod
    def _shutdown(self) -> None:
        """Release backend resources; every worker must be dead afterwards."""

    def _held_mb(self, worker: _client.Worker) -> int | None:
        """MiB ``worker`` (a session's, between calls) holds; None where it cannot be read."""
        return None

    def _end_worker(self, worker: _client.Worker) -> None:
        """Kill a session's worker and wait (briefly) until it is gone."""
        worker.kill()
        _client.await_death(worker, time.monotonic() + _client.DEATH_GRACE_S)
        worker.close()

    # ------------------------------------------------------------------------------------------- async API

    async def execute(
        self,
        code: str,
        *,
        stdin: str = "",
        session: str | None = None,
        timeout_s: float | None = None,
        client: str | None = None,
    ) -> ExecResult:
        """Run ``code`` with ``stdin`` and return its result; never raises for anything the code does.

        ``client``: whose call it is (a token, a connection); clients' calls are served in turn. None: the one
        default client. Raises :class:`SandboxError` if the sandbox is closed or its backend cannot start.
        """
        submitted = time.monotonic()
        if session is None:
            future = self._pool().submit(client, self._execute, code, stdin, None, timeout_s, submitted)
            return await asyncio.wrap_future(future)
        with self._lock:  # a session's tickets must be handed out in the order the calls are queued
            executor = self._pool_locked()
            ticket = self._ticket(session)
            future = executor.submit(client, self._execute, code, stdin, ticket, timeout_s, submitted)
        # Shielded: a queued session call must run (or fail) to pass the turn on, even if its caller gives up.
        return await asyncio.shield(asyncio.wrap_future(future))

    async def close_session(self, session: str) -> None:
        """End ``session``'s interpreter (and everything it started) once the calls made before this one are done.

        Calls made after it start a new session of the same name. Unknown sessions are a no-op.
        """
        with self._lock:
            state, ticket = self._pop_session(session)
        if state is not None:
            await asyncio.shield(asyncio.to_thread(self._close_turn, state, ticket))

    async def aclose(self) -> None:
        """End every session and worker and release the backend. Idempotent."""
        await asyncio.to_thread(self.close)

    async def __aenter__(self) -> ThreadedSandbox:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ------------------------------------------------------------------------------------------- blocking API

    def start(self) -> None:
        """Start the backend now rather than on the first call."""
        self._check_open()
        self._start()

    def execute_sync(
        self,
        code: str,
        stdin: str = "",
        session: str | None = None,
        timeout_s: float | None = None,
        client: str | None = None,
    ) -> ExecResult:
        """Blocking :meth:`execute` (for threads; do not call it on an event loop). It runs on the calling thread,
        so ``client`` takes no turn in the queue (it is accepted for a uniform signature)."""
        submitted = time.monotonic()
        with self._lock:
            ticket = self._ticket(session) if session is not None else None
        return self._execute(code, stdin, ticket, timeout_s, submitted)

    def _execute(
        self,
        code: str,
        stdin: str,
        ticket: tuple[_Session, int] | None,
        timeout_s: float | None,
        submitted: float,
    ) -> ExecResult:
        timeout = self.timeout_s if timeout_s is None else float(timeout_s)
        limits: dict[str, Any] = {
            "timeout_s": timeout,
            "cpu_s": self.cpu_s if self.cpu_s is not None else timeout + 1.0,
            "max_output_bytes": self.max_output_bytes,
        }
        if ticket is None:
            self._check_open()
            if timeout <= 0:
                raise ValueError("timeout_s must be positive")
            return self._run_once(code, stdin, limits, submitted)
        state, number = ticket
        state.wait_turn(number)
        try:
            self._check_open()
            if timeout <= 0:
                raise ValueError("timeout_s must be positive")
            return self._run_in_session(state, code, stdin, limits, submitted)
        finally:
            if self._closed and state.worker is not None:  # close() left this worker to its current user
                worker, state.worker = state.worker, None
                worker.close()
            state.end_turn()

    def close_session_sync(self, session: str) -> None:
        """Blocking :meth:`close_session`."""
        with self._lock:
            state, ticket = self._pop_session(session)
        if state is not None:
            self._close_turn(state, ticket)

    def _pop_session(self, name: str) -> tuple[_Session | None, int]:
        """Called with ``self._lock`` held: forget ``name`` and queue its closing after its pending calls."""
        state = self._sessions.pop(name, None)
        return (state, state.take_ticket()) if state is not None else (None, 0)

    def _close_turn(self, state: _Session, ticket: int) -> None:
        state.wait_turn(ticket)
        try:
            worker, state.worker = state.worker, None
            if worker is not None:
                self._end_worker(worker)
        finally:
            self._gate.forget(state)
            state.end_turn()

    def close(self) -> None:
        """Blocking :meth:`aclose`."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions, self._sessions = list(self._sessions.values()), {}
            executor, self._executor = self._executor, None
        for state in sessions:
            worker = state.worker
            if worker is None:
                continue
            worker.kill()  # a call running on it ends now, as crashed
            with state.turn:
                idle = state.serving == state.next_ticket
            # Close its channel only if no call is using it (closing a polled descriptor is a race); otherwise
            # the call closes it when its turn ends.
            if idle:
                state.worker = None
                worker.close()
        self._shutdown()
        if executor is not None:
            executor.shutdown(cancel_futures=True)

    # ------------------------------------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"{type(self).__name__} is closed")

    def _pool(self) -> _fair.FairExecutor:
        with self._lock:
            return self._pool_locked()

    def _pool_locked(self) -> _fair.FairExecutor:
        self._check_open()
        if self._executor is None:
            self._executor = _fair.FairExecutor(
                self.max_concurrency, max_per_client=self.max_per_client, thread_name_prefix="rstar-sandbox"
            )
        return self._executor

    def _ticket(self, name: str) -> tuple[_Session, int]:
        """Called with ``self._lock`` held: the session's next place in line."""
        self._check_open()
        state = self._sessions.setdefault(name, _Session())
        return state, state.take_ticket()

    def _admit(self, session: Hashable | None, submitted: float) -> ExecResult | None:
        """Wait for room in the memory gate; None once admitted, else the system failure to return."""
        if self._gate.admit(session, submitted + self.queue_timeout_s):
            return None
        gate = self._gate
        return system_failure(
            f"the sandbox had no room for this call within queue_timeout_s={self.queue_timeout_s:g} s (nothing "
            f"ran): open sessions reserve {gate.reserved_mb(session)} MiB of pool_memory_mb={gate.pool_mb} MiB and a "
            f"call needs memory_mb={gate.memory_mb} MiB free; raise pool_memory_mb, lower memory_mb, or run fewer "
            "stateful episodes at once",
            submitted,
        )

    def _run_once(self, code: str, stdin: str, limits: dict[str, Any], submitted: float) -> ExecResult:
        refused = self._admit(None, submitted)
        if refused is not None:
            return refused
        for attempt in range(2):
            worker = self._spawn(session=False)
            try:
                outcome = _client.run_call(worker, code=code, stdin=stdin, **limits)
            finally:
                worker.close()
            # A worker that never started (its pool died under the request) ran nothing: retry once.
            if outcome.result.status == "crash" and not worker.started and attempt == 0:
                continue
            return _queued(outcome, submitted)
        raise AssertionError("unreachable")

    def _run_in_session(
        self, state: _Session, code: str, stdin: str, limits: dict[str, Any], submitted: float
    ) -> ExecResult:
        if state.worker is not None and state.worker.is_dead():
            lost = state.worker.death_note()
            state.worker.close()
            state.worker = None
            self._gate.forget(state)
            # Frozen between calls, a session dies only of the system (its pool died or was killed), or of a timer
            # its own code set where this machine cannot freeze it (CONTINUED: the code's doing).
            result = ExecResult("", "", "crash", lost, queue_s=time.monotonic() - submitted)
            return result if lost == _client.CONTINUED else dataclasses.replace(result, system_failure=True)
        refused = self._admit(state, submitted)
        if refused is not None:
            return refused
        try:
            for attempt in range(2):
                if state.worker is None:
                    try:
                        state.worker = self._spawn(session=True)
                    except SessionRefused as no_room:
                        return system_failure(str(no_room), submitted)
                worker = state.worker
                outcome = _client.run_call(worker, code=code, stdin=stdin, **limits)
                if not outcome.worker_alive:
                    worker.close()
                    state.worker = None
                    if outcome.result.status == "crash" and not worker.started and attempt == 0:
                        continue  # the pool died before the worker existed: nothing ran, so run it again
                return _queued(outcome, submitted)
            raise AssertionError("unreachable")
        finally:
            # What the session holds now, frozen until its next call, is what it reserves; a gone worker, nothing.
            if state.worker is not None:
                self._gate.settle(state, self._held_mb(state.worker))
            else:
                self._gate.forget(state)


def system_failure(message: str, submitted: float) -> ExecResult:
    """A call the sandbox failed before any of its code ran (see ``ExecResult.system_failure``)."""
    return ExecResult("", "", "crash", message, queue_s=time.monotonic() - submitted, system_failure=True)


def _queued(outcome: _client.CallOutcome, submitted: float) -> ExecResult:
    return dataclasses.replace(outcome.result, queue_s=max(0.0, outcome.started_at - submitted))
