"""Threads that serve clients in turn: a fair replacement for ``ThreadPoolExecutor``'s single first-come queue.

Each call is submitted under a client key (a token, a connection, an episode trainer; ``None`` is the one default
client). Idle threads take the next call as ``fq_codel``'s deficit round robin does with unit costs:

* a client with nothing queued or running (a *new* client) is served before the clients with a backlog
  (``fq_codel``'s new-flows list), so one call of an honest client waits for at most one running call to end,
  however many calls another client has queued;
* clients with a backlog are served one call each, in turn;
* ``max_per_client`` (None: no cap) bounds the calls one client has running at once, so a flood never holds every
  thread; a capped client's calls wait while other clients' calls run.

Within one client, calls start in the order they were submitted.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any


class _Job:
    __slots__ = ("args", "client", "fn", "future")

    def __init__(self, client: Hashable, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self.client, self.fn, self.args = client, fn, args
        self.future: Future[Any] = Future()


class FairExecutor:
    """At most ``max_workers`` calls running at once, taken from the clients in turn (see the module docstring)."""

    def __init__(
        self, max_workers: int, *, max_per_client: int | None = None, thread_name_prefix: str = "rstar-fair"
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be at least 1, got {max_workers}")
        if max_per_client is not None and max_per_client < 1:
            raise ValueError(f"max_per_client must be at least 1 or None (no cap), got {max_per_client}")
        self.max_workers = max_workers
        self.max_per_client = max_per_client
        self._prefix = thread_name_prefix
        self._cv = threading.Condition()
        self._queues: dict[Hashable, deque[_Job]] = {}
        self._new: deque[Hashable] = deque()
        """Clients that had nothing queued when their call came: served first."""
        self._old: deque[Hashable] = deque()
        """Clients with a backlog, in turn."""
        self._running: dict[Hashable, int] = {}
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._woken = 0
        """Idle threads notified for a submitted call that have not woken yet."""
        self._closed = False
        self.started: list[Hashable] = []
        """With ``record_starts``: the client of every call, in the order the calls started (for tests)."""
        self.record_starts = False

    def submit(self, client: Hashable, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Queue ``fn(*args)`` for ``client``; its future settles with the result (or the exception)."""
        job = _Job(client, fn, args)
        with self._cv:
            if self._closed:
                raise RuntimeError("cannot submit a call: this executor is shut down")
            queue = self._queues.get(client)
            if queue is None:
                queue = self._queues[client] = deque()
                # New only with nothing queued *or running*: a flood whose calls are taken as fast as they come
                # must not pass for new at each call.
                (self._old if self._running.get(client) else self._new).append(client)
            queue.append(job)
            if not self._wake_locked() and len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._serve, name=f"{self._prefix}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
        return job.future

    def pending(self, client: Hashable | None = None) -> int:
        """Calls queued and not started (of ``client``, or of every client)."""
        with self._cv:
            if client is not None:
                return len(self._queues.get(client, ()))
            return sum(len(q) for q in self._queues.values())

    def shutdown(self, *, cancel_futures: bool = True) -> None:
        """Stop taking calls; queued ones are cancelled (``cancel_futures``). Running calls finish on their own."""
        with self._cv:
            self._closed = True
            queued = [job for q in self._queues.values() for job in q] if cancel_futures else []
            if cancel_futures:
                self._queues.clear()
                self._new.clear()
                self._old.clear()
            self._cv.notify_all()
        for job in queued:
            job.future.cancel()

    # ------------------------------------------------------------------------------------------- internals

    def _serve(self) -> None:
        while True:
            with self._cv:
                job = self._take_locked()
                while job is None:
                    if self._closed and not self._queues:
                        return
                    self._idle += 1
                    self._cv.wait()
                    self._idle -= 1
                    self._woken = max(0, self._woken - 1)
                    job = self._take_locked()
            try:
                result = job.fn(*job.args)
            except BaseException as exc:  # the caller's future carries it
                job.future.set_exception(exc)
            else:
                job.future.set_result(result)
            finally:
                with self._cv:
                    self._release_locked(job.client)
                    if self.max_per_client is not None and job.client in self._queues:
                        self._wake_locked()  # its next call may start now (else this thread takes it)

    def _wake_locked(self) -> bool:
        """Wake an idle thread for a call; False if none is left. A woken thread counts as taken at once, not when
        it runs: two calls submitted before it wakes must not both count on it (the second would wait for the
        first to end while a thread could have been started for it)."""
        if self._idle <= self._woken:
            return False
        self._woken += 1
        self._cv.notify()
        return True

    def _take_locked(self) -> _Job | None:
        """The next call to start: new clients first, then the backlogged ones in turn; None if none may start."""
        while True:
            job = self._take_from_locked(self._new) or self._take_from_locked(self._old)
            if job is None:
                return None
            if job.future.set_running_or_notify_cancel():
                if self.record_starts:
                    self.started.append(job.client)
                return job
            self._release_locked(job.client)  # cancelled while queued: nothing to run

    def _take_from_locked(self, ring: deque[Hashable]) -> _Job | None:
        cap = self.max_per_client
        for index, client in enumerate(ring):
            if cap is not None and self._running.get(client, 0) >= cap:
                continue
            del ring[index]
            queue = self._queues[client]
            job = queue.popleft()
            if queue:
                self._old.append(client)  # served once: its next call waits for the others' turn
            else:
                del self._queues[client]
            self._running[client] = self._running.get(client, 0) + 1
            return job
        return None

    def _release_locked(self, client: Hashable) -> None:
        left = self._running[client] - 1
        if left:
            self._running[client] = left
        else:
            del self._running[client]


__all__ = ["FairExecutor"]
