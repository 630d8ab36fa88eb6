"""The ``e2b`` backend against the local code-interpreter server: pool, retries, faults, sandbox death.

The shared protocol suite (tests/sandbox/test_protocol.py) runs the same backend for the semantics of calls;
here the server injects what the cloud does to a client: 429s, 5xx, dropped connections, hung requests, killed
sandboxes. The SDK runs in its debug mode (no account, no network beyond this machine). A live test runs only
when ``E2B_API_KEY`` is set.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rstar_env.sandbox import ExecResult, SandboxError, create_sandbox
from rstar_env.sandbox.e2b import E2BSandbox, classify
from rstar_env_testkit.e2b_server import CodeInterpreterServer

from .._extras import require

# The tests import the SDK; collection only finds it.
require("e2b_code_interpreter", "pip install 'rstar-env[e2b]'")

FAST_RETRIES = {"backoff_s": 0.01, "max_backoff_s": 0.05, "seed": 0}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def server() -> Iterator[CodeInterpreterServer]:
    with CodeInterpreterServer() as srv:
        yield srv


@pytest.fixture
def make(server: CodeInterpreterServer) -> Iterator[Any]:
    """Build sandboxes on the shared server; faults left over by a test are cleared, sandboxes closed."""
    boxes: list[E2BSandbox] = []

    def build(**options: Any) -> E2BSandbox:
        box = E2BSandbox(debug=True, sandbox_url=server.sandbox_url, timeout_s=2.0, **{**FAST_RETRIES, **options})
        run(box.__aenter__())
        boxes.append(box)
        # Let the spare contexts fill first, so that injected faults hit the test's own calls.
        assert wait_for(lambda: all(len(vm.spares) >= box.spare_contexts for vm in box._vms))
        return box

    yield build
    server.clear_faults()
    for box in boxes:
        run(box.aclose())


def wait_for(condition: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


# --------------------------------------------------------------------------------------------------- config


def test_missing_api_key_names_the_cause_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    monkeypatch.delenv("E2B_DEBUG", raising=False)
    with pytest.raises(SandboxError, match="E2B_API_KEY") as caught:
        create_sandbox("e2b")
    assert "E2B_DEBUG=true" in str(caught.value)  # the self-hosted alternative


def test_no_option_starts_a_server_on_the_host() -> None:
    # The protocol server runs code on the host with no isolation: only tests start it, never a config.
    with pytest.raises(TypeError, match="local_server"):
        E2BSandbox(debug=True, local_server=True)


def test_classify_maps_sdk_errors() -> None:
    import httpx
    from e2b import exceptions as e2b_errors

    assert classify(e2b_errors.RateLimitException("rate limited")).kind == "rate"
    assert classify(e2b_errors.SandboxException("429 Too Many Requests: slow down")).kind == "rate"
    assert classify(e2b_errors.AuthenticationException("bad key")).kind == "auth"
    assert classify(e2b_errors.NotFoundException("Context abc not found")).kind == "context"
    assert classify(e2b_errors.TimeoutException("x: This error is likely due to sandbox timeout.")).kind == "dead"
    killed = e2b_errors.TimeoutException("The sandbox was killed while the request was in progress. ...")
    assert classify(killed).kind == "killed"
    assert classify(httpx.ConnectError("refused")).kind == "transient"
    assert classify(httpx.RemoteProtocolError("peer closed")).kind == "lost"
    assert classify(e2b_errors.SandboxException("503 Service Unavailable")).kind == "transient"
    assert classify(ValueError("?")).kind == "other"


# --------------------------------------------------------------------------------------------------- pool


def test_spare_contexts_are_primed_and_removed_on_close(server: CodeInterpreterServer, make: Any) -> None:
    box = make(spare_contexts=3)
    (vm,) = box.sandboxes
    assert wait_for(lambda: server.contexts(vm) == 3)
    result = run(box.execute("print('spare')"))
    assert result.stdout == "spare\n"
    assert wait_for(lambda: server.contexts(vm) == 3)  # used once, removed, topped up again
    run(box.aclose())
    assert server.contexts(vm) == 0  # nothing left behind on a server that outlives the pool


def test_pool_grows_to_max_sandboxes_under_load(make: Any) -> None:
    box = make(max_sandboxes=3, per_sandbox=2, spare_contexts=1)

    async def load() -> list[ExecResult]:
        return await asyncio.gather(*(box.execute(f"import time\ntime.sleep(0.3)\nprint({i})") for i in range(6)))

    results = run(load())
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert len(box.sandboxes) == 3 and box.stats["sandboxes_created"] == 3


def test_sessions_are_pinned_and_isolated(server: CodeInterpreterServer, make: Any) -> None:
    box = make(max_sandboxes=2, per_sandbox=1, spare_contexts=0)

    async def scenario() -> list[ExecResult]:
        await asyncio.gather(box.execute("v = 'a'", session="a"), box.execute("v = 'b'", session="b"))
        return list(await asyncio.gather(box.execute("v", session="a"), box.execute("v", session="b")))

    a, b = run(scenario())
    assert (a.stdout, b.stdout) == ("'a'\n", "'b'\n")
    run(box.close_session("a"))
    run(box.close_session("b"))


# --------------------------------------------------------------------------------------------------- retries


def test_rate_limits_are_retried_with_backoff(server: CodeInterpreterServer, make: Any) -> None:
    box = make()
    before = server.requests[("POST", "/execute", 429)]
    server.inject("429", times=3, match="after 429s")  # this call only, not a spare context's priming
    result = run(box.execute("print('after 429s')"))
    assert (result.status, result.stdout) == ("ok", "after 429s\n")
    assert server.requests[("POST", "/execute", 429)] - before == 3
    assert box.stats["retries"] >= 3


def test_retry_budget_is_bounded(server: CodeInterpreterServer, make: Any) -> None:
    box = make(max_attempts=3)
    server.inject("429", times=100, match="never")
    before = server.requests[("POST", "/execute", 429)]
    result = run(asyncio.wait_for(box.execute("print('never')"), 30))  # a hang guard
    assert result.status == "crash"
    assert result.message is not None and "3 attempts" in result.message and "429" in result.message
    assert server.requests[("POST", "/execute", 429)] - before == 3  # the budget, counted
    server.clear_faults()
    assert run(box.execute("print('back')")).stdout == "back\n"


def test_rate_limited_context_creation_is_retried(server: CodeInterpreterServer, make: Any) -> None:
    box = make(spare_contexts=0)
    server.inject("429", path="/contexts", times=2)
    assert run(box.execute("print('ctx')")).stdout == "ctx\n"


def test_a_dropped_connection_is_retried_for_a_stateless_call(server: CodeInterpreterServer, make: Any) -> None:
    box = make()
    server.inject("disconnect", match="again")
    result = run(box.execute("print('again')"))
    assert (result.status, result.stdout) == ("ok", "again\n")
    assert box.stats["retries"] >= 1


def test_a_dropped_connection_crashes_a_session_which_then_starts_fresh(
    server: CodeInterpreterServer, make: Any
) -> None:
    box = make()

    async def scenario() -> list[ExecResult]:
        first = await box.execute("x = 1", session="s")
        server.inject("disconnect", match="x += 1")
        dropped = await box.execute("x += 1", session="s")  # may or may not have run: the state is given up
        after = await box.execute("x", session="s")
        return [first, dropped, after]

    first, dropped, after = run(scenario())
    assert first.ok and dropped.status == "crash" and "state is lost" in (dropped.message or "")
    assert dropped.system_failure  # the service lost it: never shown to the model, never its tool error
    assert (after.status, after.message) == ("exception", "NameError: name 'x' is not defined")


def test_a_hung_request_times_out(server: CodeInterpreterServer, make: Any) -> None:
    box = make()
    server.inject("hang", match="hung")
    result = run(asyncio.wait_for(box.execute("print('hung')", timeout_s=0.5), 30))  # a hang guard
    assert result.status == "timeout" and result.message == "timed out after 0.5 s"  # the 0.5 s deadline fired
    assert run(box.execute("print('fine')")).stdout == "fine\n"


def test_a_timed_out_kernel_is_removed(server: CodeInterpreterServer, make: Any) -> None:
    box = make(spare_contexts=1)
    (vm,) = box.sandboxes
    assert wait_for(lambda: server.contexts(vm) == 1)
    result = run(box.execute("while True:\n    pass", timeout_s=0.3))
    assert result.status == "timeout"
    assert wait_for(lambda: server.contexts(vm) == 1)  # the spinning kernel is gone, the spare refilled


# --------------------------------------------------------------------------------------------------- death


def test_a_sandbox_killed_mid_call_is_crashed_and_replaced(server: CodeInterpreterServer, make: Any) -> None:
    box = make(max_sandboxes=1)
    (old,) = box.sandboxes

    async def scenario() -> ExecResult:
        call = asyncio.ensure_future(box.execute("import time\ntime.sleep(5)", timeout_s=10))
        await asyncio.sleep(0.3)
        await asyncio.to_thread(server.kill_vm, old)
        return await call

    result = run(asyncio.wait_for(scenario(), 30))  # a hang guard
    assert result.status == "crash" and "died" in (result.message or "")  # told, not timed out
    assert run(box.execute("print('new vm')")).stdout == "new vm\n"
    assert old not in box.sandboxes and len(box.sandboxes) == 1
    assert box.stats["sandboxes_replaced"] == 1


def test_a_session_on_a_dead_sandbox_reports_lost_state_once(server: CodeInterpreterServer, make: Any) -> None:
    box = make()
    assert run(box.execute("y = 1", session="ep")).ok
    (vm,) = box.sandboxes
    server.kill_vm(vm)

    async def scenario() -> list[ExecResult]:
        return [await box.execute(code, session="ep") for code in ("y", "y", "y = 2\ny")]

    lost, fresh, again = run(scenario())
    assert lost.status == "crash" and "state is lost" in (lost.message or "") and lost.system_failure
    assert (fresh.status, fresh.message) == ("exception", "NameError: name 'y' is not defined")
    assert again.stdout == "2\n"


def test_a_502_before_the_call_moves_it_to_another_sandbox(server: CodeInterpreterServer, make: Any) -> None:
    box = make()
    server.inject("502", match="moved")
    result = run(box.execute("print('moved')"))
    assert (result.status, result.stdout) == ("ok", "moved\n")
    assert box.stats["sandboxes_replaced"] == 1


def test_a_kernel_that_dies_is_crashed(make: Any) -> None:
    box = make()

    async def scenario() -> list[ExecResult]:
        await box.execute("z = 1", session="k")
        died = await box.execute("import os\nos._exit(3)", session="k")
        after = await box.execute("z", session="k")
        stateless = await box.execute("import os\nos._exit(3)")
        return [died, after, stateless]

    died, after, stateless = run(scenario())
    assert died.status == "crash" and stateless.status == "crash"
    assert not died.system_failure and not stateless.system_failure  # the model's code ended its kernel
    assert (after.status, after.message) == ("exception", "NameError: name 'z' is not defined")


def test_closing_during_a_call_returns_crashed(make: Any) -> None:
    box = make()

    async def scenario() -> ExecResult:
        call = asyncio.ensure_future(box.execute("import time\ntime.sleep(5)", timeout_s=10))
        await asyncio.sleep(0.3)
        await box.aclose()
        return await call

    result = run(asyncio.wait_for(scenario(), 30))  # a hang guard
    assert result.status == "crash" and "closed" in (result.message or "")  # the close ended it
    with pytest.raises(SandboxError, match="closed"):
        run(box.execute("print(1)"))


# --------------------------------------------------------------------------------------------------- lifetime


def test_refresh_extends_lifetime_and_recycles_old_sandboxes(make: Any) -> None:
    box = make(sandbox_lifetime_s=600, max_sandbox_age_s=3600)
    (vm_state,) = box._vms
    extended: list[int] = []

    async def set_timeout(timeout: int) -> None:  # the SDK skips this call in debug mode: record it instead
        extended.append(timeout)

    vm_state.sbx.set_timeout = set_timeout
    run(box._runner.run(box.refresh()))
    assert extended == [600] and box.sandboxes == [vm_state.label]
    assert run(box.execute("w = 1", session="pinned")).ok
    box.max_sandbox_age_s = 0.0  # now every VM is too old: retired, but its session keeps it alive
    run(box._runner.run(box.refresh()))
    assert run(box.execute("w", session="pinned")).stdout == "1\n"
    assert run(box.execute("print('new')")).stdout == "new\n"  # stateless work went to a new VM
    assert len(box.sandboxes) == 2 and box.stats["sandboxes_created"] == 2
    run(box.close_session("pinned"))
    box.max_sandbox_age_s = 3600.0
    run(box._runner.run(box.refresh()))  # idle now: the old VM is killed
    assert vm_state.dead and vm_state.label not in box.sandboxes and len(box.sandboxes) == 1


# --------------------------------------------------------------------------------------------------- SDK modes


def _port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does: TIME_WAIT is fine
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_e2b_debug_env_talks_to_localhost_49999(monkeypatch: pytest.MonkeyPatch) -> None:
    if not (_port_free(49999) and _port_free(49983)):
        pytest.skip("ports 49999/49983 are in use")
    monkeypatch.setenv("E2B_DEBUG", "true")
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    monkeypatch.delenv("E2B_SANDBOX_URL", raising=False)
    with CodeInterpreterServer(port=49999, envd_port=49983) as srv:

        async def scenario() -> ExecResult:
            async with create_sandbox("e2b", timeout_s=2.0, spare_contexts=0) as box:
                return await box.execute("print(6 * 7)")

        assert run(scenario()).stdout == "42\n"
        assert srv.requests[("POST", "/execute", 200)] >= 2  # the runner's bootstrap and the call


@pytest.mark.skipif(not os.environ.get("E2B_API_KEY"), reason="live E2B test: set E2B_API_KEY")
def test_live_e2b() -> None:  # pragma: no cover - needs an account
    async def scenario() -> list[ExecResult]:
        async with create_sandbox("e2b", timeout_s=20.0, max_sandboxes=1, spare_contexts=1) as box:
            return [
                await box.execute("import sympy\nsympy.factor('x**2 - 1')"),
                await box.execute("x = 2", session="live"),
                await box.execute("x * 21", session="live"),
                await box.execute("1 / 0"),
                await box.execute("while True:\n    pass", timeout_s=1.0),
            ]

    factor, define, use, error, timeout = run(scenario())
    assert factor.stdout == "(x - 1)*(x + 1)\n" and define.ok and use.stdout == "42\n"
    assert error.message == "ZeroDivisionError: division by zero" and timeout.status == "timeout"
