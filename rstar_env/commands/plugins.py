"""``rstar-env plugins``: the registered plugins, where each comes from, and those that failed to load."""

from __future__ import annotations

import json
import sys

import click
from rich.console import Console
from rich.table import Table

from rstar_env._cli_util import console


@click.command()
@click.option("--kind", type=click.Choice(["tool", "reward", "sampler"]), help="Only this kind of plugin.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@click.option("--check", is_flag=True, help="Exit 1 when an installed plugin failed to load (for CI).")
def plugins(kind: str | None, as_json: bool, check: bool) -> None:
    """List registered plugins and the package each comes from, and those that failed to load.

    A plugin that fails to import or register is skipped (the others keep working) and listed under "failed to
    load"; the exit status is 0 unless --check is given. On a terminal the list is a table; piped, it is
    tab-separated rows with whole names.
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
    elif not Console().is_terminal:  # piped: a table would be cut to 80 columns; whole names, one row a line
        click.echo("\t".join(("kind", "name", "source", "class")))
        for row in rows:
            click.echo("\t".join(row.values()))
        if broken:
            click.echo("\nfailed to load (skipped)\n" + "\t".join(("distribution", "entry point", "error")))
            for item in broken:
                click.echo("\t".join(" ".join(str(v).split()) for v in item.values()))
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


command = plugins
