"""One event loop on a daemon thread: the runtime's background loop, and each remote sandbox's private loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

LOOP_STOP_GRACE_S = 10.0
"""How long stopping a loop thread waits for it to finish its clean-up."""


class LoopThread:
    """One event loop running forever on a daemon thread, started on first use and stopped once.

    After :meth:`stop`, and in a forked child for a loop the runtime marked as the parent's, :meth:`loop` and
    :meth:`submit` raise :class:`RuntimeError`: what owned the loop is closed, or lives in another process.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._refusal: str | None = None  # why loop() refuses; None while it may run

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now if it was not)."""
        with self._lock:
            if self._refusal is not None:
                raise RuntimeError(self._refusal)
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
        """True when called from the loop's own thread."""
        return self._thread is not None and threading.current_thread() is self._thread

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the loop from any thread; its future. Raises RuntimeError once stopped."""
        try:
            loop = self.loop()
        except RuntimeError:
            coro.close()
            raise
        return asyncio.run_coroutine_threadsafe(coro, loop)

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this loop and await it from the caller's loop (whichever it is)."""
        if self.in_loop():  # already there (a backend calling itself): no hop
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def stop(self, timeout_s: float = LOOP_STOP_GRACE_S) -> None:
        """Stop the loop (its pending tasks are cancelled) and wait up to ``timeout_s`` for its thread. Idempotent."""
        with self._lock:
            if self._refusal is None:
                self._refusal = f"the event loop {self.name!r} is stopped"
            loop, thread = self._loop, self._thread
        if loop is None or thread is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # closed meanwhile
            loop.call_soon_threadsafe(loop.stop)
        if threading.current_thread() is not thread:
            thread.join(timeout=timeout_s)

    def _disown(self, parent: int) -> None:
        # In a forked child: the thread is the parent's and the lock may be held by one of the parent's threads.
        self._lock = threading.Lock()
        self._loop, self._thread = None, None
        self._refusal = f"the event loop {self.name!r} runs in process {parent}, not in this forked child"
