"""``rstar-env eval``: pass@1 over k samples, pass@k, lengths, turns and tool use of a model; trajectories to
JSONL."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from rstar_env._cli_util import console, fail, interrupted_status, stops_on_sigterm

from ._shared import CAPACITY_HELP, ENDPOINT_HELP, or_fail


@click.command("eval")
@click.option("--model", default=None, help="Local model: 'smollm2' (default), a model directory or a .gguf file.")
@click.option("--endpoint", "endpoints", multiple=True, help=ENDPOINT_HELP)
@click.option("--engine-capacity", "capacities", type=click.IntRange(min=1), multiple=True, help=CAPACITY_HELP)
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
    from rstar_env import aio
    from rstar_env.config import ConfigError, load_config
    from rstar_env.data import DataError, load_dataset
    from rstar_env.plugins import PluginError
    from rstar_env.progress import RunProgress
    from rstar_env.rollout.choose import build_policy, endpoint_specs
    from rstar_env.rollout.evaluate import EvalResumeError, evaluate, model_identity
    from rstar_env.rollout.metrics import format_summary_rows
    from rstar_env.rollout.policy import SamplingParams
    from rstar_env.vector import MathToolVectorEnv

    if samples < 1:
        fail("--samples must be at least 1")
    try:
        cfg = load_config(config, dataset=dataset)
        spec = cfg.dataset
        rows = load_dataset(spec.source, **spec.model_dump(exclude={"source", "limit"}), limit=limit or spec.limit)
        sampling = SamplingParams(
            **cfg.trainer.sampling(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens),
            seed=seed,
        )
    except (ConfigError, DataError, FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if token_ids and not (endpoints or cfg.inference.endpoints):
        fail("--token-ids goes with --endpoint (a local engine records token ids and log-probs anyway)")
    env_options: dict[str, Any] = {"config": cfg}
    if max_turns is not None:
        env_options["max_turns"] = max_turns
    total = len(rows) * samples
    try:
        env = MathToolVectorEnv(min(width, total), **env_options)
    except (ConfigError, PluginError) as exc:
        fail(str(exc))
    specs = or_fail(endpoint_specs, cfg, endpoints, capacities, engine_concurrency)
    served_model = served_model or cfg.inference.served_model
    policy = or_fail(
        build_policy,
        model,
        specs,
        served_model,
        sampling,
        batch_size,
        env,
        native_tools,
        cfg.policy.engine,
        token_ids,
        note=lambda text: console.print(f"[dim]{text}[/]"),
    )
    if policy.tokenizer is not None:  # token-level truth: the env encodes prompt and feedback with the policy's
        for sub in env.envs:
            sub.tokenizer = policy.tokenizer
    identity = model_identity(model, served_model=served_model or model, endpoints=[s.url for s in specs])
    out = out or _default_eval_out(identity)
    # On a terminal a bar that stays; in a log (where a bar shows nothing until the end) a line at every tenth of
    # the episodes and a heartbeat every 30 s, as `train` prints.
    with RunProgress(console, every_s=3600, heartbeat_s=30.0, every_fraction=0.1, transient=False) as progress:
        done = 0
        status = ""
        counts = {"correct": 0, "scored": 0, "failed": 0}
        progress.update("eval", 0, total)

        def on_done(trajectory: Any) -> None:
            nonlocal done, status
            done += 1
            if trajectory.failed:  # an outage is not a wrong answer
                counts["failed"] += 1
            else:
                counts["correct"] += trajectory.reward > 0.5
                counts["scored"] += 1
            rate = f"pass@1 {counts['correct'] / counts['scored']:.3f}" if counts["scored"] else "pass@1 -"
            status = rate + (f"  failed {counts['failed']}" if counts["failed"] else "")
            progress.update("eval", done, total, text=status)

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
            fail(str(exc))
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the evaluation runs on in the runtime's loop
            if running:  # cancel it, and wait for its cleanup (the engine and its processes shut down)
                aio.run_sync(_cancel(running[0]))
            console.print(f"[yellow]stopped: finished episodes are in {out}; the same command continues the run[/]")
            raise SystemExit(interrupted_status(exc)) from None
        progress.update("eval", total, total, text=status)  # episodes resumed from --out count as done
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


def _default_eval_out(identity: dict[str, str]) -> str:
    """``runs/eval/NAME[-HASH].jsonl``: one file per model (and weights), so runs of two models never meet."""
    import re

    name = re.sub(r"[^A-Za-z0-9._-]+", "-", identity["model"]).strip("-.")[-60:] or "model"
    return f"runs/eval/{name}" + (f"-{identity['hash'][:8]}" if "hash" in identity else "") + ".jsonl"


command = eval_command
