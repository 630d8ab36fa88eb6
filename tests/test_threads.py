"""Torch's threads sized to the cores other programs leave free (rstar_env.threads)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from rstar_env import threads
from rstar_env.threads import Sample, free_cores, others_busy

TICK = os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(
    ("cores", "busy", "expected"),
    [(2, 0.0, 2), (2, 0.3, 2), (2, 0.67, 1), (2, 1.0, 1), (2, 3.0, 1), (4, 1.6, 2), (4, 0.4, 4), (1, 0.9, 1)],
)
def test_the_threads_are_the_cores_left_rounded(cores, busy, expected):
    assert free_cores(cores, busy) == expected


def test_others_are_all_work_on_our_cores_but_our_own():
    before = Sample(at=10.0, busy=0, own=0)
    # 2 s: 3 core-seconds of work on our cores, 1.6 of them ours -> others kept 0.7 cores busy
    after = Sample(at=12.0, busy=3 * TICK, own=int(1.6 * TICK))
    assert others_busy(before, after) == pytest.approx(0.7, abs=0.02)
    assert others_busy(before, Sample(at=12.0, busy=TICK, own=2 * TICK)) == 0.0  # never negative
    assert others_busy(before, before) == 0.0


ORPHAN = (
    "import os, time\nif os.fork():\n    os._exit(0)\n"
    "print(os.getpid(), flush=True)\n"
    "null = os.open(os.devnull, os.O_RDWR)\nfor fd in (0, 1, 2):\n    os.dup2(null, fd)\n"
    "end = time.monotonic() + 20\nwhile time.monotonic() < end:\n    pass\n"
)
"""A CPU-bound process whose parent exits at once: re-parented away from the tree of the one that started it. It
says its pid, then lets go of its output (a reader holding the other end would otherwise wait its 20 s out)."""

MEASURE = f"""
import json, os, subprocess, sys, time
from rstar_env import threads
from rstar_env.threads import others_busy
orphan = int(subprocess.run([sys.executable, "-c", {ORPHAN!r}], check=True, capture_output=True).stdout)
child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
time.sleep(0.2)
cores = threads._cores()
first = threads.sample(cores)
time.sleep(0.8)
second = threads.sample(cores)
child.kill()
seconds = second.at - first.at
own = (second.own - first.own) / os.sysconf("SC_CLK_TCK") / seconds
print(json.dumps({{"own": own, "others": others_busy(first, second), "orphan": orphan}}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="measures /proc (Linux)")
def test_a_busy_program_outside_our_tree_counts_and_our_own_child_does_not():
    # In a fresh process: this one may be a child subreaper (the sandbox makes it one), which would adopt the orphan.
    out = subprocess.run([sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=60, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    with contextlib.suppress(ProcessLookupError):
        os.kill(measured["orphan"], signal.SIGKILL)  # done with it (left alone, it stops after its 20 s)
    # The child's work is ours: this process sleeps, so without it "own" would be about 0. (A share, not a rate: on
    # a loaded machine the spinning child gets a fraction of a core, 0.24 at load 8 on 2 cores.)
    assert measured["own"] > 0.05, measured
    assert measured["others"] > 0.3, measured  # the orphan's is not (whatever else the machine runs adds to it)


def test_a_fixed_count_applies_to_the_calling_thread(monkeypatch):
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    monkeypatch.setenv(threads.ENV_VAR, "1")
    try:
        assert threads.adapt() == 1 and torch.get_num_threads() == 1
        seen = []
        worker = threading.Thread(target=lambda: seen.append((threads.adapt(), torch.get_num_threads())))
        worker.start()
        worker.join()
        assert seen == [(1, 1)]
    finally:
        torch.set_num_threads(before)
        threads._applied.__dict__.clear()


def test_auto_measures_and_a_bad_setting_names_the_fix(monkeypatch):
    monkeypatch.setenv(threads.ENV_VAR, "auto")  # and restored (absent) after the test
    share = threads.CoreShare()
    assert 1 <= share.threads() <= len(threads._cores())
    threads.configure("auto")
    assert os.environ[threads.ENV_VAR] == "auto"  # auto leaves the environment's setting alone
    threads.configure(3)
    assert os.environ[threads.ENV_VAR] == "3" and threads.CoreShare().threads() == 3
    monkeypatch.setenv(threads.ENV_VAR, "none")
    with pytest.raises(ValueError, match=r"'auto'.*at least 1"):
        threads.CoreShare().threads()


def test_the_trainer_setting_is_checked():
    pytest.importorskip("torch")
    from pydantic import ValidationError

    from rstar_trainers.local.config import LocalTrainerConfig

    assert LocalTrainerConfig().threads == "auto" and LocalTrainerConfig(threads=1).threads == 1
    with pytest.raises(ValidationError):
        LocalTrainerConfig(threads=0)


@pytest.mark.slow  # four child processes with torch, two beside a busy neighbour: about 30 s
def test_bench_threads_compares_settings_idle_and_beside_a_neighbour(tmp_path, tiny_llama):
    pytest.importorskip("torch")
    import copy
    import json

    from click.testing import CliRunner

    from rstar_env.cli import main

    model, tokenizer = tiny_llama[0], copy.deepcopy(tiny_llama[1])
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    args = ["--model", str(tmp_path / "m"), "--prompts", "2", "--tokens", "3", "--steps", "1", "--threads", "1"]
    result = CliRunner().invoke(main, ["bench", "threads", *args, "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert [(r["threads"], r["neighbours"]) for r in rows] == [("auto", 0), ("1", 0), ("auto", 1), ("1", 1)]
    assert all(r["tok_s"] > 0 and r["step_s"] > 0 and r["tokens"] > 0 for r in rows)
    assert [r["threads_at_end"] for r in rows if r["threads"] == "1"] == [1, 1]
    bad = CliRunner().invoke(main, ["bench", "threads", "--threads", "zero"])
    assert bad.exit_code == 2 and "auto or a thread count" in bad.output
