"""Sandbox settings for tests whose subject is not what the model's code imports."""

from __future__ import annotations

from typing import Any

LIGHT_POOL: dict[str, Any] = {"preload": [], "warmup": None}
"""A ``local`` pool that imports nothing ahead of calls: about 0.2 CPU-seconds to start instead of 1 (numpy, sympy
and sympy's warm-up). The default pool is what users run: tests of isolation, limits, memory and the default
config keep it."""

LIGHT_PYTHON: dict[str, Any] = {"name": "python", "options": {"sandbox_options": LIGHT_POOL}}
"""The ``python`` tool on a light pool, as an env's ``tools`` entry."""
