"""Every kind of session a real ``rstar-env serve env`` holds has an owner, a cap and an end, checked over HTTP and
WebSocket on loopback as a client would: ``/mcp`` sessions, ``/ws`` sessions, HTTP episodes and ``/run_jupyter``
runs count against one ``--max-sessions``, idle ones are closed, episode ids are the server's and bound to the
client that made them, and a ``/run_jupyter`` run stops when its client hangs up."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import pytest

from .._extras import require
from .._pools import light_config

require("openenv", "the serve extra: pip install -e '.[serve]'")

httpx = pytest.importorskip("httpx")

from rstar_env.bench.serve import ServerProcess  # noqa: E402  (after the skips: the serve extra)

IDLE_S = 2.0


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    config = light_config(tmp_path_factory.mktemp("config") / "run.yaml")
    running = ServerProcess(
        "env", "--config", str(config), "--max-sessions", "3", "--idle-timeout-s", str(IDLE_S), start_timeout_s=240
    )
    yield running
    assert running.stop() == 0, running.output()[-3000:]


def capacity(server: ServerProcess) -> dict:
    return httpx.get(f"{server.url}/capacity").json()


def wait_until_empty(server: ServerProcess, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    while (seen := capacity(server))["active_sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    return seen


def mcp(server: ServerProcess, method: str, client: str = "a", **params: object) -> dict:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return httpx.post(f"{server.url}/mcp", json=body, headers={"X-Rstar-Client": client}).json()


def test_mcp_sessions_take_slots_that_idle_ones_give_back_to_ws_clients(server):
    from websockets.asyncio.client import connect

    async def ws_reset() -> dict:
        async with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            await ws.send(json.dumps({"type": "reset", "data": {"problem": "1+1?", "answer": "2"}}))
            return json.loads(await ws.recv())

    created = [mcp(server, "openenv/session/create")["result"]["session_id"] for _ in range(3)]
    assert capacity(server)["active_sessions"] == 3

    async def refused() -> dict:
        async with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            return json.loads(await ws.recv())  # said at once, before the client asks anything

    locked_out = asyncio.run(refused())
    assert locked_out["data"]["code"] == "CAPACITY_REACHED" and "--max-sessions 3" in locked_out["data"]["message"]
    other = mcp(server, "openenv/session/close", client="b", session_id=created[0])
    assert "Unknown session_id" in other["error"]["message"]  # another client's session is not reachable
    assert wait_until_empty(server)["active_sessions"] == 0  # idle /mcp sessions end (--idle-timeout-s)
    assert asyncio.run(ws_reset())["type"] == "observation"
    mine = mcp(server, "openenv/session/create")["result"]["session_id"]
    assert mcp(server, "openenv/session/close", session_id=mine)["result"]["closed"] is True
    assert capacity(server)["active_sessions"] == 0


def test_concurrent_http_resets_cannot_pass_the_cap_and_idle_episodes_end(server):
    assert wait_until_empty(server)["active_sessions"] == 0

    async def main() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as client:
            body = {"problem": "What is 2 + 2?", "answer": "4"}
            return await asyncio.gather(*(client.post(f"{server.url}/reset", json=body) for _ in range(12)))

    replies = asyncio.run(main())
    codes = sorted(reply.status_code for reply in replies)
    assert codes == [200] * 3 + [503] * 9, codes
    assert "--max-sessions" in next(r for r in replies if r.status_code == 503).json()["detail"]
    episode = next(r for r in replies if r.status_code == 200).json()["observation"]["info"]["episode_id"]
    assert wait_until_empty(server)["active_sessions"] == 0  # idle HTTP episodes are closed
    gone = httpx.post(f"{server.url}/step", json={"action": {"text": "x"}, "episode_id": episode})
    assert gone.status_code == 409 and "--idle-timeout-s" in gone.json()["detail"]


def test_episode_ids_are_the_servers_and_bound_to_their_client(server):
    assert wait_until_empty(server)["active_sessions"] == 0
    a, b = {"X-Rstar-Client": "a"}, {"X-Rstar-Client": "b"}
    chosen = httpx.post(
        f"{server.url}/reset", json={"problem": "1+1?", "answer": "2", "episode_id": "shared"}, headers=a
    )
    assert chosen.status_code == 409 and "ids are the server's" in chosen.json()["detail"]
    first = httpx.post(f"{server.url}/reset", json={"problem": "What is 6 * 7?", "answer": "42"}, headers=a).json()
    episode = first["observation"]["info"]["episode_id"]
    assert len(episode) == 32
    hijack = httpx.post(
        f"{server.url}/reset", json={"problem": "What is 1 + 1?", "answer": "2", "episode_id": episode}, headers=b
    )
    assert hijack.status_code == 409
    stolen = httpx.post(f"{server.url}/step", json={"action": {"text": "x"}, "episode_id": episode}, headers=b)
    assert stolen.status_code == 409
    assert httpx.get(f"{server.url}/state", params={"episode_id": episode}, headers=b).status_code == 409
    done = httpx.post(
        f"{server.url}/step",
        json={"action": {"text": "<answer>\\boxed{42}</answer>"}, "episode_id": episode},
        headers=a,
        timeout=60,
    ).json()
    assert (done["reward"], done["done"]) == (1.0, True)  # scored against A's own problem


def test_run_jupyter_counts_caps_its_cells_and_stops_when_its_client_hangs_up(server):
    assert wait_until_empty(server)["active_sessions"] == 0
    too_many = httpx.post(f"{server.url}/run_jupyter", json={"cells": ["1"] * 300}).json()
    assert too_many["status"] == "SandboxError" and "at most 256" in too_many["message"]
    body = json.dumps({"cells": ["import time; time.sleep(1.5)"] * 40, "total_timeout": 600}).encode()
    request = (
        f"POST /run_jupyter HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request)
        deadline = time.monotonic() + 60
        while not capacity(server)["active_sessions"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert capacity(server)["active_sessions"] == 1  # it holds a slot while it runs
    # The client hung up: the run stops at once, not after 40 cells (60 s), and its slot is free again.
    assert wait_until_empty(server, timeout_s=20)["active_sessions"] == 0
