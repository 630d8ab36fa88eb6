"""The Ray actor behind the ``ray`` backend: one local sandbox pool on the node the actor runs on.

Kept free of Ray imports so it can be imported (and pickled by reference) without Ray; :mod:`.ray` wraps it
with ``ray.remote``. Every method is ``async``, so Ray runs it as an async actor: many batches are in flight at
once and the local pool's own thread pool is the back-pressure.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import AsyncIterator
from typing import Any


class SandboxActor:
    """Holds a :class:`~rstar_env.sandbox.local.LocalSandbox` started with ``options``."""

    def __init__(self, options: dict[str, Any]) -> None:
        from .local import LocalSandbox

        self.box = LocalSandbox(**options)
        self.box.start()  # the actor is ready only once its pool is: callers see a slow start, not slow calls

    async def run(self, calls: list[dict[str, Any]]) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        """Run a batch of calls concurrently; yield ``(index, result dict)`` as each finishes.

        Tasks are created in batch order, so calls of one session take their turns in that order.
        """
        tasks = [asyncio.ensure_future(self._one(index, call)) for index, call in enumerate(calls)]
        for next_done in asyncio.as_completed(tasks):
            yield await next_done

    async def _one(self, index: int, call: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        result = await self.box.execute(
            call["code"], stdin=call.get("stdin", ""), session=call.get("session"), timeout_s=call.get("timeout_s")
        )
        return index, result.to_dict()

    async def close_sessions(self, sessions: list[str]) -> None:
        for name in sessions:
            await self.box.close_session(name)

    async def info(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "host": socket.gethostname(), "max_concurrency": self.box.max_concurrency}

    async def shutdown(self) -> None:
        await self.box.aclose()
