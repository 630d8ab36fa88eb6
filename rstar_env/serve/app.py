"""Build a server (:func:`build_app`) and run it until SIGTERM (:func:`serve`).

One app may mount the env, the sandbox and the verifier together: every route shares one
:class:`~rstar_env.serve.resources.Resources`. :func:`serve` prints ``rstar-env serve: listening on
http://HOST:PORT`` once the socket is bound (``port=0`` picks a free port: read it from that line), and on SIGTERM
or SIGINT stops accepting, lets running requests finish for up to ``drain_s`` seconds, closes every session (its
episode and sandbox session), then the sandbox pool and the reward plugin's workers: nothing it started is left.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from rstar_env import __version__
from rstar_env.runtime import runtime
from rstar_env.serve.fair import FairGate
from rstar_env.serve.guard import Guard, check_bind, is_loopback
from rstar_env.serve.limits import Limits
from rstar_env.serve.net import header_protocol, raise_open_files, redact_logs
from rstar_env.serve.resources import Resources
from rstar_env.serve.sessions import Sessions

ROUTES = ("env", "sandbox", "verify")
"""What a server can mount: the OpenEnv env, the SandboxFusion sandbox, the verifier."""

READY_LINE = "rstar-env serve: listening on http://{host}:{port}"

log = logging.getLogger("rstar_env.serve")


def build_app(
    resources: Resources,
    routes: Iterable[str] = ROUTES,
    *,
    limits: Limits = Limits(),  # noqa: B008 (a frozen dataclass: one shared default is safe)
    token: str | Mapping[str, str] | None = None,
) -> Any:
    """The ASGI app: the chosen ``routes`` on ``resources``, behind the :class:`~rstar_env.serve.guard.Guard`.
    Its lifespan closes the sessions and then ``resources`` at shutdown."""
    chosen = list(routes)
    unknown = set(chosen) - set(ROUTES)
    if unknown or not chosen:
        raise ValueError(f"routes must be some of {ROUTES}, got {chosen}")
    sessions = Sessions(limits.max_sessions, idle_s=limits.idle_timeout_s, max_session_s=limits.max_session_s)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await sessions.close_all()  # every kind: its episode and sandbox session
        await resources.aclose()

    app = FastAPI(
        title="rstar-env",
        version=__version__,
        lifespan=lifespan,
        description="rstar-env's env (OpenEnv), sandbox (SandboxFusion) and verifier.",
    )
    app.state.sessions = sessions
    app.add_exception_handler(RequestValidationError, _bad_request)
    if "env" in chosen:
        from rstar_env.serve.env_server import add_env_routes

        add_env_routes(app, resources, sessions)
    else:

        @app.get("/health", tags=["Health"])
        async def health() -> dict[str, str]:
            return {"status": "healthy"}

    if "sandbox" in chosen:
        from rstar_env.serve.sandbox_server import add_sandbox_routes

        workers = int(getattr(resources.sandbox, "max_concurrency", 16) or 16)
        gate = FairGate(limits.call_slots or max(1, workers // 2), limits.max_calls_per_client)
        app.state.run_code_gate = gate
        add_sandbox_routes(app, resources, sessions=sessions, gate=gate, max_cells=limits.max_jupyter_cells)
    from rstar_env.serve.verify import add_verify_route

    verify_gate = FairGate(limits.call_slots or 2 * (os.cpu_count() or 1), limits.max_calls_per_client)
    app.state.verify_gate = verify_gate
    add_verify_route(app, resources, verify_gate)
    return Guard(
        app,
        token=token,
        max_request_bytes=limits.max_request_bytes,
        max_session_s=limits.max_session_s,
        idle_s=limits.idle_timeout_s,
        allowed_hosts=limits.allowed_hosts,
        allowed_origins=limits.allowed_origins,
        read_timeout_s=limits.read_timeout_s,
    )


async def _bad_request(request: Request, exc: Exception) -> JSONResponse:
    """A request that does not validate is a 400 that names each field and what is wrong with it."""
    assert isinstance(exc, RequestValidationError)
    errors = [
        {"loc": list(error.get("loc", ())), "msg": error.get("msg", ""), "type": error.get("type", "")}
        for error in exc.errors()
    ]
    named = "; ".join(f"{'.'.join(str(p) for p in e['loc'] if p != 'body') or 'body'}: {e['msg']}" for e in errors)
    return JSONResponse({"detail": errors, "message": f"invalid request: {named}"}, status_code=400)


def serve(
    resources: Resources,
    routes: Iterable[str] = ROUTES,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | Mapping[str, str] | None = None,
    limits: Limits = Limits(),  # noqa: B008 (a frozen dataclass: one shared default is safe)
    log_level: str = "warning",
) -> None:
    """Run the server until SIGTERM/SIGINT (see the module docstring). Refuses a non-loopback ``host`` without a
    ``token`` (:class:`~rstar_env.serve.guard.BindError`) before binding anything."""
    import uvicorn

    check_bind(host, token)
    if not is_loopback(host) and host not in limits.allowed_hosts:
        # Reached by a name or address this process cannot know; the token keeps strangers out.
        limits = replace(limits, allowed_hosts=(*limits.allowed_hosts, "*"))
    app = build_app(resources, routes, limits=limits, token=token)
    raise_open_files()  # one descriptor per connection: thousands of sessions need more than the usual 1024
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), port))
    sock.listen(limits.backlog)
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
        http=header_protocol(limits.read_timeout_s),
        limit_concurrency=limits.max_connections,
        timeout_keep_alive=limits.keep_alive_s,
        backlog=limits.backlog,
        h11_max_incomplete_event_size=16 * 1024,
    )
    secrets = [token] if isinstance(token, str) else list(token or [])
    redact_logs(secrets)  # after uvicorn.Config, which set up its loggers and handlers
    server = uvicorn.Server(config)
    # uvicorn turns SIGTERM/SIGINT into a graceful shutdown, then raises the signal again under the handler it found:
    # with this one, that ends serve() normally, so the cleanup below runs and the process exits 0. The same handler
    # takes a signal that comes before uvicorn has installed its own (a client that read the ready line may stop the
    # server at once): the server then shuts down as soon as it has started, instead of missing the signal.
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, functools.partial(_stop, server))
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


def _stop(server: Any, signum: int, frame: Any) -> None:
    """A stop signal outside uvicorn's handler: before uvicorn took the signals, it asks ``server`` to shut down once
    started (uvicorn checks ``should_exit`` before serving); after uvicorn shut down, it is uvicorn re-raising the
    signal, and setting the flag again does nothing."""
    server.should_exit = True
