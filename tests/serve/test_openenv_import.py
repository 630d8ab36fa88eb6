"""``rstar_env.serve._openenv``: the servers and clients import openenv-core without its Gradio web UI (about 2.5 s
of every server start and client import), unless ``ENABLE_WEB_INTERFACE`` turns that UI on."""

from __future__ import annotations

import os
import subprocess
import sys

from .._extras import require

require("openenv", "the serve extra: pip install -e '.[serve]'")

PROBE = """
import importlib.util, sys
import rstar_env.serve.client, rstar_env.serve.env_server
from openenv.core.env_server import HTTPEnvServer
print("gradio" in sys.modules, "openenv.core.env_server.web_interface" in sys.modules)
print(importlib.util.find_spec("gradio").name)  # still importable by whoever wants it (find_spec raises if hidden)
"""


def probe(web_ui: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "ENABLE_WEB_INTERFACE"}
    if web_ui is not None:
        env["ENABLE_WEB_INTERFACE"] = web_ui
    done = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_server_and_client_modules_leave_gradio_unimported():
    assert probe(None) == ["False False", "gradio"]


def test_enable_web_interface_keeps_openenvs_web_ui():
    assert probe("true") == ["True True", "gradio"]
