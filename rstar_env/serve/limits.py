"""What one caller may ask of a server, and what the server holds for all of them: :class:`Limits`.

Each limit's default and help are written once, here (as TRL's config dataclasses give each field its default,
help and flag once): ``rstar-env serve`` builds its options from these fields (:func:`limit_option`), so the
command line and the Python API cannot drift apart. This module imports nothing of the server (no FastAPI), so the
command line can read it without the ``serve`` extra installed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def _limit(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Limits:
    """What one caller may ask of a server, and what the server holds for all of them (``help(Limits)`` and
    :func:`limit_help` give each field's meaning)."""

    max_sessions: int = _limit(
        64, "Sessions of every kind together: /ws, /mcp sessions, HTTP episodes, /run_jupyter runs."
    )
    max_request_bytes: int = _limit(1 << 20, "Largest HTTP body or WebSocket message.")
    max_session_s: float | None = _limit(3600.0, "Wall-clock life of one session of any kind.")
    idle_timeout_s: float | None = _limit(600.0, "How long a session or HTTP episode may wait for its next message.")
    drain_s: float = _limit(10.0, "On SIGTERM, how long running requests may take to finish.")
    max_jupyter_cells: int = _limit(256, "Cells of one /run_jupyter request.")
    call_slots: int | None = _limit(
        None,
        "/run_code (and /verify) calls running at once, more wait their turn fairly per client [default: half the "
        "sandbox pool's workers, so the rest stay free for episodes' tool calls; twice the CPUs for /verify].",
    )
    max_calls_per_client: int | None = _limit(
        None, "/run_code (and /verify) calls one client may have running at once [default: --call-slots]."
    )
    max_connections: int = _limit(
        8192, "Open connections (and running requests) before new ones are answered 503 (uvicorn's limit_concurrency)."
    )
    backlog: int = _limit(
        8192,
        "Connections the kernel queues before the server accepts them (bounded by net.core.somaxconn); the command "
        "line sets it to max(--max-connections, 4096).",
    )
    read_timeout_s: float = _limit(10.0, "How long a request's headers, then its body, may take to arrive.")
    keep_alive_s: float = _limit(5.0, "How long an idle HTTP connection stays open for its next request.")
    allowed_hosts: tuple[str, ...] = _limit(
        (),
        "Host header values answered besides loopback names (several may be given; default for a non-loopback "
        "host: any); '*': any.",
    )
    allowed_origins: tuple[str, ...] = _limit(
        (), "Browser origins (scheme://host[:port]) allowed besides loopback ones (several may be given); '*': any."
    )


_FIELDS = {f.name: f for f in dataclasses.fields(Limits)}


def limit_help(name: str) -> str:
    """The help of the :class:`Limits` field ``name``."""
    return _FIELDS[name].metadata["help"]


def limit_option(name: str, *flags: str, **click_kwargs: Any) -> Any:
    """A ``click.option`` for the :class:`Limits` field ``name``, its default and help taken from the field (the
    flag defaults to ``--name-with-dashes``; ``click_kwargs`` add its type, ``multiple``...)."""
    import click

    spec = _FIELDS[name]
    default = spec.default
    kwargs: dict[str, Any] = {"help": spec.metadata["help"]}
    if not click_kwargs.get("multiple"):  # a repeatable option's default is its empty tuple
        kwargs.update(default=default, show_default=default is not None)
    return click.option(*(flags or ("--" + name.replace("_", "-"),)), name, **kwargs, **click_kwargs)
