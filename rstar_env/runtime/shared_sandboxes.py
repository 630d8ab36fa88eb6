"""Sandboxes shared by their settings across the envs of a process (the runtime's registry)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any, Protocol, TypeVar

log = logging.getLogger("rstar_env.runtime")

SANDBOX_CLOSE_GRACE_S = 30.0
"""How long :meth:`SharedSandboxes.close_all` waits for one sandbox to close."""


class _Closable(Protocol):
    async def aclose(self) -> None: ...


S = TypeVar("S", bound=_Closable)


class SharedSandboxes:
    """Sandboxes counted by reference under a key (their settings), so that every tool of every env of a process
    that asks for the same settings uses one sandbox: one warm pool per process, not one per env. The last
    :meth:`release` of a key closes its sandbox."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[Hashable, list[Any]] = {}  # key -> [sandbox, references]

    def acquire(self, key: Hashable, create: Callable[[], S]) -> S:
        """The sandbox shared under ``key`` (made by ``create()`` if there is none), with one more reference."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = [create(), 0]
            entry[1] += 1
            return entry[0]

    async def release(self, key: Hashable) -> None:
        """Drop one reference to ``key``'s sandbox; the last one closes it. An unknown key is a no-op."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del self._entries[key]
        await entry[0].aclose()

    def held(self) -> dict[Hashable, int]:
        """Every shared sandbox still referenced: its key and its number of references."""
        with self._lock:
            return {key: entry[1] for key, entry in self._entries.items()}

    def close_all(self) -> dict[Hashable, int]:
        """Close every shared sandbox now, whoever still holds it, and forget them all; returns what :meth:`held`
        said before. A holder's next call finds its sandbox closed (``SandboxError``). Blocking: call it from
        plain code, not from an event loop's thread."""
        with self._lock:
            entries, self._entries = self._entries, {}
        for entry in entries.values():
            _close_now(entry[0])
        return {key: entry[1] for key, entry in entries.items()}

    def _after_fork_in_child(self) -> None:
        # A forked child must not drive (or close) its parent's sandboxes: their processes and loop threads are the
        # parent's. It builds its own on first use. (The copies' own fork handling is theirs, through on_fork.)
        self._lock = threading.Lock()
        self._entries = {}


def _close_now(sandbox: _Closable) -> None:
    # aclose() is a coroutine and the caller may or may not be on a loop: run it on a loop of its own, in a thread.
    def close() -> None:
        try:
            asyncio.run(sandbox.aclose())
        except Exception:
            log.exception("closing the shared sandbox %r failed", sandbox)

    closer = threading.Thread(target=close, name="rstar-env-close", daemon=True)
    closer.start()
    closer.join(timeout=SANDBOX_CLOSE_GRACE_S)
    if closer.is_alive():
        log.warning(
            "the shared sandbox %r did not close within %g s; left to close on its own", sandbox, SANDBOX_CLOSE_GRACE_S
        )
