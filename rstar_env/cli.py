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
def run_tool(
    name: str, config: str | None, arguments: str | None, backend: str | None, timeout_s: float | None
) -> None:
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


# -- eval --------------------------------------------------------------------------------------------------------
def _build_policy(model: str | None, endpoint: str | None, served_model: str | None, sampling: Any,
                  batch_size: int, env: Any, native_tools: bool = True) -> Any:
    if endpoint:
        from rstar_env.rollout.openai import OpenAIPolicy

        name = served_model or model
        if not name:
            _fail("--endpoint needs the served model's name: --served-model NAME")
        return OpenAIPolicy.for_env(env, endpoint, name, sampling=sampling, native_tools=native_tools)
    from rstar_env.rollout.local import ModelNotFoundError, TransformersPolicy

    try:
        return TransformersPolicy(model, sampling=sampling, batch_size=batch_size)
    except (ModelNotFoundError, ImportError) as exc:
        _fail(str(exc))


@main.command("eval")
@click.option("--model", default=None, help="Local model: 'smollm2' (default), a model directory or a .gguf file.")
@click.option("--endpoint", default=None, help="OpenAI-compatible base URL (e.g. http://localhost:8000/v1).")
@click.option("--served-model", default=None, help="Model name to request from --endpoint.")
@click.option("--native-tools/--text-tools", default=True, show_default=True,
              help="With --endpoint: send tool schemas as `tools=` (hermes parser) or describe them in the prompt.")
@click.option("--dataset", default=None, help="Dataset source (default: the config's, else 'arithmetic').")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Run config (env, tools, reward, dataset).")
@click.option("--samples", "-k", default=1, show_default=True, help="Samples per problem (pass@1 is their mean).")
@click.option("--limit", type=int, default=None, help="Only the first N problems.")
@click.option("--out", type=click.Path(dir_okay=False), default="runs/eval.jsonl", show_default=True,
              help="Trajectories JSONL; a run resumes from what it already holds.")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--max-new-tokens", type=int, default=512, show_default=True, help="Per assistant turn.")
@click.option("--max-turns", type=int, default=None, help="Override the config's env.max_turns.")
@click.option("--width", type=int, default=32, show_default=True, help="Episodes in flight.")
@click.option("--batch-size", type=int, default=16, show_default=True, help="Local model batch size.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def eval_command(model: str | None, endpoint: str | None, served_model: str | None, dataset: str | None,
                 native_tools: bool, config: str | None, samples: int, limit: int | None, out: str,
                 temperature: float, top_p: float,
                 max_new_tokens: int, max_turns: int | None, width: int, batch_size: int, seed: int,
                 as_json: bool) -> None:
    """Evaluate a model: pass@1 over k samples, pass@k, lengths, turns, tool use; trajectories to JSONL."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rstar_env import _aio
    from rstar_env.config import ConfigError, load_config
    from rstar_env.data import DataError, load_dataset
    from rstar_env.plugins import PluginError
    from rstar_env.rollout.evaluate import evaluate
    from rstar_env.rollout.metrics import format_summary_rows
    from rstar_env.rollout.policy import SamplingParams
    from rstar_env.vector import MathToolVectorEnv

    if samples < 1:
        _fail("--samples must be at least 1")
    try:
        cfg = load_config(config, dataset=dataset)
        spec = cfg.dataset
        rows = load_dataset(spec.source, **spec.model_dump(exclude={"source", "limit"}), limit=limit or spec.limit)
        sampling = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed)
    except (ConfigError, DataError, FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    env_options: dict[str, Any] = {"config": cfg}
    if max_turns is not None:
        env_options["max_turns"] = max_turns
    total = len(rows) * samples
    try:
        env = MathToolVectorEnv(min(width, total), **env_options)
    except (ConfigError, PluginError) as exc:
        _fail(str(exc))
    policy = _build_policy(model, endpoint, served_model, sampling, batch_size, env, native_tools)
    if policy.tokenizer is not None:  # token-level truth: the env encodes prompt and feedback with the policy's
        for sub in env.envs:
            sub.tokenizer = policy.tokenizer
    with Progress(TextColumn("[bold]eval"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                  TimeElapsedColumn(), console=console,
                  disable=as_json and not sys.stderr.isatty()) as progress:
        task = progress.add_task("", total=total)
        counts = {"correct": 0, "scored": 0, "failed": 0}

        def on_done(trajectory: Any) -> None:
            if trajectory.failed:  # an outage is not a wrong answer
                counts["failed"] += 1
            else:
                counts["correct"] += trajectory.reward > 0.5
                counts["scored"] += 1
            rate = f"pass@1 {counts['correct'] / counts['scored']:.3f}" if counts["scored"] else "pass@1 -"
            failed = f"  failed {counts['failed']}" if counts["failed"] else ""
            progress.update(task, advance=1, description=rate + failed)

        async def run() -> dict[str, Any]:
            try:
                return await evaluate(policy, rows, samples=samples, out=out, env=env, on_done=on_done)
            finally:
                await policy.aclose()
                await env.aclose()

        summary = _aio.run_sync(run())
        progress.update(task, completed=total)
    tps = getattr(policy, "tokens_per_second", None)
    if tps:
        summary["policy_tokens_per_second"] = tps
    summary["trajectories_file"] = out
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        table = Table(title=f"eval: {model or endpoint or 'smollm2'} on {cfg.dataset.source}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in format_summary_rows(summary):
            table.add_row(key, value)
        Console().print(table)
    failures = summary.get("env_errors", 0) + summary.get("policy_errors", 0)
    if failures:
        console.print(f"[red]eval: {failures} episode(s) ended in a system failure (env_error/policy_error) and were "
                      f"not scored; the error is in each record's 'error' field of {out}. Run the same command "
                      "again to retry them.[/]")
        sys.exit(1)


# -- chat ----------------------------------------------------------------------------------------------------------
@main.command()
@click.option("--model", default=None, help="Local model: 'smollm2' (default), a model directory or a .gguf file.")
@click.option("--endpoint", default=None, help="OpenAI-compatible base URL instead of a local model.")
@click.option("--served-model", default=None, help="Model name to request from --endpoint.")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Run config (tools, reward, env).")
@click.option("--temperature", type=float, default=0.7, show_default=True)
@click.option("--max-new-tokens", type=int, default=512, show_default=True, help="Per assistant turn.")
@click.option("--max-turns", type=int, default=10, show_default=True)
@click.option("--answer", "gold", default=None, help="A gold answer to score the final response against.")
def chat(model: str | None, endpoint: str | None, served_model: str | None, config: str | None,
         temperature: float, max_new_tokens: int, max_turns: int, gold: str | None) -> None:
    """Chat with a model that can run Python: each question is an episode; tool calls and their results are shown
    as they happen. Type a question (empty line or Ctrl-D quits)."""
    from rstar_env import _aio
    from rstar_env.config import ConfigError
    from rstar_env.env import MathToolEnv
    from rstar_env.plugins import PluginError
    from rstar_env.rollout.collect import context_ids
    from rstar_env.rollout.policy import Request, SamplingParams

    try:
        env = MathToolEnv(config=config, max_turns=max_turns)
    except (ConfigError, PluginError) as exc:
        _fail(str(exc))
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    policy = _build_policy(model, endpoint, served_model, sampling, 1, env)
    env.tokenizer = policy.tokenizer

    async def episode(question: str) -> None:
        await env.areset(options={"problem": question, "answer": gold or ""})
        while True:
            trajectory = env.trajectory
            assert trajectory is not None
            ids = context_ids(trajectory) if policy.tokenizer is not None else None
            (generation,) = await policy.generate([Request(trajectory, ids)])
            console.rule("[bold cyan]assistant")
            console.print(generation.text, markup=False, highlight=False)
            _, reward, terminated, truncated, info = await env.astep(
                generation.text, token_ids=generation.token_ids, logprobs=generation.logprobs
            )
            for call in info["trajectory"].turns[-1].tool_calls:
                style = "red" if call.error else "green"
                console.rule(f"[{style}]tool {call.name or '?'}" + (f" ({call.error})" if call.error else ""))
                console.print(call.result.text, markup=False, highlight=False)
            if terminated or truncated:
                final = info["trajectory"]
                scored = f"  reward {reward} against {gold!r}" if gold is not None else ""
                console.print(f"[dim]episode over: {final.end_reason}; answer {final.final_answer!r}{scored}[/]")
                return

    try:
        while True:
            console.print("[bold]you>[/] ", end="")
            question = sys.stdin.readline()
            if not question.strip():
                return
            _aio.run_sync(episode(question.strip()))
    finally:
        _aio.run_sync(policy.aclose())
        env.close()


# -- training ----------------------------------------------------------------------------------------------------
@main.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), required=True, help="Run config (YAML).")
@click.option("--max-steps", type=int, default=None, help="Stop after this many more steps (checkpointed).")
@click.option("--output-dir", default=None, help="Override trainer.output_dir.")
@click.option("--fresh", is_flag=True, help="Ignore checkpoints in the output directory (start over).")
@click.option("--backend", type=click.Choice(["local"]), default=None,
              help="Run a config written for another backend (e.g. a stage config) on this machine.")
@click.option("--model", default=None, help="Override trainer.model.")
def train(config: str, max_steps: int | None, output_dir: str | None, fresh: bool, backend: str | None,
          model: str | None) -> None:
    """Train with GRPO-RoC on this machine (the `local` trainer); resumes from the output directory's latest
    checkpoint. Ctrl-C saves a checkpoint."""
    from rstar_env.config import ConfigError, load_config

    try:
        from rstar_trainers.local.config import trainer_config
        from rstar_trainers.local.trainer import LocalTrainer
    except ImportError as exc:
        _fail(f"the local trainer needs torch and transformers ({exc}): pip install 'rstar-env[local]'")
    try:
        run = load_config(config)
        settings = trainer_config(run, force_local=backend == "local", output_dir=output_dir, model=model)
    except ConfigError as exc:
        _fail(str(exc))
    if fresh:
        import shutil

        shutil.rmtree(Path(settings.output_dir), ignore_errors=True)
    trainer = LocalTrainer(run, settings)
    if trainer.step:
        console.print(f"resuming {settings.output_dir} at step {trainer.step}")
    columns = ("step", "reward", "accuracy", "tool_error_ratio_correct", "groups_kept", "loss", "time/step_s")
    table_header = "  ".join(f"{c.split('/')[-1]:>12}" for c in columns)
    console.print(table_header)

    def show(metrics: dict[str, Any]) -> None:
        console.print("  ".join(f"{metrics.get(c, 0):>12.4g}" for c in columns))

    try:
        trainer.train(max_steps=max_steps, on_step=show)
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted: checkpoint saved at step {trainer.step}[/]")
        raise SystemExit(130) from None
    finally:
        trainer.close()
    console.print(f"done: step {trainer.step}; metrics in {settings.output_dir}/metrics.jsonl "
                  f"(rstar-env plot {settings.output_dir})")


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="PNG path (default RUN_DIR/curves.png).")
def plot(run_dir: str, out: str | None) -> None:
    """Draw a training run's curves to PNG."""
    from rstar_trainers.local.plot import plot_run

    try:
        path = plot_run(run_dir, out)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        _fail(str(exc))
    click.echo(str(path))


@main.command("filter-hard")
@click.argument("trajectories", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Problems JSONL to write.")
@click.option("--max-pass-rate", type=float, default=1.0, show_default=True,
              help="Keep problems whose pass rate is below this (1.0: not solved every time).")
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


@main.group(cls=_LazyGroup, lazy={"openrlhf": "rstar_trainers.openrlhf.launch:command"})
def launch() -> None:
    """Launch distributed training (OpenRLHF on a Ray cluster)."""


if __name__ == "__main__":  # pragma: no cover
    main()
