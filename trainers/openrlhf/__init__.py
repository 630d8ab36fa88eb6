"""GRPO-RoC on OpenRLHF (Ray, vLLM rollouts, DeepSpeed training).

- :mod:`.agent_func`: the file ``--train.agent_func_path`` points at (``AgentExecutor`` / ``AgentInstance``).
- :mod:`.samples_generator`: ``RocSamplesGenerator``, 2G rollouts per prompt down-sampled to G by the sampler plugin.
- :mod:`.patch`: puts that generator into OpenRLHF's Ray actors (``worker_process_setup_hook``).
- :mod:`.launch`: ``rstar-env launch openrlhf`` (click ``command``); :mod:`.train`: the job's entry point.
- :mod:`.config`: the ``trainer: {backend: openrlhf}`` schema; :mod:`.convert`: SFT data converter.

Nothing here is imported by ``import rstar_trainers.openrlhf``: OpenRLHF, torch and Ray load only where used.
"""
