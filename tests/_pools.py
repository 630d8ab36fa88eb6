"""Sandbox settings for tests whose subject is not what the model's code imports."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LIGHT_POOL: dict[str, Any] = {"preload": [], "warmup": None}
"""A ``local`` pool that imports nothing ahead of calls: about 0.2 CPU-seconds to start instead of 1 (numpy, sympy
and sympy's warm-up). The default pool is what users run: tests of isolation, limits, memory and the default
config keep it."""


def light_python(*, sandbox: dict[str, Any] | None = None, **python: Any) -> dict[str, Any]:
    """The ``python`` tool (with ``python`` options) on a light pool (``sandbox``: more of its options), as an env's
    ``tools`` entry."""
    return {"name": "python", "options": {**python, "sandbox_options": {**LIGHT_POOL, **(sandbox or {})}}}


LIGHT_PYTHON: dict[str, Any] = light_python()
"""The ``python`` tool on a light pool, with its other options at their defaults."""


def light_config(path: Path, *, sandbox: dict[str, Any] | None = None, **python: Any) -> Path:
    """Write a run config to ``path`` for a server under test: the ``python`` tool (with ``python`` options) on a
    light pool (``sandbox``: more of its options), and the ``math`` reward without its parsers' warm-up. Each
    ``rstar-env serve env`` of the suite starts its own pool and verifier: 2.5 CPU-seconds less each."""
    import yaml

    config = {
        "tools": [light_python(sandbox=sandbox, **python)],
        "reward": {"name": "math", "options": {"warm_up": False}},
    }
    path.write_text(yaml.safe_dump(config))
    return path
