"""Adapters that plug rstar-env into other projects' trainers (:mod:`rstar_env.integrations.trl`: TRL's
``GRPOTrainer``). Each adapter imports its trainer's package only when used: ``pip install 'rstar-env[trl]'``."""
