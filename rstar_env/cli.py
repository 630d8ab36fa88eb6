"""The ``rstar-env`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from rstar_env import __version__
from rstar_env._cli_util import CommandGroup, console, interrupted_status, stops_on_sigterm
from rstar_env._cli_util import fail as _fail
from rstar_env._cli_util import one_line as _one_line

COMMANDS = "rstar_env.commands"
"""The entry-point group through which installed distributions mount commands into ``rstar-env`` (``name =
"module:click_command"``); the trainers mount ``train``, ``compare``, ``plot`` and ``roc-check`` this way.
``rstar_env.commands.launch`` does the same for ``rstar-env launch`` subcommands."""


@click.group(
    cls=CommandGroup,
    entry_points=COMMANDS,
    context_settings={"help_option_names": ["-h", "--help"]},
    lazy={"serve": "rstar_env.serve.cli:command"},
)  # servers for other trainers, imported on use
@click.version_option(__version__, prog_name="rstar-env")
def main() -> None:
    """rstar-env: agentic RL for math reasoning with a Python tool."""


# -- plugins -----------------------------------------------------------------------------------------------------
@main.command()
@click.option("--kind", type=click.Choice(["tool", "reward", "sampler"]), help="Only this kind of plugin.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--check", is_flag=True, help="Exit 1 when an installed plugin failed to load (for CI).")
def plugins(kind: str | None, as_json: bool, check: bool) -> None:
    """List registered plugins and the package each comes from, and those that failed to load.

    A plugin that fails to import or register is skipped (the others keep working) and listed under "failed to
    load"; the exit status is 0 unless --check is given. On a terminal the list is a table; piped, it is
    tab-separated rows with whole names.
    """
    import warnings

    from rstar_env.plugins import PluginLoadWarning, failed_plugins, list_plugins

    with warnings.catch_warnings():  # listed below, once, rather than as warnings too
        warnings.simplefilter("ignore", PluginLoadWarning)
        infos = list_plugins(kind)  # type: ignore[arg-type]
        failed = failed_plugins()
    rows = [
        {"kind": i.kind, "name": i.name, "source": i.source, "class": f"{i.cls.__module__}.{i.cls.__qualname__}"}
        for i in infos
    ]
    broken = [{"distribution": f.distribution, "entry_point": f.entry_point, "error": f.error} for f in failed]
    if as_json:
        click.echo(json.dumps({"plugins": rows, "failed": broken}, indent=2))
    elif not Console().is_terminal:  # piped: a table would be cut to 80 columns; whole names, one row a line
        click.echo("\t".join(("kind", "name", "source", "class")))
        for row in rows:
            click.echo("\t".join(row.values()))
        if broken:
            click.echo("\nfailed to load (skipped)\n" + "\t".join(("distribution", "entry point", "error")))
            for item in broken:
                click.echo("\t".join(" ".join(str(v).split()) for v in item.values()))
    else:
        table = Table(title="rstar-env plugins")
        for column in ("kind", "name", "source", "class"):
            table.add_column(column)
        for row in rows:
            table.add_row(*row.values())
        Console().print(table)
        if broken:
            failed_table = Table(title="failed to load (skipped)", title_style="bold red")
            for column in ("distribution", "entry point", "error"):
                failed_table.add_column(column, overflow="fold")
            for item in broken:
                failed_table.add_row(*item.values())
            Console().print(failed_table)
    if check and broken:
        console.print(f"[red]{len(broken)} plugin entry point(s) failed to load[/]")
        sys.exit(1)


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
        _fail(str(exc))
    except Exception as exc:  # a tool's constructor (a plugin, or the sandbox it builds) refused its options
        _fail(_one_line(f"{name}: could not build the tool", exc))

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
            if not isinstance(args, dict):
                _fail(f"--arguments must be a JSON object of the {name} tool's arguments, got {type(args).__name__}")
            problem = validate_arguments(tool.schema, args)  # the env's check, so a bad call fails the same way
            if problem is not None:
                _fail(f"{name}: {problem}")
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
        _fail(_one_line(f"{name}: the call failed", exc))
    click.echo(json.dumps(result, indent=2, ensure_ascii=False))


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

    Handy for debugging tools and reward plugins: you see exactly what the model would see.
    """
    from rstar_env.config import ConfigError
    from rstar_env.env import MathToolEnv
    from rstar_env.format import printable
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
        console.print(printable(obs), markup=False, highlight=False)
        turn = 0
        while True:
            turn += 1
            if actions is not None:
                if turn > len(actions):
                    _fail(f"the script has {len(actions)} actions; the episode has not ended")
                action: str | None = actions[turn - 1]
                console.rule(f"assistant (turn {turn})")
                console.print(printable(action), markup=False, highlight=False)
            else:
                action = _read_turn(f"assistant turn {turn}>")
            if action is None:
                console.print("[yellow]input ended; episode abandoned[/]")
                return
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
            console.rule("environment")
            console.print(printable(obs), markup=False, highlight=False)
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


# -- eval --------------------------------------------------------------------------------------------------------
def _endpoint_specs(
    cfg: Any, endpoints: tuple[str, ...], capacities: tuple[int, ...], concurrency: int | None
) -> list[Any]:
    """The engines to use: ``--endpoint`` (with ``--engine-capacity``, ``--engine-concurrency``) or the config's."""
    from rstar_env.config import EndpointSpec

    if not endpoints:
        specs = list(cfg.inference.endpoints) if cfg is not None else []
        if capacities:
            _fail("--engine-capacity goes with --endpoint (or set capacity_tokens in inference.endpoints)")
    else:
        if capacities and len(capacities) not in (1, len(endpoints)):
            _fail(
                f"--engine-capacity: give one value for all endpoints or one per --endpoint "
                f"({len(endpoints)}), got {len(capacities)}"
            )
        specs = []
        for i, url in enumerate(endpoints):
            capacity = capacities[0] if len(capacities) == 1 else capacities[i] if capacities else None
            specs.append(EndpointSpec(url=url, capacity_tokens=capacity))
    if concurrency is not None:
        specs = [spec.model_copy(update={"max_concurrency": concurrency}) for spec in specs]
    return specs


def _build_policy(
    model: str | None,
    endpoints: list[Any],
    served_model: str | None,
    sampling: Any,
    batch_size: int,
    env: Any,
    native_tools: bool = True,
    engine: str = "transformers",
    token_ids: bool = False,
) -> Any:
    if endpoints:
        from rstar_env.rollout.dispatch import endpoint_policy

        name = served_model or model
        if not name:
            _fail("--endpoint needs the served model's name: --served-model NAME")
        try:
            return endpoint_policy(
                env, endpoints, name, sampling=sampling, native_tools=native_tools, return_token_ids=token_ids
            )
        except ValueError as exc:
            _fail(str(exc))
    from rstar_env.rollout.local import ModelNotFoundError, TransformersPolicy
    from rstar_env.rollout.vllm import VLLMPolicy, choose_engine

    try:
        chosen, note = choose_engine(engine)  # the config's policy.engine
        if note:
            console.print(f"[dim]{note}[/]")
        if chosen == "vllm":
            return VLLMPolicy(model, sampling=sampling)
        return TransformersPolicy(model, sampling=sampling, batch_size=batch_size)
    except (ModelNotFoundError, ImportError) as exc:
        _fail(str(exc))


_ENDPOINT_HELP = (
    "OpenAI-compatible base URL (e.g. http://localhost:8000/v1); repeat for several engines, "
    "requests go to the one with the most free KV capacity."
)
_CAPACITY_HELP = (
    "KV-cache tokens of each --endpoint (one value for all, or one per endpoint); default: read "
    "from its vLLM /metrics, else --engine-concurrency."
)


@main.command("eval")
@click.option("--model", default=None, help="Local model: 'smollm2' (default), a model directory or a .gguf file.")
@click.option("--endpoint", "endpoints", multiple=True, help=_ENDPOINT_HELP)
@click.option("--engine-capacity", "capacities", type=click.IntRange(min=1), multiple=True, help=_CAPACITY_HELP)
@click.option(
    "--engine-concurrency",
    type=click.IntRange(min=1),
    default=None,
    help="Requests in flight per endpoint when its KV capacity is unknown [default: 64].",
)
@click.option("--served-model", default=None, help="Model name to request from --endpoint.")
@click.option(
    "--native-tools/--text-tools",
    default=True,
    show_default=True,
    help="With --endpoint: send tool schemas as `tools=` (hermes parser) or describe them in the prompt.",
)
@click.option(
    "--token-ids",
    is_flag=True,
    help="With --endpoint: record the sampled token ids and their log-probs in the trajectories (a vLLM server: "
    "its `return_token_ids` and `logprobs`; `transformers serve` refuses them).",
)
@click.option("--dataset", default=None, help="Dataset source (default: the config's, else 'arithmetic').")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Run config (env, tools, reward, dataset).")
@click.option("--samples", "-k", default=1, show_default=True, help="Samples per problem (pass@1 is their mean).")
@click.option("--limit", type=int, default=None, help="Only the first N problems.")
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Trajectories JSONL; a run resumes from what it already holds of the same model (another "
    "model's file is refused) [default: runs/eval/MODEL.jsonl, one file per model and weights].",
)
@click.option(
    "--temperature",
    type=float,
    default=None,
    help="Sampling temperature (0 is greedy) [default: the config's trainer.eval_temperature or "
    "trainer.temperature, else 1.0].",
)
@click.option(
    "--top-p", type=float, default=None, help="Nucleus sampling [default: the config's trainer.top_p, else 1.0]."
)
@click.option(
    "--max-new-tokens",
    type=int,
    default=None,
    help="Per assistant turn [default: the config's trainer.max_new_tokens, else 512].",
)
@click.option("--max-turns", type=int, default=None, help="Override the config's env.max_turns.")
@click.option("--width", type=int, default=32, show_default=True, help="Episodes in flight.")
@click.option("--batch-size", type=int, default=16, show_default=True, help="Local model batch size.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
@stops_on_sigterm
def eval_command(
    model: str | None,
    endpoints: tuple[str, ...],
    capacities: tuple[int, ...],
    engine_concurrency: int | None,
    served_model: str | None,
    dataset: str | None,
    native_tools: bool,
    token_ids: bool,
    config: str | None,
    samples: int,
    limit: int | None,
    out: str | None,
    temperature: float | None,
    top_p: float | None,
    max_new_tokens: int | None,
    max_turns: int | None,
    width: int,
    batch_size: int,
    seed: int,
    as_json: bool,
) -> None:
    """Evaluate a model: pass@1 over k samples, pass@k, lengths, turns, tool use; trajectories to JSONL.

    Sampling follows the config's trainer section (as the trainer's held-out evaluation does) unless
    --temperature, --top-p or --max-new-tokens say otherwise. On a terminal a progress bar shows; in a log
    (stderr not a terminal) a progress line is printed at every tenth of the episodes and every 30 s.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rstar_env import aio
    from rstar_env.config import ConfigError, load_config
    from rstar_env.data import DataError, load_dataset
    from rstar_env.plugins import PluginError
    from rstar_env.rollout.evaluate import EvalResumeError, evaluate, model_identity
    from rstar_env.rollout.metrics import format_summary_rows
    from rstar_env.rollout.policy import SamplingParams
    from rstar_env.vector import MathToolVectorEnv

    if samples < 1:
        _fail("--samples must be at least 1")
    try:
        cfg = load_config(config, dataset=dataset)
        spec = cfg.dataset
        rows = load_dataset(spec.source, **spec.model_dump(exclude={"source", "limit"}), limit=limit or spec.limit)
        sampling = SamplingParams(
            **_config_sampling(cfg.trainer, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens),
            seed=seed,
        )
    except (ConfigError, DataError, FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    if token_ids and not (endpoints or cfg.inference.endpoints):
        _fail("--token-ids goes with --endpoint (a local engine records token ids and log-probs anyway)")
    env_options: dict[str, Any] = {"config": cfg}
    if max_turns is not None:
        env_options["max_turns"] = max_turns
    total = len(rows) * samples
    try:
        env = MathToolVectorEnv(min(width, total), **env_options)
    except (ConfigError, PluginError) as exc:
        _fail(str(exc))
    specs = _endpoint_specs(cfg, endpoints, capacities, engine_concurrency)
    served_model = served_model or cfg.inference.served_model
    policy = _build_policy(
        model, specs, served_model, sampling, batch_size, env, native_tools, cfg.policy.engine, token_ids
    )
    if policy.tokenizer is not None:  # token-level truth: the env encodes prompt and feedback with the policy's
        for sub in env.envs:
            sub.tokenizer = policy.tokenizer
    identity = model_identity(model, served_model=served_model or model, endpoints=[s.url for s in specs])
    out = out or _default_eval_out(identity)
    # In a log a bar shows nothing until the end: plain lines there instead (as `train` prints).
    log = _ProgressLines(console, total) if not console.is_terminal else contextlib.nullcontext()
    with (
        Progress(
            TextColumn("[bold]eval"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.description}"),
            TimeElapsedColumn(),
            console=console,
            disable=not console.is_terminal,
        ) as progress,
        log,
    ):
        task = progress.add_task("", total=total)
        done = 0
        counts = {"correct": 0, "scored": 0, "failed": 0}

        def on_done(trajectory: Any) -> None:
            nonlocal done
            done += 1
            if trajectory.failed:  # an outage is not a wrong answer
                counts["failed"] += 1
            else:
                counts["correct"] += trajectory.reward > 0.5
                counts["scored"] += 1
            rate = f"pass@1 {counts['correct'] / counts['scored']:.3f}" if counts["scored"] else "pass@1 -"
            failed = f"  failed {counts['failed']}" if counts["failed"] else ""
            progress.update(task, advance=1, description=rate + failed)
            if isinstance(log, _ProgressLines):
                log.update(done, rate + failed)

        running: list[asyncio.Task[Any]] = []

        async def run() -> dict[str, Any]:
            running.append(asyncio.current_task())  # type: ignore[arg-type]
            try:
                return await evaluate(policy, rows, samples=samples, out=out, env=env, on_done=on_done, model=identity)
            finally:
                await policy.aclose()
                await env.aclose()

        try:
            summary = aio.run_sync(run())
        except EvalResumeError as exc:
            _fail(str(exc))
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the evaluation runs on in the runtime's loop
            if running:  # cancel it, and wait for its cleanup (the engine and its processes shut down)
                aio.run_sync(_cancel(running[0]))
            console.print(f"[yellow]stopped: finished episodes are in {out}; the same command continues the run[/]")
            raise SystemExit(interrupted_status(exc)) from None
        progress.update(task, completed=total)
        if isinstance(log, _ProgressLines):  # episodes resumed from --out count as done, as on the bar
            log.update(total, log.text)
    tps = getattr(policy, "tokens_per_second", None)
    if tps:
        summary["policy_tokens_per_second"] = tps
    summary["trajectories_file"] = out
    summary["model"] = identity
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        where = identity["model"] + (f" at {identity['endpoint']}" if "endpoint" in identity else "")
        table = Table(title=f"eval: {where} on {cfg.dataset.source}", caption=f"trajectories: {out}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in format_summary_rows(summary):
            table.add_row(key, value)
        Console().print(table)
    if summary.get("rescored_stale"):
        console.print(
            f"[yellow]eval: {summary['rescored_stale']} record(s) in {out} were scored with other settings "
            "(reward plugin, its options, or env settings) and were run again; the summary covers only the "
            "current settings.[/]"
        )
    failures = summary.get("env_errors", 0) + summary.get("policy_errors", 0)
    if failures:
        console.print(
            f"[red]eval: {failures} episode(s) ended in a system failure (env_error/policy_error) and were "
            f"not scored; the error is in each record's 'error' field of {out}. Run the same command "
            "again to retry them.[/]"
        )
        sys.exit(1)


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


_SAMPLING_KEYS = {
    "temperature": ("eval_temperature", "temperature"),
    "top_p": ("top_p",),
    "max_new_tokens": ("eval_max_new_tokens", "max_new_tokens", "max_new_tokens_per_turn"),
}
"""Where a config's trainer section keeps each sampling setting, first found wins: the held-out (``eval_``) value,
then the rollouts' (``max_new_tokens_per_turn`` is the OpenRLHF trainer's name)."""


def _config_sampling(trainer: dict[str, Any], **given: float | int | None) -> dict[str, Any]:
    """The sampling settings: a value given on the command line, else the config's (:data:`_SAMPLING_KEYS`), else
    :class:`SamplingParams`' default (left out)."""
    chosen: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            key = next((k for k in _SAMPLING_KEYS[name] if trainer.get(k) is not None), None)
            if key is None:
                continue
            value = trainer[key]
            integer = name == "max_new_tokens"
            if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
                _fail(
                    f"trainer.{key} must be {'an integer' if integer else 'a number'}, got {value!r} (fix the "
                    f"config, or pass --{name.replace('_', '-')})"
                )
        chosen[name] = value
    return chosen


class _ProgressLines:
    """Progress as plain lines, for a log (where a bar shows nothing until the end): ``done/total (percent)``,
    the caller's text (pass@1 so far) and the elapsed time, at every tenth of ``total`` and whenever ``every_s``
    passed without a line (a heartbeat, so a log never goes quiet while the first episodes run)."""

    def __init__(self, console: Console, total: int, *, every_s: float = 30.0) -> None:
        import threading

        self.console, self.total, self.every_s = console, max(total, 1), every_s
        self.done, self.text = 0, ""
        self._started = self._last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name="eval-progress", daemon=True)

    def __enter__(self) -> _ProgressLines:
        self._started = time.monotonic()
        with self._lock:
            self._emit()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def update(self, done: int, text: str = "") -> None:
        """``done`` of ``total`` finished; ``text`` goes on the line (and on the next heartbeat's)."""
        with self._lock:
            tenth = done * 10 // self.total > self.done * 10 // self.total
            self.done, self.text = done, text
            if tenth:
                self._emit()

    def _heartbeat(self) -> None:
        while not self._stop.wait(min(self.every_s, 5.0)):
            with self._lock:
                if time.monotonic() - self._last >= self.every_s:
                    self._emit()

    def _emit(self) -> None:
        now = time.monotonic()
        self._last = now
        elapsed = now - self._started
        clock = f"{elapsed:.0f} s" if elapsed < 120 else f"{elapsed / 60:.1f} min"
        text = f"  {self.text}" if self.text else ""
        self.console.print(
            f"eval: {self.done}/{self.total} ({100 * self.done / self.total:.0f}%){text}  elapsed {clock}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )


def _default_eval_out(identity: dict[str, str]) -> str:
    """``runs/eval/NAME[-HASH].jsonl``: one file per model (and weights), so runs of two models never meet."""
    import re

    name = re.sub(r"[^A-Za-z0-9._-]+", "-", identity["model"]).strip("-.")[-60:] or "model"
    return f"runs/eval/{name}" + (f"-{identity['hash'][:8]}" if "hash" in identity else "") + ".jsonl"


# -- chat ----------------------------------------------------------------------------------------------------------
@main.command()
@click.option("--model", default=None, help="Local model: 'smollm2' (default), a model directory or a .gguf file.")
@click.option("--endpoint", "endpoints", multiple=True, help=_ENDPOINT_HELP)
@click.option("--served-model", default=None, help="Model name to request from --endpoint.")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Run config (tools, reward, env).")
@click.option("--temperature", type=float, default=0.7, show_default=True)
@click.option(
    "--max-new-tokens",
    type=int,
    default=None,
    help="Per assistant turn [default: the config's trainer.max_new_tokens, else 512].",
)
@click.option("--max-turns", type=int, default=10, show_default=True)
@click.option("--answer", "gold", default=None, help="A gold answer to score the final response against.")
@stops_on_sigterm
def chat(
    model: str | None,
    endpoints: tuple[str, ...],
    served_model: str | None,
    config: str | None,
    temperature: float,
    max_new_tokens: int | None,
    max_turns: int,
    gold: str | None,
) -> None:
    """Chat with a model that can run Python: each question is an episode; tool calls and their results are shown
    as they happen. Type a question; /quit, /exit, an empty line or Ctrl-D ends the chat. Without --answer the
    episodes are unscored."""
    from rich.markup import escape

    from rstar_env import aio
    from rstar_env.config import ConfigError, load_config
    from rstar_env.env import MathToolEnv
    from rstar_env.format import extract_answer, printable
    from rstar_env.plugins import PluginError
    from rstar_env.rollout.collect import context_ids
    from rstar_env.rollout.policy import Request, SamplingParams

    out = Console(highlight=False)  # the conversation is the command's output: stdout
    try:
        cfg = load_config(config)
        if gold is None:  # a question typed in a chat has no gold answer: run it unscored, not as a data error
            cfg = cfg.model_copy(update={"dataset": cfg.dataset.model_copy(update={"allow_unscored": True})})
        env = MathToolEnv(config=cfg, max_turns=max_turns)
    except (ConfigError, PluginError) as exc:
        _fail(str(exc))
    sampling = SamplingParams(
        temperature=temperature, **_config_sampling(cfg.trainer, max_new_tokens=max_new_tokens)
    )  # as trained
    specs = _endpoint_specs(cfg, endpoints, (), None)
    with out.status("loading the model...", spinner="dots"):
        policy = _build_policy(
            model, specs, served_model or cfg.inference.served_model, sampling, 1, env, engine=cfg.policy.engine
        )
    env.tokenizer = policy.tokenizer
    hidden = _chat_markers(env, policy.tokenizer)

    async def episode(question: str) -> None:
        await env.areset(options={"problem": question, "answer": gold})
        key = uuid.uuid4().hex  # one key per episode: several engines keep its turns on one (prefix cache)
        while True:
            trajectory = env.trajectory
            assert trajectory is not None
            ids = context_ids(trajectory) if policy.tokenizer is not None else None
            with out.status("the model is writing...", spinner="dots"):
                (generation,) = await policy.generate([Request(trajectory, ids, episode=key)])
            out.rule("[bold cyan]assistant")
            out.print(printable(hidden.sub("", generation.text).strip()), markup=False)
            with out.status("running tools...", spinner="dots"):
                _, reward, terminated, truncated, info = await env.astep(
                    generation.text, token_ids=generation.token_ids, logprobs=generation.logprobs
                )
            for call in info["trajectory"].turns[-1].tool_calls:
                style = "red" if call.error else "green"
                out.rule(f"[{style}]tool {call.name or '?'}" + (f" ({call.error})" if call.error else ""))
                out.print(printable(call.result.text), markup=False)
            if terminated or truncated:
                final = info["trajectory"]
                said = final.final_answer
                if said is None and final.turns:  # unscored: no reward plugin ran, so read the answer format here
                    said = extract_answer(final.turns[-1].action)
                text = _episode_end(final.end_reason, said, reward, gold, info.get("error"))
                out.print(f"[dim]{escape(text)}[/]", soft_wrap=True)
                return

    out.print(
        "[dim]Type a question and press Enter; /quit, /exit, an empty line or Ctrl-D ends the chat.[/]", soft_wrap=True
    )
    try:
        while True:
            out.print("[bold]you>[/] ", end="")
            question = sys.stdin.readline().strip()
            if not question or question.lower() in _CHAT_QUIT:
                return
            aio.run_sync(episode(question))
    finally:
        aio.run_sync(policy.aclose())
        env.close()


_CHAT_QUIT = frozenset({"/quit", "/exit"})
"""Lines that end a chat instead of being asked."""

_END_REASONS = {
    "answer": "the model answered",
    "max_turns": "the turn limit (--max-turns) was reached",
    "length": "the reply outgrew the length budget",
    "action_too_long": "a reply was too long to run",
    "time_limit": "the time limit was reached",
    "env_error": "the environment failed",
    "policy_error": "the model failed to generate",
}


def _episode_end(
    end_reason: str | None, said: str | None, reward: float, gold: str | None, error: str | None = None
) -> str:
    """How a chat episode ended, in words: why, the final answer (or that none was found), and the score."""
    why = _END_REASONS.get(end_reason or "", end_reason or "unknown")
    answer = f"final answer {said}" if said else "no answer found in the model's reply"
    if end_reason in ("env_error", "policy_error"):
        scored = "not scored" + (f": {error.strip().splitlines()[-1]}" if error and error.strip() else "")
    elif gold is None:
        scored = "unscored: no --answer"
    else:
        scored = f"reward {reward:g} against --answer {gold}"
    return f"episode over ({why}): {answer}; {scored}"


def _chat_markers(env: Any, tokenizer: Any) -> Any:
    """A pattern matching the chat template's control markers (``<|im_end|>``, any ``<|name|>``) and the
    tokenizer's special tokens: the model's raw turn end is protocol, not something to show a person."""
    import re

    markers = {*env.chat_format.control_markers, *(getattr(tokenizer, "all_special_tokens", None) or [])}
    markers = {m for m in markers if isinstance(m, str) and m.strip() and m.startswith("<")}
    alternatives = [re.escape(m) for m in sorted(markers, key=len, reverse=True)] + [r"<\|[^|<>\s]{1,40}\|>"]
    return re.compile("|".join(alternatives))


# -- models and data ---------------------------------------------------------------------------------------------
@main.command("export-model")
@click.option("--model", default=None, help="'smollm2' (default), a model directory or a .gguf file.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory to write (default: ~/.cache/rstar-env/models/NAME, or $RSTAR_ENV_CACHE/models/NAME).",
)
@click.option("--overwrite", is_flag=True, help="Write again even if the directory holds an export.")
def export_model_command(model: str | None, out: str | None, overwrite: bool) -> None:
    """Write a model as a Hugging Face directory that `transformers serve` or vLLM can serve; prints its path."""
    from rstar_env.rollout.local import ModelNotFoundError

    try:
        from rstar_env.rollout.export import export_model

        path = export_model(model, out, overwrite=overwrite)
    except (ModelNotFoundError, ImportError, OSError) as exc:
        _fail(str(exc))
    click.echo(str(path))


@main.command("filter-hard")
@click.argument("trajectories", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Problems JSONL to write.")
@click.option(
    "--max-pass-rate",
    type=float,
    default=1.0,
    show_default=True,
    help="Keep problems whose pass rate is below this (1.0: not solved every time).",
)
@click.option("--min-samples", type=int, default=1, show_default=True)
def filter_hard_command(trajectories: tuple[str, ...], out: str, max_pass_rate: float, min_samples: int) -> None:
    """Build the stage-3 set from eval or training trajectory files: problems not yet solved every time."""
    from rstar_env.rollout.hard import filter_hard

    try:
        seen, hard = filter_hard(trajectories, out, max_pass_rate=max_pass_rate, min_samples=min_samples)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    click.echo(f"{hard} of {seen} problems kept (pass rate < {max_pass_rate}) -> {out}")


# -- bench -------------------------------------------------------------------------------------------------------
# Subcommands imported on use, so ``rstar-env --help`` stays fast and optional extras stay optional.
@main.group(
    cls=CommandGroup,
    lazy={
        "sandbox": "rstar_env.bench.sandbox:command",
        "reward": "rstar_env.bench.reward:command",
        "gym": "rstar_env.bench.gym:command",
        "rollout": "rstar_env.bench.rollout:command",
        "generate": "rstar_env.bench.generate:command",
        "serve": "rstar_env.bench.serve:command",
        "train": "rstar_env.bench.train:command",
        "threads": "rstar_env.bench.threads:command",
    },
)
def bench() -> None:
    """Benchmarks that print side-by-side ratios measured in one run."""


@main.group(cls=CommandGroup, entry_points=f"{COMMANDS}.launch")  # OpenRLHF's comes from rstar_trainers.openrlhf
def launch() -> None:
    """Launch distributed training (OpenRLHF on a Ray cluster)."""


if __name__ == "__main__":  # pragma: no cover
    main()
