"""Every session a server holds, whatever opened it: a ``/ws`` connection, an ``openenv/session/create`` over
``/mcp``, an HTTP episode (``/reset`` ... ``/step``) or a ``/run_jupyter`` run. One table, one cap, one end:

- **a cap**: all kinds together count against ``max_sessions``; a slot is taken in one step (no ``await`` between
  the check and the insert), so concurrent opens cannot pass it;
- **an owner**: the client that opened it (:func:`rstar_env.serve.guard.client_of`); only that client reaches it
  by id (a session id is also 128 random bits: the server's, never the client's);
- **an end**: a session is closed when its client closes it or goes away, after ``idle_s`` without a message, or
  ``max_session_s`` after it opened, and at shutdown. Closing runs the session's ``close`` callback, which ends its
  episode and its sandbox session. ``/ws`` sessions are timed by the :class:`~rstar_env.serve.guard.Guard`
  (which closes the socket too), so the reaper here leaves them to it (``reaped=False``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("rstar_env.serve")

KINDS = ("ws", "mcp", "http", "jupyter")
"""The kinds of session a server counts."""


class CapacityError(Exception):
    """Every session slot is taken."""

    def __init__(self, open_now: int, max_sessions: int) -> None:
        super().__init__(
            f"{open_now} sessions are open, the most this server holds (--max-sessions {max_sessions}); "
            "close sessions you no longer need, or retry when one ends"
        )
        self.open_now = open_now
        self.max_sessions = max_sessions


@dataclass
class Session:
    """One open session (see the module docstring)."""

    id: str
    kind: str
    owner: str
    close: Callable[[], Awaitable[None]] | None = None
    """What ends it (its episode, its sandbox session); set once the session's object exists."""
    reaped: bool = True
    """Whether :meth:`Sessions.reap` times it (``False`` for ``/ws``, timed by the Guard)."""
    opened: float = field(default_factory=time.monotonic)
    seen: float = field(default_factory=time.monotonic)
    busy: int = 0
    """Requests running on it: an idle limit never ends a session mid-request."""
    obj: Any = None
    """The session's own object (an env, for the env kinds)."""


class Sessions:
    """The table of a server's sessions (see the module docstring)."""

    def __init__(self, max_sessions: int, *, idle_s: float | None, max_session_s: float | None) -> None:
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self.max_session_s = max_session_s
        self._open: dict[str, Session] = {}
        self._reaper: asyncio.Task[None] | None = None

    # -- opening and finding -----------------------------------------------------------------------------------------
    def open(self, kind: str, owner: str, *, reaped: bool = True) -> Session:
        """Take a slot now (raises :class:`CapacityError` when none is free); the caller sets ``close`` once it has
        built what the session holds, and calls :meth:`end` when it is done."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if len(self._open) >= self.max_sessions:
            raise CapacityError(len(self._open), self.max_sessions)
        session = Session(id=uuid.uuid4().hex, kind=kind, owner=owner, reaped=reaped)
        self._open[session.id] = session
        self._start_reaper()
        return session

    def get(self, session_id: str | None, owner: str, kind: str) -> Session | None:
        """The open session ``session_id`` of ``kind`` if ``owner`` opened it, else ``None`` (another client's
        session is as unknown to a caller as one that never existed)."""
        session = self._open.get(session_id or "")
        if session is None or session.kind != kind or session.owner != owner:
            return None
        return session

    def count(self, kind: str | None = None) -> int:
        return sum(1 for s in self._open.values() if kind is None or s.kind == kind)

    def counts(self) -> dict[str, int]:
        return {kind: self.count(kind) for kind in KINDS}

    @contextlib.contextmanager
    def using(self, session: Session) -> Any:
        """Mark ``session`` busy for a request: the idle clock restarts when it ends."""
        session.busy += 1
        try:
            yield session
        finally:
            session.busy -= 1
            session.seen = time.monotonic()

    # -- ending --------------------------------------------------------------------------------------------------------
    async def end(self, session: Session | str) -> bool:
        """Close ``session`` (once: later calls are no-ops); whether this call closed it."""
        key = session if isinstance(session, str) else session.id
        found = self._open.pop(key, None)
        if found is None:
            return False
        if found.close is not None:
            try:
                await found.close()
            except Exception as exc:  # closing is best effort: the slot is free either way
                log.warning("closing %s session %s failed: %s: %s", found.kind, key, type(exc).__name__, exc)
        return True

    def expired(self, session: Session, now: float) -> str | None:
        """Why ``session`` has outlived a limit at ``now``, or ``None``."""
        if self.max_session_s is not None and now - session.opened > self.max_session_s:
            return f"session time limit of {self.max_session_s:g} s reached (--max-session-s)"
        if self.idle_s is not None and not session.busy and now - session.seen > self.idle_s:
            return f"no request for {self.idle_s:g} s (--idle-timeout-s)"
        return None

    async def reap(self) -> list[str]:
        """End every reaped session past a limit (a busy one past its lifetime ends after its request); their ids."""
        now = time.monotonic()
        stale = [s for s in self._open.values() if s.reaped and not s.busy and self.expired(s, now)]
        for session in stale:
            await self.end(session)
        return [s.id for s in stale]

    async def close_all(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        for session in list(self._open.values()):
            await self.end(session)

    def _start_reaper(self) -> None:
        limits = [x for x in (self.idle_s, self.max_session_s) if x is not None]
        if self._reaper is not None or not limits:
            return
        # Often enough that a session outlives its limit by at most a quarter of it (and never less than 50 ms).
        interval = min(max(min(limits) / 4, 0.05), 5.0)

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                try:
                    await self.reap()
                except Exception as exc:  # never let one bad close stop the reaping of the others
                    log.warning("session reaper: %s: %s", type(exc).__name__, exc)

        self._reaper = asyncio.get_running_loop().create_task(loop())


__all__ = ["KINDS", "CapacityError", "Session", "Sessions"]
