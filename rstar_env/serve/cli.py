"""``rstar-env serve env | sandbox | verify``: run a server for other trainers (see :mod:`rstar_env.serve`)."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import click

from rstar_env._cli_util import fail, one_line
from rstar_env.serve import SERVE_EXTRA_HINT
from rstar_env.serve.guard import TOKEN_ENV, TOKEN_FILE_ENV, BindError, check_bind, resolve_token
from rstar_env.serve.limits import Limits, limit_option


def _options(func: Callable[..., Any]) -> Callable[..., Any]:
    decorators = [
        click.option(
            "--config",
            type=click.Path(dir_okay=False),
            default=None,
            help="Run config (YAML): env settings, tools, reward, dataset.",
        ),
        click.option(
            "--host",
            default="127.0.0.1",
            show_default=True,
            help=f"Address to listen on; anything but loopback needs a token (--token-file, or {TOKEN_ENV}).",
        ),
        click.option(
            "--port",
            type=click.IntRange(0, 65535),
            default=8000,
            show_default=True,
            help="Port (0: a free one, printed on the 'listening on' line).",
        ),
        click.option(
            "--token",
            default=None,
            help=f"Token every request must carry. Visible to every local user in /proc/PID/cmdline: prefer "
            f"--token-file or ${TOKEN_ENV}.",
        ),
        click.option(
            "--token-file",
            type=click.Path(dir_okay=False),
            default=None,
            help=f"File of tokens, one a line: TOKEN, or NAME TOKEN to give each client its own (fair queueing and "
            f"sessions go by name). Default: ${TOKEN_FILE_ENV}, then ${TOKEN_ENV}.",
        ),
        limit_option("allowed_origins", "--allow-origin", multiple=True),
        limit_option("allowed_hosts", "--allow-host", multiple=True),
        limit_option("max_sessions", type=click.IntRange(min=1)),
        limit_option("max_request_bytes", type=click.IntRange(min=1024)),
        limit_option("max_session_s", type=click.FloatRange(min=0, min_open=True)),
        limit_option("idle_timeout_s", type=click.FloatRange(min=0, min_open=True)),
        limit_option("max_jupyter_cells", type=click.IntRange(min=1)),
        limit_option("call_slots", type=click.IntRange(min=1)),
        limit_option("max_calls_per_client", type=click.IntRange(min=1)),
        limit_option("max_connections", type=click.IntRange(min=16)),
        limit_option("read_timeout_s", type=click.FloatRange(min=0, min_open=True)),
        limit_option("drain_s", type=click.FloatRange(min=0)),
        click.option(
            "--log-level",
            type=click.Choice(["critical", "error", "warning", "info", "debug"]),
            default="warning",
            show_default=True,
        ),
    ]
    return functools.reduce(lambda f, d: d(f), reversed(decorators), func)


def _run(
    routes: tuple[str, ...],
    *,
    config: str | None,
    host: str,
    port: int,
    token: str | None,
    token_file: str | None,
    log_level: str,
    model: str | None = None,
    dataset: str | None = None,
    **limit_options: Any,
) -> None:
    try:
        tokens = resolve_token(token, token_file)
        check_bind(host, tokens)  # before anything is built: a refused server starts nothing
    except BindError as exc:
        fail(str(exc))
    needed = ["fastapi", "uvicorn", *(["openenv"] if "env" in routes else [])]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        fail(f"rstar-env serve needs packages that are not installed ({', '.join(missing)}); {SERVE_EXTRA_HINT}")
    from rstar_env.serve.app import serve

    try:
        from rstar_env.serve.resources import Resources

        resources = Resources(config, model=model, dataset=dataset, load_dataset="env" in routes)
    except Exception as exc:
        fail(one_line("could not build the server's plugins", exc))
    # Every option named after a Limits field is that field; the listen backlog follows the connection cap.
    limits = Limits(**limit_options, backlog=max(limit_options["max_connections"], 4096))
    try:
        serve(resources, routes, host=host, port=port, token=tokens, limits=limits, log_level=log_level)
    except OSError as exc:  # the address is taken or cannot be bound
        fail(one_line(f"could not listen on {host}:{port}", exc))


@click.group("serve")
def command() -> None:
    """Servers for other trainers: the env (OpenEnv), the sandbox (SandboxFusion) and the verifier (/verify).

    Each binds 127.0.0.1 unless given a token (--token-file, or the environment); stops cleanly on SIGTERM
    (running requests finish, sessions and the sandbox pool are closed).
    """


@command.command("env")
@_options
@click.option(
    "--model",
    default=None,
    help="Model whose tokenizer renders token ids into observations (smollm2, a folder, a .gguf).",
)
@click.option("--dataset", default=None, help="Where reset without a problem draws one (default: the config's).")
def env_command(**options: Any) -> None:
    """The env as an OpenEnv server (/ws, /reset, /step, /state, /health, /schema, /capacity), with /run_code,
    /run_jupyter and /verify on the same warm pool."""
    _run(("env", "sandbox", "verify"), **options)


@command.command("sandbox")
@_options
def sandbox_command(**options: Any) -> None:
    """The sandbox behind SandboxFusion's /run_code and /run_jupyter (Python only), and /verify."""
    _run(("sandbox", "verify"), **options)


@command.command("verify")
@_options
def verify_command(**options: Any) -> None:
    """The verifier alone: POST /verify {"response", "gold"} -> {"reward", "extracted", "reason"}."""
    _run(("verify",), **options)
