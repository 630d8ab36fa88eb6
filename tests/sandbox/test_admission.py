"""Admission by what sessions hold, and waiting instead of refusing (issue 41, finding 2).

Before: each stateful session reserved its whole ``memory_mb`` of ``pool_memory_mb``, so a 24 GiB machine opened 4
sessions at the defaults, and the fifth got ``crash`` with a refusal text that became the model's tool response.
Now a session reserves what it holds (its cgroup's usage, at least 64 MiB), a call that does not fit waits for
room (``queue_s``), and past ``queue_timeout_s`` it is a failure of the system (``system_failure``), never run.
No wall-clock bounds here: the tests count what ran, waited and was turned away.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from rstar_env.sandbox import ExecResult, SandboxError, _pool
from rstar_env.sandbox._admission import FLOOR_MB, MemoryGate
from rstar_env.sandbox.local import LocalSandbox

HOLD_200 = "held = b'\\x01' * (200 << 20)\nprint('holding')"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def start_or_skip(box: LocalSandbox, *, cgroups: bool = False) -> None:
    try:
        box.start()
    except SandboxError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and the local sandbox cannot start: {exc}")
        pytest.skip(f"local sandbox unavailable on this machine: {exc}")
    if cgroups and not box.info.get("cgroups"):
        box.close()
        pytest.skip("no cgroup per worker here: what a session holds cannot be read")


# ------------------------------------------------------------------------------------------- the ledger alone


def test_the_gate_reserves_what_idle_sessions_hold_and_a_limit_for_running_ones() -> None:
    gate = MemoryGate(pool_mb=1024, memory_mb=256)
    assert gate.admit("a", deadline=0.0)  # nothing else reserved: admitted at once, whatever the deadline
    assert gate.reserved_mb() == 256  # running: it may grow to its limit
    gate.settle("a", 500)  # came to rest holding 500 MiB (more than its limit only in this ledger test)
    assert gate.reserved_mb() == 500
    assert gate.admit("b", deadline=0.0)  # 500 + 256 <= 1024
    gate.settle("b", 3)
    assert gate.reserved_mb() == 500 + FLOOR_MB  # the floor, not the 3 MiB it held
    assert gate.admit(None, deadline=0.0)  # a stateless call: 564 + 256 <= 1024
    gate.settle("a", 800)
    assert not gate.admit(None, deadline=0.0)  # 864 + 256 > 1024: it would wait; here its deadline has passed
    assert gate.admit("a", deadline=0.0)  # "a" itself fits: the others hold 64, and its own 800 is in its limit
    gate.forget("a")
    assert gate.reserved_mb() == FLOOR_MB and gate.sessions == 1
    assert (gate.waits, gate.turned_away) == (1, 1)


def test_sixteen_sessions_fit_the_default_budgets_of_a_24_gib_machine_in_the_ledger() -> None:
    """Finding 41.2's figure: 16 stateful sessions at memory_mb=2048 and pool_memory_mb=12288 (half of 24 GiB):
    before, (12288 - 2048) // 2048 = 5 sessions could be open (4 on the machine measured); now 161 that hold
    little ((12288 - 2048) // 64 others, and one more)."""
    gate = MemoryGate(pool_mb=12288, memory_mb=2048)
    for i in range(161):
        assert gate.admit(i, deadline=0.0), i
        gate.settle(i, 40)
    assert not gate.admit(161, deadline=0.0)
    assert gate.sessions == 161 and gate.reserved_mb() == 161 * FLOOR_MB


# ------------------------------------------------------------------------------------------- the local pool


@pytest.fixture
def small_pool() -> Iterator[LocalSandbox]:
    """memory_mb=256 and pool_memory_mb=512: one session holding 200 MiB and one holding little fit; a third does
    not (200 + 64 + 256 > 512). Before, a second session was refused outright ((512 - 256) // 256 = 1)."""
    box = LocalSandbox(
        timeout_s=4.0,
        max_concurrency=4,
        spares=1,
        preload=(),
        warmup=None,
        memory_mb=256,
        pool_memory_mb=512,
        queue_timeout_s=1.0,
    )
    start_or_skip(box, cgroups=True)
    yield box
    box.close()


def test_sixteen_stateful_sessions_at_the_default_memory_budgets_all_run_their_calls() -> None:
    """16 concurrent stateful episodes, each making three calls, at memory_mb=2048 and pool_memory_mb=12288 (the
    defaults on a 24 GiB machine): every call runs, none waits past its deadline, none is refused."""
    box = LocalSandbox(
        timeout_s=8.0, spares=2, preload=(), warmup=None, memory_mb=2048, pool_memory_mb=12288, queue_timeout_s=120
    )
    start_or_skip(box)

    async def episode(i: int) -> list[ExecResult]:
        calls = ["x = 6 * 7", "x += 1", "print(x)"]
        return [await box.execute(code, session=f"episode-{i}") for code in calls]

    async def all_of_them() -> tuple[list[list[ExecResult]], int]:
        results = await asyncio.gather(*(episode(i) for i in range(16)))
        return results, box._gate.sessions

    try:
        results, open_at_the_end = run(all_of_them())
        assert open_at_the_end == 16
        assert all(r.ok and not r.system_failure for rs in results for r in rs), results
        assert all(rs[-1].stdout == "43\n" for rs in results), results
        assert box._gate.turned_away == 0
    finally:
        box.close()


def test_a_call_that_does_not_fit_waits_and_runs_once_a_session_closes(small_pool: LocalSandbox) -> None:
    box = small_pool
    assert run(box.execute(HOLD_200, session="a")).ok
    assert box._gate.reserved_mb() >= 200  # read from its cgroup
    assert run(box.execute("print('b')", session="b")).ok  # before: refused, the text shown to the model

    async def wait_then_close() -> ExecResult:
        call = asyncio.ensure_future(box.execute("print('c')", session="c", timeout_s=4.0))
        for _ in range(1000):  # until the call is waiting for room (counted, not timed)
            if box._gate.waits:
                break
            await asyncio.sleep(0.01)
        assert box._gate.waits == 1 and not call.done()
        await box.close_session("a")
        return await call

    box.queue_timeout_s = 60.0
    result = run(wait_then_close())
    assert (result.status, result.stdout, result.system_failure) == ("ok", "c\n", False), result
    assert box._gate.turned_away == 0 and result.queue_s > 0


def test_a_wait_past_its_deadline_is_a_system_failure_and_room_comes_back(small_pool: LocalSandbox) -> None:
    """Turned away unrun, as the system's failure; a session that ends (closed, timed out, crashed, or its pool
    killed) gives its room back to the next one."""
    box = small_pool

    def turned_away(session: str) -> bool:
        result = run(box.execute("print('in')", session=session))
        if result.ok:
            return False
        assert result.system_failure and result.status == "crash" and result.stdout == "", result
        assert "queue_timeout_s=1" in (result.message or "") and "pool_memory_mb=512" in (result.message or "")
        return True

    assert run(box.execute("print('b')", session="b")).ok  # a session that holds little stays open throughout
    assert run(box.execute(HOLD_200, session="a")).ok
    assert turned_away("c")
    run(box.close_session("a"))  # closed: room comes back
    assert not turned_away("c") and run(box.execute(HOLD_200, session="c")).ok
    assert turned_away("d")
    stopped = run(box.execute("while True:\n    pass", session="c", timeout_s=0.5))  # a timeout ends its worker
    assert stopped.status == "timeout" and not stopped.system_failure
    assert not turned_away("d") and run(box.execute(HOLD_200, session="d")).ok
    assert turned_away("e")
    killed = run(box.execute("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)", session="d"))
    assert killed.status == "crash" and not killed.system_failure, killed  # the code's own crash: the model's
    assert not turned_away("e") and run(box.execute(HOLD_200, session="e")).ok
    assert box._gate.turned_away == 3


def test_a_killed_pool_is_a_system_failure_never_the_codes(
    small_pool: LocalSandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = small_pool
    assert run(box.execute("x = 1", session="s")).ok
    started: list[int] = []
    note = _pool.LocalWorker.note

    def noting(worker: _pool.LocalWorker, message: dict[str, Any]) -> None:
        note(worker, message)
        if message.get("op") == "started":
            started.append(worker.call)

    monkeypatch.setattr(_pool.LocalWorker, "note", noting)

    async def killed_mid_call() -> ExecResult:
        call = asyncio.ensure_future(box.execute("import time\ntime.sleep(3)", timeout_s=4.0))
        for _ in range(1000):  # until a worker took the call (counted, not timed)
            if started:
                break
            await asyncio.sleep(0.01)
        zygote = box.pool.zygote_pid()
        assert zygote is not None
        os.kill(zygote, signal.SIGKILL)  # every worker dies with it
        return await call

    during = run(killed_mid_call())
    assert during.status == "crash" and during.system_failure, during
    lost = run(box.execute("print(x)", session="s"))  # the session died between its calls, with its pool
    assert lost.status == "crash" and lost.system_failure, lost
    assert run(box.execute("print('again')", session="s")).stdout == "again\n"  # a fresh interpreter, a new pool
    assert box._gate.sessions == 1


def test_model_made_failures_are_never_system_failures(small_pool: LocalSandbox) -> None:
    box = small_pool
    cases = {
        "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)": "crash",
        "x = bytearray(1 << 40)": "exception",  # its own MemoryError, within budget
        "raise ValueError('no')": "exception",
    }
    for code, status in cases.items():
        for session in (None, "m"):
            result = run(box.execute(code, session=session))
            assert (result.status, result.system_failure) == (status, False), (code, result)
