"""The module the entry point names: one hook per kind, each returning plugin classes (not instances)."""

from rstar_env.plugin import hookimpl
from rstar_examples.calculator import Calculator
from rstar_examples.exact_match import ExactMatch
from rstar_examples.keep_shortest import KeepShortest


@hookimpl
def rstar_env_tools() -> list[type]:
    return [Calculator]


@hookimpl
def rstar_env_rewards() -> list[type]:
    return [ExactMatch]


@hookimpl
def rstar_env_samplers() -> list[type]:
    return [KeepShortest]
