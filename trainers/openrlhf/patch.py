"""Put :class:`~rstar_trainers.openrlhf.samples_generator.RocSamplesGenerator` where OpenRLHF looks for its
samples generator, in every process of a job.

OpenRLHF builds its ``SamplesGenerator`` inside Ray actors: ``PPOTrainer.__init__`` (sync trainer) and
``GenerateSamplesActor.__init__`` (async trainer, an actor started by another actor). Patching the module globals
in the driver alone is not a mechanism to rely on: the actors run in other processes that import OpenRLHF afresh.
(With Ray 2.60 a driver-side patch happens to reach them, because Ray cloudpickles actor classes by value together
with the driver's globals; with ``load_code_from_local`` or another Ray version it would not.)

So the job's runtime env names :func:`worker_setup` as Ray's ``worker_process_setup_hook``: Ray calls it in every
worker process of the job (nested actors inherit the job's runtime env) before any task or actor code runs. It
imports nothing heavy: it installs an import hook that patches OpenRLHF's modules when (and only when) a process
imports them, so vLLM engine processes never load DeepSpeed on our account. Three names are replaced:

- ``openrlhf.trainer.ppo_utils.samples_generator.SamplesGenerator``: where a class pickled by reference resolves
  (the driver's globals carry the original class by that name);
- ``openrlhf.trainer.ppo_trainer.SamplesGenerator`` (sync trainer) and
  ``openrlhf.trainer.ppo_trainer_async.SamplesGenerator`` (async trainer): what their ``__init__`` reads.

And ``openrlhf.trainer.ppo_trainer.BasePPOTrainer`` gets the policy-version hooks of
:mod:`rstar_trainers.openrlhf.policy_version` (engines tagged after each weight sync, staleness in each step's log).

:func:`install` does the same in the current process (the driver calls it; so can tests). Only the standard
library is imported here, because Ray imports this module in every worker.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

SETUP_HOOK = "rstar_trainers.openrlhf.patch.worker_setup"
"""The ``worker_process_setup_hook`` string the launcher puts in the job's runtime env."""

DEFINING_MODULE = "openrlhf.trainer.ppo_utils.samples_generator"
TRAINER_MODULES = ("openrlhf.trainer.ppo_trainer", "openrlhf.trainer.ppo_trainer_async")
TARGETS = (DEFINING_MODULE, *TRAINER_MODULES)
ORIGINAL_ATTR = "_rstar_original_SamplesGenerator"
"""Set on the defining module: the class OpenRLHF defined, which our subclass derives from."""
DISABLE_ENV = "RSTAR_OPENRLHF_NO_ROC"
"""Set to 1 to leave OpenRLHF's samples generator alone (plain GRPO on n_samples_per_prompt rollouts)."""

_lock = threading.RLock()


def _roc_class() -> type:
    from rstar_trainers.openrlhf.samples_generator import RocSamplesGenerator

    return RocSamplesGenerator


def patch_module(module: ModuleType, roc_class: Callable[[], type] = _roc_class) -> None:
    """Replace ``module.SamplesGenerator`` with the RoC generator (idempotent)."""
    with _lock:
        if module.__name__ == DEFINING_MODULE and not hasattr(module, ORIGINAL_ATTR):
            # Remember OpenRLHF's class before anything replaces it: our subclass derives from it.
            module.__dict__[ORIGINAL_ATTR] = module.__dict__["SamplesGenerator"]
        cls = roc_class()
        if module.__dict__.get("SamplesGenerator") is not cls:
            module.SamplesGenerator = cls  # type: ignore[attr-defined]
        if module.__name__ == TRAINER_MODULES[0] and "BasePPOTrainer" in module.__dict__:
            # Policy versions and staleness (sync and async trainers both derive from BasePPOTrainer).
            from rstar_trainers.openrlhf.policy_version import install_trainer_hooks

            install_trainer_hooks(module.BasePPOTrainer)


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then patches the freshly executed module."""

    def __init__(self, loader: Any, after: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._after(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... of the wrapped loader
        return getattr(self._loader, name)


class PatchFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that patches the named modules right after they are first imported."""

    def __init__(self, targets: tuple[str, ...], after: Callable[[ModuleType], None]) -> None:
        self.targets = targets
        self.after = after

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> Any:
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _PatchingLoader(spec.loader, self.after)
                return spec
        return None


def _finder() -> PatchFinder | None:
    return next((f for f in sys.meta_path if isinstance(f, PatchFinder) and f.targets == TARGETS), None)


def install() -> bool:
    """Patch OpenRLHF's samples generator in this process: now for the modules already imported, on import for
    the others. Returns False (and does nothing) when ``RSTAR_OPENRLHF_NO_ROC=1``."""
    if os.environ.get(DISABLE_ENV) == "1":
        return False
    with _lock:
        if _finder() is None:
            sys.meta_path.insert(0, PatchFinder(TARGETS, patch_module))
        # TARGETS lists the defining module first, so its original class is recorded before anything is replaced
        # (the trainer modules import it, so it is loaded whenever they are).
        for name in TARGETS:
            module = sys.modules.get(name)
            if module is not None:
                patch_module(module)
    return True


def uninstall() -> None:
    """Remove the import hook and put OpenRLHF's class back (tests)."""
    with _lock:
        finder = _finder()
        if finder is not None:
            sys.meta_path.remove(finder)
        defining = sys.modules.get(DEFINING_MODULE)
        original = getattr(defining, ORIGINAL_ATTR, None) if defining is not None else None
        if original is None:
            return
        for name in TARGETS:
            module = sys.modules.get(name)
            if module is not None and "SamplesGenerator" in module.__dict__:
                module.SamplesGenerator = original  # type: ignore[attr-defined]


def worker_setup() -> None:
    """Ray's ``worker_process_setup_hook`` for the jobs the launcher submits."""
    install()
