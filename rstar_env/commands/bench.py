"""``rstar-env bench``: benchmarks that print side-by-side ratios measured in one run (each imported on use, so
``rstar-env --help`` stays fast and optional extras stay optional)."""

from __future__ import annotations

import click

from rstar_env._cli_util import CommandGroup


@click.group(
    "bench",
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


command = bench
