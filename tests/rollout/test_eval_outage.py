"""``rstar-env eval --endpoint`` against a server that goes down mid-run (issue 17, item 8), end to end."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

from click.testing import CliRunner

from rstar_env.cli import main
from rstar_env.rollout.evaluate import read_trajectories
from rstar_env.rollout.openai import OpenAIPolicy
from rstar_env_testkit.replay_server import ReplayServer, disconnect, reply

ROWS, SAMPLES, SERVED = 12, 2, 10
RIGHT = reply("<answer>\\boxed{7}</answer>")


def _summary(output: str) -> dict:
    summary, _ = json.JSONDecoder().raw_decode(output[output.index("{") :])
    return summary


def _go_down_after_serving(server: ReplayServer) -> threading.Thread:
    """Shut the server down (connections refused from then on) once it has dropped its first request."""

    def watch() -> None:
        for _ in range(6000):  # 30 s at most
            if any(entry is not None and entry.get("disconnect") for entry in list(server.served)):
                server.close()
                return
            time.sleep(0.005)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_an_outage_is_never_scored_and_a_rerun_retries_it(tmp_path, monkeypatch):
    # Retries back off for 10 ms, not seconds: the outage is permanent, only its detection is sped up.
    monkeypatch.setattr(OpenAIPolicy, "_backoff", lambda self, attempt, retry_after: 0.01)
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{i}", "problem": f"{i} + 7 - {i}?", "answer": "7"}) + "\n" for i in range(ROWS))
    )
    out = tmp_path / "eval.jsonl"
    args = [
        "eval",
        "--served-model",
        "m",
        "--dataset",
        str(data),
        "--samples",
        str(SAMPLES),
        "--out",
        str(out),
        "--width",
        "4",
        "--json",
    ]

    with ReplayServer([RIGHT] * SERVED, default=disconnect()) as server:
        watcher = _go_down_after_serving(server)
        result = CliRunner().invoke(main, [*args, "--endpoint", server.base_url])
        watcher.join(timeout=5)
    assert result.exit_code == 1, result.output
    said = " ".join(result.output.split())  # the terminal wraps long lines
    assert "were not scored" in said and "Run the same command again to retry them" in said
    summary = _summary(result.output)
    total = ROWS * SAMPLES
    assert summary["episodes"] == total and summary["scored"] == SERVED
    assert summary["policy_errors"] == total - SERVED and summary["env_errors"] == 0
    assert summary["pass@1"] == 1.0 and summary["mean_reward"] == 1.0  # the outage is not a wrong answer

    records = read_trajectories(out)
    assert Counter(t.end_reason for t in records) == {"answer": SERVED, "policy_error": total - SERVED}
    for t in records:
        if t.end_reason == "policy_error":
            assert t.reward_result is None and t.reward == 0.0
            assert "gave up after 5 attempts" in t.error and t.turns == []

    # The server is back: the rerun runs the failed episodes again, and only those.
    with ReplayServer([], default=RIGHT) as server:
        result = CliRunner().invoke(main, [*args, "--endpoint", server.base_url])
        retried = len(server.requests)
    assert result.exit_code == 0, result.output
    assert retried == total - SERVED
    summary = _summary(result.output)
    assert summary["resumed"] == SERVED and summary["episodes"] == total and summary["scored"] == total
    assert summary["policy_errors"] == 0 and summary["pass@1"] == 1.0
    latest = {(t.id, t.metadata["sample"]): t for t in read_trajectories(out)}
    assert len(latest) == total and all(t.end_reason == "answer" and t.reward == 1.0 for t in latest.values())
