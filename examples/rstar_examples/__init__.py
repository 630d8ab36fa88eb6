"""Example rstar-env plugins, one of each kind: :class:`Calculator` (tool), :class:`ExactMatch` (reward),
:class:`KeepShortest` (sampler). They are registered by the ``rstar_env`` entry point in ``pyproject.toml``, which
names :mod:`rstar_examples.plugins`."""

from rstar_examples.calculator import Calculator
from rstar_examples.exact_match import ExactMatch, ExactMatchOptions
from rstar_examples.keep_shortest import KeepShortest

__all__ = ["Calculator", "ExactMatch", "ExactMatchOptions", "KeepShortest"]
