"""Commands mounted into ``rstar-env`` through entry points: the trainers' ``train``, ``compare``, ``plot`` and
``roc-check`` (group ``rstar_env.commands``) and ``launch openrlhf`` (``rstar_env.commands.launch``), loaded only
when run or listed; a broken or missing entry point is a one-line error naming the distribution and the fix."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap

import click
from click.testing import CliRunner

from rstar_env._cli_util import CommandGroup
from rstar_env.cli import main


def test_the_trainers_commands_are_listed_and_come_from_the_entry_points():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0, result.output
    listed = {line.split()[0] for line in result.output.split("Commands:")[1].splitlines() if line.strip()}
    assert {"train", "compare", "plot", "roc-check", "launch", "eval", "bench"} <= listed
    mounted = {ep.name: ep for ep in importlib.metadata.entry_points(group="rstar_env.commands")}
    assert set(mounted) >= {"train", "compare", "plot", "roc-check"}
    assert mounted["train"].value == "rstar_trainers.local.cli:train" and mounted["train"].dist.name == "rstar-env"
    with click.Context(main) as ctx:
        assert main.get_command(ctx, "train").callback.__module__ == "rstar_trainers.local.cli"
        assert main.get_command(ctx, "roc-check").name == "roc-check"
    assert "train" not in main.commands  # mounted, not the host's own


def test_train_help_and_launch_openrlhf_help_work_through_the_entry_points():
    train = CliRunner().invoke(main, ["train", "--help"])
    assert train.exit_code == 0, train.output
    assert "Usage: main train [OPTIONS]" in train.output
    assert "Train on this machine (the `local` trainer)" in train.output
    assert "--max-steps INTEGER" in train.output and "--set KEY=VALUE" in train.output
    launch = CliRunner().invoke(main, ["launch", "--help"])
    assert launch.exit_code == 0 and "openrlhf" in launch.output, launch.output
    openrlhf = CliRunner().invoke(main, ["launch", "openrlhf", "--help"])
    assert openrlhf.exit_code == 0 and "--dry-run" in openrlhf.output, openrlhf.output


def test_help_lists_the_trainers_commands_without_importing_torch():
    code = textwrap.dedent("""
        import sys
        from click.testing import CliRunner
        from rstar_env.cli import main
        result = CliRunner().invoke(main, ["--help"])
        assert result.exit_code == 0 and "roc-check" in result.output, result.output
        print(sorted(m for m in ("torch", "transformers", "matplotlib") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def _install(tmp_path, monkeypatch, dist: str, entry_points: str) -> None:
    """A distribution's metadata on sys.path (what `pip install` leaves), found by importlib.metadata itself."""
    info = tmp_path / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)
    monkeypatch.syspath_prepend(str(tmp_path))


def _host() -> CommandGroup:
    @click.group(cls=CommandGroup, entry_points="rstar_env_test.commands")
    def host() -> None:
        """A host."""

    @host.command("own")
    def own() -> None:
        click.echo("the host's own")

    return host


def test_a_mounted_command_runs_and_a_host_command_wins_a_name_clash(tmp_path, monkeypatch):
    (tmp_path / "mounted_cmd_test.py").write_text(
        textwrap.dedent("""
        import click

        @click.command()
        def hello():
            \"\"\"Say hello.\"\"\"
            click.echo("hello from the mounted command")

        @click.command()
        def own():
            click.echo("the mounted one")
    """)
    )
    _install(
        tmp_path,
        monkeypatch,
        "good-dist",
        "[rstar_env_test.commands]\nhello = mounted_cmd_test:hello\nown = mounted_cmd_test:own\n",
    )
    host = _host()
    listing = CliRunner().invoke(host, ["--help"])
    assert "hello  Say hello." in listing.output and "own" in listing.output, listing.output
    assert CliRunner().invoke(host, ["hello"]).output == "hello from the mounted command\n"
    assert CliRunner().invoke(host, ["own"]).output == "the host's own\n"


def test_a_broken_entry_point_is_listed_and_fails_in_one_line_naming_the_distribution(tmp_path, monkeypatch):
    _install(
        tmp_path,
        monkeypatch,
        "broken-dist",
        "[rstar_env_test.commands]\nbroken = no_such_module_xyz:command\nnotacommand = json:dumps\n"
        "twice = no_such_module_xyz:a\n",
    )
    other = tmp_path / "other"
    other.mkdir()
    _install(other, monkeypatch, "other-dist", "[rstar_env_test.commands]\ntwice = no_such_module_xyz:b\n")
    host = _host()
    listing = CliRunner().invoke(host, ["--help"])
    assert listing.exit_code == 0, listing.output
    assert "broken       (unavailable: run it to see why)" in listing.output and "own" in listing.output
    for args in (["broken"], ["broken", "--help"], ["broken", "--some", "args"]):
        result = CliRunner().invoke(host, args)
        assert result.exit_code == 1 and result.exception is not None and isinstance(result.exception, SystemExit)
        (line,) = result.output.strip().splitlines()
        assert line.startswith(
            "Error: the command 'broken' that broken-dist (broken = no_such_module_xyz:command) "
            "mounts through the 'rstar_env_test.commands' entry-point group failed to load; "
            "reinstall broken-dist (in a checkout: pip install --no-deps -e .)"
        ), line
        assert "ModuleNotFoundError: No module named 'no_such_module_xyz'" in line and "Traceback" not in line
    wrong = CliRunner().invoke(host, ["notacommand"])
    assert wrong.exit_code == 1 and "broken-dist (notacommand = json:dumps)" in wrong.output
    assert "is a function, not a click command" in wrong.output
    clash = CliRunner().invoke(host, ["twice"])
    assert clash.exit_code == 1 and "2 distributions mount a command named 'twice'" in clash.output
    assert "broken-dist" in clash.output and "other-dist" in clash.output and "uninstall all but one" in clash.output
    assert CliRunner().invoke(host, ["own"]).output == "the host's own\n"  # the others keep working


def test_an_unknown_command_with_no_mounted_entry_point_names_the_fix():
    @click.group(cls=CommandGroup, entry_points="rstar_env_test.nothing_mounted")
    def host() -> None:
        """A host whose distributions' metadata lacks the group (installed before it existed)."""

    result = CliRunner().invoke(host, ["train"])
    assert result.exit_code == 2
    assert "No such command 'train'." in result.output
    assert "No command is mounted through the 'rstar_env_test.nothing_mounted' entry-point group" in result.output
    assert "pip install --no-deps -e ." in result.output
    plain = CliRunner().invoke(main, ["no-such-command"])  # commands are mounted: a plain typo stays plain
    assert plain.exit_code == 2 and "No such command" in plain.output and "entry-point group" not in plain.output


def test_every_command_is_a_module_mounted_through_one_table():
    import click

    from rstar_env import cli
    from rstar_env.commands import COMMANDS

    assert main.commands == {}  # the group defines no command of its own
    for name, where in COMMANDS.items():
        module, _, attr = where.partition(":")
        assert module == f"rstar_env.commands.{name.replace('-', '_')}" and attr == "command"
        command = main.get_command(click.Context(main), name)
        assert isinstance(command, click.Command) and command.name == name, name
    # the old import places of the commands still work
    assert cli.eval_command is main.get_command(click.Context(main), "eval")
    assert cli.COMMANDS == "rstar_env.commands"
