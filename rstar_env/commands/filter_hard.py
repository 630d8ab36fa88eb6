"""``rstar-env filter-hard``: the problems not yet solved every time, from trajectory files."""

from __future__ import annotations

import click

from rstar_env._cli_util import fail


@click.command("filter-hard")
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
        fail(str(exc))
    click.echo(f"{hard} of {seen} problems kept (pass rate < {max_pass_rate}) -> {out}")


command = filter_hard_command
