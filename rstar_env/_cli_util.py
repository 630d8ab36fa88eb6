"""What the ``rstar-env`` command line and the commands other packages mount into it share.

:class:`CommandGroup` is the host's side of the mounting: a click group whose subcommands are its own, modules
imported on use, and whatever installed distributions declare in an entry-point group (e.g. the trainers'
``train`` in ``rstar_env.commands``). The command line is extended by what is installed and never imports the
packages that extend it; a command module is imported only when that command runs or ``--help`` lists it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
import signal
import threading
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import click
from rich.console import Console

console = Console(stderr=True)
"""Where commands write progress and messages (stderr: stdout stays for a command's result)."""


def fail(message: str) -> NoReturn:
    """End the command with ``Error: message`` on stderr and exit status 1 (no traceback)."""
    raise click.ClickException(message)


def one_line(what: str, exc: BaseException) -> str:
    """An error as one line, like every other command's; RSTAR_ENV_TRACEBACK=1 re-raises for the full story."""
    if os.environ.get("RSTAR_ENV_TRACEBACK"):
        raise exc
    text = " ".join(str(exc).split()) or "(no message)"
    return f"{what}: {type(exc).__name__}: {text} (RSTAR_ENV_TRACEBACK=1 shows the traceback)"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises ``KeyboardInterrupt`` (see :func:`stops_on_sigterm`)."""


F = TypeVar("F", bound=Callable[..., Any])


def stops_on_sigterm(command: F) -> F:
    """Make SIGTERM stop a long-running command the way Ctrl-C does: while it runs (in the main thread), the first
    SIGTERM raises :class:`Terminated`, a ``KeyboardInterrupt``, so the command's clean-stop path runs (a trainer
    saves its checkpoint, an engine and its processes are shut down) instead of the process dying on the spot and
    leaving its children behind. Later SIGTERMs are ignored while that path runs; SIGKILL still ends it at once.
    Put it under the click decorators (it wraps the command's function)."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():  # only the main thread can take signals
            return command(*args, **kwargs)
        fired = False

        def on_sigterm(_signum: int, _frame: Any) -> None:
            nonlocal fired
            if not fired:
                fired = True
                raise Terminated("SIGTERM")

        previous = signal.signal(signal.SIGTERM, on_sigterm)
        try:
            return command(*args, **kwargs)
        finally:
            signal.signal(signal.SIGTERM, previous)

    return run  # type: ignore[return-value]


def interrupted_status(exc: BaseException) -> int:
    """The exit status of a command stopped by ``exc``: 143 (128 + SIGTERM) for :class:`Terminated`, else 130
    (128 + SIGINT), as a shell reports a process that a signal ended."""
    return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def _reinstall(who: str) -> str:
    return f"reinstall {who} (in a checkout: pip install --no-deps -e .)"


class CommandGroup(click.Group):
    """A group whose subcommands are its own, ``lazy`` ones (``name -> "module:attr"``, imported on use), and the
    ones installed distributions mount through the entry-point group ``entry_points`` (``name = "module:command"``).

    Its own commands win over mounted ones of the same name. A mounted command that fails to import, is not a click
    command, or is mounted by two distributions at once is still listed, and running it fails with one line naming
    the distribution, the entry point and the fix.
    """

    def __init__(
        self, *args: Any, lazy: dict[str, str] | None = None, entry_points: str | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})
        self.entry_point_group = entry_points
        self._mounted_eps: dict[str, list[importlib.metadata.EntryPoint]] | None = None
        self._loaded: dict[str, click.Command] = {}

    def mounted(self) -> dict[str, list[importlib.metadata.EntryPoint]]:
        """The entry points of ``entry_points`` by command name (metadata only: nothing is imported)."""
        if self._mounted_eps is None:
            found: dict[str, list[importlib.metadata.EntryPoint]] = {}
            if self.entry_point_group:
                for ep in importlib.metadata.entry_points(group=self.entry_point_group):
                    same = found.setdefault(ep.name, [])
                    if all(e.value != ep.value for e in same):  # one distribution seen twice on sys.path
                        same.append(ep)
            self._mounted_eps = found
        return self._mounted_eps

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy, *self.mounted()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        own = super().get_command(ctx, name)
        if own is not None:
            return own
        if name in self.lazy:
            module, _, attr = self.lazy[name].partition(":")
            return getattr(importlib.import_module(module), attr)
        eps = self.mounted().get(name)
        if not eps:
            return None
        if name not in self._loaded:
            self._loaded[name] = self._load(name, eps)
        return self._loaded[name]

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            if self.entry_point_group and not self.mounted():  # e.g. metadata installed before the group existed
                exc.message += (
                    f" No command is mounted through the '{self.entry_point_group}' entry-point group "
                    "here: the installed metadata of the distribution that provides the command is "
                    f"missing or stale; {_reinstall('it')}."
                )
            raise

    def _load(self, name: str, eps: list[importlib.metadata.EntryPoint]) -> click.Command:
        where = [f"{_distribution(ep)} ({ep.name} = {ep.value})" for ep in eps]
        if len(eps) > 1:
            return _Unavailable(
                name,
                f"{len(eps)} distributions mount a command named {name!r} in the "
                f"'{self.entry_point_group}' entry-point group: {', '.join(where)}; uninstall "
                "all but one",
            )
        ep = eps[0]
        what = (
            f"the command {name!r} that {where[0]} mounts through the '{self.entry_point_group}' entry-point "
            f"group failed to load; {_reinstall(_distribution(ep))}, or uninstall it"
        )
        try:
            command = ep.load()
        except BaseException as exc:  # an import may raise anything, SystemExit included: isolate it
            if isinstance(exc, KeyboardInterrupt):
                raise
            return _Unavailable(name, what, exc)
        if not isinstance(command, click.Command):
            return _Unavailable(
                name,
                f"{where[0]}, mounted as {name!r} in the '{self.entry_point_group}' "
                f"entry-point group, is a {type(command).__name__}, not a click command; "
                f"its entry point must name one",
            )
        return command


def _distribution(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return dist.name if dist is not None else "(unknown distribution)"


class _Unavailable(click.Command):
    """A mounted command that could not be loaded: listed as such; running it (``--help`` too) fails in one line."""

    def __init__(self, name: str, message: str, exc: BaseException | None = None) -> None:
        def run(args: tuple[str, ...]) -> None:
            fail(one_line(message, exc) if exc is not None else message)

        super().__init__(
            name,
            callback=run,
            add_help_option=False,
            short_help="(unavailable: run it to see why)",
            params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
            context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        )
