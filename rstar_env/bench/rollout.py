"""``rstar-env bench rollout``: rollout scheduling, simulated and for real.

* default: the pure simulation (:mod:`rstar_env.bench.rollout_sim`): lockstep vs static pinning vs dynamic on one
  workload of long-tailed generations, tool latencies and engines of unequal speed and KV capacity;
* ``--longtail``: the long-tailed setting (:mod:`rstar_env.bench.longtail`) run for real through ``evaluate``
  against a scripted endpoint played in process, against the ideal event-driven run;
* ``--endpoint URL`` (repeatable, with ``--served-model``): an eval on real OpenAI-compatible engines through the
  dispatcher, reporting wall time and each engine's requests, failures and busy time.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import click


def _simulation(seed: int) -> dict[str, Any]:
    from rstar_env.bench.rollout_sim import Workload, compare

    workload = Workload(seed=seed)
    return {
        "workload": {
            "episodes": workload.prompts * workload.samples,
            "turns": workload.turns,
            "width": workload.width,
            "engines": [{"speed_tok_s": m.speed, "capacity_tokens": m.capacity} for m in workload.engines],
        },
        "schedulers": compare(workload),
    }


def _endpoints(
    endpoints: tuple[str, ...], served_model: str, problems: int, samples: int, width: int
) -> dict[str, Any]:
    from rstar_env import aio
    from rstar_env.data import generate_problems
    from rstar_env.rollout.dispatch import endpoint_policy
    from rstar_env.rollout.evaluate import evaluate
    from rstar_env.rollout.policy import SamplingParams
    from rstar_env.vector import MathToolVectorEnv

    rows = generate_problems(problems, seed=0)
    env = MathToolVectorEnv(min(width, problems * samples), max_turns=3)
    policy = endpoint_policy(
        env, list(endpoints), served_model, native_tools=False, sampling=SamplingParams(max_new_tokens=256, seed=0)
    )

    async def go() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            try:
                return await evaluate(policy, rows, samples=samples, out=Path(tmp) / "eval.jsonl", env=env)
            finally:
                await policy.aclose()
                await env.aclose()

    start = time.perf_counter()
    summary = aio.run_sync(go())
    return {
        "wall_s": time.perf_counter() - start,
        "episodes": summary.get("episodes"),
        "policy_errors": summary.get("policy_errors", 0),
        "engines": policy.stats(),
    }


@click.command("rollout")
@click.option("--longtail", is_flag=True, help="The long-tailed setting, for real, on a scripted in-process endpoint.")
@click.option("--endpoint", "endpoints", multiple=True, help="Run an eval on these real engines (repeatable).")
@click.option("--served-model", default=None, help="With --endpoint: the served model's name.")
@click.option("--problems", default=16, show_default=True, help="With --endpoint: generated problems.")
@click.option("--samples", default=4, show_default=True, help="With --endpoint: samples per problem.")
@click.option("--width", default=32, show_default=True, help="With --endpoint: episodes in flight.")
@click.option("--seed", default=0, show_default=True, help="The simulated workload's seed.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(
    longtail: bool,
    endpoints: tuple[str, ...],
    served_model: str | None,
    problems: int,
    samples: int,
    width: int,
    seed: int,
    as_json: bool,
) -> None:
    """Rollout scheduling: lockstep vs static pinning vs dynamic (simulated), or real runs."""
    if endpoints:
        if not served_model:
            raise click.ClickException("--endpoint needs the served model's name: --served-model NAME")
        result: dict[str, Any] = _endpoints(endpoints, served_model, problems, samples, width)
    elif longtail:
        from rstar_env.bench.longtail import LongTail, bounds, run

        scenario = LongTail()
        result = {**bounds(scenario), "instant": run(scenario, instant=True), "run": run(scenario)}
        result["ratio_to_ideal"] = result["run"]["wall_s"] / result["ideal_s"]
    else:
        result = _simulation(seed)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    if endpoints:
        click.echo(
            f"wall {result['wall_s']:.2f}s  episodes {result['episodes']}  policy_errors {result['policy_errors']}"
        )
        for e in result["engines"]:
            click.echo(
                f"  {e['endpoint']}: requests {e['requests']}  failed {e['failed']}  busy {e['busy_s']:.2f}s  "
                f"capacity {e['capacity']:g} {e['capacity_unit']} ({e['capacity_source']})"
            )
    elif longtail:
        click.echo(
            f"ideal event-driven {result['ideal_s']:.1f}s  packing bound {result['packing_bound_s']:.1f}s  "
            f"longest episode {result['longest_episode_s']:.1f}s"
        )
        click.echo(
            f"measured {result['run']['wall_s']:.1f}s ({result['ratio_to_ideal']:.2f}x the ideal); "
            f"instant replies {result['instant']['wall_s']:.1f}s; policy_errors "
            f"{result['run']['policy_errors']}"
        )
    else:
        click.echo("| scheduler | makespan | ratio to lower bound | engine busy % | over-capacity moments |")
        click.echo("|---|---|---|---|---|")
        for r in result["schedulers"]:
            busy = " / ".join(f"{b:.0f}" for b in r["busy_pct"])
            click.echo(
                f"| {r['scheduler']} | {r['makespan_s']:.1f} s | {r['ratio']:.2f}x | {busy} | {r['over_capacity']} |"
            )
        bound = result["schedulers"][0]["lower_bound_s"]
        click.echo(
            f"lower bound {bound:.1f} s; engines "
            + ", ".join(
                f"{e['speed_tok_s']:g} tok/s x {e['capacity_tokens']} KV tokens" for e in result["workload"]["engines"]
            )
        )
