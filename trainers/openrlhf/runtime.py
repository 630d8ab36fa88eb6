"""How the processes of an OpenRLHF job find the run config.

The launcher exports the config's path as ``RSTAR_ENV_CONFIG`` in the job's runtime env, so every Ray worker (the
vLLM engines running the agent, the trainer actor running the RoC generator) reads the same YAML. Without the
variable, a ``rstar_env.yaml`` next to the calling file is used (handy when ``--train.agent_func_path`` points at a
copy of ``agent_func.py`` in a directory of its own). Nothing is configured by editing code.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from rstar_env.config import ConfigError, RunConfig, load_config

CONFIG_ENV = "RSTAR_ENV_CONFIG"
CONFIG_FILENAME = "rstar_env.yaml"

_cache: dict[str, RunConfig] = {}
_lock = threading.Lock()


def config_path(next_to: str | os.PathLike[str] | None = None) -> Path:
    """The run config this process uses: ``$RSTAR_ENV_CONFIG``, else ``rstar_env.yaml`` beside ``next_to``."""
    value = os.environ.get(CONFIG_ENV)
    if value:
        return Path(value).expanduser()
    if next_to is not None:
        candidate = Path(next_to).resolve().parent / CONFIG_FILENAME
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"no run config: set {CONFIG_ENV} to the YAML path (the launcher does this for every Ray worker), "
        f"or put a {CONFIG_FILENAME} next to {next_to or 'the agent file'}"
    )


def load_run_config(next_to: str | os.PathLike[str] | None = None) -> RunConfig:
    """The validated run config, read once per process and path."""
    path = config_path(next_to)
    key = str(path)
    with _lock:
        if key not in _cache:
            _cache[key] = load_config(path)
        return _cache[key]


def clear_cache() -> None:
    with _lock:
        _cache.clear()
