"""A pool of math-verify worker processes: a hard wall-clock limit per comparison, and a queue that is fair to
ordinary answers when pathological ones arrive in bulk.

:meth:`VerifierPool.submit` queues comparisons and returns one :class:`~concurrent.futures.Future` each;
:meth:`VerifierPool.run_many` is its blocking form. Both are thread-safe and create no asyncio object, so the
reward plugin awaits the futures from whichever event loop it runs on. Each worker process has one dispatcher
thread that feeds it, a batch of comparisons per message, and waits for each verdict under its own deadline. A
worker that has not answered by then is killed (``SIGKILL``) and replaced at once. Workers are forked from one
warm template process per pool, a plain ``subprocess`` child running :mod:`._worker` that imported math-verify
and warmed its parsers once: a worker starts or replaces a killed one in milliseconds, not the two CPU-seconds of
a fresh interpreter's imports and warm-up. So the pool works the same under any ``multiprocessing`` start
method, from any thread, and never re-imports the caller's ``__main__``.

**Scheduling.** The pool is shared by every episode of a process and has few workers (one per CPU). With a
first-come queue, a burst of pathological answers that each run to the timeout holds every worker for
``answers x timeout_s / workers`` seconds, and an ordinary answer behind them waits as long: past the env's
``reward_timeout_s``, its episode ended unscored (``env_error``), and so did the last slow answers. Here:

* **Fair between clients.** Each :meth:`~VerifierPool.submit` names its client (``client=``: a token, a
  connection; ``None`` is the one default client). Untried comparisons are taken from the clients in turn, one
  each (round robin): however many comparisons one client has queued (120 slow ``/verify`` requests), another
  client's next one is taken as soon as a worker asks for work, behind at most one of them.
* **Fair between requests.** Each :meth:`~VerifierPool.submit` is a request (one episode's answer, or one
  trainer's batch). A first attempt may run the full ``timeout_s``, but once it has run ``probe_s`` (half a second
  at the default ``timeout_s`` of 3 s; nearly every comparison takes milliseconds) while comparisons of another
  request wait, the worker stops it (``SIGUSR1``) and it joins a second queue. So an ordinary answer waits behind
  at most ``probe_s`` of each answer ahead of it, never a whole timeout. Within one request nothing is preempted
  (its caller waits for all of it anyway), and on an idle pool a slow comparison runs to its timeout, as alone.
* **Untried comparisons first, then one full attempt.** A preempted comparison gets one attempt of the full
  ``timeout_s`` when a worker has no untried comparison to run, or before them once its deadline nears (it is
  due ``latency_s - 2 x timeout_s`` after its request). Its own work is at most ``probe_s + timeout_s``; waiting
  in either queue is not work and is not held against it.
* **Bounded latency for slow answers.** A preempted comparison that cannot start its full attempt in time to
  finish within ``latency_s`` of its request (more of them due at once than there are workers) is a ``timeout``
  at once: it has shown it is slow, and its caller must not wait on it without end. So a burst of pathological
  answers scores ``timeout`` (reward 0) within ``latency_s`` each, rather than ending unscored when the caller's
  own limit (the env's ``reward_timeout_s``) runs out, and the ordinary answers among them are judged as they
  would be alone.

A comparison that ignores its worker's timer and the preemption signal (stuck in C code, where no signal handler
runs) is killed at its hard limit, ``timeout_s``, as it would be alone; its verdict is ``timeout``. A worker that
starts (or restarts after a kill) takes no comparison until it is ready, so the others run them meanwhile.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO

Verdict = tuple[str, str]
"""``(code, detail)``: code is ``verified``, ``mismatch``, ``bad_gold``, ``timeout`` or ``error``."""

_WORKER_MODULE = "rstar_plugins.rewards._worker"
_MAX_BATCH = 8
"""Untried comparisons sent to a worker in one message: fewer messages, and little waiting behind a slow one."""


class _Template:
    """The pool's warm template process (:mod:`._worker`): math-verify imported and its parsers warmed once; each
    worker is forked from it. Its standard input is one end of a Unix socket, on which the pool sends each new
    worker's pipe ends."""

    def __init__(self, memory_mb: int, warm_up: bool) -> None:
        # stderr goes to an anonymous file rather than a pipe: a chatty worker can never block on a full pipe,
        # and a template that dies at start-up leaves its traceback for the error message.
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close())
        self.sock, theirs = socket.socketpair()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", _WORKER_MODULE, str(memory_mb), "warm" if warm_up else "cold"],
                stdin=theirs.fileno(),
                stdout=subprocess.DEVNULL,
                stderr=self.stderr,
                close_fds=True,
            )
        finally:
            theirs.close()
        self.lock = threading.Lock()

    def fork(self) -> _Worker:
        """Ask for a worker; it says it is ready on its own pipe (the template may still be warming)."""
        to_worker, worker_reads = os.pipe()[::-1]
        worker_writes, from_worker = os.pipe()[::-1]
        try:
            with self.lock:
                socket.send_fds(self.sock, [b"f"], [worker_reads, worker_writes])
        except OSError:
            os.close(to_worker)
            os.close(from_worker)
            raise
        finally:
            os.close(worker_reads)
            os.close(worker_writes)
        reader = Connection(from_worker, readable=True, writable=False)
        writer = Connection(to_worker, readable=False, writable=True)
        return _Worker(self, reader, writer)

    def failure(self, timeout_s: float) -> str:
        code = self.proc.poll()
        try:
            self.stderr.seek(0)
            tail = self.stderr.read()[-2000:].decode(errors="replace").strip()
        except ValueError:  # closed with the pool meanwhile
            tail = ""
        state = f"exited with status {code}" if code is not None else f"was not ready after {timeout_s:.0f}s"
        return (
            f"math-verify worker ({sys.executable} -m {_WORKER_MODULE}) {state}. Check that math-verify is "
            f"installed for this interpreter (pip install 'math-verify>=0.7') and that rstar_plugins is "
            f"importable. Worker stderr:\n{tail or '(empty)'}"
        )

    def close(self) -> None:
        """Kill the template (its workers are killed one by one, or see their pipes close)."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(OSError):
            self.stderr.close()


def _exited(pidfd: int, timeout_s: float) -> bool:
    """Whether the process behind ``pidfd`` has exited, waiting up to ``timeout_s``. ``poll``, not ``select``: in a
    trainer's process a new descriptor's number may be past select's limit of 1024."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout_s) * 1000))


class _Worker:
    """One worker process, forked by the template, and the pool's two pipe ends. Its pid is known once it is
    ready; it is not the pool's child, so it is watched and signalled through a pidfd where Linux has them."""

    def __init__(self, template: _Template, reader: Connection, writer: Connection) -> None:
        self.template, self.reader, self.writer = template, reader, writer
        self.pid: int | None = None
        self._pidfd: int | None = None
        self._pidfd_lock = threading.Lock()  # the dispatcher closes it while close() may still wait on it
        self.ready = False

    def wait_ready(self, timeout_s: float, stop: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.reader.poll(0.05):
            if stop():
                raise RuntimeError("the VerifierPool was closed while a worker started")
            if self.template.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(self.template.failure(timeout_s))
        try:
            message = self.reader.recv()
        except (EOFError, OSError):
            if stop():  # closing the pool killed the template before it forked this worker
                raise RuntimeError("the VerifierPool was closed while a worker started") from None
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.template.proc.wait(timeout=5)  # it closed the pipe on its way out: report its exit
            raise RuntimeError(self.template.failure(timeout_s)) from None
        if not (
            isinstance(message, tuple) and len(message) == 2 and message[0] == "ready" and isinstance(message[1], int)
        ):
            raise RuntimeError(f"math-verify worker sent {message!r} instead of its ready message")
        self.pid = message[1]
        if hasattr(os, "pidfd_open"):
            try:
                self._pidfd = os.pidfd_open(self.pid)
            except ProcessLookupError:
                raise RuntimeError(f"math-verify worker {self.pid} exited as it started") from None
            except OSError:
                self._pidfd = None  # a kernel without pidfds: signals by pid
        self.ready = True

    def alive(self) -> bool:
        if self.pid is None:
            return True
        with self._pidfd_lock:
            if self._pidfd is not None:
                return not _exited(self._pidfd, 0.0)
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        return True

    def signal(self, signum: int) -> None:
        with self._pidfd_lock, contextlib.suppress(OSError):
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, signum)
            elif self.pid is not None:
                os.kill(self.pid, signum)

    def wait(self, timeout_s: float) -> bool:
        """Whether the process has exited within ``timeout_s`` (one not ready yet has nothing to wait for: it
        exits when it finds its pipes closed)."""
        if self.pid is None:
            return True
        with self._pidfd_lock:
            pidfd = None if self._pidfd is None else os.dup(self._pidfd)  # a copy: the original may be closed
        if pidfd is not None:
            try:
                return _exited(pidfd, timeout_s)
            finally:
                os.close(pidfd)
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def signal_kill(self) -> None:
        """Kill the process, leaving the pipes to the thread that reads them (closing them under it is a race).
        One not ready yet has no pid: it sees its pipes closed by :meth:`kill` and exits."""
        self.signal(signal.SIGKILL)

    def kill(self) -> None:
        self.signal_kill()
        self.wait(5)
        for end in (self.reader, self.writer):
            with contextlib.suppress(OSError):
                end.close()
        with self._pidfd_lock:
            pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            os.close(pidfd)


@dataclass
class _Config:
    """The pool's limits, shared with its dispatcher threads (see :class:`VerifierPool`)."""

    timeout_s: float
    soft_timeout_s: float
    probe_s: float
    latency_s: float
    memory_mb: int
    startup_timeout_s: float
    worker_timer: bool = True
    max_per_client: int | None = None
    warm_up: bool = True


class _Task:
    """One comparison and its future. ``request``: which :meth:`VerifierPool.submit` it came from; ``deadline``: by
    when a preempted comparison must have its verdict."""

    __slots__ = ("client", "deadline", "future", "gold", "pred", "request", "started")

    def __init__(self, pred: str, gold: str, request: int, deadline: float, client: Hashable = None) -> None:
        self.pred, self.gold, self.request, self.deadline = pred, gold, request, deadline
        self.client = client
        self.future: Future[Verdict] = Future()
        self.started = False


class _Slot:
    """A worker process's place in the pool, fed by one dispatcher thread."""

    def __init__(self) -> None:
        self.worker: _Worker | None = None
        self.error: str | None = None  # why the last start failed (reported by start(wait=True))
        self.warm: deque[tuple[list[tuple[str, str]], Future[None]]] = deque()


class _NoClient:
    """No client may start a comparison now (see :meth:`_Scheduler._next_client_locked`)."""


_NO_CLIENT = _NoClient()


def _settle(task: _Task, verdict: Verdict | BaseException) -> None:
    with contextlib.suppress(Exception):  # cancelled while queued, or closed: nobody is waiting
        if isinstance(verdict, BaseException):
            task.future.set_exception(verdict)
        else:
            task.future.set_result(verdict)


class _Scheduler:
    """The queues, the workers and their dispatcher threads. Kept apart from :class:`VerifierPool` so the threads
    do not keep the pool alive: a pool dropped without ``close()`` is closed when collected."""

    def __init__(self, config: _Config) -> None:
        self.config = config
        self.cv = threading.Condition()
        self.fresh: dict[Hashable, deque[_Task]] = {}  # not yet tried, per client: served first
        self.turns: deque[Hashable] = deque()  # clients with untried comparisons, in the order they are served
        self.queued = 0  # untried comparisons, all clients together
        self.in_flight: dict[Hashable, int] = {}  # client -> its comparisons started and without a verdict
        self.waiting: dict[int, int] = {}  # request -> its comparisons in ``fresh``
        self.slow: list[_Task] = []  # preempted after its probe: one full attempt when a worker is free
        self.requests = 0
        self.slots: list[_Slot] = []
        self.procs: set[_Worker] = set()
        self.template: _Template | None = None
        self.closed = False
        self.kills = 0
        self.preemptions = 0

    # -- queue -------------------------------------------------------------------------------------------------------
    def submit(
        self, items: Sequence[tuple[str, str]], latency_s: float, client: Hashable = None
    ) -> list[Future[Verdict]]:
        deadline = time.monotonic() + latency_s
        with self.cv:
            if self.closed:
                raise RuntimeError("this VerifierPool is closed; create a new one")
            self.requests += 1
            tasks = [_Task(pred, gold, self.requests, deadline, client) for pred, gold in items]
            self._queue_locked(tasks, front=False)
        return [t.future for t in tasks]

    def _queue_locked(self, tasks: list[_Task], front: bool) -> None:
        """Queue untried comparisons on their clients' queues (``front``: back where they were, in order)."""
        for task in reversed(tasks) if front else tasks:
            queue = self.fresh.get(task.client)
            if queue is None:
                queue = self.fresh[task.client] = deque()
                # Its turn comes after the clients waiting now: one of each, at most, goes before its comparison
                # (comparisons put back after a worker died go back in front).
                if front:
                    self.turns.appendleft(task.client)
                else:
                    self.turns.append(task.client)
            if front:
                queue.appendleft(task)
            else:
                queue.append(task)
            self.queued += 1
            self.waiting[task.request] = self.waiting.get(task.request, 0) + 1
        self.cv.notify_all()

    def others_wait(self, request: int) -> bool:
        """Whether comparisons of another request wait for a worker."""
        with self.cv:
            return len(self.waiting) > 1 or (len(self.waiting) == 1 and request not in self.waiting)

    def next_job(self, slot: _Slot) -> tuple[str, list[_Task]] | None:
        """``("warm", [])`` (the slot's warm-up list is next), ``("first", untried)``, ``("full", [preempted])``,
        or ``None`` once the pool is closed."""
        with self.cv:
            while True:
                if self.closed:
                    return None
                if slot.warm:
                    return "warm", []
                self._expire_locked()
                due = self._take_slow_locked(due_only=True)
                if due is not None:
                    return "full", [due]
                batch = self._take_fresh_locked()
                if batch:
                    return "first", batch
                rest = self._take_slow_locked(due_only=False)
                if rest is not None:
                    return "full", [rest]
                self.cv.wait()

    def _take_slow_locked(self, due_only: bool) -> _Task | None:
        """The preempted comparison with the earliest deadline; with ``due_only``, only one whose deadline nears."""
        if not self.slow:
            return None
        task = min(self.slow, key=lambda t: t.deadline)
        if due_only and time.monotonic() < task.deadline - 2 * self.config.timeout_s:
            return None
        self.slow.remove(task)
        return task

    def _next_client_locked(self) -> Hashable | _NoClient:
        """The first client in turn whose next comparison may start (under ``max_per_client``), taken off the turns."""
        cap = self.config.max_per_client
        for index, client in enumerate(self.turns):
            head = self.fresh[client][0]
            if cap is None or head.started or self.in_flight.get(client, 0) < cap:
                del self.turns[index]
                return client
        return _NO_CLIENT

    def _release(self, client: Hashable) -> None:
        with self.cv:  # an RLock: settled under it (expiry) or not (a dispatcher thread)
            left = self.in_flight.get(client, 0) - 1
            if left > 0:
                self.in_flight[client] = left
            else:
                self.in_flight.pop(client, None)
            if self.config.max_per_client is not None:
                self.cv.notify_all()

    def _take_fresh_locked(self) -> list[_Task]:
        size = max(1, min(_MAX_BATCH, math.ceil(self.queued / max(1, len(self.slots)))))
        batch: list[_Task] = []
        while len(batch) < size:
            # One comparison of each client in turn: a backlog never holds another client's next one.
            client = self._next_client_locked()
            if client is _NO_CLIENT:
                break
            queue = self.fresh[client]
            task = queue.popleft()
            self.queued -= 1
            if queue:
                self.turns.append(client)
            else:
                del self.fresh[client]
            left = self.waiting[task.request] - 1
            if left:
                self.waiting[task.request] = left
            else:
                del self.waiting[task.request]
            if not task.started:
                if not task.future.set_running_or_notify_cancel():
                    continue  # its caller gave up (the env's own limit, a cancelled step): no work for it
                task.started = True
                # In flight for its client until its verdict (a preempted one included): max_per_client counts it.
                self.in_flight[client] = self.in_flight.get(client, 0) + 1
                task.future.add_done_callback(lambda _f, c=client: self._release(c))
            batch.append(task)
        return batch

    def expire(self) -> None:
        with self.cv:
            self._expire_locked()

    def _expire_locked(self) -> None:
        """Slow comparisons whose full attempt can no longer end by their deadline are timeouts now."""
        if not self.slow:
            return
        latest_start = time.monotonic() + self.config.timeout_s
        keep: list[_Task] = []
        for task in self.slow:
            if latest_start > task.deadline:
                _settle(task, self._congested())
            else:
                keep.append(task)
        self.slow = keep

    def _congested(self) -> Verdict:
        c = self.config
        return (
            "timeout",
            f"math-verify ran past {c.probe_s:.2f}s while other answers waited, and no worker was "
            f"free for a full {c.timeout_s:g}s attempt within {c.latency_s:g}s of the request (the "
            "workers were busy with other slow answers)",
        )

    def to_slow(self, task: _Task) -> None:
        with self.cv:
            if self.closed:
                _settle(task, RuntimeError("the VerifierPool was closed before this comparison ended"))
            elif time.monotonic() + self.config.timeout_s > task.deadline:
                _settle(task, self._congested())
            else:
                self.slow.append(task)
                self.cv.notify()

    def requeue(self, tasks: list[_Task]) -> None:
        """Untried comparisons of a batch whose worker died go back to the front, in order."""
        if not tasks:
            return
        with self.cv:
            if self.closed:
                for task in tasks:
                    _settle(task, RuntimeError("the VerifierPool was closed before this comparison ended"))
                return
            self._queue_locked(tasks, front=True)

    # -- workers -----------------------------------------------------------------------------------------------------
    def spawn(self, slot: _Slot) -> None:
        with self.cv:
            if self.closed:
                return
            if self.template is None or self.template.proc.poll() is not None:
                self._new_template()  # the first, or the last one was killed or broke at start-up
            assert self.template is not None
            try:
                worker = self.template.fork()
            except OSError:  # its socket broke: it is exiting
                worker = self._new_template().fork()
            self.procs.add(worker)
            slot.worker = worker

    def _new_template(self) -> _Template:
        """A fresh template in place of the current one (closed, if any). Called with ``cv`` held."""
        if self.template is not None:
            self.template.close()
        self.template = _Template(self.config.memory_mb, self.config.warm_up)
        return self.template

    def retire(self, slot: _Slot, replace: bool) -> None:
        worker, slot.worker = slot.worker, None
        if worker is not None:
            worker.kill()
            with self.cv:
                self.procs.discard(worker)
        if replace:
            self.spawn(slot)  # starts warming now, while this thread reports the verdict

    def ensure_ready(self, slot: _Slot) -> _Worker:
        if slot.worker is None:
            self.spawn(slot)
        worker = slot.worker
        if worker is None:
            raise RuntimeError("this VerifierPool is closed; create a new one")
        if not worker.ready:
            try:
                worker.wait_ready(self.config.startup_timeout_s, lambda: self.closed)
            except RuntimeError as exc:
                slot.error = str(exc)
                self.retire(slot, replace=False)
                raise
            slot.error = None
        return worker

    def serve(self, slot: _Slot) -> None:
        """A dispatcher thread: start the worker, then feed it until the pool closes."""
        try:
            while True:
                # Take work only with a ready worker: a replacement starting (seconds) must not hold comparisons
                # that the other workers could run. A failure to start is reported to start(wait=True), and to
                # the requests this slot takes next (it tries again for them).
                if slot.worker is None or not slot.worker.ready:
                    with contextlib.suppress(RuntimeError):
                        self.ensure_ready(slot)
                job = self.next_job(slot)
                if job is None:
                    return
                kind, tasks = job
                if kind == "warm":
                    with self.cv:
                        items, done = slot.warm.popleft()
                    self.run_warm(slot, items, done)
                    continue
                try:
                    self.ensure_ready(slot)
                except RuntimeError as exc:
                    for task in tasks:
                        _settle(task, RuntimeError(str(exc)))
                    continue
                self.run_tasks(slot, tasks, first=kind == "first")
        finally:
            self.retire(slot, replace=False)
            with self.cv:
                pending = [done for _, done in slot.warm]
                slot.warm.clear()
            for done in pending:
                with contextlib.suppress(Exception):
                    done.set_exception(RuntimeError("the VerifierPool was closed"))

    def run_tasks(self, slot: _Slot, tasks: list[_Task], first: bool) -> None:
        """Send ``tasks`` to the slot's worker in one message and settle each as its verdict comes. ``first``:
        untried comparisons, each preempted once it has run ``probe_s`` while others wait."""
        c = self.config
        worker = slot.worker
        assert worker is not None
        yield_s = c.probe_s if first else 0.0
        try:
            worker.writer.send([(t.pred, t.gold, c.soft_timeout_s if c.worker_timer else 0.0, yield_s) for t in tasks])
        except OSError as exc:
            self.retire(slot, replace=True)
            self._fail_or_close(tasks[0], f"math-verify worker died ({type(exc).__name__}); replaced")
            self.requeue(tasks[1:])
            return
        for i, task in enumerate(tasks):
            try:
                others = any(t.request != task.request for t in tasks[i + 1 :]) if first else None
                reply = self._await_reply(worker, task.request, others)
                if isinstance(reply, str):
                    with self.cv:
                        self.kills += 1
                    self.retire(slot, replace=True)
                    _settle(task, ("timeout", f"{reply}; worker killed and replaced"))
                    self.requeue(tasks[i + 1 :])
                    return
                _, code, detail, exiting = reply
            except (EOFError, OSError) as exc:
                # The worker died under this item (memory limit hit in C code, a crash) or the pool closed.
                self.retire(slot, replace=True)
                self._fail_or_close(task, f"math-verify worker died ({type(exc).__name__}); replaced")
                self.requeue(tasks[i + 1 :])
                return
            if code == "preempted":
                with self.cv:
                    self.preemptions += 1
                self.to_slow(task)
            else:
                _settle(task, (code, detail))
            # Between verdicts (at most a timeout apart), slow comparisons that can no longer start in time get
            # theirs, even while every worker is busy: none waits past its deadline for a free dispatcher.
            self.expire()
            if exiting or not worker.alive():
                self.retire(slot, replace=True)  # it exits after a MemoryError: do not give it more work
                self.requeue(tasks[i + 1 :])
                return

    def _await_reply(self, worker: _Worker, request: int, batch_waits: bool | None) -> tuple | str:
        """The worker's next reply, or why it must be killed (a string). ``batch_waits``: ``None`` for a full
        attempt (never preempted); else whether comparisons of another request wait later in the same batch.

        A first attempt that has run ``probe_s`` while others wait gets ``SIGUSR1`` every 50 ms until it answers.
        One signal is not enough: this clock starts when the batch is sent, the worker's when it reads it, so under
        load the first signal can come before the worker's own probe has run (or before it has read the batch), and
        the worker rightly ignores it; a single ignored signal used to let that comparison run its whole timeout
        ahead of the answers waiting. One stuck in C code answers only when it returns, so it is then held to the
        hard limit like any other: killing it sooner would cost a worker restart (seconds of CPU) that the hard
        limit may never need."""
        c = self.config
        started = time.monotonic()
        hard = started + c.timeout_s
        preemptible = batch_waits is not None
        while True:
            now = time.monotonic()
            if not preemptible:
                until = hard
            elif now < started + c.probe_s:
                until = min(hard, started + c.probe_s)
            else:
                until = min(hard, now + 0.05)  # past the probe: look for waiting answers every 50 ms
            if worker.reader.poll(max(0.0, until - now)):
                return worker.reader.recv()
            now = time.monotonic()
            if now >= hard:
                return f"no verdict within {c.timeout_s:.2f}s (math-verify ignored its timer)"
            if preemptible and now >= started + c.probe_s and (batch_waits or self.others_wait(request)):
                worker.signal(signal.SIGUSR1)

    def _fail_or_close(self, task: _Task, detail: str) -> None:
        if self.closed:
            _settle(task, RuntimeError("the VerifierPool was closed before this comparison ended"))
        else:
            _settle(task, ("error", detail))

    def run_warm(self, slot: _Slot, items: list[tuple[str, str]], done: Future[None]) -> None:
        c = self.config
        try:
            worker = self.ensure_ready(slot)
        except RuntimeError as exc:
            done.set_exception(exc)
            return
        try:
            worker.writer.send([(pred, gold, c.soft_timeout_s if c.worker_timer else 0.0, 0.0) for pred, gold in items])
            for _ in items:
                if not worker.reader.poll(c.timeout_s):
                    raise TimeoutError
                *_, exiting = worker.reader.recv()
                if exiting:
                    raise EOFError
        except (OSError, EOFError):  # TimeoutError is an OSError: a slow or failed worker is replaced
            self.retire(slot, replace=True)
        done.set_result(None)

    def close(self) -> None:
        with self.cv:
            self.closed = True
            pending = [task for queue in self.fresh.values() for task in queue] + list(self.slow)
            self.fresh.clear()
            self.turns.clear()
            self.queued = 0
            self.waiting.clear()
            self.slow.clear()
            workers = list(self.procs)
            self.cv.notify_all()
        for task in pending:
            _settle(task, RuntimeError("the VerifierPool was closed while this comparison waited for a worker"))
        for worker in workers:
            # SIGKILL straight away: a worker holds no state worth a graceful exit, and waiting for sympy's
            # interpreter shutdown would make every close() cost a fraction of a second per worker. Its
            # dispatcher thread closes the pipes (closing them under its read is a race).
            worker.signal_kill()
        for worker in workers:
            worker.wait(5)
        with self.cv:
            template, self.template = self.template, None
        if template is not None:
            template.close()


def _close_scheduler(scheduler: _Scheduler, owner_pid: int) -> None:
    # Runs from weakref.finalize, at garbage collection or at interpreter exit: no worker outlives its pool.
    # A forked child inherits the pool object but not the workers: it must not kill its parent's processes.
    if os.getpid() == owner_pid:
        scheduler.close()


class VerifierPool:
    """``workers`` math-verify processes, started lazily on first use, and the fair queue that feeds them.

    ``timeout_s``: the hard wall-clock limit of a comparison's full attempt, from the moment a worker has it.
    ``probe_s``: how long a first attempt runs before it yields to another request's comparisons (default: a
    quarter of ``timeout_s``, at most half a second). ``latency_s``: a preempted comparison has its verdict within
    this many seconds of its submission, a ``timeout`` when the workers had no room for its full attempt
    (default: 4 x ``timeout_s``).
    ``memory_mb``: each worker's address-space limit (0: none). ``max_per_client``: comparisons of one client
    started and without a verdict at once (None: no cap), so one client never holds every worker. ``warm_up``:
    compare typical answers once in the template before it forks workers (about 1.3 CPU-seconds at start; each
    worker then parses its first answers about twice as fast); off for a pool that scores a few answers. See the
    module docstring for the schedule.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 3.0,
        memory_mb: int = 1024,
        startup_timeout_s: float = 60.0,
        *,
        probe_s: float | None = None,
        latency_s: float | None = None,
        max_per_client: int | None = None,
        warm_up: bool = True,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.workers = workers
        timeout_s = float(timeout_s)
        # The worker's own timer fires a little before the hard kill, so ordinary slow comparisons end with the
        # worker alive; only code that never returns to the interpreter pays a process restart.
        margin_s = min(0.5, 0.2 * timeout_s)
        probe = float(probe_s) if probe_s is not None else min(0.5, timeout_s / 4)
        latency = float(latency_s) if latency_s is not None else 4 * timeout_s
        if max_per_client is not None and max_per_client < 1:
            raise ValueError(f"max_per_client must be at least 1, or None for no cap; got {max_per_client!r}")
        if not 0 < probe <= timeout_s:
            raise ValueError(f"probe_s must be > 0 and at most timeout_s ({timeout_s:g}), got {probe:g}")
        if latency < probe + timeout_s:
            raise ValueError(
                f"latency_s must leave room for a probe and a full attempt (>= probe_s + timeout_s = "
                f"{probe + timeout_s:g}), got {latency:g}"
            )
        self.config = _Config(
            timeout_s=timeout_s,
            soft_timeout_s=max(0.05, timeout_s - margin_s),
            probe_s=probe,
            latency_s=latency,
            memory_mb=int(memory_mb),
            startup_timeout_s=startup_timeout_s,
            max_per_client=max_per_client,
            warm_up=warm_up,
        )
        """The limits, read by the dispatcher threads at each comparison (``worker_timer=False``: the workers arm
        no timer of their own, so only the hard kill ends a comparison; for tests of that kill)."""
        self.owner_pid = os.getpid()
        self._scheduler = _Scheduler(self.config)
        self._started = False
        self._start_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_scheduler, self._scheduler, self.owner_pid)

    @property
    def timeout_s(self) -> float:
        return self.config.timeout_s

    @property
    def probe_s(self) -> float:
        return self.config.probe_s

    @property
    def latency_s(self) -> float:
        return self.config.latency_s

    @property
    def closed(self) -> bool:
        return self._scheduler.closed

    @property
    def kills(self) -> int:
        """How many workers were killed for running past their hard limit (for tests and statistics)."""
        return self._scheduler.kills

    @property
    def preemptions(self) -> int:
        """How many first attempts yielded after ``probe_s`` to another request's comparisons (for tests and
        statistics)."""
        return self._scheduler.preemptions

    def pids(self) -> list[int]:
        """The workers that have started (not the template they are forked from)."""
        with self._scheduler.cv:
            return [w.pid for w in self._scheduler.procs if w.pid is not None]

    def template_pid(self) -> int | None:
        """The process the workers are forked from (None before the first start and after close())."""
        with self._scheduler.cv:
            template = self._scheduler.template
            return None if template is None else template.proc.pid

    def start(self, wait: bool = False) -> None:
        """Start the workers (their dispatcher threads start them); with ``wait``, block until every one is ready,
        raising ``RuntimeError`` with the worker's stderr when one cannot start."""
        scheduler = self._scheduler
        with self._start_lock:
            if scheduler.closed:
                raise RuntimeError("this VerifierPool is closed; create a new one")
            if not self._started:
                self._started = True
                for k in range(self.workers):
                    slot = _Slot()
                    scheduler.spawn(slot)  # the process starts importing now; its thread waits for it
                    scheduler.slots.append(slot)
                    threading.Thread(target=scheduler.serve, args=(slot,), name=f"math-verify-{k}", daemon=True).start()
        if wait:
            deadline = time.monotonic() + self.config.startup_timeout_s
            for slot in scheduler.slots:
                while not (slot.worker is not None and slot.worker.ready):
                    if slot.error is not None:
                        raise RuntimeError(slot.error)
                    if scheduler.closed:
                        raise RuntimeError("this VerifierPool was closed while its workers started")
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"math-verify workers were not ready after {self.config.startup_timeout_s:.0f}s"
                        )
                    time.sleep(0.02)

    def submit(self, items: Sequence[tuple[str, str]], *, client: str | None = None) -> list[Future[Verdict]]:
        """Queue ``(answer text, gold)`` comparisons; one future each, in order, settled with the verdict (or with
        ``RuntimeError`` when the workers cannot start or the pool closes). Cancelling a future that has not
        started spares the workers its comparison. Never blocks on the workers. ``client``: whose comparisons these
        are (a token, a connection); clients are served in turn (None: the one default client)."""
        self.start()
        return self._scheduler.submit(items, self.config.latency_s, client)

    def run(self, pred: str, pred_is_latex: bool, gold: str, *, client: str | None = None) -> Verdict:
        """Compare one answer to ``gold`` with math-verify in a worker (blocking).
        ``pred_is_latex``: ``pred`` is a box's content (it is read boxed); otherwise it is answer text."""
        return self.run_many([(f"\\boxed{{{pred}}}" if pred_is_latex else pred, gold)], client=client)[0]

    def run_many(self, items: Sequence[tuple[str, str]], *, client: str | None = None) -> list[Verdict]:
        """:meth:`submit` and wait for every verdict (blocking; thread-safe)."""
        return [future.result() for future in self.submit(items, client=client)]

    def run_on_every_worker(self, items: Sequence[tuple[str, str]]) -> None:
        """Compare ``items`` on every worker, all at once (each worker gets the whole list): a worker's LaTeX parser
        gets faster as it sees more answers, so this brings all of them to the steady state of a long run, which
        a benchmark then measures. Verdicts are discarded; a worker that fails or times out is replaced."""
        self.start(wait=True)
        scheduler = self._scheduler
        waits: list[Future[None]] = []
        with scheduler.cv:
            for slot in scheduler.slots:
                done: Future[None] = Future()
                slot.warm.append((list(items), done))
                waits.append(done)
            scheduler.cv.notify_all()
        for done in waits:
            done.result()

    def close(self) -> None:
        """Stop every worker. Safe to call twice; comparisons still queued fail with RuntimeError.
        In a forked child this only forgets the workers (they belong to the parent)."""
        if os.getpid() != self.owner_pid:
            self._scheduler.closed = True
            self._finalizer.detach()
            return
        self._finalizer.detach()
        self._scheduler.close()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
