"""``rstar-env serve sandbox`` as a real subprocess, driven by the ``sandbox-fusion`` PyPI client and by the request
verl's ``sandbox_fusion`` tool sends; ``/verify`` on the same server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .._extras import require

require("openenv", "the serve extra: pip install -e '.[serve]'")

httpx = pytest.importorskip("httpx")
psutil = pytest.importorskip("psutil")
sandbox_fusion = pytest.importorskip("sandbox_fusion")

from rstar_env.bench.serve import ServerProcess  # noqa: E402  (after the skips: the serve extra)


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = ServerProcess("sandbox", start_timeout_s=240)
    yield server.url
    children = psutil.Process(server.proc.pid).children(recursive=True)
    assert server.stop() == 0, server.output()[-3000:]
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, alive
    assert "Traceback" not in server.output(), server.output()[-3000:]


def run(url: str, code: str, **fields) -> sandbox_fusion.RunCodeResponse:
    request = sandbox_fusion.RunCodeRequest(code=code, language=fields.pop("language", "python"), **fields)
    return sandbox_fusion.run_code(request, endpoint=url, max_attempts=1)


def test_run_code_with_the_sandbox_fusion_client(url):
    done = run(url, "import sys\nprint(sum(range(10)))\nprint(sys.stdin.read().upper())", stdin="hello")
    assert done.status == sandbox_fusion.RunStatus.Success
    assert done.run_result.status == sandbox_fusion.CommandRunStatus.Finished
    assert (done.run_result.return_code, done.run_result.stdout) == (0, "45\nHELLO\n")
    assert done.compile_result is None
    assert run(url, "1 + 1").run_result.stdout == ""  # like `python file.py`: a bare expression is not echoed


def test_failures_map_onto_sandbox_fusion_outcomes(url):
    raised = run(url, "raise ValueError('bad value')")
    assert raised.status == sandbox_fusion.RunStatus.Failed
    assert raised.run_result.return_code == 1 and "ValueError: bad value" in raised.run_result.stderr
    assert run(url, "import sys\nsys.exit(3)").run_result.return_code == 3
    slow = run(url, "import time\ntime.sleep(30)", run_timeout=1)
    assert slow.status == sandbox_fusion.RunStatus.Failed
    assert slow.run_result.status == sandbox_fusion.CommandRunStatus.TimeLimitExceeded
    assert sandbox_fusion.summary_run_code_result(slow, sandbox_fusion.SummaryMapping(RunTimeout="tle")) == "tle"


def test_other_languages_are_refused_clearly(url):
    with pytest.raises(Exception, match="runs Python only"):
        run(url, "int main() { return 0; }", language="cpp")
    raw = httpx.post(f"{url}/run_code", json={"code": "echo hi", "language": "bash"}).json()
    assert raw["status"] == "SandboxError" and "'bash' is not supported" in raw["message"]
    files = httpx.post(f"{url}/run_code", json={"code": "print(1)", "language": "python", "files": {"a": "eA=="}})
    assert files.json()["status"] == "SandboxError" and "files" in files.json()["message"]


def test_verls_sandbox_fusion_request_shape(url):
    # What verl's sandbox_fusion tool posts (verl/utils/reward_score/sandbox_fusion/utils.py), extra fields included.
    payload = {
        "compile_timeout": 10,
        "run_timeout": 10,
        "code": "print(int(input()) * 2)",
        "stdin": "21",
        "language": "python",
        "files": {},
        "fetch_files": [],
        "memory_limit_MB": 1024,
    }
    reply = httpx.post(f"{url}/run_code", json=payload, headers={"Accept": "application/json"}, timeout=60)
    reply.raise_for_status()
    body = reply.json()
    assert body["status"] == "Success" and body["run_result"]["status"] == "Finished"
    assert body["run_result"]["stdout"].rstrip("\n") == "42" and body["run_result"]["return_code"] == 0


def test_run_jupyter_keeps_state_between_cells(url):
    request = sandbox_fusion.RunJupyterRequest(
        cells=["a = 123", "a * 2", "print(a)", "raise RuntimeError('boom')", "print('not run')"]
    )
    done = sandbox_fusion.run_jupyter(request, endpoint=url, max_attempts=1)
    assert done.status == sandbox_fusion.RunStatus.Failed
    assert [cell.stdout for cell in done.cells[:3]] == ["", "246\n", "123\n"]
    assert len(done.cells) == 4 and done.cells[3].error[0]["ename"] == "RuntimeError"
    fresh = sandbox_fusion.run_jupyter(
        sandbox_fusion.RunJupyterRequest(cells=["print('a' in dir())"]), endpoint=url, max_attempts=1
    )
    assert fresh.status == sandbox_fusion.RunStatus.Success and fresh.cells[0].stdout == "False\n"  # its own session


def test_verify_returns_the_reward_and_its_reason(url):
    right = httpx.post(f"{url}/verify", json={"response": "so <answer>\\boxed{\\frac{1}{2}}</answer>", "gold": "0.5"})
    assert right.status_code == 200
    assert right.json()["reward"] == 1.0 and right.json()["reason"] and right.json()["reward_plugin"] == "math"
    wrong = httpx.post(f"{url}/verify", json={"response": "\\boxed{3}", "answer": "4"}).json()
    assert wrong["reward"] == 0.0 and wrong["extracted"] == "3" and wrong["reason"]
    missing = httpx.post(f"{url}/verify", json={"response": "\\boxed{3}"})
    assert missing.status_code == 400 and "gold" in missing.json()["message"]


def test_oversized_requests_are_refused_before_they_are_read(url):
    reply = httpx.post(f"{url}/run_code", json={"code": "#" * (2 << 20), "language": "python"})
    assert reply.status_code == 413 and "--max-request-bytes" in reply.json()["detail"]
    assert run(url, "print('still serving')").run_result.stdout == "still serving\n"
