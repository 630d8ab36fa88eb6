"""An alias of :mod:`rstar_env.plugins`, the plugin author's import place (the full guide: ``docs/plugins.md``).

``hookimpl``, ``register``, the ``load_*`` functions and everything else of the author surface are importable from
here too, as they always were::

    from rstar_env.plugin import EpisodeContext, ToolResult, hookimpl, register, tool_schema
"""

from __future__ import annotations

from rstar_env.plugins import *  # noqa: F403  (the same objects, one definition)
from rstar_env.plugins import __all__ as __all__
