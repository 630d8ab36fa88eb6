"""How sandbox interpreters are started: the command line and the environment they get.

The zygote and the ``subprocess`` workers run the private modules of this package *without importing*
``rstar_env`` (which would pull gymnasium and friends into every sandbox and let user code see them). They load
this directory as a synthetic package named ``_rstar_sandbox``; never putting the directory itself on
``sys.path`` matters, because ``subprocess.py`` here would shadow the standard library's.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from typing import Any

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SANDBOX_MODULES = (
    "_zygote",
    "_worker",
    "_protocol",
    "_limits",
    "_proctree",
    "_cgroup",
    "_seccomp",
    "_hugepages",
    "_pidns",
    "_procview",
    "_sysinfo",
)
"""The modules of this directory that the zygote and its workers load (stdlib only). Under bubblewrap, copies of
these files are all the sandbox holds of the package (:func:`._isolation.Isolation.command`)."""

THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
)
"""Pinned to 1: a forked numpy must not start BLAS thread pools (fork + threads), and calls share cores."""

ENV_ALLOWLIST = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")
"""The only variables copied from the caller's environment: nothing that looks like a credential."""

_BOOT = """\
import json, sys, types
pkg = types.ModuleType("_rstar_sandbox"); pkg.__path__ = [{dir!r}]; sys.modules["_rstar_sandbox"] = pkg
from _rstar_sandbox import {module} as m
m.{function}(int(sys.argv[1]){config})
"""


def clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of sandboxed code: the allowlist, threads pinned to 1, then ``extra``."""
    env = {name: os.environ[name] for name in ENV_ALLOWLIST if name in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.setdefault("LANG", "C.UTF-8")
    env.update(dict.fromkeys(THREAD_VARS, "1"))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    env["MPLBACKEND"] = "Agg"
    if extra:
        env.update(extra)
    return env


def python_argv(
    module: str,
    function: str,
    fd: int,
    config: Mapping[str, Any] | None,
    python: str | None = None,
    package_dir: str = PACKAGE_DIR,
) -> list[str]:
    """``python -c`` command line that runs ``_rstar_sandbox.<module>.<function>(fd, config)``; ``package_dir`` is
    where this directory is seen by the new interpreter (bubblewrap puts it elsewhere).

    ``config=None`` runs ``<function>(fd)``, which reads its configuration from ``fd`` instead: the ``local``
    pool's workers are forks of that interpreter and can read its command line (``/proc/self/cmdline``), which
    must then say nothing of the host (the pool's folder, its uids, the caller's ``PATH``).
    """
    config_arg = ", json.loads(sys.argv[2])" if config is not None else ""
    boot = _BOOT.format(dir=package_dir, module=module, function=function, config=config_arg)
    argv = [python or sys.executable, "-c", boot, str(fd)]
    return [*argv, json.dumps(config)] if config is not None else argv
