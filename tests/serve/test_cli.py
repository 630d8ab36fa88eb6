"""``rstar-env serve``'s options take each limit's default and help from :class:`~rstar_env.serve.limits.Limits`
(written once), and the command builds exactly the ``Limits`` its flags name."""

from __future__ import annotations

import dataclasses

import click
import pytest
from click.testing import CliRunner

from rstar_env.serve import cli
from rstar_env.serve.limits import Limits, limit_help


def _limit_params(command: click.Command) -> dict[str, click.Parameter]:
    names = {f.name for f in dataclasses.fields(Limits)}
    return {p.name: p for p in command.params if p.name in names}


@pytest.mark.parametrize("name", ["env", "sandbox", "verify"])
def test_each_limit_option_is_the_field(name):
    params = _limit_params(cli.command.commands[name])
    # Every Limits field a user can set from the command line (backlog follows --max-connections; keep_alive_s
    # is uvicorn's usual 5 s): a new field without an option, or an option that restates a field, shows here.
    assert set(params) == {f.name for f in dataclasses.fields(Limits)} - {"backlog", "keep_alive_s"}
    for field_name, param in params.items():
        assert param.help == limit_help(field_name), field_name
        expected = getattr(Limits(), field_name)
        assert (param.default if not param.multiple else ()) == expected, field_name


def test_the_command_builds_the_limits_its_flags_name(monkeypatch):
    built: list[Limits] = []

    class NoResources:
        def __init__(self, *args, **kwargs):
            pass

    monkeypatch.setattr("rstar_env.serve.resources.Resources", NoResources)
    monkeypatch.setattr("rstar_env.serve.app.serve", lambda *a, limits, **k: built.append(limits))
    runner = CliRunner()
    assert runner.invoke(cli.command, ["verify"]).exit_code == 0
    assert built.pop() == Limits()  # the defaults, exactly (backlog: max(8192, 4096))
    flags = ["--max-sessions", "5", "--max-connections", "100", "--allow-host", "a", "--allow-host", "b"]
    result = runner.invoke(cli.command, ["verify", *flags, "--call-slots", "3", "--idle-timeout-s", "2.5"])
    assert result.exit_code == 0, result.output
    assert built.pop() == Limits(
        max_sessions=5, max_connections=100, backlog=4096, allowed_hosts=("a", "b"), call_slots=3, idle_timeout_s=2.5
    )
