"""The ``rstar-env`` command line."""

from __future__ import annotations

import importlib
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
@click.option("--check", is_flag=True, help="Exit 1 when an installed plugin failed to load (for CI).")
def plugins(kind: str | None, as_json: bool, check: bool) -> None:
    """List registered plugins and the package each comes from, and those that failed to load.

    A plugin that fails to import or register is skipped (the others keep working) and listed under "failed to
    load"; the exit status is 0 unless --check is given.
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
    from rstar_env.plugins import PluginError, load_tool
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
            result = await tool.call(args, EpisodeContext(episode_id="cli"))
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


def _one_line(what: str, exc: BaseException) -> str:
    """An error as one line, like every other command's; RSTAR_ENV_TRACEBACK=1 re-raises for the full story."""
    import os

    if os.environ.get("RSTAR_ENV_TRACEBACK"):
        raise exc
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{what}: {type(exc).__name__}: {text} (RSTAR_ENV_TRACEBACK=1 shows the traceback)"


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
def _endpoint_specs(cfg: Any, endpoints: tuple[str, ...], capacities: tuple[int, ...],
                    concurrency: int | None) -> list[Any]:
    """The engines to use: ``--endpoint`` (with ``--engine-capacity``, ``--engine-concurrency``) or the config's."""
    from rstar_env.config import EndpointSpec

    if not endpoints:
        specs = list(cfg.inference.endpoints) if cfg is not None else []
        if capacities:
            _fail("--engine-capacity goes with --endpoint (or set capacity_tokens in inference.endpoints)")
    else:
        if capacities and len(capacities) not in (1, len(endpoints)):
            _fail(f"--engine-capacity: give one value for all endpoints or one per --endpoint "
                  f"({len(endpoints)}), got {len(capacities)}")
        specs = []
        for i, url in enumerate(endpoints):
            capacity = capacities[0] if len(capacities) == 1 else capacities[i] if capacities else None
            specs.append(EndpointSpec(url=url, capacity_tokens=capacity))
    if concurrency is not None:
        specs = [spec.model_copy(update={"max_concurrency": concurrency}) for spec in specs]
    return specs


def _build_policy(model: str | None, endpoints: list[Any], served_model: str | None, sampling: Any,
                  batch_size: int, env: Any, native_tools: bool = True) -> Any:
    if endpoints:
        from rstar_env.rollout.dispatch import endpoint_policy

        name = served_model or model
        if not name:
            _fail("--endpoint needs the served model's name: --served-model NAME")
        try:
            return endpoint_policy(env, endpoints, name, sampling=sampling, native_tools=native_tools)
        except ValueError as exc:
            _fail(str(exc))
    from rstar_env.rollout.local import ModelNotFoundError, TransformersPolicy

    try:
        return TransformersPolicy(model, sampling=sampling, batch_size=batch_size)
    except (ModelNotFoundError, ImportError) as exc:
        _fail(str(exc))


_ENDPOINT_HELP = ("OpenAI-compatible base URL (e.g. http://localhost:8000/v1); repeat for several engines, "
                  "requests go to the one with the most free KV capacity.")
_CAPACITY_HELP = ("KV-cache tokens of each --endpoint (one value for all, or one per endpoint); default: read "
                  "from its vLLM /metrics, else --engine-concurrency.")


@main.command("eval")
@click.option("--model", default=None, help="Local model: 'smollm2' (default), a model directory or a .gguf file.")
@click.option("--endpoint", "endpoints", multiple=True, help=_ENDPOINT_HELP)
@click.option("--engine-capacity", "capacities", type=click.IntRange(min=1), multiple=True, help=_CAPACITY_HELP)
@click.option("--engine-concurrency", type=click.IntRange(min=1), default=None,
              help="Requests in flight per endpoint when its KV capacity is unknown [default: 64].")
@click.option("--served-model", default=None, help="Model name to request from --endpoint.")
@click.option("--native-tools/--text-tools", default=True, show_default=True,
              help="With --endpoint: send tool schemas as `tools=` (hermes parser) or describe them in the prompt.")
@click.option("--dataset", default=None, help="Dataset source (default: the config's, else 'arithmetic').")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Run config (env, tools, reward, dataset).")
@click.option("--samples", "-k", default=1, show_default=True, help="Samples per problem (pass@1 is their mean).")
@click.option("--limit", type=int, default=None, help="Only the first N problems.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Trajectories JSONL; a run resumes from what it already holds of the same model (another "
                   "model's file is refused) [default: runs/eval/MODEL.jsonl, one file per model and weights].")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--max-new-tokens", type=int, default=512, show_default=True, help="Per assistant turn.")
@click.option("--max-turns", type=int, default=None, help="Override the config's env.max_turns.")
@click.option("--width", type=int, default=32, show_default=True, help="Episodes in flight.")
@click.option("--batch-size", type=int, default=16, show_default=True, help="Local model batch size.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON on stdout.")
def eval_command(model: str | None, endpoints: tuple[str, ...], capacities: tuple[int, ...],
                 engine_concurrency: int | None, served_model: str | None, dataset: str | None,
                 native_tools: bool, config: str | None, samples: int, limit: int | None, out: str | None,
                 temperature: float, top_p: float,
                 max_new_tokens: int, max_turns: int | None, width: int, batch_size: int, seed: int,
                 as_json: bool) -> None:
    """Evaluate a model: pass@1 over k samples, pass@k, lengths, turns, tool use; trajectories to JSONL."""
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
    specs = _endpoint_specs(cfg, endpoints, capacities, engine_concurrency)
    served_model = served_model or cfg.inference.served_model
    policy = _build_policy(model, specs, served_model, sampling, batch_size, env, native_tools)
    if policy.tokenizer is not None:  # token-level truth: the env encodes prompt and feedback with the policy's
        for sub in env.envs:
            sub.tokenizer = policy.tokenizer
    identity = model_identity(model, served_model=served_model or model, endpoints=[s.url for s in specs])
    out = out or _default_eval_out(identity)
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
                return await evaluate(policy, rows, samples=samples, out=out, env=env, on_done=on_done,
                                      model=identity)
            finally:
                await policy.aclose()
                await env.aclose()

        try:
            summary = aio.run_sync(run())
        except EvalResumeError as exc:
            _fail(str(exc))
        progress.update(task, completed=total)
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
        console.print(f"[yellow]eval: {summary['rescored_stale']} record(s) in {out} were scored with other settings "
                      "(verifier, its options, or env settings) and were run again; the summary covers only the "
                      "current settings.[/]")
    failures = summary.get("env_errors", 0) + summary.get("policy_errors", 0)
    if failures:
        console.print(f"[red]eval: {failures} episode(s) ended in a system failure (env_error/policy_error) and were "
                      f"not scored; the error is in each record's 'error' field of {out}. Run the same command "
                      "again to retry them.[/]")
        sys.exit(1)


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
@click.option("--max-new-tokens", type=int, default=512, show_default=True, help="Per assistant turn.")
@click.option("--max-turns", type=int, default=10, show_default=True)
@click.option("--answer", "gold", default=None, help="A gold answer to score the final response against.")
def chat(model: str | None, endpoints: tuple[str, ...], served_model: str | None, config: str | None,
         temperature: float, max_new_tokens: int, max_turns: int, gold: str | None) -> None:
    """Chat with a model that can run Python: each question is an episode; tool calls and their results are shown
    as they happen. Type a question (empty line or Ctrl-D quits). Without --answer the episodes are unscored."""
    from rich.markup import escape

    from rstar_env import aio
    from rstar_env.config import ConfigError, load_config
    from rstar_env.env import MathToolEnv
    from rstar_env.format import extract_answer
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
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    specs = _endpoint_specs(cfg, endpoints, (), None)
    with out.status("loading the model...", spinner="dots"):
        policy = _build_policy(model, specs, served_model or cfg.inference.served_model, sampling, 1, env)
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
            out.print(hidden.sub("", generation.text).strip(), markup=False)
            with out.status("running tools...", spinner="dots"):
                _, reward, terminated, truncated, info = await env.astep(
                    generation.text, token_ids=generation.token_ids, logprobs=generation.logprobs
                )
            for call in info["trajectory"].turns[-1].tool_calls:
                style = "red" if call.error else "green"
                out.rule(f"[{style}]tool {call.name or '?'}" + (f" ({call.error})" if call.error else ""))
                out.print(call.result.text, markup=False)
            if terminated or truncated:
                final = info["trajectory"]
                said = final.final_answer
                if said is None and final.turns:  # unscored: no verifier ran, so read the answer format here
                    said = extract_answer(final.turns[-1].action)
                scored = f"  reward {reward} against {gold!r}" if gold is not None else "  (unscored: no --answer)"
                out.print(f"[dim]episode over: {final.end_reason}; answer {escape(repr(said))}{escape(scored)}[/]")
                return

    try:
        while True:
            out.print("[bold]you>[/] ", end="")
            question = sys.stdin.readline()
            if not question.strip():
                return
            aio.run_sync(episode(question.strip()))
    finally:
        aio.run_sync(policy.aclose())
        env.close()


def _chat_markers(env: Any, tokenizer: Any) -> Any:
    """A pattern matching the chat template's control markers (``<|im_end|>``, any ``<|name|>``) and the
    tokenizer's special tokens: the model's raw turn end is protocol, not something to show a person."""
    import re

    markers = {*env.chat_format.control_markers, *(getattr(tokenizer, "all_special_tokens", None) or [])}
    markers = {m for m in markers if isinstance(m, str) and m.strip() and m.startswith("<")}
    alternatives = [re.escape(m) for m in sorted(markers, key=len, reverse=True)] + [r"<\|[^|<>\s]{1,40}\|>"]
    return re.compile("|".join(alternatives))


# -- training ----------------------------------------------------------------------------------------------------
@main.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), required=True, help="Run config (YAML).")
@click.option("--max-steps", type=int, default=None, help="Stop after this many more steps (checkpointed).")
@click.option("--output-dir", default=None, help="Override trainer.output_dir.")
@click.option("--fresh", is_flag=True, help="Ignore checkpoints in the output directory (start over).")
@click.option("--backend", type=click.Choice(["local"]), default=None,
              help="Run a config written for another backend (e.g. a stage config) on this machine.")
@click.option("--model", default=None, help="Override trainer.model.")
@click.option("--seed", type=int, default=None, help="Override trainer.seed (RL, and an sft: stage's default seed).")
@click.option("--device", default=None, help="Override trainer.device: cpu, cuda, cuda:N (SFT stage too).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Override trainer.dtype: compute precision of rollouts and training (weights stay float32).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override an RL trainer key (YAML value), e.g. --set steps=2; repeatable.")
def train(config: str, max_steps: int | None, output_dir: str | None, fresh: bool, backend: str | None,
          model: str | None, seed: int | None, device: str | None, dtype: str | None, sets: tuple[str, ...]) -> None:
    """Train on this machine (the `local` trainer): GRPO-RoC, an SFT stage (`trainer.stage: sft`), or both (an RL
    section with an `sft:` sub-section runs SFT first, then RL from its weights). Resumes from the output
    directory's checkpoints. Ctrl-C saves a checkpoint."""
    from rstar_env.config import ConfigError, load_config
    from rstar_env.data import DataError
    from rstar_env.sampler import SamplerError

    try:
        from rstar_trainers.local.config import sft_config, trainer_config
        from rstar_trainers.local.sft import run_sft_stage, run_sft_stage_isolated
        from rstar_trainers.local.trainer import LocalTrainer
    except ImportError as exc:
        _fail(f"the local trainer needs torch and transformers ({exc}): pip install 'rstar-env[local]'")
    try:
        run = load_config(config)
        if run.trainer.get("stage") == "sft":
            sft = sft_config(run.trainer, output_dir=output_dir, model=model, seed=seed, device=device)
            out, settings = Path(sft.output_dir), None
        else:
            settings = trainer_config(run, force_local=backend == "local", output_dir=output_dir, model=model,
                                      seed=seed, device=device, dtype=dtype, **_overrides(sets))
            out = Path(settings.output_dir)
            sft = None
            if settings.sft is not None:
                sft = sft_config({"model": settings.model, "seed": settings.seed, "device": settings.device,
                                  "tensorboard": settings.tensorboard, **settings.sft,
                                  "output_dir": str(out / "sft")}, device=device)
        _check_device(device or (settings.device if settings is not None else sft.device if sft else "cpu"),
                      dtype or (settings.dtype if settings is not None else "float32"))
    except ConfigError as exc:
        _fail(str(exc))
    if fresh:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    from rstar_trainers.local.progress import (
        RL_COLUMNS,
        RL_LEGEND,
        SFT_COLUMNS,
        RunProgress,
        held_out_line,
        peak_memory_gib,
        summary_lines,
        table_header,
        table_row,
    )

    started = time.monotonic()
    sft_model: str | None = None
    if sft is not None:
        console.print("[bold]SFT stage[/] -> " + sft.output_dir)
        try:
            if settings is None:
                with RunProgress(console) as progress:
                    for line in table_header(SFT_COLUMNS):
                        progress.print(line)
                    model_dir, report = run_sft_stage(
                        run, sft, max_steps=max_steps, on_progress=progress.update,
                        on_step=lambda m: progress.print(table_row(SFT_COLUMNS, m)))
            else:  # SFT before RL: in a child process (it shows its own progress), so RL never holds its memory
                model_dir, report = run_sft_stage_isolated(run, sft)
        except (ConfigError, DataError) as exc:
            _fail(str(exc))
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: SFT checkpoint saved[/]")
            raise SystemExit(130) from None
        if report:
            console.print(held_out_line("SFT held-out", report), markup=False, highlight=False, soft_wrap=True)
        if settings is None:
            if model_dir is None:
                console.print(f"SFT stage not finished yet (rerun to continue); checkpoints in {sft.output_dir}")
                return
            eval_path = Path(sft.output_dir) / "eval.json"
            for line in summary_lines(model=str(model_dir), run_dir=sft.output_dir, eval_before=None,
                                      eval_after=report or None,
                                      eval_path=str(eval_path) if eval_path.exists() else None,
                                      seconds=time.monotonic() - started, peak_gib=peak_memory_gib(),
                                      steps=_last_step(Path(sft.output_dir))):
                console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        if model_dir is None:
            _fail(f"the SFT stage has not finished (rerun to continue it); its checkpoints are in {sft.output_dir}")
        sft_model = str(model_dir)
        settings = settings.model_copy(update={"model": str(model_dir)})
        console.print("[bold]RL stage[/] from " + str(model_dir))
    assert settings is not None

    def held_out(name: str, report: dict[str, float]) -> None:
        progress.print(held_out_line("held-out before RL" if name == "eval_start" else "held-out after RL", report))

    with RunProgress(console) as progress:
        try:
            trainer = LocalTrainer(run, settings, on_progress=progress.update)
        except (ConfigError, DataError, ValueError) as exc:  # ValueError: a device or dtype this machine lacks
            _fail(str(exc))
        if trainer.step:
            progress.print(f"resuming {settings.output_dir} at step {trainer.step}")
        for line in (*table_header(RL_COLUMNS), RL_LEGEND):
            progress.print(line)
        try:
            trainer.train(max_steps=max_steps, on_step=lambda m: progress.print(table_row(RL_COLUMNS, m)),
                          on_eval=held_out, on_progress=progress.update)
        except SamplerError as exc:  # a plugin's contract broken: its message says which and how, no traceback
            _fail(str(exc))
        except KeyboardInterrupt:
            console.print(f"[yellow]interrupted: checkpoint saved at step {trainer.step}[/]")
            raise SystemExit(130) from None
        finally:
            trainer.close()
    root = Path(settings.output_dir)
    model_path = root / "model"
    for line in summary_lines(
        model=str(model_path) if (model_path / "config.json").exists() and trainer.step >= settings.steps else None,
        run_dir=settings.output_dir, eval_before=_read_json(root / "eval_start.json"),
        eval_after=_read_json(root / "eval.json"),
        eval_path=str(root / "eval.json") if (root / "eval.json").exists() else None,
        seconds=time.monotonic() - started, peak_gib=peak_memory_gib(), steps=trainer.step, sft_model=sft_model,
    ):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _last_step(run_dir: Path) -> int:
    from rstar_trainers.local.logging import read_metrics

    try:
        return max((int(r.get("step", 0)) for r in read_metrics(run_dir)), default=0)
    except FileNotFoundError:
        return 0


@main.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), required=True,
              help="An RL config with an `sft:` sub-section (e.g. configs/quickstart.yaml), or any RL config with "
                   "--sft-model.")
@click.option("--seeds", default="0,1", show_default=True, help="Comma-separated seeds; each trains both arms.")
@click.option("--steps", type=int, default=None, help="RL steps per arm (default: the config's trainer.steps).")
@click.option("--output-dir", default=None, help="Where the arms, figure and table go (default: OUTPUT_DIR/compare).")
@click.option("--sft-model", default=None,
              help="Start both arms from this model instead of the config's SFT stage (run, or found finished, "
                   "in OUTPUT_DIR/sft).")
@click.option("--device", default=None, help="Override trainer.device: cpu, cuda, cuda:N (SFT stage too).")
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None,
              help="Override trainer.dtype (compute precision; weights stay float32).")
@click.option("--jobs", type=int, default=1, show_default=True,
              help="Arms trained at once, each in its own process (e.g. all 2 x seeds on one GPU).")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a trainer key (YAML value), e.g. --set prompts_per_step=4; repeatable.")
def compare(config: str, seeds: str, steps: int | None, output_dir: str | None, sft_model: str | None,
            device: str | None, dtype: str | None, jobs: int, sets: tuple[str, ...]) -> None:
    """GRPO vs GRPO-RoC from the same SFT checkpoint, with the same seeds, data and steps, as paired arms: for
    each seed both arms draw the same step-1 rollouts (per-request sampling streams) and differ only through the
    sampler. Plots, per step, the tool-error ratio in correct trajectories before selection, the reward, the
    response length and the per-seed difference; prints the per-seed differences RoC - GRPO with a 95%
    t-interval over seeds; writes both arms' metrics, compare.png, compare.md, per_step.csv and the sampler-only
    check of the step-1 rollouts (roc_check.json). Reruns resume."""
    from rstar_env.config import ConfigError, load_config
    from rstar_env.data import DataError

    try:
        from rstar_trainers.local.compare import run_compare
        from rstar_trainers.local.config import sft_config, trainer_config
        from rstar_trainers.local.sft import run_sft_stage_isolated
    except ImportError as exc:
        _fail(f"compare needs torch and transformers ({exc}): pip install 'rstar-env[local]'")
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        _fail(f"--seeds takes comma-separated integers, got {seeds!r}")
    if not seed_list or (steps is not None and steps < 1) or jobs < 1:
        _fail("give at least one seed, --steps >= 1 and --jobs >= 1")
    try:
        run = load_config(config)
        settings = trainer_config(run, device=device, dtype=dtype, **_overrides(sets))
        _check_device(settings.device, settings.dtype)
    except ConfigError as exc:
        _fail(str(exc))
    root = Path(settings.output_dir)
    model = sft_model
    if model is None:
        if settings.sft is None:
            _fail(f"{config} has no trainer.sft section: pass --sft-model PATH (the checkpoint both arms start from)")
        sft = sft_config({"model": settings.model, "seed": settings.seed, "device": settings.device,
                          "tensorboard": settings.tensorboard, **settings.sft, "output_dir": str(root / "sft")},
                         device=device)
        console.print(f"SFT stage in {sft.output_dir} (reused when finished)")
        try:
            model_dir, _ = run_sft_stage_isolated(run, sft)
        except (ConfigError, DataError) as exc:
            _fail(str(exc))
        model = str(model_dir)
    out = Path(output_dir) if output_dir else root / "compare"
    from rstar_trainers.local.progress import COMPARE_COLUMNS, RunProgress, table_header, table_row

    with RunProgress(console) as progress:
        for line in table_header(COMPARE_COLUMNS):
            progress.print(line)
        try:
            summary = run_compare(
                run, settings, out=out, model=model, seeds=seed_list, steps=steps or settings.steps, jobs=jobs,
                on_step=lambda arm, seed, m: progress.print(table_row(COMPARE_COLUMNS, {**m, "arm": f"{arm}/{seed}"})),
                on_progress=progress.update)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted: each arm's checkpoint is saved; rerun to continue[/]")
            raise SystemExit(130) from None
    click.echo((out / "compare.md").read_text())
    roc = summary["arms"]["roc"]["tool_error_ratio_correct"]["mean_second_half"]
    grpo = summary["arms"]["grpo"]["tool_error_ratio_correct"]["mean_second_half"]
    paired = summary["paired"]["tool_error_ratio_correct"]["second_half"]
    low, high = paired["ci95"]
    interval = "no interval with one seed" if low != low else f"95% CI [{low:+.4f}, {high:+.4f}] over seeds"
    click.echo(f"tool-error ratio in correct trajectories, second half: GRPO-RoC {roc:.3f} vs GRPO {grpo:.3f}; "
               f"paired difference RoC - GRPO {paired['mean']:+.4f} ({interval}); figure {out / 'compare.png'}")


@main.command("roc-check")
@click.argument("rollouts", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--keep", type=int, required=True, help="G: trajectories kept per group (trainer.group_size).")
@click.option("--step", type=int, default=1, show_default=True, help="Which step's rollouts to read.")
@click.option("--draws", type=int, default=500, show_default=True, help="Replays of each sampler (fresh rng each).")
@click.option("--mode", type=click.Choice(["topk", "weighted"]), default="topk", show_default=True,
              help="RoC's positive selection.")
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Also write the report as JSON.")
def roc_check_command(rollouts: tuple[str, ...], keep: int, step: int, draws: int, mode: str,
                      json_out: str | None) -> None:
    """The sampler-only check: on recorded rollouts (run directories or trajectories.jsonl files, e.g. each arm
    of `rstar-env compare`), the tool-error ratio of the positives GRPO-RoC would keep against GRPO's uniform
    pick, over many draws. If RoC is not clearly below GRPO here, training from these weights cannot show its
    effect."""
    import json as _json

    from rstar_trainers.local.roc_check import format_report, read_step_groups, roc_check

    if keep < 1 or draws < 1:
        _fail("--keep and --draws must be at least 1")
    groups = []
    try:
        for path in rollouts:
            groups += read_step_groups(path, step=step)
    except (FileNotFoundError, ValueError) as exc:
        _fail(str(exc))
    report = roc_check(groups, keep, draws=draws, roc={"mode": mode})
    click.echo(format_report(report))
    if json_out:
        Path(json_out).write_text(_json.dumps(report, indent=1))


def _overrides(sets: tuple[str, ...]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as trainer overrides (values parsed as YAML: numbers, booleans, strings)."""
    import yaml

    out: dict[str, Any] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            _fail(f"--set takes KEY=VALUE (a trainer key), got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _check_device(device: str, dtype: str) -> None:
    """Fail with a clear message, before any model loads, when torch cannot use ``device`` / ``dtype`` here."""
    try:
        from rstar_env.rollout.local import check_dtype
        from rstar_trainers.local.trainer import check_device
    except ImportError:
        return  # the trainer's own import error says what to install
    try:
        check_device(device)
        check_dtype(dtype, device)
    except ValueError as exc:
        _fail(str(exc))


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


@main.command("export-model")
@click.option("--model", default=None, help="'smollm2' (default), a model directory or a .gguf file.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Directory to write (default: ~/.cache/rstar-env/models/NAME, or $RSTAR_ENV_CACHE/models/NAME).")
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
    lazy={
        "sandbox": "rstar_env.bench.sandbox:command",
        "reward": "rstar_env.bench.reward:command",
        "gym": "rstar_env.bench.gym:command",
        "rollout": "rstar_env.bench.rollout:command",
    },
)
def bench() -> None:
    """Benchmarks that print side-by-side ratios measured in one run."""


@main.group(cls=_LazyGroup, lazy={"openrlhf": "rstar_trainers.openrlhf.launch:command"})
def launch() -> None:
    """Launch distributed training (OpenRLHF on a Ray cluster)."""


if __name__ == "__main__":  # pragma: no cover
    main()
