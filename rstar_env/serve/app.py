"""Build a server (:func:`build_app`) and run it until SIGTERM (:func:`serve`).

One app may mount the env, the sandbox and the verifier together: every route shares one
:class:`~rstar_env.serve.resources.Resources`. :func:`serve` prints ``rstar-env serve: listening on
http://HOST:PORT`` once the socket is bound (``port=0`` picks a free port: read it from that line), and on SIGTERM
or SIGINT stops accepting, lets running requests finish for up to ``drain_s`` seconds, closes every session (its
episode and sandbox session), then the sandbox pool and the reward plugin's workers: nothing it started is left.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from rstar_env import __version__
from rstar_env.runtime import runtime
from rstar_env.serve.guard import Guard, check_bind
from rstar_env.serve.resources import Resources

ROUTES = ("env", "sandbox", "verify")
"""What a server can mount: the OpenEnv env, the SandboxFusion sandbox, the verifier."""

READY_LINE = "rstar-env serve: listening on http://{host}:{port}"

log = logging.getLogger("rstar_env.serve")


@dataclass(frozen=True)
class Limits:
    """What one caller may ask of a server."""

    max_sessions: int = 64
    """Concurrent /ws sessions (and, separately, open HTTP episodes)."""
    max_request_bytes: int = 1 << 20
    """One HTTP body or one WebSocket message."""
    max_session_s: float | None = 3600.0
    """Wall-clock life of one /ws session (``None``: unlimited)."""
    idle_timeout_s: float | None = 600.0
    """How long a /ws session or an HTTP episode may wait for its next message."""
    drain_s: float = 10.0
    """At shutdown, how long running requests may take to finish."""


def build_app(
    resources: Resources, routes: Iterable[str] = ROUTES, *, limits: Limits = Limits(), token: str | None = None
) -> Any:
    """The ASGI app: the chosen ``routes`` on ``resources``, behind the :class:`~rstar_env.serve.guard.Guard`.
    Its lifespan closes the sessions and then ``resources`` at shutdown."""
    chosen = list(routes)
    unknown = set(chosen) - set(ROUTES)
    if unknown or not chosen:
        raise ValueError(f"routes must be some of {ROUTES}, got {chosen}")
    episodes = None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        server = getattr(app.state, "openenv_server", None)
        destroy = getattr(server, "_destroy_session", None)  # OpenEnv's own way to close a session and its env
        if destroy is not None:  # sessions whose disconnect the route had not seen yet
            for session_id in list(getattr(server, "_sessions", {})):
                await destroy(session_id)
        if episodes is not None:
            await episodes.close_all()
        await resources.aclose()

    app = FastAPI(
        title="rstar-env",
        version=__version__,
        lifespan=lifespan,
        description="rstar-env's env (OpenEnv), sandbox (SandboxFusion) and verifier.",
    )
    if "env" in chosen:
        from rstar_env.serve.env_server import add_env_routes

        episodes = add_env_routes(app, resources, max_sessions=limits.max_sessions, idle_s=limits.idle_timeout_s)
    else:

        @app.get("/health", tags=["Health"])
        async def health() -> dict[str, str]:
            return {"status": "healthy"}

    if "sandbox" in chosen:
        from rstar_env.serve.sandbox_server import add_sandbox_routes

        add_sandbox_routes(app, resources)
    if "verify" in chosen or "sandbox" in chosen or "env" in chosen:
        from rstar_env.serve.verify import add_verify_route

        add_verify_route(app, resources)
    return Guard(
        app,
        token=token,
        max_request_bytes=limits.max_request_bytes,
        max_session_s=limits.max_session_s,
        idle_s=limits.idle_timeout_s,
    )


def serve(
    resources: Resources,
    routes: Iterable[str] = ROUTES,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    limits: Limits = Limits(),
    log_level: str = "warning",
) -> None:
    """Run the server until SIGTERM/SIGINT (see the module docstring). Refuses a non-loopback ``host`` without a
    ``token`` (:class:`~rstar_env.serve.guard.BindError`) before binding anything."""
    import uvicorn

    check_bind(host, token)
    app = build_app(resources, routes, limits=limits, token=token)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.set_inheritable(False)
    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=False,
        lifespan="on",
        # A message over the limit is answered by the Guard and the session goes on; far past it, the connection
        # is closed before the message is even buffered.
        ws_max_size=max(4 * limits.max_request_bytes, limits.max_request_bytes + (1 << 20)),
        timeout_graceful_shutdown=limits.drain_s,
    )
    server = uvicorn.Server(config)
    # uvicorn turns SIGTERM/SIGINT into a graceful shutdown, then raises the signal again under the handler it found:
    # with this one, that ends serve() normally, so the cleanup below runs and the process exits 0.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _after_shutdown)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(READY_LINE.format(host=shown, port=bound), flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        left = runtime().sandboxes.close_all()  # nothing of the pool outlives the server, whatever happened
        if left:
            log.warning("closed %d shared sandbox(es) left open at shutdown", len(left))
        sys.stdout.flush()


def _after_shutdown(signum: int, frame: Any) -> None:
    """The signal handler uvicorn re-raises the stop signal under once it has shut down: nothing left to do."""
