"""No vLLM engine process outlives the command that started it.

vLLM's ``VLLM::EngineCore`` and ``VLLM::Worker`` ignore a SIGTERM and survive their parent's death. So the
long-running commands turn SIGTERM into their Ctrl-C path (the engine is shut down), and a guardian process
(``rstar_env.rollout._engine_guard``) kills the engine's processes when the command dies in any way, SIGKILL
included. The guardian is checked on stand-in "engine" processes in every run (Linux); the real thing, an
``rstar-env eval`` generating on the vLLM engine, is stopped with SIGTERM and killed with SIGKILL (``vllm``: slow).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guardian reads /proc (Linux)")

# A parent that starts, while the guardian watches, an "engine" (a spawn child, as vLLM starts its engine core)
# with a child of its own (a worker), and a bystander (a plain child, which is not the guardian's business).
_PARENT = """
import multiprocessing, subprocess, time
from rstar_env.rollout._engine_guard import EngineGuard
from rstar_env.sandbox._proctree import children

guard = EngineGuard()
with guard.watch_children():
    engine = multiprocessing.get_context("spawn").Process(target=subprocess.call, args=(["sleep", "600"],))
    engine.start()
    bystander = subprocess.Popen(["sleep", "600"])
    while not children(engine.pid):
        time.sleep(0.05)
print(guard.pid, engine.pid, children(engine.pid)[0], bystander.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    from rstar_env.sandbox._proctree import is_alive

    return is_alive(pid)


def _gone_within(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@linux
def test_the_guardian_kills_the_engine_tree_when_its_parent_is_sigkilled():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    bystander = None
    try:
        assert parent.stdout is not None
        line = parent.stdout.readline()
        assert line, "the parent script failed (its traceback is in the captured stderr)"
        guardian, engine, worker, bystander = (int(x) for x in line.split())
        assert all(_alive(p) for p in (guardian, engine, worker, bystander))
        parent.kill()
        parent.wait(10)
        assert _gone_within([engine, worker, guardian], 10) == []
        assert _alive(bystander)  # not an engine process: left alone
    finally:
        parent.kill()
        if bystander is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(bystander, signal.SIGKILL)


@linux
def test_closing_the_guard_kills_what_is_left_and_ends_the_guardian():
    import multiprocessing

    from rstar_env.rollout._engine_guard import EngineGuard

    guard = EngineGuard()
    with guard.watch_children():
        engine = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(600,))
        engine.start()
    guardian = guard.pid
    assert guardian is not None and _alive(guardian) and _alive(engine.pid)
    guard.close()
    engine.join(10)
    assert engine.exitcode == -signal.SIGKILL and not _alive(guardian)
    guard.close()  # idempotent


def test_sigterm_stops_a_command_as_ctrl_c_does_once():
    from rstar_env._cli_util import Terminated, interrupted_status, stops_on_sigterm

    seen = []

    @stops_on_sigterm
    def command() -> None:
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises here
        except KeyboardInterrupt as exc:  # the commands' Ctrl-C path
            seen.append(exc)
            os.kill(os.getpid(), signal.SIGTERM)  # a second one while it stops: ignored
            time.sleep(0.05)
            raise

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        command()
    assert len(seen) == 1 and interrupted_status(seen[0]) == 143 and interrupted_status(KeyboardInterrupt()) == 130
    assert signal.getsignal(signal.SIGTERM) is before  # restored


# -- the real engine (slow) -------------------------------------------------------------------------------------------
_EVAL = "import sys; from rstar_env.cli import main; sys.argv[0] = 'rstar-env'; main()"


def _engine_processes(sid: int) -> list[str]:
    """vLLM's processes and our guardian in session ``sid`` (zombies excluded: they are dead already)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            title = " ".join(proc.info["cmdline"] or ())
            if os.getsid(proc.pid) != sid or proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if title.startswith("VLLM::") or "_engine_guard" in title or "spawn_main" in title:
                found.append(f"{proc.pid} {title[:80]}")
    return found


@linux
@pytest.mark.vllm
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_stopped_eval_leaves_no_vllm_process(sig, tmp_path):
    config = tmp_path / "vllm.yaml"
    config.write_text("policy:\n  engine: vllm\n")
    out, log = tmp_path / "eval.jsonl", tmp_path / "eval.log"
    # Small, but more than runs before the signal: it comes as the first of 32 episodes (width 4) is written.
    args = ["eval", "--config", str(config), "--dataset", "arithmetic:n=32,seed=0", "--out", str(out)]
    args += ["--max-new-tokens", "16", "--max-turns", "1", "--width", "4", "--temperature", "1"]
    env = {**os.environ, "RSTAR_VLLM_CPU_KV_GIB": "0.5", "HF_HUB_OFFLINE": "1"}
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-c", _EVAL, *args], stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while not (out.exists() and out.read_text().count("\n") >= 1):  # an episode done: the others generate
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "no episode finished in 300 s"
            time.sleep(0.1)
        assert _engine_processes(proc.pid), "no vLLM engine process found while it generates"
        sent = time.monotonic()
        proc.send_signal(sig)
        code = proc.wait(60)
        stopped_s = time.monotonic() - sent
        left = _engine_processes(proc.pid)
        deadline = time.monotonic() + 15
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = _engine_processes(proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the test leaves: not the next test's problem
        proc.wait(30)
    assert left == [], f"left after {sig.name}: {left}"
    records = [json.loads(line) for line in out.read_text().splitlines()]  # whole lines only: resumable
    assert 1 <= len(records) < 32
    if sig == signal.SIGTERM:  # the Ctrl-C path: the engine shut down, the exit status says SIGTERM
        assert code == 128 + signal.SIGTERM and stopped_s < 30, (code, stopped_s, log.read_text()[-2000:])
        assert "stopped: finished episodes are in" in log.read_text()
        assert "Task was destroyed but it is pending" not in log.read_text()  # the engine's loop was drained
    else:
        assert code == -signal.SIGKILL
