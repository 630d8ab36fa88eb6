"""One protocol suite for every sandbox backend: what ``execute`` returns for what code does.

To run it against another backend, add its name (and, if it needs options, an entry in BACKEND_OPTIONS) to
BACKENDS_UNDER_TEST; a backend that cannot start here is skipped with the reason.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from rstar_env.sandbox import ExecResult, Sandbox, SandboxError, create_sandbox
from rstar_env.sandbox._base import ThreadedSandbox

from .._forked import in_forked_child
from .._pools import LIGHT_POOL

BACKENDS_UNDER_TEST: list[str] = ["local", "subprocess", "e2b", "ray"]
BACKEND_PARAMS = [pytest.param(b, marks=pytest.mark.ray) if b == "ray" else b for b in BACKENDS_UNDER_TEST]
"""The backends as test parameters: Ray's are marked, so that they run together, first, on one local Ray."""
BACKEND_OPTIONS: dict[str, dict[str, Any]] = {
    # Remote backends run against local stand-ins (each skipped when its extra is not installed): e2b against
    # the testkit's code-interpreter server (see backend_options) through the SDK's debug mode, ray on a local Ray
    # instance (started once per test process; zero-CPU actors so several sandboxes fit on a 2-core machine).
    "ray": {
        "ray_init": {"num_cpus": 2, "include_dashboard": False, "log_to_driver": False},
        "num_actors": 1,
        "max_concurrency": 4,
        "actor_options": {"num_cpus": 0},
        "local_options": LIGHT_POOL,  # the Ray layer is under test here; the local pool as "local"
    },
}
TIMEOUT_S = 1.0
"""Per-call limit in this suite; a call that has not come back within its timeout + SLACK_S fails as a hang."""
SLACK_S = 20.0
"""Generous: it catches a deadline that never fired (the code under test runs for 100 s or forever), not a slow
machine; the statuses say which limit ended a call."""


def run(coro: Any) -> Any:
    """Each test drives the shared sandbox from a fresh event loop: sandboxes must not bind to a loop."""
    return asyncio.run(coro)


_e2b_server: Any = None
"""The testkit's E2B code-interpreter server, started on first use by an e2b test of this module."""


def backend_options(backend: str) -> dict[str, Any]:
    global _e2b_server
    if backend != "e2b":
        return BACKEND_OPTIONS.get(backend, {})
    if _e2b_server is None:
        from rstar_env_testkit.e2b_server import CodeInterpreterServer

        _e2b_server = CodeInterpreterServer().start()
    return {"debug": True, "sandbox_url": _e2b_server.sandbox_url}


@pytest.fixture(scope="module", autouse=True)
def _stop_e2b_server() -> Iterator[None]:
    global _e2b_server
    yield
    if _e2b_server is not None:
        _e2b_server.stop()
        _e2b_server = None


def make(backend: str, **options: Any) -> Sandbox:
    try:
        sandbox = create_sandbox(backend, **{"timeout_s": TIMEOUT_S, **backend_options(backend), **options})
        run(sandbox.__aenter__())
    except SandboxError as exc:
        pytest.skip(f"backend {backend!r} unavailable: {exc}")
    return sandbox


@pytest.fixture(scope="module", params=BACKEND_PARAMS)
def sandbox(request: pytest.FixtureRequest) -> Iterator[Sandbox]:
    box = make(request.param)
    yield box
    run(box.aclose())


def execute(box: Sandbox, code: str, **kwargs: Any) -> ExecResult:
    # A hang guard, not a time limit under test: a deadline that never fired (the code runs for 100 s or forever)
    # runs into it; the result's status says which limit ended the call.
    return run(asyncio.wait_for(box.execute(code, **kwargs), kwargs.get("timeout_s", TIMEOUT_S) + SLACK_S))


# --------------------------------------------------------------------------------------------------- results


def test_ok_and_print(sandbox: Sandbox) -> None:
    result = execute(sandbox, "print(1 + 1)")
    assert (result.status, result.stdout, result.stderr, result.message) == ("ok", "2\n", "", None)
    assert result.ok and result.duration_s > 0


def test_stderr_is_separate(sandbox: Sandbox) -> None:
    result = execute(sandbox, "import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert (result.status, result.stdout, result.stderr) == ("ok", "out\n", "err\n")


@pytest.mark.parametrize(
    ("code", "stdout"),
    [
        ("x = 3\nx * 2", "6\n"),  # the last bare expression is echoed, as in a notebook
        ("'a' + 'b'", "'ab'\n"),  # with its repr
        ("x = 3", ""),  # an assignment is not an expression
        ("None", ""),  # None is not echoed
        ("print('hi')", "hi\n"),  # print's own None is not echoed
        ("6 * 7;", ""),  # a trailing semicolon silences the echo, as in Jupyter
        ("for i in range(2):\n    i", ""),  # only a top-level last statement is echoed
        ("import math\nmath.factorial(5)", "120\n"),
    ],
)
def test_echo_of_last_expression(sandbox: Sandbox, code: str, stdout: str) -> None:
    result = execute(sandbox, code)
    assert (result.status, result.stdout) == ("ok", stdout)


def test_exception_is_an_error_with_summary_and_clean_traceback(sandbox: Sandbox) -> None:
    result = execute(sandbox, "def f():\n    return 1 / 0\n\nf()")
    assert result.status == "exception"
    assert result.message == "ZeroDivisionError: division by zero"
    assert result.stderr.startswith("Traceback (most recent call last):")
    assert 'File "<cell>", line 4, in <module>' in result.stderr
    assert "return 1 / 0" in result.stderr  # source lines of the cell are shown
    assert "_worker" not in result.stderr and "rstar" not in result.stderr  # no frames of the runner
    assert result.stderr.rstrip().endswith("ZeroDivisionError: division by zero")


def test_output_before_an_exception_is_kept(sandbox: Sandbox) -> None:
    result = execute(sandbox, "print('partial')\nraise ValueError('bad\\nsecond line')")
    assert (result.status, result.stdout, result.message) == ("exception", "partial\n", "ValueError: bad")


def test_syntax_error(sandbox: Sandbox) -> None:
    result = execute(sandbox, "def f(:\n    pass")
    assert result.status == "exception"
    assert result.message is not None and result.message.startswith("SyntaxError")
    assert "SyntaxError" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("import sys\nsys.exit()", "ok"),
        ("import sys\nsys.exit(0)", "ok"),
        ("import sys\nsys.exit(3)", "exception"),
        ("raise SystemExit('goodbye')", "exception"),
    ],
)
def test_sys_exit(sandbox: Sandbox, code: str, status: str) -> None:
    result = execute(sandbox, code)
    assert result.status == status
    if status == "exception":
        assert result.message is not None and result.message.startswith("SystemExit")


def test_stdin(sandbox: Sandbox) -> None:
    result = execute(sandbox, "a, b = map(int, input().split())\nprint(a + b)", stdin="2 40\n")
    assert (result.status, result.stdout) == ("ok", "42\n")


def test_large_stdin_and_empty_stdin(sandbox: Sandbox) -> None:
    big = "x" * 1_000_000 + "\n"
    result = execute(sandbox, "import sys\nprint(len(sys.stdin.read()))", stdin=big)
    assert (result.status, result.stdout) == ("ok", f"{len(big)}\n")
    result = execute(sandbox, "import sys\nprint(repr(sys.stdin.read()))")
    assert (result.status, result.stdout) == ("ok", "''\n")


def test_unicode_round_trip(sandbox: Sandbox) -> None:
    result = execute(sandbox, "print(input() + ' ∑ é 🙂')", stdin="π\n")
    assert (result.status, result.stdout) == ("ok", "π ∑ é 🙂\n")


# --------------------------------------------------------------------------------------------------- limits


@pytest.mark.parametrize(
    "code",
    ["while True:\n    pass", "import time\ntime.sleep(100)", "x = 10 ** 10 ** 8"],
    ids=["python-loop", "sleep-in-c", "bigint-in-c"],
)
def test_timeout(sandbox: Sandbox, code: str) -> None:
    result = execute(sandbox, code, timeout_s=0.5)
    assert result.status == "timeout"
    assert result.message == "timed out after 0.5 s"  # the verdict names the limit that ended it (execute's guard
    # fails a call whose limit never fires); when it ended is a timing, not asserted here
    assert execute(sandbox, "print('next')").stdout == "next\n"


def test_output_printed_before_a_timeout_is_kept(sandbox: Sandbox) -> None:
    result = execute(sandbox, "print('progress')\nwhile True:\n    pass", timeout_s=0.5)
    assert (result.status, result.stdout) == ("timeout", "progress\n")


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_output_limit(backend: str) -> None:
    box = make(backend, max_output_bytes=10_000)
    try:
        flood = execute(box, "while True:\n    print('x' * 1000)")
        assert flood.status == "output_limit"
        assert flood.message is not None and "10000" in flood.message
        assert 0 < len(flood.stdout) <= 10_000 and set(flood.stdout) <= {"x", "\n"}
        # Stopped by the limit, not by the 1 s timeout: the status above says which (no clock needed).
        finished = execute(box, "print('y' * 20_000)")
        assert finished.status == "output_limit" and len(finished.stdout) <= 10_000
        assert execute(box, "print('small')").stdout == "small\n"
    finally:
        run(box.aclose())


# --------------------------------------------------------------------------------------------------- sessions


def test_stateless_calls_do_not_share_globals(sandbox: Sandbox) -> None:
    assert execute(sandbox, "leak = 1").ok
    result = execute(sandbox, "leak")
    assert (result.status, result.message) == ("exception", "NameError: name 'leak' is not defined")


def test_session_keeps_globals_until_closed(sandbox: Sandbox) -> None:
    async def scenario() -> list[ExecResult]:
        results = [
            await sandbox.execute("x = 41\ndef inc(v):\n    return v + 1", session="ep-a"),
            await sandbox.execute("inc(x)", session="ep-a"),
            await sandbox.execute("x", session="ep-b"),  # another session has its own globals
            await sandbox.execute("x"),  # and so does a stateless call
        ]
        await sandbox.close_session("ep-a")
        results.append(await sandbox.execute("x", session="ep-a"))  # closed: a fresh interpreter
        await sandbox.close_session("ep-a")
        await sandbox.close_session("ep-b")
        await sandbox.close_session("never-opened")  # a no-op
        return results

    defined, used, other, stateless, reopened = run(scenario())
    assert defined.ok and (used.status, used.stdout) == ("ok", "42\n")
    for result in (other, stateless, reopened):
        assert (result.status, result.message) == ("exception", "NameError: name 'x' is not defined")


def test_session_survives_errors_and_runs_in_order(sandbox: Sandbox) -> None:
    async def scenario() -> list[ExecResult]:
        await sandbox.execute("log = []", session="ordered")
        calls = [sandbox.execute(f"log.append({i})", session="ordered") for i in range(5)]
        await asyncio.gather(*calls)
        await sandbox.execute("1 / 0", session="ordered")
        last = await sandbox.execute("log", session="ordered")
        await sandbox.close_session("ordered")
        return [last]

    (last,) = run(scenario())
    assert (last.status, last.stdout) == ("ok", "[0, 1, 2, 3, 4]\n")


def test_session_after_a_timeout_starts_fresh(sandbox: Sandbox) -> None:
    async def scenario() -> list[ExecResult]:
        results = [
            await sandbox.execute("y = 1", session="killed"),
            await sandbox.execute("while True:\n    pass", session="killed", timeout_s=0.3),
            await sandbox.execute("y", session="killed"),
            await sandbox.execute("y = 2\ny", session="killed"),
        ]
        await sandbox.close_session("killed")
        return results

    first, killed, after, again = run(scenario())
    assert first.ok and killed.status == "timeout"
    assert (after.status, after.message) == ("exception", "NameError: name 'y' is not defined")
    assert (again.status, again.stdout) == ("ok", "2\n")


# --------------------------------------------------------------------------------------------------- concurrency


def test_concurrent_calls_are_independent(sandbox: Sandbox) -> None:
    # What is tested is independence, not speed: 24 calls at once on a loaded 2-core machine can take more than
    # the module's 1 s timeout, and a timed-out call's output is cut short.
    async def scenario() -> list[ExecResult]:
        return await asyncio.gather(*(sandbox.execute(f"n = {i}\nprint(n * n)", timeout_s=30) for i in range(24)))

    results = run(scenario())
    assert [r.stdout for r in results] == [f"{i * i}\n" for i in range(24)]
    assert all(r.ok for r in results)


def test_usable_from_another_thread_and_loop(sandbox: Sandbox) -> None:
    results: list[ExecResult] = []
    thread = threading.Thread(target=lambda: results.append(execute(sandbox, "print('thread')")))
    thread.start()
    thread.join(timeout=30)
    assert [r.stdout for r in results] == ["thread\n"]
    assert execute(sandbox, "print('main')").stdout == "main\n"


def test_a_slow_call_does_not_block_others(sandbox: Sandbox) -> None:
    async def scenario() -> tuple[ExecResult, list[ExecResult], bool]:
        slow = asyncio.ensure_future(sandbox.execute("import time\ntime.sleep(1.5)\nprint('slow')", timeout_s=30))
        await asyncio.sleep(0.05)
        fast = [await sandbox.execute("print('fast')") for _ in range(3)]
        slow_was_done = slow.done()
        return await slow, fast, slow_was_done

    slow, fast, slow_done_before_the_fast_ones = run(scenario())
    assert slow.stdout == "slow\n" and all(r.stdout == "fast\n" for r in fast)
    assert not slow_done_before_the_fast_ones  # an order of events: three calls ran while the slow one slept


# --------------------------------------------------------------------------------------------------- lifecycle


@pytest.mark.parametrize("backend", BACKEND_PARAMS)
def test_context_manager_and_idempotent_close(backend: str) -> None:
    async def scenario() -> ExecResult:
        async with create_sandbox(backend, timeout_s=TIMEOUT_S, **backend_options(backend)) as box:
            assert isinstance(box, Sandbox)
            result = await box.execute("print('ctx')")
        await box.aclose()  # idempotent
        with pytest.raises(SandboxError):
            await box.execute("1")
        return result

    try:
        result = run(scenario())
    except SandboxError as exc:  # pragma: no cover - backend missing on this machine
        pytest.skip(f"backend {backend!r} unavailable: {exc}")
    assert result.stdout == "ctx\n"


def test_a_forked_child_runs_its_copy_on_its_own_or_is_told_why_it_cannot(sandbox: Sandbox) -> None:
    """A fork (multiprocessing, gymnasium's AsyncVectorEnv) copies the sandbox into the child without its threads.
    The copy either works there on its own (the process backends) or refuses with an error that says what to do
    (the remote backends, whose connection lives on a thread of the parent); it never hangs, and the parent's
    sandbox goes on working."""
    session = "the parent's"
    assert execute(sandbox, "x = 41; print(1)", session=session).stdout == "1\n"  # its threads exist when it forks

    def child() -> dict[str, str]:
        run(sandbox.close_session(session))  # the parent's session: a no-op in the child, never a hang
        try:
            return {"stdout": execute(sandbox, "print(6 * 7)").stdout}
        except SandboxError as exc:
            return {"error": str(exc)}

    report = in_forked_child(child)
    if isinstance(sandbox, ThreadedSandbox):
        assert report == {"stdout": "42\n"}, report
    else:
        assert "cannot be used in a forked child" in report.get("error", ""), report
        assert "'spawn'" in report["error"]
    assert execute(sandbox, "print(2)").stdout == "2\n"
    assert execute(sandbox, "print(x + 1)", session=session).stdout == "42\n"  # the child ended nothing of it
    run(sandbox.close_session(session))
