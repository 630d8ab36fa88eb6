"""``rstar-env bench train``: the whole job per engine in a child process, the SFT stage trained once and shared,
the process tree's peak memory. Run on a 2-layer model saved to a folder, so a job takes seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

pytest.importorskip("torch")

from rstar_env.bench.train import PeakMemory, neighbours, run_engine, tree_pss_bytes, tree_rss_bytes
from rstar_env.cli import main

ROWS = [{"problem": f"What is {a} + {a}?", "answer": str(2 * a), "id": f"p{a}"} for a in range(1, 5)]

PARENT = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c",
    "b = bytearray(300 * 2**20); print('ready', flush=True); import time; time.sleep(60)"], stdout=subprocess.PIPE)
child.stdout.readline()
print("ready", flush=True)
child.wait()
"""


def test_tree_memory_counts_the_children():
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert parent.stdout.readline().strip() == b"ready"
        assert tree_rss_bytes(parent.pid) > 300 * 2**20  # the grandchild's buffer is resident (bytearray zero-fills it)
        assert 300 * 2**20 < tree_pss_bytes(parent.pid) <= tree_rss_bytes(parent.pid)
    finally:
        import os
        import signal

        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while tree_rss_bytes(parent.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert tree_rss_bytes(parent.pid) == 0


SHARING = """
import os, sys, time
b = bytearray(200 * 2**20)
if os.fork() == 0:  # the child shares the buffer's pages until one side writes
    time.sleep(60)
    os._exit(0)
print("ready", flush=True)
time.sleep(60)
"""


def test_pages_shared_by_a_fork_count_once_in_pss_and_twice_in_rss():
    parent = subprocess.Popen([sys.executable, "-c", SHARING], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert parent.stdout.readline().strip() == b"ready"
        rss, pss = tree_rss_bytes(parent.pid), tree_pss_bytes(parent.pid)
        assert rss > 400 * 2**20 and 200 * 2**20 < pss < 300 * 2**20, (rss, pss)
    finally:
        import os
        import signal

        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()


def test_the_watcher_reads_pss_every_few_seconds_and_at_once_when_memory_grows(monkeypatch):
    # PSS walks every page table (~90 ms beside a vLLM engine): read every half second it slowed the job it measured.
    rss = [1000 * 2**20]
    reads: list[float] = []
    monkeypatch.setattr("rstar_env.bench.train.tree_rss_bytes", lambda pid: rss[0])
    monkeypatch.setattr("rstar_env.bench.train.tree_pss_bytes", lambda pid: reads.append(now) or rss[0] // 2)
    memory = PeakMemory(1, pss_every_s=5.0)
    for tick in range(20):  # ten seconds of a steady tree, sampled every half second
        now = tick * 0.5
        memory.sample(now)
    assert reads == [0.0, 5.0], reads
    now = 10.0
    rss[0] = 1100 * 2**20  # a new peak forming: read now, not at the next 5 s mark
    memory.sample(now)
    assert reads[-1] == 10.0 and memory.pss == 550 * 2**20 and memory.rss == 1100 * 2**20
    rss[0] = 900 * 2**20
    now = 10.5
    memory.sample(now)
    assert len(reads) == 3 and memory.rss == 1100 * 2**20  # peaks are kept


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


def test_neighbours_burn_cpu_while_the_block_runs_and_are_gone_after():
    with neighbours(2) as procs:
        assert len(procs) == 2
        start = [_cpu_ticks(p.pid) for p in procs]
        time.sleep(0.5)
        assert all(_cpu_ticks(p.pid) > s for p, s in zip(procs, start, strict=True))
    assert all(p.returncode is not None for p in procs)


@pytest.fixture
def job(tmp_path, tiny_llama):
    model, tokenizer = tiny_llama
    model_dir = tmp_path / "model"
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return {
        "env": {"max_turns": 1, "system_prompt": "Answer."},
        "tools": [{"name": "python"}],  # the SFT data is played through the tool
        "reward": {"name": "math", "options": {"last_number": True}},
        "dataset": str(data),
        "trainer": {
            "model": str(model_dir),
            "steps": 1,
            "prompts_per_step": 2,
            "group_size": 2,
            "max_new_tokens": 4,
            "max_response_tokens": 8,
            "tensorboard": False,
            "eval_dataset": str(data),
            "eval_at_start": True,
            "sft": {
                "dataset": "toolsft:n=4,seed=0,level=1",
                "max_len": 2048,
                "train_batch_size": 4,
                "micro_train_batch_size": 2,
                "max_epochs": 1,
                "tensorboard": False,
            },
        },
    }


@pytest.mark.slow
def test_each_engine_runs_the_job_and_the_sft_stage_is_trained_once(tmp_path, job):
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    out = tmp_path / "o"
    args = ["--config", str(config), "--engine", "transformers", "--output-dir", str(out), "--seed", "3"]
    result = CliRunner().invoke(main, ["bench", "train", *args, "--neighbours", "1"])
    assert result.exit_code == 0, result.output
    assert "SFT stage" in result.output and "beside 1 CPU-bound process" in result.output
    rows = [line for line in result.output.splitlines() if line.startswith("| transformers |")]
    assert len(rows) == 1 and "GiB" in rows[0] and " -> " in rows[0]
    assert (out / "transformers" / "sft" / "done.json").exists()
    assert "SFT steps" in (out / "transformers.log").read_text()
    written = yaml.safe_load((out / "transformers" / "config.yaml").read_text())
    assert written["policy"]["engine"] == "transformers" and written["trainer"]["steps"] == 1
    assert written["trainer"]["seed"] == 3

    # A later engine starts from the first one's SFT model: no SFT of its own, its RL stage timed alone.
    second = run_engine(job, "transformers", tmp_path / "b", out / "transformers" / "sft", tmp_path / "b.log")
    assert second["sft_s"] == 0.0 and second["rl_s"] > 0
    assert second["pass@1_before"] is not None and second["pass@1_after"] is not None
    assert second["peak_tree_gib"] > 0.05  # torch alone holds more than 50 MiB
    assert 0.05 < second["peak_tree_pss_gib"] <= second["peak_tree_gib"]
    log = (tmp_path / "b.log").read_text()
    assert "SFT steps" not in log and "RL stage" in log


@pytest.mark.slow
def test_a_failing_job_names_its_log(tmp_path, job):
    job["dataset"] = str(tmp_path / "no-such-rows.jsonl")
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    command = ["bench", "train", "--config", str(config), "--engine", "transformers", "--output-dir", str(tmp_path)]
    result = CliRunner().invoke(main, command)
    assert result.exit_code != 0
    assert "transformers.log" in result.output and "exited with" in result.output
