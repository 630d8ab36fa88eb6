"""``rstar-env launch``: distributed training, mounted by the trainer packages through the
``rstar_env.commands.launch`` entry-point group (OpenRLHF's comes from ``rstar_trainers.openrlhf``)."""

from __future__ import annotations

import click

from rstar_env._cli_util import CommandGroup

from . import ENTRY_POINTS


@click.group("launch", cls=CommandGroup, entry_points=f"{ENTRY_POINTS}.launch")
def launch() -> None:
    """Launch distributed training (OpenRLHF on a Ray cluster)."""


command = launch
