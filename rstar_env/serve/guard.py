"""What makes a server that runs model-written code safe to start: where it may listen, who may call it, and how
much one caller may ask.

- :func:`check_bind`: a loopback address needs nothing; any other needs a token (refused with an error otherwise).
- :class:`Guard`, an ASGI middleware in front of every route:
  - with a token, every request carries it, as ``Authorization: Bearer <token>`` or as a path prefix
    ``/token/<token>/...`` (for clients that cannot set headers: OpenEnv's ``EnvClient`` takes
    ``base_url="http://host:port/token/<token>"``, the sandbox-fusion client ``endpoint=`` the same);
  - an HTTP body over ``max_request_bytes`` is answered 413 before any route reads it;
  - a WebSocket message over ``max_request_bytes`` is answered with an error message and dropped: the session
    goes on (uvicorn closes the connection only past a hard cap well above it);
  - a WebSocket session lives at most ``max_session_s`` seconds and waits at most ``idle_s`` for its next message:
    then it is closed (code 1008, the reason says which limit) and the route sees a disconnect, so the episode and
    its sandbox session are freed as for a dropped client.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

TOKEN_ENV = "RSTAR_ENV_SERVE_TOKEN"
"""The environment variable a server reads its token from when ``--token`` is not given."""

TOKEN_PREFIX = "/token/"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BindError(ValueError):
    """A server was asked to listen where it must not (a non-loopback address without a token)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (``127.0.0.0/8``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def check_bind(host: str, token: str | None) -> None:
    """Refuse (:class:`BindError`) to listen on a non-loopback ``host`` without a token."""
    if token is not None and not token.strip():
        raise BindError(f"the token is empty; pass a non-empty --token or {TOKEN_ENV}")
    if not is_loopback(host) and token is None:
        raise BindError(
            f"refusing to listen on {host}: this server runs model-written code, and only a loopback address "
            f"(127.0.0.1, the default) may go without a token. Pass --token (or set {TOKEN_ENV}); clients then send "
            "'Authorization: Bearer <token>' or use the base URL http://HOST:PORT/token/<token>"
        )


class Guard:
    """The ASGI middleware described in the module docstring; ``token=None`` lets every request in."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        max_request_bytes: int,
        max_session_s: float | None,
        idle_s: float | None = None,
    ) -> None:
        self.app = app
        self.idle_s = idle_s
        self.token = token
        self.max_request_bytes = max_request_bytes
        self.max_session_s = max_session_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if self.token is not None and not self._authorized(scope):
            await _refuse(
                scope,
                send,
                401,
                "missing or wrong token: send 'Authorization: Bearer <token>' or use "
                "the base URL http://HOST:PORT/token/<token>",
            )
            return
        if kind == "http":
            await self._http(scope, receive, send)
        else:
            await self._websocket(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        assert self.token is not None
        path: str = scope.get("path", "")
        if path.startswith(TOKEN_PREFIX):
            given, _, rest = path[len(TOKEN_PREFIX) :].partition("/")
            if hmac.compare_digest(given.encode(), self.token.encode()):
                scope["path"] = "/" + rest  # the routes see the path without the token
                scope["raw_path"] = scope["path"].encode()
                return True
            return False
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                scheme, _, given = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())
        return False

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.max_request_bytes
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await _refuse(
                    scope,
                    send,
                    413,
                    f"the request body is {int(value)} bytes; this server takes at most {limit} (--max-request-bytes)",
                )
                return
        # Read the body here, bounded, and hand the route a replay of it: a chunked upload cannot outgrow the limit.
        body, more, size = [], True, 0
        while more:
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _refuse(scope, send, 413, f"the request body is over {limit} bytes (--max-request-bytes)")
                return
            body.append(chunk)
            more = message.get("more_body", False)
        await self.app(
            scope, _replay([{"type": "http.request", "body": b"".join(body), "more_body": False}], then=receive), send
        )

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit, lifetime, idle = self.max_request_bytes, self.max_session_s, self.idle_s
        loop = asyncio.get_running_loop()
        end = None if lifetime is None else loop.time() + lifetime
        state = {"closed": False}

        async def guarded_send(message: Message) -> None:
            if state["closed"]:  # closed by the guard (a limit) or the client: what the route still sends goes nowhere
                return
            if message["type"] != "websocket.close":
                await send(message)
                return
            state["closed"] = True
            with contextlib.suppress(OSError):  # the client left first (OpenEnv's route closes after it anyway)
                await send(message)

        async def guarded_receive() -> Message:
            while True:
                limits: list[tuple[float, str]] = []
                if end is not None:
                    reason = f"session time limit of {lifetime:g} s reached (--max-session-s)"
                    limits.append((end - loop.time(), reason))
                if idle is not None:
                    limits.append((idle, f"no message for {idle:g} s (--idle-timeout-s)"))
                if not limits:
                    message = await receive()
                else:
                    wait, reason = min(limits)
                    try:
                        message = await asyncio.wait_for(receive(), max(wait, 0.0))
                    except TimeoutError:
                        await guarded_send({"type": "websocket.close", "code": 1008, "reason": reason})
                        return {"type": "websocket.disconnect", "code": 1008, "reason": reason}
                if message["type"] != "websocket.receive":
                    if message["type"] == "websocket.disconnect":
                        state["closed"] = True
                    return message
                data = message.get("text") if message.get("text") is not None else message.get("bytes") or b""
                size = len(data.encode()) if isinstance(data, str) else len(data)
                if size <= limit:
                    return message
                # Too big: say so and wait for the next message; the session and its episode go on.
                await guarded_send(
                    {
                        "type": "websocket.send",
                        "text": json.dumps(
                            {
                                "type": "error",
                                "data": {
                                    "message": f"message of {size} bytes dropped: this server takes at most {limit} "
                                    "bytes per message (--max-request-bytes); the session goes on",
                                    "code": "MESSAGE_TOO_LARGE",
                                },
                            }
                        ),
                    }
                )

        await self.app(scope, guarded_receive, guarded_send)


def _replay(messages: list[Message], then: Receive | None = None) -> Receive:
    pending = list(messages)

    async def receive() -> Message:
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}

    return receive


async def _refuse(scope: Scope, send: Send, status: int, detail: str) -> None:
    if scope["type"] == "websocket":
        # Closing before accepting refuses the handshake (HTTP 403); the reason travels where the client shows it.
        await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})
        return
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def resolve_token(token: str | None) -> str | None:
    """The token given, else the one in :data:`TOKEN_ENV`, else ``None``."""
    return token if token is not None else os.environ.get(TOKEN_ENV) or None
