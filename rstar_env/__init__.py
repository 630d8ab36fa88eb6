"""rstar-env: agentic RL for math reasoning with a Python tool.

``import rstar_env`` is light: it registers the ``rstar_env/MathTool-v0`` gymnasium environment and imports
nothing heavy. Everything else is imported where it is used.
"""

from __future__ import annotations

import gymnasium

__version__ = "0.1.0"

ENV_ID = "rstar_env/MathTool-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(
        id=ENV_ID,
        entry_point="rstar_env.env:MathToolEnv",
        vector_entry_point="rstar_env.vector:MathToolVectorEnv",
        disable_env_checker=True,
    )

__all__ = ["ENV_ID", "__version__"]
