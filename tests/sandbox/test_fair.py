"""Clients served in turn by the sandbox's threads (issue 41, finding 3).

Before: one first-come queue. 80 ``/run_code`` calls of ``time.sleep(3.9)`` from one client, and an honest
episode's ``print(6 * 7)`` waited behind all of them, "stopped" at its tool deadline without running. Now a client's
next call starts as soon as one running call ends, however long another client's backlog. Counted, not timed: the
tests record the order in which calls start.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable
from typing import Any

import pytest

from rstar_env.sandbox import SandboxError
from rstar_env.sandbox._fair import FairExecutor
from rstar_env.sandbox.local import LocalSandbox


def _until(condition: Callable[[], bool]) -> None:
    """Wait for ``condition`` (threads are running toward it); counted polls, generous."""
    for _ in range(5000):
        if condition():
            return
        threading.Event().wait(0.005)
    raise AssertionError("the condition never came")


def _blocked_jobs(executor: FairExecutor, client: str, n: int) -> list[threading.Event]:
    gates = [threading.Event() for _ in range(n)]
    for gate in gates:
        executor.submit(client, gate.wait)
    return gates


def test_a_new_clients_call_starts_after_at_most_one_call_of_a_backlog_ends() -> None:
    executor = FairExecutor(2)
    executor.record_starts = True
    flood = _blocked_jobs(executor, "A", 80)
    _until(lambda: len(executor.started) == 2)  # both threads hold one of A's calls; 78 are queued
    honest = threading.Event()
    done = executor.submit("B", honest.set)
    flood[0].set()  # one of A's calls ends
    assert done.result(timeout=30) is None
    assert executor.started[:3] == ["A", "A", "B"], executor.started[:3]
    for gate in flood:
        gate.set()
    executor.shutdown()


def test_two_calls_submitted_at_once_beside_one_idle_thread_run_together() -> None:
    """One thread idle (a call came and went), then two calls at once: the idle thread takes one and a second
    thread is started for the other. It used to count the idle thread for both (it had not woken yet), so the
    second call waited for the first to end: a sandbox of two slots ran its calls one at a time."""
    executor = FairExecutor(2)
    executor.submit("a", lambda: None).result(timeout=10)
    together = threading.Barrier(2, timeout=10)  # broken (an error) unless both calls run at the same time
    # Submitted under the executor's lock (re-entrant), so the idle thread cannot wake between the two.
    with executor._cv:
        futures = [executor.submit("a", together.wait) for _ in range(2)]
    assert sorted(f.result(timeout=20) for f in futures) == [0, 1]
    executor.shutdown()


def test_backlogged_clients_take_turns_and_each_keeps_its_order() -> None:
    executor = FairExecutor(1)
    executor.record_starts = True
    order: list[tuple[str, int]] = []
    hold = threading.Event()
    executor.submit("warm", hold.wait)
    _until(lambda: executor.started == ["warm"])
    futures = [executor.submit("A", order.append, ("A", i)) for i in range(4)]
    futures += [executor.submit("B", order.append, ("B", i)) for i in range(2)]
    hold.set()
    for future in futures:
        future.result(timeout=30)
    assert order == [("A", 0), ("B", 0), ("A", 1), ("B", 1), ("A", 2), ("A", 3)], order
    executor.shutdown()


def test_a_per_client_cap_keeps_threads_for_other_clients() -> None:
    executor = FairExecutor(3, max_per_client=1)
    executor.record_starts = True
    flood = _blocked_jobs(executor, "A", 5)
    _until(lambda: executor.started == ["A"])
    assert executor.pending("A") == 4  # capped: two threads stay free although A has calls queued
    honest = executor.submit("B", lambda: "ran")
    assert honest.result(timeout=30) == "ran"  # no call of A had to end
    assert executor.started == ["A", "B"]
    for gate in flood:
        gate.set()
    executor.shutdown()


def test_shutdown_cancels_queued_calls_and_bad_settings_are_named() -> None:
    executor = FairExecutor(1)
    hold = threading.Event()
    executor.submit(None, hold.wait)
    queued = executor.submit(None, lambda: None)
    executor.shutdown()
    assert queued.cancelled()
    hold.set()
    with pytest.raises(RuntimeError, match="shut down"):
        executor.submit(None, lambda: None)
    with pytest.raises(ValueError, match="max_per_client"):
        FairExecutor(2, max_per_client=0)


def test_the_sandbox_serves_an_honest_client_beside_a_flood() -> None:
    """The issue's reproduction, scaled to a test: one client's sleeping calls fill every slot and queue far more;
    another client's print(6 * 7) starts as soon as one of them ends (before: after all of them)."""
    box = LocalSandbox(timeout_s=8.0, max_concurrency=2, spares=1, preload=(), warmup=None)
    try:
        box.start()
    except SandboxError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and the local sandbox cannot start: {exc}")
        pytest.skip(f"local sandbox unavailable on this machine: {exc}")
    executor = box._pool()
    executor.record_starts = True

    async def scenario() -> Any:
        flood = [asyncio.ensure_future(box.execute("import time\ntime.sleep(0.3)", client="flood")) for _ in range(12)]
        while len(executor.started) < 2:  # both slots hold a flood call
            await asyncio.sleep(0.01)
        honest = await box.execute("print(6 * 7)", client="honest")
        for call in flood:
            call.cancel()
        return honest

    try:
        honest = asyncio.run(scenario())
        assert (honest.status, honest.stdout) == ("ok", "42\n"), honest
        assert executor.started.index("honest") <= 2, executor.started
    finally:
        box.close()


def test_an_envs_client_key_reaches_the_sandbox_queue() -> None:
    """A server sets ``env.client`` per client; the python tool's calls are then queued under it."""
    from rstar_env.testing import answer, aplay, make_env, python_call
    from rstar_plugins.tools.python import PythonTool

    box = LocalSandbox(timeout_s=4.0, max_concurrency=2, spares=1, preload=(), warmup=None)
    try:
        box.start()
    except SandboxError as exc:
        pytest.skip(f"local sandbox unavailable on this machine: {exc}")
    executor = box._pool()
    executor.record_starts = True
    env = make_env(tools=[PythonTool(sandbox=box)], reward="math", max_turns=3)
    env.client = "tenant-a"
    try:
        trajectory = asyncio.run(aplay(env, [python_call("print(6 * 7)"), answer(42)], problem="p", answer="42"))
        assert trajectory.tool_calls[0].result.text == "42"
        assert executor.started == ["tenant-a"]
    finally:
        env.close()
        box.close()
