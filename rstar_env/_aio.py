"""The former, private name of :mod:`rstar_env.aio`: the same module object, so patches and state are shared."""

import sys

from rstar_env import aio

sys.modules[__name__] = aio
