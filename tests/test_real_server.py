"""``rstar-env eval`` against real OpenAI-compatible servers: ``transformers serve`` on CPU with the default model
exported to a Hugging Face directory (cached outside the repo). One endpoint, then two with one killed mid-run."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "torch")),
    reason="needs transformers[serving] (the dev extra installs it)",
)

_SERVE = "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; sys.exit(main())"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    """One ``transformers serve`` process preloading ``model``; its access log is kept to see what it served."""

    def __init__(self, model: Path, log: Path) -> None:
        self.port = _free_port()
        self.log = log
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                _SERVE,
                "serve",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--device",
                "cpu",
                "--log-level",
                "info",
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def served(self) -> int:
        return self.log.read_text(errors="replace").count("POST /v1/chat/completions")

    def wait_ready(self, model: Path, timeout_s: float = 240) -> None:
        import httpx

        body = {"model": str(model), "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"transformers serve exited: {self.log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.post(self.base_url + "/chat/completions", json=body, timeout=120).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"transformers serve did not answer in {timeout_s}s")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def exported_model() -> Path:
    from rstar_env.rollout.export import export_model

    return export_model()  # ~/.cache/rstar-env/models/smollm2, written once per machine


@pytest.fixture(scope="module")
def servers(exported_model, tmp_path_factory):
    logs = tmp_path_factory.mktemp("serve")
    started = [Served(exported_model, logs / f"serve{i}.log") for i in range(2)]
    try:
        for server in started:
            server.wait_ready(exported_model)
        yield started
    finally:
        for server in started:
            server.kill()


def _eval(tmp_path: Path, model: Path, endpoints: list[str], problems: int) -> tuple[int, dict, Path]:
    # Small on purpose: a CPU server answers one request at a time; what is tested is the plumbing and failover.
    from rstar_env.cli import main

    out = tmp_path / "eval.jsonl"
    args = [
        "eval",
        "--served-model",
        str(model),
        "--dataset",
        f"arithmetic:n={problems},seed=0",
        "--out",
        str(out),
        "--text-tools",
        "--max-new-tokens",
        "12",
        "--max-turns",
        "1",
        "--width",
        "4",
        "--json",
    ]
    for url in endpoints:
        args += ["--endpoint", url]
    result = CliRunner().invoke(main, args)
    assert "{" in result.output, result.output
    summary, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{") :])
    return result.exit_code, summary, out


def test_eval_against_one_real_server(servers, exported_model, tmp_path):
    code, summary, out = _eval(tmp_path, exported_model, [servers[0].base_url], 3)
    assert code == 0, summary
    assert summary["episodes"] == 3 and summary["policy_errors"] == 0
    assert len(out.read_text().splitlines()) == 3
    (engine,) = summary["engines"]
    assert engine["endpoint"] == servers[0].base_url and engine["failed"] == 0 and engine["requests"] == 3


def test_eval_on_two_real_servers_survives_one_killed_mid_run(servers, exported_model, tmp_path):
    doomed, alive = servers
    before = doomed.served()

    def kill_once_it_served() -> None:
        for _ in range(24000):  # 120 s at most
            if doomed.served() > before:
                doomed.kill()
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_once_it_served, daemon=True)
    killer.start()
    code, summary, out = _eval(tmp_path, exported_model, [doomed.base_url, alive.base_url], 6)
    killer.join(timeout=130)
    assert doomed.proc.poll() is not None  # it really died during the run
    assert code == 0, summary
    assert summary["episodes"] == 6 and summary["policy_errors"] == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 6 and not any(r["end_reason"] == "policy_error" for r in records)
    engines = {e["endpoint"]: e for e in summary["engines"]}
    assert engines[doomed.base_url]["requests"] >= 1 and engines[alive.base_url]["requests"] >= 1
