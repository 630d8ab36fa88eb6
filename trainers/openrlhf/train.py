"""``python -m rstar_trainers.openrlhf.train <OpenRLHF train_ppo_ray flags>``: OpenRLHF's PPO entry with GRPO-RoC.

The job's driver. It

1. installs the RoC samples-generator patch in this process (:func:`rstar_trainers.openrlhf.patch.install`);
2. connects to Ray *before* OpenRLHF does (``train_ppo_ray`` only calls ``ray.init`` when Ray is not initialised)
   so that every worker of the job gets :func:`~rstar_trainers.openrlhf.patch.worker_setup` as its
   ``worker_process_setup_hook``. Under ``rstar-env launch`` the job's runtime env already carries the hook and
   ``RSTAR_ENV_CONFIG`` (Ray merges a driver's runtime env with the job's and rejects conflicts, so we then pass
   none); run by hand, the driver passes them itself, with the environment variables OpenRLHF's own ``ray.init``
   would have set;
3. runs OpenRLHF's ``openrlhf.cli.train_ppo_ray`` as ``__main__`` with the given flags: its parser, its validation,
   its ``train()``.
"""

from __future__ import annotations

import os
import runpy
import sys

from rstar_trainers.openrlhf.patch import SETUP_HOOK, install
from rstar_trainers.openrlhf.runtime import CONFIG_ENV

ENTRY = "openrlhf.cli.train_ppo_ray"


def runtime_env() -> dict:
    """The runtime env the driver passes to ``ray.init`` when the job was not submitted by our launcher."""
    from rstar_trainers.openrlhf.launch import OPENRLHF_ENV_VARS

    env_vars = {key: os.environ.get(key, value) for key, value in OPENRLHF_ENV_VARS.items()}
    if os.environ.get(CONFIG_ENV):
        env_vars[CONFIG_ENV] = os.path.abspath(os.environ[CONFIG_ENV])
    return {"env_vars": env_vars, "worker_process_setup_hook": SETUP_HOOK}


def main(argv: list[str] | None = None) -> None:
    from rstar_trainers.openrlhf.launch import JOB_MARKER_ENV

    argv = list(sys.argv[1:] if argv is None else argv)
    if not os.environ.get(CONFIG_ENV):
        raise SystemExit(f"{CONFIG_ENV} is not set: point it at the run config (rstar-env launch openrlhf sets it)")
    install()
    import ray

    if not ray.is_initialized():
        if os.environ.get(JOB_MARKER_ENV) == "1":
            ray.init()
        else:
            ray.init(runtime_env=runtime_env())
    sys.argv = [ENTRY, *argv]
    runpy.run_module(ENTRY, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
