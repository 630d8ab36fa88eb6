"""Which policy version generated each token, and how stale each training batch is (async and partial rollouts).

**Version.** The policy version is the trainer's global step whose update produced the weights: 0 is the starting
model, N the weights after N optimizer steps (a resumed run starts at its checkpoint's step). The trainer process
(OpenRLHF's ``PPOTrainer``, or the async ``TrainingActor``) knows it; the engines do not. So, after every weight
broadcast, :func:`broadcast_and_tag` tells each vLLM engine actor the version it now holds
(:func:`set_engine_version`, run on the actor through Ray's ``__ray_call__``) and reads back what each engine
acknowledges: a sync that an engine missed raises instead of training on mislabelled samples. In partial-rollout
mode OpenRLHF pauses generation around the broadcast, so the version changes while no token is being produced.

**Per token.** The agent (:mod:`rstar_trainers.openrlhf.agent_func`) runs in the engine actor's process and reads
:func:`engine_version` as each streamed chunk of a turn arrives, so every generated token carries the version that
produced it (:func:`version_runs` compresses them). The episode's ``extra_logs`` carry its oldest and newest token
version (``policy_version_min`` / ``policy_version_max``), which OpenRLHF copies into each sample's ``info``.

**Staleness.** When the trainer trains on a batch at version ``V`` (its ``global_step``), a sample whose oldest
token is of version ``v`` is ``V - v`` versions behind. :func:`staleness_stats` gives min/mean/max over the batch
and the share of samples whose tokens span several versions; :func:`install_trainer_hooks` adds them to OpenRLHF's
step status (``async/staleness_{min,mean,max}``, ``async/mixed_version_samples``, ``async/policy_version``), so they
appear in the ``Global step`` log line, TensorBoard and wandb.

Only the standard library is imported at module level: Ray imports this module in every worker.
"""

from __future__ import annotations

import functools
import logging
import sys
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any


@functools.cache
def _logger() -> logging.Logger:
    """OpenRLHF's logger setup where it is installed (a Ray worker prints only what its handlers pass), else ours."""
    try:
        from openrlhf.utils.logging_utils import init_logger
    except ImportError:
        return logging.getLogger(__name__)
    return init_logger(__name__)


VERSION_MIN_KEY = "policy_version_min"
VERSION_MAX_KEY = "policy_version_max"
"""``extra_logs`` / ``info`` keys: the oldest and newest policy version among an episode's generated tokens."""
TOKEN_VERSIONS_KEY = "rstar_token_versions"
"""The agent result's key for the per-turn ``[[version, count], ...]`` runs of its generated tokens."""
STATUS_PREFIX = "async/"

_engine_version = 0
_lock = threading.Lock()


# -- engine side ----------------------------------------------------------------------------------------------------
def engine_version() -> int:
    """The policy version the engine of this process holds (0 until the first broadcast is tagged)."""
    return _engine_version


def set_engine_version(actor: Any, version: int) -> int:
    """Record ``version`` as what this engine process now holds; returns it (the trainer's acknowledgement).

    Called as ``engine.__ray_call__.remote(set_engine_version, version)``: Ray passes the actor instance first."""
    global _engine_version
    with _lock:
        _engine_version = int(version)
        return _engine_version


def version_runs(versions: Sequence[int]) -> list[list[int]]:
    """``[5, 5, 6]`` -> ``[[5, 2], [6, 1]]``: each version with the count of consecutive tokens it produced."""
    runs: list[list[int]] = []
    for version in versions:
        if runs and runs[-1][0] == version:
            runs[-1][1] += 1
        else:
            runs.append([int(version), 1])
    return runs


# -- trainer side ---------------------------------------------------------------------------------------------------
def staleness_stats(version_min: Sequence[float], version_max: Sequence[float], current: int) -> dict[str, float]:
    """Per sample, ``current - oldest token version``: min, mean and max over the batch, the share of samples whose
    tokens come from more than one version, and ``current`` itself. Empty input gives ``{}``."""
    if not version_min:
        return {}
    behind = [current - v for v in version_min]
    mixed = sum(1 for lo, hi in zip(version_min, version_max, strict=True) if hi != lo)
    return {
        f"{STATUS_PREFIX}policy_version": float(current),
        f"{STATUS_PREFIX}staleness_min": float(min(behind)),
        f"{STATUS_PREFIX}staleness_mean": float(sum(behind) / len(behind)),
        f"{STATUS_PREFIX}staleness_max": float(max(behind)),
        f"{STATUS_PREFIX}mixed_version_samples": float(mixed / len(behind)),
    }


def sample_versions(samples: Sequence[Any]) -> tuple[list[float], list[float]]:
    """The oldest and newest token version of each OpenRLHF ``Experience`` (from its ``info``)."""
    lows, highs = [], []
    for sample in samples:
        info = getattr(sample, "info", None) or {}
        if VERSION_MIN_KEY not in info:
            raise ValueError(
                f"a sample lacks info[{VERSION_MIN_KEY!r}]: the agent that rolled it out is not "
                "rstar_trainers.openrlhf.agent_func (--train.agent_func_path)"
            )
        for key, out in ((VERSION_MIN_KEY, lows), (VERSION_MAX_KEY, highs)):
            value = info[key]
            out.extend(float(v) for v in (value.reshape(-1).tolist() if hasattr(value, "reshape") else [value]))
    return lows, highs


def broadcast_and_tag(
    trainer: Any, broadcast: Callable[[Any], Any], get: Callable[[Any], Any] | None = None
) -> list[int]:
    """Run OpenRLHF's weight broadcast (``broadcast(trainer)``), then tell every engine the version it now holds;
    returns the engines' acknowledgements (raises if one differs). ``get`` is ``ray.get`` (tests pass another)."""
    if get is None:
        import ray

        get = ray.get
    broadcast(trainer)
    version = int(getattr(trainer, "_rstar_policy_version", 0))
    engines = list(getattr(trainer, "vllm_engines", None) or [])
    acks = get([engine.__ray_call__.remote(set_engine_version, version) for engine in engines])
    if any(ack != version for ack in acks):
        raise RuntimeError(f"engines acknowledged policy versions {acks} after broadcasting version {version}")
    _logger().info("weights of policy version %d synced to %d engine(s)", version, len(engines))
    return acks


def _wrappers(real_init_states: Callable, real_train_step: Callable, real_broadcast: Callable) -> tuple:
    """The three wrapped trainer methods (unbound: ``self`` first), around OpenRLHF's."""

    @functools.wraps(real_init_states)
    def init_checkpoint_states(self: Any) -> dict[str, Any]:
        states = real_init_states(self)
        self._rstar_policy_version = int(states.get("global_step", 0) or 0)
        return states

    @functools.wraps(real_train_step)
    def train_step(self: Any, rollout_samples: Any, global_step: int) -> tuple[dict[str, Any], int]:
        lows, highs = sample_versions(rollout_samples)
        stats = staleness_stats(lows, highs, global_step)
        # The broadcast inside train_step sends the weights of this update: version global_step + 1.
        self._rstar_policy_version = global_step + 1
        status, step = real_train_step(self, rollout_samples, global_step)
        status.update(stats)
        return status, step

    @functools.wraps(real_broadcast)
    def broadcast_to_vllm(self: Any) -> None:
        broadcast_and_tag(self, real_broadcast)

    for wrapper in (init_checkpoint_states, train_step, broadcast_to_vllm):
        wrapper._rstar_hook = True  # type: ignore[attr-defined]
    return init_checkpoint_states, train_step, broadcast_to_vllm


METHODS = ("init_checkpoint_states", "train_step", "broadcast_to_vllm")


def install_trainer_hooks(base: type) -> None:
    """Wrap OpenRLHF's ``BasePPOTrainer`` (``base``) so that it tracks the policy version (from the checkpoint it
    resumes, then +1 per training step), tags the engines after each broadcast, and adds the batch's staleness to
    each step's status. Idempotent."""
    if getattr(base, "_rstar_versioned", False):
        return
    for name, wrapper in zip(METHODS, _wrappers(*(getattr(base, n) for n in METHODS)), strict=True):
        setattr(base, name, wrapper)
    base._rstar_versioned = True


def install_on_trainer(trainer: Any) -> bool:
    """The same hooks on one trainer instance (instance attributes over its class's methods), where its methods
    are not ours: Ray's ``@ray.remote`` copies each method onto the actor class it builds at decoration time, so an
    actor class decorated before the patch (the sync ``PPOTrainer``, decorated in the driver while its module is
    executed) calls OpenRLHF's originals although ``BasePPOTrainer`` is patched. Returns False (nothing done) when the
    methods already are the hooks."""
    if all(getattr(getattr(trainer, name), "_rstar_hook", False) for name in METHODS):
        return False
    for name, wrapper in zip(METHODS, _wrappers(*(getattr(type(trainer), n) for n in METHODS)), strict=True):
        setattr(trainer, name, types.MethodType(wrapper, trainer))
    trainer._rstar_versioned = True
    return True


def calling_trainer(depth: int = 8) -> Any:
    """The OpenRLHF trainer whose ``__init__`` is building the caller (``self`` of a frame up the stack that has
    ``train_step`` and ``broadcast_to_vllm``), or ``None``."""
    frame = sys._getframe(2)
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and all(callable(getattr(owner, n, None)) for n in METHODS):
            return owner
        frame = frame.f_back
    return None
