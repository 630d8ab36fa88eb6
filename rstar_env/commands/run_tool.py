"""``rstar-env run-tool``: one tool call, its result printed as JSON."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from rstar_env._cli_util import fail, one_line


def _tool_spec(config: str | None, name: str) -> dict[str, Any]:
    from rstar_env.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        fail(str(exc))
    for spec in cfg.tools:
        if spec.name == name:
            return dict(spec.options)
    return {}


@click.command("run-tool")
@click.argument("name")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Take the tool's options from this config.")
@click.option("--arguments", "arguments", help="The call's arguments as JSON (default for python: code from stdin).")
@click.option("--backend", help="Sandbox backend for the python tool (overrides the config).")
@click.option("--timeout", "timeout_s", type=float, help="Time limit in seconds (overrides the config).")
def run_tool(
    name: str, config: str | None, arguments: str | None, backend: str | None, timeout_s: float | None
) -> None:
    """Run one tool call and print the result as JSON.

    For ``python``, the code is read from standard input and the sandbox's ExecResult is printed:
    ``echo 'print(1+1)' | rstar-env run-tool python``.
    """
    from rstar_env import aio
    from rstar_env.plugins import PluginError, invoke, load_tool
    from rstar_env.tool import EpisodeContext, validate_arguments

    options = _tool_spec(config, name)
    if backend:
        options["backend"] = backend
    if timeout_s:
        options["timeout_s"] = timeout_s
    try:
        tool = load_tool(name, **options)
    except PluginError as exc:
        fail(str(exc))
    except Exception as exc:  # a tool's constructor (a plugin, or the sandbox it builds) refused its options
        fail(one_line(f"{name}: could not build the tool", exc))

    async def run() -> dict[str, Any]:
        try:
            if arguments is None and name == "python":
                code = sys.stdin.read()
                result = await tool.sandbox.execute(code, timeout_s=tool.timeout_s)
                return result.to_dict()
            try:
                args = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                fail(f"--arguments is not valid JSON: {exc}")
            if not isinstance(args, dict):
                fail(f"--arguments must be a JSON object of the {name} tool's arguments, got {type(args).__name__}")
            problem = validate_arguments(tool.schema, args)  # the env's check, so a bad call fails the same way
            if problem is not None:
                fail(f"{name}: {problem}")
            # the env's way of calling a plugin: `async def` awaited, a plain `def` run in a thread
            result = await invoke(tool.call, args, EpisodeContext(episode_id="cli"))
            return result.to_dict()
        finally:
            closer = getattr(tool, "aclose", None)
            if closer is not None:
                await closer()

    try:
        result = aio.run_sync(run())
    except click.ClickException:
        raise
    except Exception as exc:  # the sandbox or the plugin failed (not the code it ran: that is a result, above)
        fail(one_line(f"{name}: the call failed", exc))
    click.echo(json.dumps(result, indent=2, ensure_ascii=False))


command = run_tool
