"""``rstar-env bench gym``: what gymnasium's env checker (on in the registration) costs per step.

Three ways to step the same env, interleaved round by round in one run so machine load hits them alike:

* **checked**: ``gym.make(ENV_ID)``: the env checker, order enforcement (the registration's defaults);
* **unchecked**: ``gym.make(ENV_ID, disable_env_checker=True)``;
* **bare**: ``env.unwrapped``, no wrapper at all.

The action is a tool call to a tool the env lacks: the env parses it and answers with an error, so a step costs
the env's own work and no sandbox; episodes are 8 steps long. That is the worst case for the wrappers' share: a
real step (a model's generation, a Python call) is orders of magnitude longer. The checker inspects the first
``reset`` and ``step`` of an env; the one-time cost of ``make`` + first ``reset`` + first ``step`` is measured too.
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import click

_ACTION = '<tool_call>\n{"name": "missing", "arguments": {}}\n</tool_call>'
_ROW = {"problem": "What is 2 + 2?", "answer": "4"}


def _make(checked: bool) -> Any:
    import gymnasium

    from rstar_env import ENV_ID

    return gymnasium.make(ENV_ID, tools=[], reward="math", max_turns=1_000_000, disable_env_checker=not checked)


def _steps_per_second(env: Any, steps: int, per_episode: int = 8) -> float:
    # Episodes of a realistic length: info["trajectory"] is a snapshot, so a step costs more as an episode grows.
    elapsed, done = 0.0, 0
    while done < steps:
        env.reset(options=_ROW)
        start = time.perf_counter()
        for _ in range(min(per_episode, steps - done)):
            env.step(_ACTION)
            done += 1
        elapsed += time.perf_counter() - start
    return steps / elapsed


def _first_contact_s(checked: bool) -> float:
    start = time.perf_counter()
    env = _make(checked)
    env.reset(options=_ROW)
    env.step(_ACTION)
    elapsed = time.perf_counter() - start
    env.close()
    return elapsed


def run(steps: int = 2000, rounds: int = 5) -> dict[str, Any]:
    checked, unchecked = _make(True), _make(False)
    ways = {"checked": checked, "unchecked": unchecked, "bare": checked.unwrapped}
    for env in ways.values():  # warm up: the checker's first-step checks, imports, the loop thread
        _steps_per_second(env, 20)
    rates: dict[str, list[float]] = {name: [] for name in ways}
    first: dict[str, list[float]] = {"checked": [], "unchecked": []}
    for _ in range(rounds):
        for name, env in ways.items():
            rates[name].append(_steps_per_second(env, steps))
        first["checked"].append(_first_contact_s(True))
        first["unchecked"].append(_first_contact_s(False))
    checked.close()
    unchecked.close()
    median = {name: statistics.median(values) for name, values in rates.items()}
    per_step_us = {name: 1e6 / rate for name, rate in median.items()}
    return {
        "steps_per_round": steps,
        "rounds": rounds,
        "steps_per_s": median,
        "per_step_us": per_step_us,
        "checker_overhead_us_per_step": per_step_us["checked"] - per_step_us["unchecked"],
        "ratio_checked_over_unchecked": median["checked"] / median["unchecked"],
        "ratio_checked_over_bare": median["checked"] / median["bare"],
        "first_reset_and_step_ms": {name: 1e3 * statistics.median(v) for name, v in first.items()},
    }


@click.command(name="gym")
@click.option("--steps", default=2000, show_default=True, help="steps per way and round")
@click.option("--rounds", default=5, show_default=True, help="interleaved rounds; medians are reported")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
def command(steps: int, rounds: int, as_json: bool) -> None:
    """Per-step cost of gymnasium's env checker and wrappers, measured side by side."""
    result = run(steps, rounds)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"{steps} steps x {rounds} rounds, interleaved; medians")
    for name in ("checked", "unchecked", "bare"):
        click.echo(
            f"  {name:<10} {result['steps_per_s'][name]:>9.0f} steps/s  {result['per_step_us'][name]:>7.1f} us/step"
        )
    click.echo(
        f"  checked / unchecked: {result['ratio_checked_over_unchecked']:.3f}   "
        f"checked / bare: {result['ratio_checked_over_bare']:.3f}   "
        f"checker overhead: {result['checker_overhead_us_per_step']:+.1f} us/step"
    )
    first = result["first_reset_and_step_ms"]
    click.echo(f"  make + first reset + first step: {first['checked']:.1f} ms checked, "
               f"{first['unchecked']:.1f} ms unchecked")  # fmt: skip
