"""rstar-env: agentic RL for math reasoning with a Python tool.

``import rstar_env`` is light: it registers the ``rstar_env/MathTool-v0`` gymnasium environment and imports
nothing heavy. Everything else is imported where it is used.
"""

from __future__ import annotations

from typing import Any

import gymnasium

__version__ = "0.1.0"

ENV_ID = "rstar_env/MathTool-v0"

if ENV_ID not in gymnasium.registry:
    # The env checker stays on (gymnasium's default): it checks the first reset and step of every env `make` builds,
    # and your wrappers with it; after that its wrapper only forwards (see README, "Measured figures").
    gymnasium.register(
        id=ENV_ID,
        entry_point="rstar_env.env:MathToolEnv",
        vector_entry_point="rstar_env.vector:MathToolVectorEnv",
    )


def __getattr__(name: str) -> Any:
    if name == "TokenAction":  # lazily, so that `import rstar_env` stays light
        from rstar_env.spaces import TokenAction

        return TokenAction
    raise AttributeError(f"module 'rstar_env' has no attribute {name!r}")


__all__ = ["ENV_ID", "TokenAction", "__version__"]
