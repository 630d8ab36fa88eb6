"""Browser, network and input hygiene of a real ``rstar-env serve env``, over HTTP and WebSocket on loopback: a web
page cannot reach it (``Origin``, ``Host``, ``text/plain`` bodies), half-sent headers do not lock an honest client
out, tokens come from a file and never reach a log, bad input gets an answer naming the cause, and one client's
flood of ``/run_code`` adds at most one call's time to another client's call."""

from __future__ import annotations

import asyncio
import json
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .._extras import require
from .._pools import light_config

require("openenv", "the serve extra: pip install -e '.[serve]'")

httpx = pytest.importorskip("httpx")

from rstar_env.bench.serve import ServerProcess  # noqa: E402  (after the skips: the serve extra)

pytestmark = pytest.mark.usefixtures("openenv_clients")


ALICE, BOB = "alice-7f3c9e1d2b", "bob-0a8e55c4f1"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServerProcess]:
    """One server for the tests that need no token: its sandbox pool has 2 workers, which the flood test needs and
    the others do not notice (each start of ``serve env`` costs seconds of imports, so they share it)."""
    config = light_config(tmp_path_factory.mktemp("config") / "run.yaml", sandbox={"max_concurrency": 2})
    running = ServerProcess("env", "--config", str(config), start_timeout_s=240)
    yield running
    assert running.stop() == 0, running.output()[-3000:]


@pytest.fixture(scope="module")
def token_server(tmp_path_factory) -> Iterator[ServerProcess]:
    tokens = tmp_path_factory.mktemp("tokens") / "tokens"
    tokens.write_text(f"# one line per client\nalice {ALICE}\nbob {BOB}\n")
    config = light_config(tokens.parent / "run.yaml")
    running = ServerProcess(
        "env",
        "--config",
        str(config),
        "--token-file",
        str(tokens),
        "--read-timeout-s",
        "1",
        "--log-level",
        "debug",
        start_timeout_s=240,
    )
    yield running
    running.stop()


def test_a_web_page_cannot_reach_a_loopback_server(server):
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    async def ws(origin: str) -> str:
        async with connect(f"ws://127.0.0.1:{server.port}/ws", origin=origin) as sock:  # type: ignore[arg-type]
            await sock.send(json.dumps({"type": "state"}))
            return json.loads(await sock.recv())["type"]

    with pytest.raises(InvalidStatus) as refused:
        asyncio.run(ws("http://evil.example"))
    assert refused.value.response.status_code == 403
    assert asyncio.run(ws(f"http://127.0.0.1:{server.port}")) == "state"  # the operator's own pages may
    post = httpx.post(
        f"{server.url}/verify", json={"response": "1", "gold": "1"}, headers={"Origin": "http://evil.example"}
    )
    assert post.status_code == 403 and "--allow-origin" in post.json()["detail"]
    plain = httpx.post(
        f"{server.url}/mcp",
        content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "openenv/session/create", "params": {}}),
        headers={"Content-Type": "text/plain"},
    )
    assert plain.status_code == 415 and "application/json" in plain.json()["detail"]
    rebound = httpx.get(f"{server.url}/health", headers={"Host": "evil.example"})
    assert rebound.status_code == 400 and "--allow-host" in rebound.json()["detail"]
    assert httpx.get(f"{server.url}/health", headers={"Host": "localhost"}).status_code == 200
    assert httpx.get(f"{server.url}/capacity").json()["active_sessions"] == 0  # nothing was opened


def test_bad_input_gets_an_answer_naming_the_cause_and_the_session_goes_on(server):
    from websockets.asyncio.client import connect

    for field in ("run_timeout", "compile_timeout"):
        for value in ("NaN", "Infinity", "-1"):
            body = f'{{"code": "print(1)", "language": "python", "{field}": {value}}}'
            reply = httpx.post(f"{server.url}/run_code", content=body, headers={"Content-Type": "application/json"})
            assert reply.status_code == 400 and field in reply.json()["message"], (field, value, reply.text)
    jupyter = '{"cells": ["1"], "total_timeout": NaN}'
    reply = httpx.post(f"{server.url}/run_jupyter", content=jupyter, headers={"Content-Type": "application/json"})
    assert reply.status_code == 400 and "total_timeout" in reply.json()["message"]

    async def main() -> None:
        async with connect(f"ws://127.0.0.1:{server.port}/ws", max_size=None) as ws:

            async def ask(message: str) -> dict:
                await ws.send(message)
                return json.loads(await ws.recv())

            nested = await ask("[" * 100_000 + "]" * 100_000)
            assert nested["type"] == "error" and "deeper than" in nested["data"]["message"]
            listed = await ask(json.dumps([{"type": "reset"}]))
            assert listed["type"] == "error" and "JSON object" in listed["data"]["message"]
            await ask(json.dumps({"type": "reset", "data": {"problem": "1+1?", "answer": "2"}}))
            orphan = await ask(json.dumps({"type": "step", "data": {"text": "hi", "logprobs": [-0.1]}}))
            assert orphan["data"]["code"] == "VALIDATION_ERROR" and "token_ids" in json.dumps(orphan["data"])
            odd = await ask(json.dumps({"type": "step", "data": [1, 2]}))
            assert odd["type"] == "error"
            final = await ask(json.dumps({"type": "step", "data": {"text": "<answer>\\boxed{2}</answer>"}}))
            assert (final["type"], final["data"]["reward"], final["data"]["done"]) == ("observation", 1.0, True)

    asyncio.run(main())
    assert "Traceback" not in server.output()


def test_half_sent_headers_are_dropped_and_an_honest_client_gets_in(token_server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    slow = []
    try:
        for _ in range(1100):
            sock = socket.create_connection(("127.0.0.1", token_server.port))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")  # and never the rest
            slow.append(sock)
        honest = httpx.get(f"{token_server.url}/health", headers={"Authorization": f"Bearer {ALICE}"}, timeout=60)
        assert honest.status_code == 200
        for sock in slow[:50]:  # the server closed them at --read-timeout-s: they read the end of the stream
            sock.settimeout(60)
            assert sock.recv(1024) == b""
        with socket.create_connection(("127.0.0.1", token_server.port)) as trickle:  # headers whole, body never
            trickle.sendall(
                f"POST /verify HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {ALICE}\r\n"
                "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{".encode()
            )
            trickle.settimeout(60)
            assert trickle.recv(1024).startswith(b"HTTP/1.1 408")
    finally:
        for sock in slow:
            sock.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_tokens_come_from_a_file_name_their_clients_and_never_reach_the_log(token_server):
    from websockets.asyncio.client import connect

    assert httpx.get(f"{token_server.url}/health").status_code == 401
    assert httpx.get(f"{token_server.url}/token/{BOB}/health").status_code == 200
    body = {"problem": "What is 6 * 7?", "answer": "42"}
    alice = {"Authorization": f"Bearer {ALICE}", "X-Rstar-Client": "bob"}  # a label cannot pose as another token
    episode = httpx.post(f"{token_server.url}/reset", json=body, headers=alice).json()["observation"]["info"]
    stolen = httpx.post(
        f"{token_server.url}/token/{BOB}/step", json={"action": {"text": "x"}, "episode_id": episode["episode_id"]}
    )
    assert stolen.status_code == 409

    async def main() -> None:
        async with connect(f"ws://127.0.0.1:{token_server.port}/token/{ALICE}/ws") as ws:
            await ws.send(json.dumps({"type": "state"}))
            await ws.recv()
        headers = {"Authorization": f"Bearer {BOB}"}
        async with connect(f"ws://127.0.0.1:{token_server.port}/ws", additional_headers=headers) as ws:
            await ws.send(json.dumps({"type": "state"}))
            await ws.recv()

    asyncio.run(main())
    time.sleep(0.5)  # let the server's log lines of those requests reach its output
    log = token_server.output()
    assert "GET" in log or "connection" in log.lower(), log[-2000:]  # debug logging is on and printed requests
    assert ALICE not in log and BOB not in log


def test_one_clients_run_code_flood_adds_at_most_one_call_to_anothers_and_to_episodes(server):
    """The pool has 2 workers; a flood of 4 two-second calls from one client. Before, the honest call and the
    episode's tool call queued behind the whole flood (4 s); now /run_code takes one worker at a time, served per
    client in turn, so the honest call waits for one flood call at most and the episode's never waits on it."""
    from openenv.core.generic_client import GenericEnvClient

    url, finished, lock = server.url, [], threading.Lock()

    def call(client: str, code: str) -> None:
        reply = httpx.post(
            f"{url}/run_code",
            json={"code": code, "language": "python"},
            headers={"X-Rstar-Client": client},
            timeout=120,
        )
        assert reply.json()["status"] == "Success", reply.text
        with lock:
            finished.append(client)

    flood = [threading.Thread(target=call, args=("flood", "import time; time.sleep(2)")) for _ in range(4)]
    for thread in flood:
        thread.start()
    deadline = time.monotonic() + 60
    while len(finished) < 2 and time.monotonic() < deadline:  # the flood is queued: its first calls end
        queued = httpx.get(f"{url}/capacity").json().get("calls", {}).get("run_code", {}).get("queued", 0)
        if queued >= 3:
            break
        time.sleep(0.05)

    async def episode() -> tuple[str | None, int]:
        async with GenericEnvClient(base_url=url, message_timeout_s=120) as env:
            await env.reset(problem="What is 6 * 7?", answer="42")
            call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(6 * 7)"}}\n</tool_call>'
            result = await env.step({"text": call})
            with lock:
                flood_done = finished.count("flood")
            return result.observation["info"]["tool_calls"][0]["error"], flood_done

    error, flood_done_at_episode = asyncio.run(episode())
    assert error is None and flood_done_at_episode <= 1
    call("honest", "print(6 * 7)")
    with lock:
        flood_done_at_honest = finished.count("flood")
    for thread in flood:
        thread.join()
    assert flood_done_at_honest <= 2, finished  # behind at most the call running when it came (and the one before)


def test_path_token_docs_name_the_process_list_risk():
    from click.testing import CliRunner

    from rstar_env.serve.cli import command

    help_text = CliRunner().invoke(command, ["env", "--help"]).output
    assert "/proc/PID/cmdline" in help_text and "--token-file" in help_text
    assert Path(__file__).name  # the help is what an operator reads before choosing how to pass a token
