"""The servers' fair queue (:class:`rstar_env.serve.fair.FairGate`) and session table
(:class:`rstar_env.serve.sessions.Sessions`), on their own: who is admitted, in what order, and what ends when.
Counted in events, never timed."""

from __future__ import annotations

import asyncio

import pytest

from rstar_env.serve.fair import FairGate
from rstar_env.serve.sessions import CapacityError, Sessions


def test_a_flood_adds_at_most_the_running_call_to_another_clients_next_call():
    async def main() -> list[str]:
        gate, order = FairGate(slots=1), []
        release = {name: asyncio.Event() for name in ("a1", "a2", "a3", "a4", "a5", "b1")}

        async def call(client: str, name: str) -> None:
            async with gate.slot(client):
                order.append(name)
                await release[name].wait()

        flood = [asyncio.create_task(call("flood", f"a{i}")) for i in range(1, 6)]
        await asyncio.sleep(0)
        honest = asyncio.create_task(call("honest", "b1"))
        await asyncio.sleep(0)
        assert gate.queued("flood") == 4 and gate.queued("honest") == 1
        for name in ("a1", "b1", "a2", "a3", "a4", "a5"):
            while name not in order:
                await asyncio.sleep(0)
            release[name].set()
        await asyncio.gather(*flood, honest)
        return order

    assert asyncio.run(main()) == ["a1", "b1", "a2", "a3", "a4", "a5"]  # b1 waited for a1 only


def test_per_client_caps_and_cancelled_waiters_free_their_turn():
    async def main() -> None:
        gate = FairGate(slots=3, per_client=1)
        hold = asyncio.Event()

        async def call(client: str) -> None:
            async with gate.slot(client):
                await hold.wait()

        tasks = [asyncio.create_task(call("a")) for _ in range(3)] + [asyncio.create_task(call("b"))]
        await asyncio.sleep(0)
        assert gate.running == {"a": 1, "b": 1} and gate.queued("a") == 2  # a third slot stays free for others
        tasks[1].cancel()
        await asyncio.sleep(0)
        assert gate.queued("a") == 1
        hold.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert gate.busy == 0 and gate.queued() == 0 and not gate.last

    asyncio.run(main())
    with pytest.raises(ValueError, match="at least 1"):
        FairGate(0)


def test_the_session_table_caps_every_kind_together_and_ends_idle_ones():
    async def main() -> None:
        sessions = Sessions(3, idle_s=0.05, max_session_s=None)
        closed: list[str] = []

        def closer(name: str):
            async def close() -> None:
                closed.append(name)

            return close

        opened = [sessions.open(kind, "a") for kind in ("ws", "mcp", "http")]
        with pytest.raises(CapacityError, match="--max-sessions 3"):
            sessions.open("jupyter", "a")
        for session in opened:
            session.close = closer(session.kind)
        opened[0].reaped = False  # timed by the Guard, not here
        assert sessions.get(opened[2].id, "b", "http") is None and sessions.get(opened[2].id, "a", "http")
        with sessions.using(opened[1]):  # busy: never idle
            while sessions.count("http"):
                await asyncio.sleep(0.01)
            assert sessions.count("mcp") == 1
        while sessions.count("mcp"):
            await asyncio.sleep(0.01)
        assert closed == ["http", "mcp"] and sessions.count() == 1
        await sessions.close_all()
        assert closed == ["http", "mcp", "ws"] and sessions.count() == 0

    asyncio.run(main())
