"""What the plugin machinery reports: its errors and warning, and the records it lists."""

from __future__ import annotations

from dataclasses import dataclass

from ._hookspecs import PluginKind


class PluginError(LookupError):
    """A plugin cannot be found, loaded or built; the message says what is registered and how to fix it."""


class OptionsError(PluginError, ValueError):
    """A plugin's options have bad values. ``problems`` holds ``(option, message)`` pairs, each option a dotted path
    (``mode``, ``sandbox_options.memory_mb``; ``""`` for the options as a whole), so a config error names its key.
    A ``ValueError`` too, as a constructor's bad argument."""

    def __init__(self, prefix: str, problems: list[tuple[str, str]]) -> None:
        self.prefix = prefix
        self.problems = problems
        super().__init__(f"{prefix}: " + "; ".join(f"{o}: {m}" if o else m for o, m in problems))


class PluginLoadWarning(UserWarning):
    """An installed plugin failed to import or register and was skipped (the others keep working)."""


@dataclass(frozen=True)
class PluginInfo:
    kind: PluginKind
    name: str
    cls: type
    source: str
    """The distribution that provides it (entry point), or ``runtime`` for ``register()``."""


@dataclass(frozen=True)
class FailedPlugin:
    """An entry point that was skipped: it failed to import, or what it registers is invalid."""

    distribution: str
    entry_point: str
    """``name = module`` as written in the distribution's ``[project.entry-points.rstar_env]``."""
    error: str

    def __str__(self) -> str:
        return f"{self.distribution}: entry point {self.entry_point!r} skipped: {self.error}"


def qualname(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
