"""What keeps one server answering its honest clients when the network side misbehaves: a deadline on request
headers (slowloris), enough file descriptors for thousands of connections, and a token that never reaches a log.

uvicorn arms its keep-alive timer only after a response and cancels it on every byte received, so a connection
that sends its headers one byte at a time, or never ends them, is held for ever: a few thousand of them exhaust
the descriptors and lock every client out. :class:`HeaderDeadline` closes a connection whose request headers are
not complete ``header_timeout_s`` after it opened (or after its previous request began), as nginx's
``client_header_timeout`` does; the body is timed by the Guard.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def header_protocol(header_timeout_s: float) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol, with a deadline of ``header_timeout_s`` on each request's headers."""

    class HeaderDeadline(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(header_timeout_s, self._late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _late(self) -> None:
            self._deadline = None
            if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
                self.transport.close()

    return HeaderDeadline


def raise_open_files() -> tuple[int, int]:
    """Raise this process's soft limit on open files to its hard limit (each connection is one); the new pair."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # a container may refuse: keep what we have
            pass
    return soft, hard


class Redact(logging.Filter):
    """Replaces every token in a log record's text by ``***``: uvicorn and websockets log request paths (a token
    may be a ``/token/<token>`` prefix) and, at debug level, headers (``Authorization: Bearer <token>``)."""

    def __init__(self, secrets: list[str]) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot format itself: leave it to the handler
            return True
        if any(secret in text for secret in self.secrets):
            for secret in self.secrets:
                text = text.replace(secret, "***")
            record.msg, record.args = text, None
        return True


def redact_logs(secrets: list[str]) -> None:
    """Put :class:`Redact` on every handler that exists now (call it after uvicorn configured its logging) and on
    the loggers that log requests, so no token reaches any log."""
    flt = Redact(secrets)
    names: list[Any] = [None, "uvicorn", "uvicorn.error", "uvicorn.access", "websockets", "rstar_env"]
    for name in names:
        logger = logging.getLogger(name)
        logger.addFilter(flt)
        for handler in logger.handlers:
            handler.addFilter(flt)


__all__ = ["Redact", "header_protocol", "raise_open_files", "redact_logs"]
