"""Fair admission per client for the stateless routes (``/run_code``, ``/verify``): one client's backlog adds at
most one call's time to another client's next call.

A :class:`FairGate` lets ``slots`` calls run at once (fewer than the sandbox pool's workers, so the episodes'
own tool calls always find room) and at most ``per_client`` of them for one client. Calls that cannot start wait
in a queue per client; when a call ends, the waiting client served longest ago (one never served first; deficit
round robin with one call as the quantum) starts its oldest call. A flood of one client therefore queues behind
itself: another client's call waits only for the first slot to free.

Who a client is comes from the Guard (:func:`rstar_env.serve.guard.client_of`): a token's name is unforgeable; an
``X-Rstar-Client`` label is only as fair as the clients that send it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator


class FairGate:
    """See the module docstring. ``per_client=None``: a client may take every slot (when no other waits)."""

    def __init__(self, slots: int, per_client: int | None = None) -> None:
        if slots < 1 or (per_client is not None and per_client < 1):
            raise ValueError(f"slots and per_client must be at least 1, got {slots} and {per_client}")
        self.slots = slots
        self.per_client = per_client
        self.running: Counter[str] = Counter()
        self.waiting: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self.served = 0
        self.last: dict[str, int] = {}
        """When each client with calls running or waiting was last granted one (the ``served`` count then)."""

    @property
    def busy(self) -> int:
        return sum(self.running.values())

    def queued(self, client: str | None = None) -> int:
        if client is not None:
            return len(self.waiting.get(client, ()))
        return sum(len(q) for q in self.waiting.values())

    @contextlib.asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[None]:
        """Hold one of the slots for ``client`` while the block runs (waiting for its turn first)."""
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.setdefault(client, deque()).append(granted)
        self._dispatch()
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted as it was cancelled: give the slot back
                self._release(client)
            else:
                self._forget(client, granted)
            raise
        try:
            yield
        finally:
            self._release(client)

    def _release(self, client: str) -> None:
        self.running[client] -= 1
        if self.running[client] <= 0:
            del self.running[client]
            if client not in self.waiting:
                self.last.pop(client, None)  # nothing of it left: forget it
        self._dispatch()

    def _forget(self, client: str, granted: asyncio.Future[None]) -> None:
        queue = self.waiting.get(client)
        if queue is not None:
            with contextlib.suppress(ValueError):
                queue.remove(granted)
            if not queue:
                del self.waiting[client]
                if not self.running[client]:
                    self.last.pop(client, None)

    def _dispatch(self) -> None:
        """Start waiting calls while slots are free, each time for the client served longest ago."""
        while self.busy < self.slots:
            eligible = [c for c in self.waiting if self.per_client is None or self.running[c] < self.per_client]
            if not eligible:
                return  # nobody waits, or every waiting client is at its own cap
            client = min(eligible, key=lambda c: self.last.get(c, -1))  # min keeps the first of equals: arrival
            queue = self.waiting[client]
            granted = queue.popleft()
            if not queue:
                del self.waiting[client]
            if granted.cancelled():
                continue
            self.running[client] += 1
            self.served += 1
            self.last[client] = self.served
            granted.set_result(None)


__all__ = ["FairGate"]
