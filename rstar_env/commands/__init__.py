"""The ``rstar-env`` subcommands, one module each (``rstar_env/commands/<name>.py``, its click command named
``command``), mounted by :func:`rstar_env.cli.main` through one table, :data:`COMMANDS`, and imported only when the
command runs or ``--help`` lists it.

Installed distributions mount their own commands (the trainers' ``train``, ``compare``, ``plot``, ``roc-check``)
through the :data:`ENTRY_POINTS` entry-point group (``name = "module:click_command"``); a command of this table
wins over a mounted one of the same name.
"""

from __future__ import annotations

ENTRY_POINTS = "rstar_env.commands"
"""The entry-point group through which installed distributions mount commands into ``rstar-env`` (``name =
"module:click_command"``); ``rstar_env.commands.launch`` does the same for ``rstar-env launch`` subcommands."""

COMMANDS: dict[str, str] = {
    name: f"rstar_env.commands.{name.replace('-', '_')}:command"
    for name in (
        "bench",
        "chat",
        "episode",
        "eval",
        "export-model",
        "filter-hard",
        "launch",
        "plugins",
        "run-tool",
        "serve",
    )
}
"""``rstar-env`` subcommand -> ``module:attr`` of its click command."""

__all__ = ["COMMANDS", "ENTRY_POINTS"]
