"""``rstar-env serve``: the servers for other trainers (defined in :mod:`rstar_env.serve.cli`, mounted here)."""

from __future__ import annotations

from rstar_env.serve.cli import command

__all__ = ["command"]
