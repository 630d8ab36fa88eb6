"""Admission by what sessions hold: Kubernetes' *request* and *limit*, for a pool of sandbox sessions.

A session's *limit* is ``memory_mb``, enforced by its worker's cgroup. Its *request*, what the pool sets aside for
it, is what it holds: read from its cgroup when its call ends (the session is frozen then and cannot grow), never
less than :data:`FLOOR_MB`. While one of its calls runs, a session may grow to its limit, so a running session call
reserves ``memory_mb``. Stateless calls reserve nothing: they share what sessions leave, as they always did.

A call is admitted when what the *other* sessions reserve, plus ``memory_mb`` for this call, fits in
``pool_memory_mb`` (or when nothing else is reserved: there is nothing to wait for). So a call that stays within
``memory_mb`` never finds the pool filled by idle sessions: it is never the one the kernel kills for want of pool
memory. A call that does not fit *waits* until sessions close or shrink; past its deadline it is turned away as a
failure of the system (``ExecResult.system_failure``), never run and never shown to the model.

Nothing is reclaimed from idle sessions by force: ending one would lose a model's variables mid-episode. Room comes
back when sessions close (their episode ends) or end (a call that killed its worker), and when a session's next
call leaves it holding less.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

FLOOR_MB = 64
"""The least a session reserves: an interpreter forked from the zygote dirties a few MiB before any code runs."""


class MemoryGate:
    """The pool's memory ledger; thread-safe. ``pool_mb`` or ``memory_mb`` None: everything is admitted at once."""

    def __init__(self, pool_mb: int | None, memory_mb: int | None, floor_mb: int = FLOOR_MB) -> None:
        self.pool_mb, self.memory_mb = pool_mb, memory_mb
        self.floor_mb = min(floor_mb, memory_mb) if memory_mb is not None else floor_mb
        self._cv = threading.Condition()
        self._held: dict[Hashable, int] = {}
        """Open sessions -> MiB they hold at rest (their request)."""
        self._running: set[Hashable] = set()
        self.waits = 0
        """Calls that had to wait for room (for tests and benchmarks)."""
        self.turned_away = 0
        """Calls whose wait outlasted their deadline."""

    @property
    def enabled(self) -> bool:
        return self.pool_mb is not None and self.memory_mb is not None

    def reserved_mb(self, excluding: Hashable | None = None) -> int:
        """What the open sessions (but ``excluding``) reserve now."""
        with self._cv:
            return self._reserved_locked(excluding)

    @property
    def sessions(self) -> int:
        """Sessions open (holding a reservation)."""
        with self._cv:
            return len(self._held)

    def admit(self, session: Hashable | None, deadline: float) -> bool:
        """Wait until the call fits (see the module docstring) or ``deadline`` (``time.monotonic()``) passes.

        True: admitted; a session call then reserves ``memory_mb`` until :meth:`settle`. False: no room in time.
        """
        if not self.enabled:
            return True
        with self._cv:
            if not self._fits_locked(session):
                self.waits += 1
                while not self._fits_locked(session):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self.turned_away += 1
                        return False
                    self._cv.wait(left)
            if session is not None:
                self._held.setdefault(session, self.floor_mb)
                self._running.add(session)
            return True

    def settle(self, session: Hashable, held_mb: int | None) -> None:
        """The session's call ended with its worker alive, holding ``held_mb`` (None: unknown, the floor)."""
        if not self.enabled:
            return
        with self._cv:
            self._running.discard(session)
            self._held[session] = max(self.floor_mb, held_mb or 0)
            self._cv.notify_all()

    def forget(self, session: Hashable) -> None:
        """The session's worker is gone (closed, or ended by its call): it holds nothing any more."""
        if not self.enabled:
            return
        with self._cv:
            self._running.discard(session)
            if self._held.pop(session, None) is not None:
                self._cv.notify_all()

    def _reserved_locked(self, excluding: Hashable | None) -> int:
        limit = self.memory_mb or 0
        return sum(limit if s in self._running else held for s, held in self._held.items() if s != excluding)

    def _fits_locked(self, session: Hashable | None) -> bool:
        others = self._reserved_locked(session)
        return others == 0 or others + (self.memory_mb or 0) <= (self.pool_mb or 0)


__all__ = ["FLOOR_MB", "MemoryGate"]
