"""``rstar-env bench threads``: torch's thread choice, idle and beside CPU-bound neighbours, side by side in one run.

For each thread setting (``auto``, rstar-env's default, and each fixed count from the machine's cores down to 1) and
each neighbour count (0, then ``--neighbours``), a fresh child process loads the model and measures what the main
job spends its time on: generating with the transformers policy (``--prompts`` chat prompts, up to ``--tokens``
new tokens each, at temperature 1 with fixed seeds) and training micro-steps (2 rows of 300 tokens, forward, backward
and AdamW, as the trainers take them). The neighbours (``while True: pass``) run for the whole measurement of that
row and stop after it. Each row is printed with its ratio to ``auto`` at the same neighbour count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import click

from rstar_env.bench.train import neighbours


def measure(model: str, prompts: int, tokens: int, steps: int) -> dict[str, float]:
    """In this process: generation tokens/s and seconds per training micro-step, threads as ``RSTAR_ENV_THREADS``."""
    import torch

    from rstar_env import threads
    from rstar_env.bench.generate import _requests
    from rstar_env.bench.generate import prompts as chat_prompts
    from rstar_env.rollout.local import TransformersPolicy, load_model
    from rstar_env.rollout.policy import SamplingParams

    loaded, tokenizer = load_model(model, cache=False)
    contexts = chat_prompts(tokenizer, prompts)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=tokens, seed=0)
    policy = TransformersPolicy(loaded, tokenizer=tokenizer, sampling=sampling, batch_size=prompts)
    policy.generate_sync(_requests(contexts[:2], 0))  # warm-up
    start = time.perf_counter()
    generations = policy.generate_sync(_requests(contexts, 1))
    generate_s = time.perf_counter() - start
    generated = sum(len(g.token_ids or ()) for g in generations)

    loaded.train()
    optimizer = torch.optim.AdamW(loaded.parameters(), lr=1e-7)
    ids = torch.randint(0, len(tokenizer), (2, 300), generator=torch.Generator().manual_seed(0))

    def step() -> None:
        threads.adapt()
        loaded(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return {
        "tok_s": generated / generate_s,
        "tokens": generated,
        "step_s": (time.perf_counter() - start) / steps,
        "threads_at_end": threads.adapt(),
    }


def run_row(setting: str, busy: int, model: str, prompts: int, tokens: int, steps: int) -> dict[str, Any]:
    env = {**os.environ, "RSTAR_ENV_THREADS": setting}
    env.pop("OMP_NUM_THREADS", None)  # the setting alone decides
    code = (
        "import json, sys; from rstar_env.bench.threads import measure; "
        f"print(json.dumps(measure({model!r}, {prompts}, {tokens}, {steps})))"
    )
    with neighbours(busy):
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise click.ClickException(
            f"threads={setting}, {busy} neighbour(s): the measurement failed:\n{done.stderr[-3000:]}"
        )
    return {"threads": setting, "neighbours": busy, **json.loads(done.stdout.strip().splitlines()[-1])}


@click.command("threads")
@click.option("--model", default="smollm2", show_default=True)
@click.option(
    "--neighbours",
    "busy",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="CPU-bound processes beside the second half of the rows.",
)
@click.option("--prompts", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--tokens", type=click.IntRange(min=1), default=48, show_default=True, help="New tokens per prompt.")
@click.option("--steps", type=click.IntRange(min=1), default=3, show_default=True, help="Training micro-steps timed.")
@click.option(
    "--threads",
    "chosen",
    multiple=True,
    help="Settings to compare: auto or a count [default: auto, then every count from the cores down to 1].",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(
    model: str, busy: int, prompts: int, tokens: int, steps: int, chosen: tuple[str, ...], as_json: bool
) -> None:
    """Torch thread settings (auto and fixed counts), idle and beside CPU-bound neighbours, side by side."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    settings = list(dict.fromkeys(["auto", *chosen])) if chosen else ["auto", *(str(n) for n in range(cores, 0, -1))]
    for setting in settings:
        if setting != "auto" and not (setting.isdigit() and int(setting) > 0):
            raise click.BadParameter(f"{setting!r}: use auto or a thread count of at least 1", param_hint="--threads")
    rows = []
    for count in (0, busy):
        for setting in settings:
            click.echo(f"threads={setting}, {count} neighbour(s) ...", err=True)
            rows.append(run_row(setting, count, model, prompts, tokens, steps))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    click.echo("| neighbours | threads | generation tok/s | vs auto | training micro-step | vs auto | auto chose |")
    click.echo("|---|---|---|---|---|---|---|")
    for row in rows:
        auto = next(r for r in rows if r["neighbours"] == row["neighbours"] and r["threads"] == "auto")
        click.echo(
            f"| {row['neighbours']} | {row['threads']} | {row['tok_s']:.1f} | {row['tok_s'] / auto['tok_s']:.2f}x | "
            f"{row['step_s']:.2f} s | {auto['step_s'] / row['step_s']:.2f}x | "
            f"{row['threads_at_end'] if row['threads'] == 'auto' else '-'} |"
        )
