"""The ``ray`` backend on a local Ray instance: routing, batching, and actors that die under load.

The call semantics are the shared protocol suite's (tests/sandbox/test_protocol.py runs it on ``ray`` too).
Ray starts once (``num_cpus=2``, no dashboard), in the test process that runs the Ray tests (they run first, see
tests/conftest.py), and stops when this module ends; actors take no CPU reservation so several sandboxes fit on a
2-core machine.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from .._extras import require

require("ray", "pip install 'rstar-env[ray]'")

from rstar_env.sandbox import ExecResult  # noqa: E402
from rstar_env.sandbox.ray import RaySandbox  # noqa: E402

from .._pools import LIGHT_POOL  # noqa: E402

pytestmark = pytest.mark.ray

# Each actor's own local pool is a light one: the actors' batching, spreading and replacement are under test here,
# the local pool itself in the protocol and hostile suites.
OPTIONS: dict[str, Any] = {
    "actor_options": {"num_cpus": 0},
    "timeout_s": 5.0,
    "max_concurrency": 4,
    "local_options": LIGHT_POOL,
}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    """One local Ray for this module (the protocol suite's Ray tests, which run just before, may have started it).
    Shut down at the end: its daemons poll, and would burn CPU beside every later test of this process."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture
def make(ray_instance: None) -> Iterator[Any]:
    boxes: list[RaySandbox] = []

    def build(**options: Any) -> RaySandbox:
        box = RaySandbox(**{**OPTIONS, **options})
        run(box.__aenter__())
        boxes.append(box)
        return box

    yield build
    for box in boxes:
        run(box.aclose())


def wait_for(condition: Any, timeout_s: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_calls_made_together_are_batched(make: Any) -> None:
    box = make(num_actors=1)

    async def burst() -> list[ExecResult]:
        return await asyncio.gather(*(box.execute(f"print({i} * 2)") for i in range(100)))

    results = run(burst())
    assert [r.stdout for r in results] == [f"{i * 2}\n" for i in range(100)]
    # One burst: a few dispatches of up to 64 (2 when every call lands within the batching window).
    assert box.stats["calls"] == 100 and 2 <= box.stats["dispatches"] <= 10


def test_a_slow_call_does_not_hold_back_its_batch(make: Any) -> None:
    # A window wide enough that a busy machine cannot split the two calls (2 ms did, once in a loaded run).
    box = make(num_actors=1, batch_window_s=0.5)

    ended: list[str] = []

    async def scenario() -> list[ExecResult]:
        async def call(name: str, code: str) -> ExecResult:
            result = await box.execute(code)
            ended.append(name)
            return result

        return await asyncio.gather(
            call("slow", "import time\ntime.sleep(1.5)\nprint('slow')"), call("fast", "print('fast')")
        )

    slow, fast = run(scenario())
    assert box.stats["dispatches"] == 1  # same batch
    assert (slow.stdout, fast.stdout) == ("slow\n", "fast\n")
    assert ended == ["fast", "slow"]  # streamed back as each finished, not when the batch did


def test_stateless_calls_spread_over_actors(make: Any) -> None:
    box = make(num_actors=2)

    async def burst() -> list[ExecResult]:
        return await asyncio.gather(*(box.execute("import time\ntime.sleep(0.2)") for _ in range(8)))

    assert all(r.ok for r in run(burst()))
    assert box.stats["dispatches"] >= 2  # both actors got work: least-loaded routing alternates
    assert all(actor.load == 0 for actor in box._actors)


def test_an_actor_killed_mid_load(make: Any) -> None:
    import ray

    box = make(num_actors=2)
    victim, survivor = box._actors

    async def scenario() -> tuple[list[ExecResult], list[ExecResult], ExecResult, ExecResult]:
        # Pin one session to each actor, then load both with slow calls and kill one actor under it.
        await box.execute("mine = 'victim'", session="on-victim")
        await box.execute("mine = 'survivor'", session="on-survivor")
        assert box._sessions["on-victim"].actor is victim and box._sessions["on-survivor"].actor is survivor
        calls = [asyncio.ensure_future(box.execute("import time\ntime.sleep(1)\nprint('done')")) for _ in range(8)]
        await asyncio.sleep(0.4)
        ray.kill(victim.handle)
        results = await asyncio.wait_for(asyncio.gather(*calls), 60)  # a hang guard: the verdicts say what happened
        lost = await box.execute("mine", session="on-victim")
        kept = await box.execute("mine", session="on-survivor")
        fresh = [await box.execute("mine", session="on-victim"), await box.execute("print('after')")]
        return results, fresh, lost, kept

    results, (fresh, after), lost, kept = run(scenario())
    statuses = sorted(r.status for r in results)
    assert statuses == ["crash"] * 4 + ["ok"] * 4  # 4 calls went to each actor
    assert all("died" in (r.message or "") and r.system_failure for r in results if r.status == "crash")
    assert all(r.stdout == "done\n" for r in results if r.ok)
    assert lost.status == "crash" and "state is lost" in (lost.message or "") and lost.system_failure
    assert kept.stdout == "'survivor'\n"
    assert (fresh.status, fresh.message) == ("exception", "NameError: name 'mine' is not defined")
    assert after.stdout == "after\n"
    assert box.stats["actors_replaced"] == 1
    assert wait_for(lambda: len(box.actors) == 2)  # the pool replaced it
    assert victim.handle not in box.actors


def test_bench_sandbox_with_ray(ray_instance: None) -> None:
    from click.testing import CliRunner

    from rstar_env.bench.sandbox import command

    args = ["--backend", "ray", "--workload", "print", "--workload", "session", "--concurrency", "4"]
    result = CliRunner().invoke(command, [*args, "--calls", "20", "--budget-s", "10", "--json"])
    assert result.exit_code == 0, result.output
    rows = [row for row in json.loads(result.output)["rows"] if row["backend"] == "ray" and "ops" in row]
    assert {row["workload"] for row in rows} == {"print", "session"}
    assert all(row["ops"] == 20 and row["failures"] == 0 for row in rows)
