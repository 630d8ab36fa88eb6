"""The ``rstar-env`` command line."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from rstar_env import __version__

console = Console(stderr=True)


def _fail(message: str) -> None:
    raise click.ClickException(message)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="rstar-env")
def main() -> None:
    """rstar-env: agentic RL for math reasoning with a Python tool."""


# -- plugins -----------------------------------------------------------------------------------------------------
@main.command()
@click.option("--kind", type=click.Choice(["tool", "reward", "sampler"]), help="Only this kind of plugin.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def plugins(kind: str | None, as_json: bool) -> None:
    """List registered plugins and the package each comes from."""
    from rstar_env.plugins import PluginError, list_plugins

    try:
        infos = list_plugins(kind)  # type: ignore[arg-type]
    except PluginError as exc:
        _fail(str(exc))
    rows = [
        {"kind": i.kind, "name": i.name, "source": i.source, "class": f"{i.cls.__module__}.{i.cls.__qualname__}"}
        for i in infos
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="rstar-env plugins")
    for column in ("kind", "name", "source", "class"):
        table.add_column(column)
    for row in rows:
        table.add_row(*row.values())
    Console().print(table)


# -- run-tool ----------------------------------------------------------------------------------------------------
def _tool_spec(config: str | None, name: str) -> dict[str, Any]:
    from rstar_env.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except ConfigError as exc:
        _fail(str(exc))
    for spec in cfg.tools:
        if spec.name == name:
            return dict(spec.options)
    return {}


@main.command("run-tool")
@click.argument("name")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Take the tool's options from this config.")
@click.option("--arguments", "arguments", help="The call's arguments as JSON (default for python: code from stdin).")
@click.option("--backend", help="Sandbox backend for the python tool (overrides the config).")
@click.option("--timeout", "timeout_s", type=float, help="Time limit in seconds (overrides the config).")
def run_tool(name: str, config: str | None, arguments: str | None, backend: str | None, timeout_s: float | None) -> None:
    """Run one tool call and print the result as JSON.

    For ``python``, the code is read from standard input and the sandbox's ExecResult is printed:
    ``echo 'print(1+1)' | rstar-env run-tool python``.
    """
    from rstar_env import _aio
    from rstar_env.plugins import PluginError, load_tool
    from rstar_env.tool import EpisodeContext

    options = _tool_spec(config, name)
    if backend:
        options["backend"] = backend
    if timeout_s:
        options["timeout_s"] = timeout_s
    try:
        tool = load_tool(name, **options)
    except PluginError as exc:
        _fail(str(exc))

    async def run() -> dict[str, Any]:
        try:
            if arguments is None and name == "python":
                code = sys.stdin.read()
                result = await tool.sandbox.execute(code, timeout_s=tool.timeout_s)
                return result.to_dict()
            try:
                args = json.loads(arguments or "{}")
            except json.JSONDecodeError as exc:
                _fail(f"--arguments is not valid JSON: {exc}")
            result = await tool.call(args, EpisodeContext(episode_id="cli"))
            return result.to_dict()
        finally:
            closer = getattr(tool, "aclose", None)
            if closer is not None:
                await closer()

    click.echo(json.dumps(_aio.run_sync(run()), indent=2, ensure_ascii=False))


# -- episode -----------------------------------------------------------------------------------------------------
def _read_turn(prompt: str) -> str | None:
    """One assistant turn from the terminal: lines until a line holding only '.', or None at end of input."""
    console.print(f"[bold cyan]{prompt}[/] [dim](end with a line holding only '.'; Ctrl-D quits)[/]")
    lines: list[str] = []
    for line in sys.stdin:
        if line.rstrip("\n") == ".":
            return "\n".join(lines)
        lines.append(line.rstrip("\n"))
    return "\n".join(lines) if lines else None


@main.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Run config (YAML).")
@click.option("--problem", help="The problem (default: drawn from the config's dataset).")
@click.option("--answer", "gold", help="The gold answer for --problem.")
@click.option("--script", type=click.Path(exists=True, dir_okay=False), help="A JSON list of actions to play.")
@click.option("--seed", type=int, default=None, help="Seed for drawing the problem.")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the final Trajectory as JSON here.")
def episode(
    config: str | None, problem: str | None, gold: str | None, script: str | None, seed: int | None, out: str | None
) -> None:
    """Play one episode: you type the assistant turns (or --script plays them), the env answers.

    Handy for debugging tools and verifiers: you see exactly what the model would see.
    """
    from rstar_env.config import ConfigError
    from rstar_env.env import MathToolEnv
    from rstar_env.plugins import PluginError

    if (problem is None) != (gold is None):
        _fail("--problem and --answer go together")
    actions: list[str] | None = None
    if script:
        actions = json.loads(Path(script).read_text(encoding="utf-8"))
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            _fail(f"{script}: expected a JSON list of strings (the assistant actions)")
    try:
        env = MathToolEnv(config=config)
    except (ConfigError, PluginError) as exc:
        _fail(str(exc))
    try:
        options = {"problem": problem, "answer": gold} if problem is not None else None
        obs, info = env.reset(seed=seed, options=options)
        console.rule("prompt")
        console.print(obs, markup=False, highlight=False)
        turn = 0
        while True:
            turn += 1
            if actions is not None:
                if turn > len(actions):
                    _fail(f"the script has {len(actions)} actions; the episode has not ended")
                action: str | None = actions[turn - 1]
                console.rule(f"assistant (turn {turn})")
                console.print(action, markup=False, highlight=False)
            else:
                action = _read_turn(f"assistant turn {turn}>")
            if action is None:
                console.print("[yellow]input ended; episode abandoned[/]")
                return
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
            console.rule("environment")
            console.print(obs, markup=False, highlight=False)
        traj = info["trajectory"]
        console.rule("episode over")
        console.print(
            f"end: [bold]{traj.end_reason}[/]  reward: [bold]{reward}[/]  extracted: {traj.final_answer!r}  "
            f"gold: {traj.answer!r}  tool calls: {traj.num_tool_calls}  tool errors: {traj.tool_error_counts()}"
        )
        if out:
            Path(out).write_text(json.dumps(traj.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
            console.print(f"trajectory written to {out}")
    finally:
        env.close()


# -- bench -------------------------------------------------------------------------------------------------------
class _LazyGroup(click.Group):
    """Subcommands imported on use, so ``rstar-env --help`` stays fast and optional extras stay optional."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, _, attr = self.lazy[name].partition(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@main.group(
    cls=_LazyGroup,
    lazy={"sandbox": "rstar_env.bench.sandbox:command", "reward": "rstar_env.bench.reward:command"},
)
def bench() -> None:
    """Benchmarks that print side-by-side ratios measured in one run."""


if __name__ == "__main__":  # pragma: no cover
    main()
