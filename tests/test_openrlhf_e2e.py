"""OpenRLHF's real ``train_ppo_ray`` end to end on the CPU: 2 GRPO-RoC steps of SmolLM2-135M, then a resumed run.

The command is the one ``rstar-env launch openrlhf --config configs/openrlhf_cpu_e2e.yaml`` prints. ``ray job
submit`` needs Ray's dashboard (``ray[default]``), which this machine does not have, so the test runs the job's
entrypoint the way Ray's job supervisor does: on a real local Ray cluster (``RAY_ADDRESS``), with the command's
``--runtime-env-json`` as the job config (``RAY_JOB_CONFIG_JSON_ENV_VAR``), so the driver and every worker get our
``worker_process_setup_hook`` and ``RSTAR_ENV_CONFIG`` from it. vLLM and OpenRLHF's CUDA-only calls are replaced
by :mod:`rstar_env_testkit.cpu_standins` (its docstring lists every replaced function), installed in every
process through a ``sitecustomize`` on ``PYTHONPATH``; the rest is OpenRLHF's code and DeepSpeed on its ``cpu``
accelerator.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# Found, not imported: importing deepspeed costs every pytest process ~4 s at collection, and the training runs in
# child processes that import it themselves.
for _package in ("openrlhf", "deepspeed", "peft"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"{_package} is not installed (scripts/setup.sh --dev installs it)", allow_module_level=True)
torch = pytest.importorskip("torch")

from rstar_env_testkit.cpu_standins import EVIDENCE_ENV, SCRIPT_ENV, read_evidence, write_site_dir  # noqa: E402

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "openrlhf_cpu_e2e.yaml"
G = 2
JOB_TIMEOUT_S = 600  # a launch takes about 2 minutes on 2 cores (float32 training; a DeepSpeed JIT build adds ~2)

CLUSTER = r"""
import sys, ray
ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, configure_logging=False,
         object_store_memory=512 * 1024 * 1024)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes our stdin
ray.shutdown()
"""


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A real local Ray cluster with one (declared) GPU: OpenRLHF's actors and placement groups ask for GPUs."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CLUSTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    address = proc.stdout.readline().strip()
    if not address:
        proc.kill()
        pytest.fail("the local Ray cluster did not start")
    yield address
    proc.stdin.close()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory, smollm2):
    """SmolLM2-135M as a Hugging Face directory (OpenRLHF and the engine load it by path)."""
    model, tokenizer = smollm2
    folder = tmp_path_factory.mktemp("smollm2-hf")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def write_config(tmp_path: Path, model: Path, *, num_episodes: int) -> Path:
    run = yaml.safe_load(CONFIG.read_text())
    trainer = run["trainer"]
    trainer["model"] = str(model)
    trainer["output_dir"] = str(tmp_path / "run")
    trainer["num_episodes"] = num_episodes
    env_vars = trainer["cluster"]["runtime_env"]["env_vars"]
    env_vars["PYTHONPATH"] = os.pathsep.join([str(write_site_dir(tmp_path / "site")), str(REPO)])
    env_vars[EVIDENCE_ENV] = str(tmp_path / "evidence")
    env_vars[SCRIPT_ENV] = str(tmp_path / "run" / "prompts.jsonl")  # the launcher's prompt file
    path = tmp_path / f"e2e_{num_episodes}.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    return path


def launch(config: Path, address: str, log: Path) -> str:
    """Run what ``rstar-env launch openrlhf`` submits, as Ray's job supervisor would; returns the job's output."""
    cli = [
        sys.executable,
        "-m",
        "rstar_env.cli",
        "launch",
        "openrlhf",
        "--config",
        str(config),
        "--dry-run",
        "--python",
        sys.executable,
    ]
    printed = subprocess.run(cli, check=True, capture_output=True, text=True, cwd=REPO).stdout.strip().splitlines()
    command = shlex.split(printed[-1])
    assert command[:3] == ["ray", "job", "submit"], command
    runtime_env = json.loads(command[command.index("--runtime-env-json") + 1])
    entrypoint = command[command.index("--") + 1 :]
    from rstar_trainers.openrlhf.launch import plan_launch, write_prompts

    plan = plan_launch(config, python=sys.executable)
    from rstar_env.config import load_config

    write_prompts(load_config(config), plan.prompt_data)
    env = {
        **os.environ,
        **runtime_env["env_vars"],
        "RAY_ADDRESS": address,
        "RAY_AUTH_MODE": "disabled",  # as the cluster fixture
        "RAY_JOB_CONFIG_JSON_ENV_VAR": json.dumps({"runtime_env": runtime_env, "metadata": {}}),
        "PYTHONUNBUFFERED": "1",
    }
    with log.open("w") as out:
        result = subprocess.run(
            entrypoint, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=JOB_TIMEOUT_S, cwd=config.parent
        )
    text = log.read_text(errors="replace")
    assert result.returncode == 0, f"the job failed ({result.returncode}):\n{text[-6000:]}"
    return text


def step_logs(text: str) -> dict[int, dict]:
    """OpenRLHF's per-step status lines: ``✨ Global step N: {...}``."""
    steps = {}
    for match in re.finditer(r"Global step (\d+): (\{.*\})", text):
        steps[int(match.group(1))] = eval(match.group(2), {"nan": float("nan"), "inf": float("inf")})
    return steps


def checksum_of_saved(model_dir: Path, name: str) -> float:
    from safetensors import safe_open

    from rstar_env_testkit.cpu_standins import checksum

    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            if name in f.keys():  # noqa: SIM118 (safe_open has no __contains__)
                return checksum(f.get_tensor(name))
    raise KeyError(name)


def test_openrlhf_trains_two_roc_steps_then_resumes(tmp_path, ray_cluster, hf_model):
    evidence = tmp_path / "evidence"
    run = tmp_path / "run"
    first = launch(write_config(tmp_path, hf_model, num_episodes=1), ray_cluster, tmp_path / "run1.log")
    steps = step_logs(first)
    assert sorted(steps) == [1, 2], first[-4000:]

    # The agent ran in the engine actor (its extra_logs reach OpenRLHF's step logs), the RoC generator in the
    # trainer actor (its statistics, before and after selection, are in the same logs).
    for status in steps.values():
        assert status["roc/rollouts"] == 2 * G and status["roc/groups_kept"] == 1
        assert {"num_tool_calls", "roc/all_pos/n", "roc/positives_kept", "roc/negatives_kept"} <= status.keys()
    assert any("roc/all_pos/tool_error_ratio" in status for status in steps.values())

    # group_norm normalised the kept G per prompt: rows of G consecutive rewards, one prompt per row.
    normalised = read_evidence(evidence, "group_norm")
    assert len(normalised) == 2
    for batch in normalised:
        assert batch["estimator"] == "group_norm" and batch["n_samples_per_prompt"] == G
        assert len(batch["prompts"]) == G  # one kept group of G out of 2G rollouts
        assert len(set(batch["prompts"])) == 1
        assert sorted(batch["rewards"]) == [0.0, 1.0]  # RoC kept one positive and one negative
    # The actor's weights changed and every broadcast reached the engine: the engine's copy after the last sync
    # is the model OpenRLHF saved at the end, and differs from where it started.
    engine = read_evidence(evidence, "engine")
    (start,) = [e for e in engine if e["event"] == "start"]
    received = [e for e in engine if e["event"] == "weight"]
    params = len([e for e in received if e["name"] == "model.embed_tokens.weight"])
    assert params == 2  # one broadcast per training step
    last = {e["name"]: e["checksum"] for e in received}
    name = "model.layers.0.self_attn.q_proj.weight"
    assert last[name] != pytest.approx(start["initial"][name], rel=0, abs=1e-9)
    assert last[name] == pytest.approx(checksum_of_saved(run / "model", name), rel=1e-12)

    # A checkpoint per step; trajectories.jsonl in our format, every rollout of both steps.
    assert (run / "checkpoints" / "_actor" / "latest").read_text().strip() == "global_step2"
    assert (run / "checkpoints" / "_actor" / "global_step2").is_dir()
    rows = [json.loads(line) for line in (run / "trajectories.jsonl").open()]
    assert [r["metadata"]["step"] for r in rows] == [1] * 2 * G + [2] * 2 * G
    assert sum(r["metadata"]["kept"] for r in rows) == 2 * G

    # A second launch (one more episode) resumes from global_step2 and goes on at step 3.
    second = launch(write_config(tmp_path, hf_model, num_episodes=2), ray_cluster, tmp_path / "run2.log")
    assert "Loading the checkpoint" in second
    assert sorted(step_logs(second)) == [3, 4], second[-4000:]
    assert (run / "checkpoints" / "_actor" / "latest").read_text().strip() == "global_step4"
    rows = [json.loads(line) for line in (run / "trajectories.jsonl").open()]
    assert [r["metadata"]["step"] for r in rows] == [1] * 2 * G + [2] * 2 * G + [3] * 2 * G + [4] * 2 * G
    from rstar_env.rollout.hard import filter_hard

    assert filter_hard([run / "trajectories.jsonl"], tmp_path / "hard.jsonl")[0] == 2
