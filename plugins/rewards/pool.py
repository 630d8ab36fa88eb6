"""A pool of math-verify worker processes with a hard wall-clock limit per comparison.

:meth:`VerifierPool.run_many` is blocking and thread-safe: it takes an idle worker, sends a batch of comparisons in
one message and waits at most ``timeout_s`` for each verdict (the worker answers item by item). A worker that has
not answered by then is killed (``SIGKILL``) and replaced at once, so a pathological expression costs its caller
exactly the timeout and costs the pool one process start (about a quarter of a second, paid by the replacement in
the background). Workers are plain ``subprocess`` children running :mod:`._worker`, so the pool works the same under
any ``multiprocessing`` start method, from any thread, and never re-imports the caller's ``__main__``.

No asyncio object is created here: the reward plugin reaches the pool through ``run_in_executor``, which keeps it
usable from one event loop after another.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import IO

Verdict = tuple[str, str]
"""``(code, detail)``: code is ``verified``, ``mismatch``, ``bad_gold``, ``timeout`` or ``error``."""

_WORKER_MODULE = "rstar_plugins.rewards._worker"


class _Worker:
    """One worker process and its two pipe ends."""

    def __init__(self, memory_mb: int, soft_timeout_s: float) -> None:
        # stderr goes to an anonymous file rather than a pipe: a chatty worker can never block on a full pipe,
        # and a worker that dies at start-up leaves its traceback for the error message.
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed in kill())
        self.proc = subprocess.Popen(
            [sys.executable, "-m", _WORKER_MODULE, str(memory_mb), f"{soft_timeout_s:.3f}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.reader = Connection(os.dup(self.proc.stdout.fileno()), readable=True, writable=False)
        self.writer = Connection(os.dup(self.proc.stdin.fileno()), readable=False, writable=True)
        self.proc.stdout.close()
        self.proc.stdin.close()
        self.ready = False

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.reader.poll(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(self._startup_failure(timeout_s))
        try:
            message = self.reader.recv()
        except (EOFError, OSError):
            raise RuntimeError(self._startup_failure(timeout_s)) from None
        if not (isinstance(message, tuple) and message[:1] == ("ready",)):
            raise RuntimeError(f"math-verify worker sent {message!r} instead of its ready message")
        self.ready = True

    def _startup_failure(self, timeout_s: float) -> str:
        code = self.proc.poll()
        self.stderr.seek(0)
        tail = self.stderr.read()[-2000:].decode(errors="replace").strip()
        state = f"exited with status {code}" if code is not None else f"was not ready after {timeout_s:.0f}s"
        return (
            f"math-verify worker ({sys.executable} -m {_WORKER_MODULE}) {state}. Check that math-verify is "
            f"installed for this interpreter (pip install 'math-verify>=0.7') and that rstar_plugins is "
            f"importable. Worker stderr:\n{tail or '(empty)'}"
        )

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)
        for end in (self.reader, self.writer):
            with contextlib.suppress(OSError):
                end.close()
        with contextlib.suppress(OSError):
            self.stderr.close()


def _kill_all(workers: set[_Worker], owner_pid: int) -> None:
    # Runs from weakref.finalize, at garbage collection or at interpreter exit: no worker outlives its pool.
    # A forked child inherits the pool object but not the workers: it must not kill its parent's processes.
    if os.getpid() != owner_pid:
        return
    for worker in list(workers):
        worker.kill()
    workers.clear()


class VerifierPool:
    """``workers`` math-verify processes, started lazily on first use.

    ``timeout_s`` is the hard wall-clock limit per comparison (from the moment the request is sent; waiting for a
    free worker is not counted). ``memory_mb`` is each worker's address-space limit (0: none).
    """

    def __init__(self, workers: int = 2, timeout_s: float = 3.0, memory_mb: int = 1024,
                 startup_timeout_s: float = 60.0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.workers = workers
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.startup_timeout_s = startup_timeout_s
        # The worker's own timer fires a little before the hard kill, so ordinary slow comparisons end with the
        # worker alive; only code that never returns to the interpreter pays a process restart.
        self.soft_timeout_s = max(0.05, self.timeout_s - min(0.5, 0.2 * self.timeout_s))
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._all: set[_Worker] = set()
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self.kills = 0
        """How many workers were killed for running past the timeout (for tests and statistics)."""
        self.owner_pid = os.getpid()
        self._finalizer = weakref.finalize(self, _kill_all, self._all, self.owner_pid)

    @property
    def closed(self) -> bool:
        return self._closed

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._all]

    def start(self, wait: bool = False) -> None:
        """Start the worker processes now rather than on the first comparison. They load in the background;
        with ``wait``, return once every idle worker is ready (raises RuntimeError if one cannot start)."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this VerifierPool is closed; create a new one")
            if not self._started:
                self._started = True
                for _ in range(self.workers):
                    self._spawn_locked()
        if wait:
            taken: list[_Worker] = []
            try:
                while True:  # only idle workers: one in use belongs to the thread that took it
                    taken.append(self._idle.get_nowait())
            except queue.Empty:
                pass
            try:
                for worker in taken:
                    if not worker.ready:
                        worker.wait_ready(self.startup_timeout_s)
            finally:
                for worker in taken:
                    self._idle.put(worker)

    def _spawn_locked(self) -> None:
        worker = _Worker(self.memory_mb, self.soft_timeout_s)
        self._all.add(worker)
        self._idle.put(worker)

    def _retire(self, worker: _Worker, replace: bool) -> None:
        worker.kill()
        with self._lock:
            self._all.discard(worker)
            if replace and not self._closed:
                self._spawn_locked()

    def _acquire(self) -> _Worker:
        while True:
            if self._closed:
                raise RuntimeError("this VerifierPool was closed while a comparison waited for a worker")
            try:
                return self._idle.get(timeout=0.2)
            except queue.Empty:
                continue

    def run(self, pred: str, pred_is_latex: bool, gold: str) -> Verdict:
        """Compare one answer to ``gold`` with math-verify in a worker; blocks at most ``timeout_s`` once sent.
        ``pred_is_latex``: ``pred`` is a box's content (it is read boxed); otherwise it is answer text."""
        return self.run_many([(f"\\boxed{{{pred}}}" if pred_is_latex else pred, gold)])[0]

    def run_many(self, items: Sequence[tuple[str, str]]) -> list[Verdict]:
        """Compare each ``(answer text, gold)`` with math-verify, the whole list in one message to one worker.

        Each comparison keeps its own hard limit: the worker replies item by item and a reply that takes longer
        than ``timeout_s`` gets its worker killed; that item is a ``timeout`` and the rest go to another worker.
        Blocking and thread-safe; call it from several threads to use several workers."""
        verdicts: list[Verdict | None] = [None] * len(items)
        todo = list(range(len(items)))
        while todo:
            worker = self._ready_worker()
            try:
                worker.writer.send([items[i] for i in todo])
            except OSError as exc:
                self._retire(worker, replace=True)
                verdicts[todo[0]] = ("error", f"math-verify worker died ({type(exc).__name__}); replaced")
                todo = todo[1:]
                continue
            done = 0
            retired = False
            while done < len(todo):
                index = todo[done]
                try:
                    if not worker.reader.poll(self.timeout_s):
                        with self._lock:
                            self.kills += 1
                        self._retire(worker, replace=True)
                        verdicts[index] = ("timeout",
                                           f"no verdict within {self.timeout_s:.2f}s; worker killed and replaced")
                        done += 1
                        retired = True
                        break
                    _, code, detail, exiting = worker.reader.recv()
                except (EOFError, OSError) as exc:
                    # The worker died under this item (memory limit hit in C code, a crash) or the pool closed.
                    self._retire(worker, replace=True)
                    verdicts[index] = ("error", f"math-verify worker died ({type(exc).__name__}); replaced")
                    done += 1
                    retired = True
                    break
                verdicts[index] = (code, detail)
                done += 1
                if exiting or worker.proc.poll() is not None:
                    self._retire(worker, replace=True)  # it exits after a MemoryError: do not hand it out again
                    retired = True
                    break
            if not retired:
                self._idle.put(worker)
            todo = todo[done:]
        return [v for v in verdicts if v is not None]

    def run_on_every_worker(self, items: Sequence[tuple[str, str]]) -> None:
        """Compare ``items`` on every worker, all at once (each worker gets the whole list): a worker's LaTeX parser
        gets faster as it sees more answers, so this brings all of them to the steady state of a long run, which
        a benchmark then measures. Verdicts are discarded; a worker that fails or times out is replaced."""
        self.start(wait=True)
        taken: list[_Worker] = []
        while len(taken) < self.workers:
            taken.append(self._ready_worker())
        for worker in taken:
            with contextlib.suppress(OSError):
                worker.writer.send(list(items))
        for worker in taken:
            healthy = True
            for _ in items:
                try:
                    if not worker.reader.poll(self.timeout_s):
                        healthy = False
                        break
                    *_, exiting = worker.reader.recv()
                except (EOFError, OSError):
                    healthy = False
                    break
                if exiting:
                    healthy = False
                    break
            if healthy:
                self._idle.put(worker)
            else:
                self._retire(worker, replace=True)

    def _ready_worker(self) -> _Worker:
        self.start()
        worker = self._acquire()
        if not worker.ready:
            try:
                worker.wait_ready(self.startup_timeout_s)
            except RuntimeError:
                self._retire(worker, replace=not self._closed)
                raise
        return worker

    def close(self) -> None:
        """Stop every worker. Safe to call twice; comparisons waiting for a worker fail with RuntimeError.
        In a forked child this only forgets the workers (they belong to the parent)."""
        if os.getpid() != self.owner_pid:
            self._closed = True
            self._finalizer.detach()
            return
        with self._lock:
            self._closed = True
            workers = list(self._all)
            self._all.clear()
        for worker in workers:
            # SIGKILL straight away: a worker holds no state worth a graceful exit, and waiting for sympy's
            # interpreter shutdown would make every close() cost a fraction of a second per worker.
            worker.kill()
        self._finalizer.detach()

    def __enter__(self) -> VerifierPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
