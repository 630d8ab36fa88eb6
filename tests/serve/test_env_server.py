"""``rstar-env serve env`` as a real subprocess, driven by OpenEnv's own clients (``EnvClient`` through
``MathToolEnvClient``, and ``GenericEnvClient``): concurrent multi-turn episodes with correct rewards, token-level
truth, errors that keep the session, dropped clients, tokens, and a SIGTERM that leaves nothing running."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .._extras import require
from .._pools import light_config

require("openenv", "the serve extra: pip install -e '.[serve]'")

psutil = pytest.importorskip("psutil")
httpx = pytest.importorskip("httpx")

from rstar_env.bench.serve import READY, ServerProcess  # noqa: E402  (after the skips: the serve extra)

pytestmark = pytest.mark.usefixtures("openenv_clients")


CALL = '<tool_call>\n{{"name": "python", "arguments": {{"code": "print({a} * {b})"}}}}\n</tool_call>'


class Server(ServerProcess):
    """A ``rstar-env serve ...`` subprocess (bench serve's launcher) and the processes it started."""

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        super().__init__(*args, env=env, start_timeout_s=240)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)

    def stop(self, timeout_s: float = 60) -> tuple[int, list[psutil.Process]]:  # type: ignore[override]
        """SIGTERM; the exit status and the processes it had started that are still alive afterwards."""
        children = self.descendants()
        code = super().stop(timeout_s)
        _, alive = psutil.wait_procs(children, timeout=10)
        return code, alive


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    config = light_config(tmp_path_factory.mktemp("config") / "run.yaml")
    running = Server("env", "--config", str(config), "--max-sessions", "64")
    yield running
    if running.proc.poll() is None:
        code, alive = running.stop()
        assert code == 0 and not alive, (code, alive)


def episode_actions(i: int) -> tuple[int, int, str]:
    a, b = 3 + i % 7, 11 + i
    return a, b, str(a * b) if i % 4 else str(a * b + 1)  # every fourth episode answers wrong


async def run_episode(server: Server, i: int) -> tuple[float | None, bool, str, str]:
    from openenv.core.generic_client import GenericEnvClient

    from rstar_env.serve.client import MathToolEnvClient

    a, b, said = episode_actions(i)
    if i % 2:
        async with MathToolEnvClient(base_url=server.url, message_timeout_s=120) as env:
            await env.reset(problem=f"What is {a} * {b}?", answer=str(a * b))
            result = await env.step(CALL.format(a=a, b=b))
            assert not result.done and result.observation.info["tool_calls"][0]["error"] is None
            feedback = result.observation.text
            result = await env.step(f"<answer>\\boxed{{{said}}}</answer>")
            return result.reward, result.done, result.observation.info["end_reason"], feedback
    async with GenericEnvClient(base_url=server.url, message_timeout_s=120) as env:
        await env.reset(problem=f"What is {a} * {b}?", answer=str(a * b))
        result = await env.step({"text": CALL.format(a=a, b=b)})
        assert not result.done
        feedback = result.observation["text"]
        result = await env.step({"text": f"<answer>\\boxed{{{said}}}</answer>"})
        return result.reward, result.done, result.observation["info"]["end_reason"], feedback


def test_64_concurrent_multi_turn_episodes_with_openenv_clients(server):
    async def main() -> list[tuple[float | None, bool, str, str]]:
        return await asyncio.gather(*(run_episode(server, i) for i in range(64)))

    results = asyncio.run(main())
    for i, (reward, done, end_reason, feedback) in enumerate(results):
        a, b, _ = episode_actions(i)
        assert str(a * b) in feedback, feedback  # the tool ran this episode's own code
        assert (reward, done, end_reason) == ((1.0 if i % 4 else 0.0), True, "answer"), i
    assert httpx.get(f"{server.url}/capacity").json()["active_sessions"] == 0  # every closed client freed its env


def test_health_schema_and_capacity_routes(server):
    assert httpx.get(f"{server.url}/health").json()["status"] == "healthy"
    schema = httpx.get(f"{server.url}/schema").json()
    assert {"text", "token_ids"} <= set(schema["action"]["properties"])
    assert {"text", "token_ids", "info"} <= set(schema["observation"]["properties"])
    capacity = httpx.get(f"{server.url}/capacity").json()
    assert capacity["max_sessions"] == 64 and capacity["active_sessions"] == 0


def test_http_step_without_an_episode_names_ws_and_by_id_episodes_work(server):
    answer = httpx.post(f"{server.url}/step", json={"action": {"text": "<answer>\\boxed{1}</answer>"}})
    assert answer.status_code == 409 and "/ws" in answer.json()["detail"]
    unknown = httpx.post(f"{server.url}/step", json={"action": {"text": "x"}, "episode_id": "nope"})
    assert unknown.status_code == 409 and "/ws" in unknown.json()["detail"]

    reset = httpx.post(f"{server.url}/reset", json={"problem": "What is 6 * 7?", "answer": "42"}).json()
    episode_id = reset["observation"]["info"]["episode_id"]
    step = httpx.post(
        f"{server.url}/step", json={"action": {"text": CALL.format(a=6, b=7)}, "episode_id": episode_id}, timeout=60
    ).json()
    assert not step["done"] and "42" in step["observation"]["text"]
    assert httpx.get(f"{server.url}/state", params={"episode_id": episode_id}).json()["step_count"] == 1
    final = httpx.post(
        f"{server.url}/step",
        json={"action": {"text": "<answer>\\boxed{42}</answer>"}, "episode_id": episode_id},
        timeout=60,
    ).json()
    assert (final["reward"], final["done"]) == (1.0, True)
    assert final["observation"]["info"]["trajectory"]["reward"] == 1.0
    again = httpx.post(f"{server.url}/step", json={"action": {"text": "x"}, "episode_id": episode_id})
    assert again.status_code == 409  # an ended episode is closed, not a 500
    bad = httpx.post(f"{server.url}/step", json={"action": {"nope": 1}, "episode_id": "x"})
    assert bad.status_code in (409, 422)


def test_malformed_messages_get_clear_errors_and_the_session_survives(server):
    from websockets.asyncio.client import connect

    async def ask(ws, message: str) -> dict:
        await ws.send(message)
        return json.loads(await ws.recv())

    async def main() -> None:
        async with connect(f"ws://127.0.0.1:{server.port}/ws", max_size=None) as ws:
            step = json.dumps({"type": "step", "data": {"text": "hi"}})
            error = (await ask(ws, step))["data"]
            assert "reset" in error["message"]  # a step before any reset says what to do
            assert (await ask(ws, "{not json"))["data"]["code"] == "INVALID_JSON"
            assert (await ask(ws, json.dumps({"type": "dance"})))["data"]["code"] == "UNKNOWN_TYPE"
            invalid = (await ask(ws, json.dumps({"type": "step", "data": {"words": "x"}})))["data"]
            assert invalid["code"] == "VALIDATION_ERROR"
            token_ids = await ask(ws, json.dumps({"type": "reset", "data": {"problem": "1+1?", "answer": "2"}}))
            assert token_ids["type"] == "observation"
            no_tokenizer = (await ask(ws, json.dumps({"type": "step", "data": {"token_ids": [1, 2]}})))["data"]
            assert "--model" in no_tokenizer["message"]
            bad_reset = (await ask(ws, json.dumps({"type": "reset", "data": {"question": "?"}})))["data"]
            assert "unknown reset field" in bad_reset["message"]
            huge = (await ask(ws, json.dumps({"type": "step", "data": {"text": "x" * (2 << 20)}})))["data"]
            assert huge["code"] == "MESSAGE_TOO_LARGE" and "--max-request-bytes" in huge["message"]
            await ask(ws, json.dumps({"type": "reset", "data": {"problem": "1+1?", "answer": "2"}}))
            final = await ask(ws, json.dumps({"type": "step", "data": {"text": "<answer>\\boxed{2}</answer>"}}))
            assert (final["type"], final["data"]["reward"], final["data"]["done"]) == ("observation", 1.0, True)

    asyncio.run(main())
    server_log = "".join(server.lines)
    assert "Traceback" not in server_log, server_log[-3000:]


def test_reset_without_a_problem_draws_from_the_dataset_as_the_env_does(server):
    from openenv.core.generic_client import GenericEnvClient

    from rstar_env.env import MathToolEnv

    local = MathToolEnv(tools=[])
    try:
        expected = [local.reset(seed=seed)[1]["trajectory"].problem for seed in (3, 4, 3)]
    finally:
        local.close()

    async def main() -> list[str]:
        async with GenericEnvClient(base_url=server.url) as env:
            return [(await env.reset(seed=seed)).observation["text"] for seed in (3, 4, 3)]

    prompts = asyncio.run(main())
    assert all(problem in prompt for problem, prompt in zip(expected, prompts, strict=True))
    assert prompts[0] == prompts[2] and prompts[0] != prompts[1]


def test_a_dropped_client_frees_its_session(server):
    from websockets.asyncio.client import connect

    stateful_call = '<tool_call>\n{"name": "python", "arguments": {"code": "x = 5\\nprint(x)"}}\n</tool_call>'

    async def main() -> None:
        ws = await connect(f"ws://127.0.0.1:{server.port}/ws")
        await ws.send(json.dumps({"type": "reset", "data": {"problem": "?", "answer": "5"}}))
        await ws.recv()
        await ws.send(json.dumps({"type": "step", "data": {"text": stateful_call}}))
        await ws.recv()
        assert httpx.get(f"{server.url}/capacity").json()["active_sessions"] == 1
        ws.transport.abort()  # no close frame: the client vanished

    asyncio.run(main())
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.url}/capacity").json()["active_sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert httpx.get(f"{server.url}/capacity").json()["active_sessions"] == 0


def _tiny_tokenizer(folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    corpus = ["What is 3 * 4? <tool_call> python print </tool_call> <answer> \\boxed{12} </answer> system user"] * 4
    raw.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def token_server(tmp_path_factory) -> Iterator[tuple[Server, Path]]:
    pytest.importorskip("transformers")
    folder = _tiny_tokenizer(tmp_path_factory.mktemp("tokenizer"))
    config = light_config(folder / "run.yaml")
    running = Server(
        "env", "--config", str(config), "--model", str(folder), "--max-session-s", "10",
        env={"RSTAR_ENV_SERVE_TOKEN": "s3cret"},
    )  # fmt: skip
    yield running, folder
    if running.proc.poll() is None:
        running.proc.kill()


def test_token_ids_travel_so_the_client_never_retokenizes(token_server):
    from transformers import AutoTokenizer

    from rstar_env.env import MathToolEnv
    from rstar_env.serve.client import MathToolEnvClient
    from rstar_env.serve.env_server import MathToolAction

    server, folder = token_server
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    call = CALL.format(a=3, b=4)
    # The server's own settings (light_config): the same prompt and feedback, without a second default pool.
    local = MathToolEnv(tokenizer=tokenizer, **yaml.safe_load((folder / "run.yaml").read_text()))
    try:
        prompt, _ = local.reset(options={"problem": "What is 3 * 4?", "answer": "12"})
        local.step(call)
        expected_prompt = local.trajectory.prompt_token_ids
        expected_feedback = local.trajectory.turns[-1].feedback_token_ids
    finally:
        local.close()

    async def main() -> None:
        async with MathToolEnvClient(base_url=f"{server.url}/token/s3cret", message_timeout_s=120) as env:
            first = await env.reset(problem="What is 3 * 4?", answer="12")
            assert first.observation.text == prompt and first.observation.token_ids == expected_prompt
            ids = tokenizer.encode(call, add_special_tokens=False)
            second = await env.step(MathToolAction(token_ids=ids))  # token-level client: ids only
            assert second.observation.token_ids == expected_feedback and expected_feedback
            assert tokenizer.decode(second.observation.token_ids, skip_special_tokens=False) == second.observation.text
            answer = tokenizer.encode("<answer>\\boxed{12}</answer>", add_special_tokens=False)
            last = await env.step(MathToolAction(token_ids=answer))
            assert (last.reward, last.done) == (1.0, True)
            assert last.observation.info["trajectory"]["turns"][0]["action_token_ids"] == ids

    asyncio.run(main())


def test_a_token_is_required_when_set_and_sessions_end_at_their_time_limit(token_server):
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    server, _ = token_server
    assert httpx.get(f"{server.url}/health").status_code == 401
    assert "token" in httpx.get(f"{server.url}/health").json()["detail"]
    assert httpx.get(f"{server.url}/health", headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert httpx.get(f"{server.url}/health", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert httpx.get(f"{server.url}/token/s3cret/health").status_code == 200

    async def main() -> None:
        with pytest.raises(InvalidStatus):
            async with connect(f"ws://127.0.0.1:{server.port}/ws"):
                pass
        async with connect(
            f"ws://127.0.0.1:{server.port}/ws", additional_headers={"Authorization": "Bearer s3cret"}
        ) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 30)  # a hang guard: the reason says which limit ended it
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
            assert "--max-session-s" in closed.value.rcvd.reason

    asyncio.run(main())


def test_a_dropped_session_frees_its_sandbox_session_and_sigterm_leaves_nothing_running(tmp_path):
    import socket

    from websockets.sync.client import connect

    config = light_config(tmp_path / "stateful.yaml", stateful=True)
    server = Server("env", "--config", str(config), "--drain-s", "5")

    def call(code: str) -> str:
        return json.dumps(
            {
                "type": "step",
                "data": {
                    "text": "<tool_call>\n"
                    + json.dumps({"name": "python", "arguments": {"code": code}})
                    + "\n</tool_call>"
                },
            }
        )

    def big() -> list[psutil.Process]:  # the session interpreter holding the 120 MB blob below
        return [p for p in server.descendants() if p.is_running() and p.memory_info().rss > 100_000_000]

    reset = json.dumps({"type": "reset", "data": {"problem": "?", "answer": "5"}})
    try:
        with connect(f"ws://127.0.0.1:{server.port}/ws") as dropped:
            dropped.send(reset)
            dropped.recv(120)
            dropped.send(call("blob = b'x' * 120_000_000"))
            dropped.recv(120)
            dropped.send(call("print(len(blob))"))  # the session keeps its interpreter between calls
            assert "120000000" in json.loads(dropped.recv(120))["data"]["observation"]["text"]
            assert len(big()) == 1
            dropped.socket.shutdown(socket.SHUT_RDWR)  # the client vanishes: no close frame
            dropped.socket.close()
        deadline = time.monotonic() + 30
        while (big() or httpx.get(f"{server.url}/capacity").json()["active_sessions"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not big() and httpx.get(f"{server.url}/capacity").json()["active_sessions"] == 0

        # SIGTERM with a session open, its stateful interpreter alive.
        with connect(f"ws://127.0.0.1:{server.port}/ws") as ws:
            ws.send(reset)
            ws.recv(120)
            ws.send(call("y = 12\nprint(y)"))
            assert "12" in json.loads(ws.recv(120))["data"]["observation"]["text"]
            assert httpx.get(f"{server.url}/capacity").json()["active_sessions"] == 1
            assert any("python" in " ".join(p.cmdline()) for p in server.descendants())  # the sandbox pool is up
            code, alive = server.stop()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert code == 0, "".join(server.lines)[-3000:]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]
    assert "Traceback" not in "".join(server.lines), "".join(server.lines)[-3000:]


def test_a_server_stopped_as_soon_as_it_prints_its_ready_line_exits_at_once():
    """A launcher that reads the ready line and stops the server at once (a failed set-up, a cancelled job): the
    SIGTERM used to come before uvicorn took the signals, and the server ignored it and served on."""
    server = Server("verify")  # stopped by ServerProcess the moment its reader sees the line
    try:
        code, alive = server.stop(timeout_s=30)
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
    assert code == 0, "".join(server.lines)[-3000:]
    assert not alive, [(p.pid, p.cmdline()) for p in alive]


def test_a_non_loopback_address_without_a_token_is_refused(monkeypatch):
    # In-process (the refusal is the command's, before anything is built), the way ``rstar-env`` dispatches it; a
    # refusal that failed would start a server, which here fails the test instead of listening.
    from click.testing import CliRunner

    import rstar_env.serve.app
    from rstar_env.cli import main

    def started(*args, **kwargs):
        raise AssertionError("a server was started on 0.0.0.0 without a token")

    monkeypatch.setattr(rstar_env.serve.app, "serve", started)
    no_token = {"RSTAR_ENV_SERVE_TOKEN": None}
    for command in ("env", "sandbox", "verify"):
        done = CliRunner().invoke(main, ["serve", command, "--host", "0.0.0.0", "--port", "0"], env=no_token)
        assert done.exit_code != 0 and READY not in done.stdout, done.output
        assert "refusing to listen on 0.0.0.0" in done.stderr and "--token" in done.stderr, done.stderr
