"""The ``rstar-env`` command line: the group, :func:`main`. It defines no command: each is a module of
:mod:`rstar_env.commands`, mounted through its one table; installed distributions mount theirs through the
``rstar_env.commands`` entry-point group."""

from __future__ import annotations

from typing import Any

import click

from rstar_env import __version__
from rstar_env._cli_util import CommandGroup
from rstar_env.commands import COMMANDS as _TABLE
from rstar_env.commands import ENTRY_POINTS

COMMANDS = ENTRY_POINTS
"""The entry-point group through which installed distributions mount commands into ``rstar-env`` (``name =
"module:click_command"``); the trainers mount ``train``, ``compare``, ``plot`` and ``roc-check`` this way.
``rstar_env.commands.launch`` does the same for ``rstar-env launch`` subcommands."""


@click.group(
    cls=CommandGroup,
    entry_points=ENTRY_POINTS,
    lazy=_TABLE,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="rstar-env")
def main() -> None:
    """rstar-env: agentic RL for math reasoning with a Python tool."""


_MOVED = {
    "plugins": "rstar_env.commands.plugins:command",
    "run_tool": "rstar_env.commands.run_tool:command",
    "episode": "rstar_env.commands.episode:command",
    "eval_command": "rstar_env.commands.eval:command",
    "chat": "rstar_env.commands.chat:command",
    "export_model_command": "rstar_env.commands.export_model:command",
    "filter_hard_command": "rstar_env.commands.filter_hard:command",
    "bench": "rstar_env.commands.bench:command",
    "launch": "rstar_env.commands.launch:command",
}
"""The commands this module used to define, still importable from it (imported on first use)."""


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        import importlib

        module, _, attr = _MOVED[name].partition(":")
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":  # pragma: no cover
    main()
