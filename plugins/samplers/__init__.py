"""Built-in group samplers: ``grpo``, ``reject_equal`` and ``roc`` (GRPO-RoC), plus sampling statistics.

Registered through the ``rstar_env`` entry-point group (``samplers = "rstar_plugins.samplers"``), like any
third-party plugin: ``rstar_env.plugins.load_sampler("roc", mode="topk")``.
"""

from __future__ import annotations

from rstar_env.plugins import hookimpl

from .basic import GRPOOptions, GRPOSampler, RejectEqualSampler
from .roc import RoCOptions, RoCSampler, error_penalty, format_penalty, penalty, roc_counts
from .stats import batch_stats, drop_reason, group_stats


@hookimpl
def rstar_env_samplers() -> list[type]:
    return [GRPOSampler, RejectEqualSampler, RoCSampler]


__all__ = [
    "GRPOOptions",
    "GRPOSampler",
    "RejectEqualSampler",
    "RoCOptions",
    "RoCSampler",
    "batch_stats",
    "drop_reason",
    "error_penalty",
    "format_penalty",
    "group_stats",
    "penalty",
    "roc_counts",
    "rstar_env_samplers",
]
