"""Suites that need an optional package: skipped where it is not installed, found without importing it."""

from __future__ import annotations

import importlib.util
import os

import pytest


def require(module: str, install: str) -> None:
    """Skip the calling test module, at collection, when ``module`` is not installed; ``install`` says how to get it.

    Found, not imported: every pytest-xdist worker collects every module, and importing the package here would
    cost each of them its import (OpenEnv, TRL: about a CPU-second each) although one runs the tests. Under CI
    nothing is skipped: a suite that cannot run its subject fails there instead."""
    if importlib.util.find_spec(module) is None and os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        pytest.skip(f"needs {module}: {install}", allow_module_level=True)
