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
    its sandbox session are freed as for a dropped client;
  - a browser cannot reach it from another site: the ``Host`` header must name this server (loopback names by
    default, ``allowed_hosts`` more: DNS rebinding gets 400), a WebSocket or an unsafe request (POST, ...) whose
    ``Origin`` is not loopback or in ``allowed_origins`` gets 403 (clients that are not browsers send no
    ``Origin``), and a POST body must be ``application/json`` (415 otherwise: a page's ``text/plain`` POST, which
    needs no CORS preflight, never reaches a route);
  - a request body must arrive within ``read_timeout_s`` (408 otherwise); headers are timed by
    :class:`rstar_env.serve.net.HeaderDeadline`;
  - each request learns its client (:func:`client_of`): the token's name when the server has several tokens
    (``--token-file`` lines ``NAME TOKEN``), else the ``X-Rstar-Client`` header, else the peer address. Sessions
    belong to their client and the fair queues serve clients in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

TOKEN_ENV = "RSTAR_ENV_SERVE_TOKEN"
"""The environment variable a server reads its token from when ``--token`` is not given."""

TOKEN_FILE_ENV = "RSTAR_ENV_SERVE_TOKEN_FILE"
"""The environment variable naming a token file when ``--token-file`` is not given."""

TOKEN_PREFIX = "/token/"

CLIENT_HEADER = b"x-rstar-client"
"""A label a client may give itself (fair queueing and session ownership) when the server has one token."""

CLIENT_KEY = "rstar_env.client"
"""Where the Guard puts the request's client in the ASGI scope (read it with :func:`client_of`)."""

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
"""The ``Host`` names a server answers by default."""

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

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


def check_bind(host: str, token: str | Mapping[str, str] | None) -> None:
    """Refuse (:class:`BindError`) to listen on a non-loopback ``host`` without a token."""
    tokens = [token] if isinstance(token, str) else list(token or [])
    if token is not None and (not tokens or any(not t.strip() for t in tokens)):
        raise BindError(f"the token is empty; pass a non-empty --token, --token-file or {TOKEN_ENV}")
    if not is_loopback(host) and token is None:
        raise BindError(
            f"refusing to listen on {host}: this server runs model-written code, and only a loopback address "
            f"(127.0.0.1, the default) may go without a token. Pass --token-file (or set {TOKEN_ENV}); clients then "
            "send 'Authorization: Bearer <token>' or use the base URL http://HOST:PORT/token/<token>"
        )


def client_of(scope: Scope) -> str:
    """The client a request came from (see the module docstring); ``"local"`` outside a Guard."""
    return str(scope.get(CLIENT_KEY) or "local")


def _hostname(value: str) -> str:
    """The host part of a ``Host`` header or of an origin's authority (``[::1]:8000`` -> ``::1``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class Guard:
    """The ASGI middleware described in the module docstring; ``token=None`` lets every request in.

    ``token`` is one token, or a mapping token -> client name (several clients, each its own token)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | Mapping[str, str] | None,
        max_request_bytes: int,
        max_session_s: float | None,
        idle_s: float | None = None,
        allowed_hosts: Iterable[str] = (),
        allowed_origins: Iterable[str] = (),
        read_timeout_s: float | None = 10.0,
    ) -> None:
        self.app = app
        self.idle_s = idle_s
        self.tokens: dict[str, str] | None = (
            None if token is None else {token: "default"} if isinstance(token, str) else dict(token)
        )
        self.named = self.tokens is not None and len(self.tokens) > 1
        self.max_request_bytes = max_request_bytes
        self.max_session_s = max_session_s
        hosts = {h.lower().strip("[]") for h in allowed_hosts}
        self.any_host = "*" in hosts
        self.hosts = hosts | set(LOOPBACK_HOSTS)
        origins = {o.lower().rstrip("/") for o in allowed_origins}
        self.any_origin = "*" in origins
        self.origins = origins
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refused = self._foreign(scope)
        if refused is not None:
            await _refuse(scope, send, *refused)
            return
        name = self._client(scope)
        if name is None:
            await _refuse(
                scope,
                send,
                401,
                "missing or wrong token: send 'Authorization: Bearer <token>' or use "
                "the base URL http://HOST:PORT/token/<token>",
            )
            return
        scope[CLIENT_KEY] = name
        if kind == "http":
            await self._http(scope, receive, send)
        else:
            await self._websocket(scope, receive, send)

    def _foreign(self, scope: Scope) -> tuple[int, str] | None:
        """Why a request that a browser may have sent from another site is refused, or ``None``."""
        headers = _headers(scope)
        host = headers.get(b"host", b"").decode("latin-1")
        if not self.any_host and _hostname(host) not in self.hosts:
            return 400, (
                f"Host {host!r} is not one this server answers (a DNS-rebinding page would send it); "
                "start the server with --allow-host NAME to answer it"
            )
        origin = headers.get(b"origin")
        unsafe = scope["type"] == "websocket" or scope.get("method", "GET") in UNSAFE_METHODS
        if origin is not None and unsafe and not self._origin_allowed(origin.decode("latin-1")):
            return 403, (
                f"Origin {origin.decode('latin-1')!r} may not call this server (a web page's request); "
                "start it with --allow-origin ORIGIN to allow that site"
            )
        return None

    def _origin_allowed(self, origin: str) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if self.any_origin or origin in self.origins:
            return True
        scheme, sep, authority = origin.partition("://")
        return bool(sep) and scheme in ("http", "https") and is_loopback(_hostname(authority))

    def _client(self, scope: Scope) -> str | None:
        """The request's client (see the module docstring), or ``None`` when its token is missing or wrong."""
        headers = _headers(scope)
        label = headers.get(CLIENT_HEADER, b"").decode("latin-1").strip()[:64]
        peer = scope.get("client")
        fallback = f"label:{label}" if label else f"addr:{peer[0]}" if peer else "local"
        if self.tokens is None:
            return fallback
        path: str = scope.get("path", "")
        given: str | None = None
        if path.startswith(TOKEN_PREFIX):
            given, _, rest = path[len(TOKEN_PREFIX) :].partition("/")
            scope["path"] = "/" + rest  # the routes see the path without the token
            scope["raw_path"] = scope["path"].encode()
        else:
            scheme, _, value = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
            given = value.strip() if scheme.lower() == "bearer" else None
        if not given:
            return None
        for token, name in self.tokens.items():  # every one compared: the time taken says nothing of which matched
            if hmac.compare_digest(given.encode(), token.encode()):
                return f"token:{name}" if self.named else fallback
        return None

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        limit = self.max_request_bytes
        headers = _headers(scope)
        length = headers.get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:
            await _refuse(
                scope,
                send,
                413,
                f"the request body is {int(length)} bytes; this server takes at most {limit} (--max-request-bytes)",
            )
            return
        has_body = (length.isdigit() and int(length) > 0) or b"transfer-encoding" in headers
        media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if scope.get("method") in UNSAFE_METHODS and has_body and media != b"application/json":
            shown = media.decode("latin-1") or "none"
            await _refuse(
                scope, send, 415, f"the body's content-type is {shown}; this server takes application/json only"
            )
            return
        # Read the body here, bounded in size and time, and hand the route a replay of it: a chunked upload cannot
        # outgrow the limit, and a body sent a byte a minute does not hold a connection for ever.
        body, more, size = [], True, 0
        loop = asyncio.get_running_loop()
        deadline = None if self.read_timeout_s is None else loop.time() + self.read_timeout_s
        while more:
            try:  # one deadline for the whole body: a trickle of small chunks cannot stretch it
                left = None if deadline is None else max(deadline - loop.time(), 0.0)
                message = await asyncio.wait_for(receive(), left)
            except TimeoutError:
                await _refuse(scope, send, 408, f"the request body did not arrive within {self.read_timeout_s:g} s")
                return
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


def _headers(scope: Scope) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in scope.get("headers", [])}


def read_token_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """The tokens of a token file: one per line, ``TOKEN`` or ``NAME TOKEN`` (``#`` starts a comment); token ->
    client name. Several tokens make several clients, each served in turn by the fair queues."""
    tokens: dict[str, str] = {}
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise BindError(f"cannot read the token file {path}: {exc.strerror or exc}") from None
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) > 2:
            raise BindError(f"{path}, line {number}: a line is TOKEN or NAME TOKEN, got {len(parts)} words")
        name, token = (parts[0], parts[1]) if len(parts) == 2 else (f"client{len(tokens) + 1}", parts[0])
        tokens[token] = name
    if not tokens:
        raise BindError(f"the token file {path} holds no token")
    return tokens


def resolve_token(token: str | None, token_file: str | None = None) -> str | dict[str, str] | None:
    """The token given, else the tokens of ``token_file`` (or of the file named by :data:`TOKEN_FILE_ENV`), else the
    one in :data:`TOKEN_ENV`, else ``None``. Prefer a file or the environment: ``--token`` shows in the process
    list (``/proc/PID/cmdline``) to every user of the machine."""
    if token is not None:
        return token
    token_file = token_file or os.environ.get(TOKEN_FILE_ENV) or None
    if token_file:
        tokens = read_token_file(token_file)
        return next(iter(tokens)) if len(tokens) == 1 else tokens
    return os.environ.get(TOKEN_ENV) or None
