"""Process trees on Linux, for rstar-env's own use outside the sandbox: a process's children and descendants
(through ``/proc``), whether one is alive, its state, and a whole-tree kill that catches what a double fork orphans.

The one public place for these: the code lives with the sandbox (``rstar_env/sandbox/_proctree.py``), whose zygote
and workers load it by path without ``rstar_env``; everything else (the thread sizing of :mod:`rstar_env.threads`,
the engine guard of :mod:`rstar_env.rollout`, the benchmarks) imports it from here.
"""

from __future__ import annotations

from rstar_env.sandbox._proctree import children, descendants, is_alive, kill_tree, state

__all__ = ["children", "descendants", "is_alive", "kill_tree", "state"]
