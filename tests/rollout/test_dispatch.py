"""The multi-engine dispatcher: KV-capacity admission, waiting, affinity, failover, stats; end to end with eval."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from click.testing import CliRunner

from rstar_env.rollout.dispatch import DispatchPolicy, EngineSpec, metrics_url_for, parse_vllm_metrics
from rstar_env.rollout.policy import Generation, Request
from rstar_env.trajectory import Trajectory


class StubEngine:
    """An engine whose requests finish when the test says so. Records what it holds at every moment."""

    tokenizer = None

    def __init__(self, name: str) -> None:
        self.name = name
        self.held: list[tuple[Request, asyncio.Future]] = []
        self.served: list[Request] = []
        self.peak = 0
        self.fail_with: dict[str, object] | None = None  # metadata of an error generation to return
        self.closed = False

    async def generate(self, requests):
        (request,) = requests
        if self.fail_with is not None:
            return [Generation("", finish_reason="error", metadata=dict(self.fail_with))]
        future = asyncio.get_running_loop().create_future()
        self.held.append((request, future))
        self.peak = max(self.peak, len(self.held))
        try:
            await future
        finally:
            self.held = [(r, f) for r, f in self.held if f is not future]
        self.served.append(request)
        return [Generation(f"{self.name}:{request.trajectory.problem}")]

    def finish(self, n: int = 1) -> None:
        for _, future in self.held[:n]:
            future.set_result(None)

    async def aclose(self):
        self.closed = True


def _request(name: str, prompt_tokens: int = 10, max_new: int = 30, episode: str | None = None) -> Request:
    return Request(
        Trajectory(problem=name, answer=""), context_ids=[1] * prompt_tokens, max_new_tokens=max_new, episode=episode
    )


async def _settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


def test_in_flight_cost_never_exceeds_capacity_and_a_request_waits_for_room():
    a, b = StubEngine("a"), StubEngine("b")
    policy = DispatchPolicy([EngineSpec(a, "a", capacity_tokens=100), EngineSpec(b, "b", capacity_tokens=60)])

    async def run():
        # Each request costs 10 prompt + 30 max tokens = 40: a holds two (80 <= 100), b one (40 <= 60).
        tasks = [asyncio.create_task(policy.generate([_request(f"p{i}")])) for i in range(4)]
        await _settle()
        assert (len(a.held), len(b.held)) == (2, 1)
        assert policy.waited == 1  # the fourth waits in the dispatcher, sent to no engine
        assert sum(len(e.served) for e in (a, b)) == 0
        b.finish()  # b frees 40 tokens: the waiting request starts there at once
        await _settle()
        assert (len(a.held), len(b.held)) == (2, 1)
        assert b.held[0][0].trajectory.problem == "p3"
        a.finish(2)
        b.finish()
        return [g for t in tasks for g in await t]

    generations = asyncio.run(run())
    assert [g.metadata["engine"] for g in generations] == ["a", "a", "b", "b"]
    assert a.peak * 40 <= 100 and b.peak * 40 <= 60
    stats = {s["endpoint"]: s for s in policy.stats()}
    assert stats["a"]["peak_in_flight_cost"] <= 100 and stats["b"]["peak_in_flight_cost"] <= 60
    assert (stats["a"]["requests"], stats["b"]["requests"]) == (2, 2)


def test_the_engine_with_most_free_capacity_is_chosen():
    a, b = StubEngine("a"), StubEngine("b")
    policy = DispatchPolicy([EngineSpec(a, "a", capacity_tokens=200), EngineSpec(b, "b", capacity_tokens=120)])

    async def run():
        tasks = [asyncio.create_task(policy.generate([_request(f"p{i}")])) for i in range(4)]
        await _settle()
        # free a/b: 200/120 -> a (160/120) -> a (120/120) -> a, the tie goes to the first (80/120) -> b
        held = [r.trajectory.problem for r, _ in a.held], [r.trajectory.problem for r, _ in b.held]
        a.finish(4)
        b.finish(4)
        await asyncio.gather(*tasks)
        return held

    assert asyncio.run(run()) == (["p0", "p1", "p2"], ["p3"])


def test_a_request_larger_than_every_engine_fails_at_once_saying_why():
    a = StubEngine("a")
    policy = DispatchPolicy([EngineSpec(a, "a", capacity_tokens=50)])
    (generation,) = asyncio.run(policy.generate([_request("big", prompt_tokens=40, max_new=20)]))
    assert generation.finish_reason == "error"
    assert "needs 60 tokens" in generation.metadata["error"] and "capacity" in generation.metadata["error"]
    assert a.served == []


def test_later_turns_keep_to_the_engine_that_served_the_episode():
    a, b = StubEngine("a"), StubEngine("b")
    policy = DispatchPolicy([EngineSpec(a, "a", capacity_tokens=100), EngineSpec(b, "b", capacity_tokens=100)])

    async def run():
        first = asyncio.create_task(policy.generate([_request("t1", episode="ep")]))
        other = asyncio.create_task(policy.generate([_request("x", episode="other")]))
        await _settle()
        assert [r.trajectory.problem for r, _ in a.held] == ["t1"]
        a.finish()
        b.finish()
        await asyncio.gather(first, other)
        # a and b are both empty now; the episode's next turn goes back to a, the other episode's to b.
        second = asyncio.create_task(policy.generate([_request("t2", episode="ep")]))
        third = asyncio.create_task(policy.generate([_request("y", episode="other")]))
        await _settle()
        placed = [r.trajectory.problem for r, _ in a.held], [r.trajectory.problem for r, _ in b.held]
        filler = asyncio.create_task(policy.generate([_request("z", episode="new")]))  # a tie: to a (80 of 100)
        await _settle()
        # a has 20 tokens free, less than the 40 the episode's next turn needs; b has 60: it goes to b.
        spill = asyncio.create_task(policy.generate([_request("t3", episode="ep")]))
        await _settle()
        spilled_to = "a" if any(r.trajectory.problem == "t3" for r, _ in a.held) else "b"
        a.finish(5)
        b.finish(5)
        await asyncio.gather(second, third, filler, spill)
        return placed, spilled_to

    placed, spilled_to = asyncio.run(run())
    assert placed == (["t2"], ["y"])
    assert spilled_to == "b"
    assert policy.affinity_hits >= 2


def test_failover_loses_no_request_and_the_dead_engine_is_probed_after_backoff():
    a, b = StubEngine("a"), StubEngine("b")
    a.fail_with = {"error": "connection error (ConnectError: refused)", "retryable": True, "connection_error": True}
    policy = DispatchPolicy(
        [EngineSpec(a, "a", max_concurrency=4), EngineSpec(b, "b", max_concurrency=4)], backoff_s=0.05
    )

    async def run():
        tasks = [asyncio.create_task(policy.generate([_request(f"p{i}")])) for i in range(6)]
        for _ in range(200):
            await _settle()
            b.finish(4)
            if all(t.done() for t in tasks):
                break
            await asyncio.sleep(0.005)
        out = [g for t in tasks for g in await t]
        a.fail_with = None  # a is back; once its backoff has passed it gets traffic again
        await asyncio.sleep(0.06)
        later = [asyncio.create_task(policy.generate([_request(f"q{i}")])) for i in range(2)]
        await _settle()
        a.finish(2)
        b.finish(2)
        return out, [g for t in later for g in await t]

    generations, later = asyncio.run(run())
    assert all(g.finish_reason == "stop" for g in generations)
    assert {g.metadata["engine"] for g in generations} == {"b"}
    assert len(b.served) >= 6
    stats = {s["endpoint"]: s for s in policy.stats()}
    assert stats["a"]["marked_down"] >= 1 and stats["a"]["failed"] == stats["a"]["requests"] - sum(
        g.metadata["engine"] == "a" for g in later
    )
    assert "a" in {g.metadata["engine"] for g in later}
    # The stats add up: every request made either failed somewhere or came back, once.
    total = sum(s["requests"] - s["failed"] for s in stats.values())
    assert total == len(generations) + len(later)


def test_a_request_fails_only_when_every_engine_failed_it():
    a, b = StubEngine("a"), StubEngine("b")
    for engine in (a, b):
        engine.fail_with = {"error": f"HTTP 503 from {engine.name}", "retryable": True}
    policy = DispatchPolicy([EngineSpec(a, "a"), EngineSpec(b, "b")])
    (generation,) = asyncio.run(policy.generate([_request("p")]))
    assert generation.finish_reason == "error"
    assert "all 2 failed it" in generation.metadata["error"] and "HTTP 503 from b" in generation.metadata["error"]


def test_the_requests_own_error_is_not_sent_to_another_engine():
    a, b = StubEngine("a"), StubEngine("b")
    a.fail_with = {"error": "HTTP 400: context too long", "retryable": False}
    policy = DispatchPolicy([EngineSpec(a, "a", max_concurrency=1), EngineSpec(b, "b", max_concurrency=1)])
    (generation,) = asyncio.run(policy.generate([_request("p")]))
    assert generation.finish_reason == "error" and "context too long" in generation.metadata["error"]
    assert b.served == [] and policy.stats()[1]["requests"] == 0


def test_engines_must_share_a_tokenizer_and_be_distinct():
    class Tok:
        pass

    a, b = StubEngine("a"), StubEngine("b")
    a.tokenizer = Tok()
    with pytest.raises(ValueError, match="different tokenizers"):
        DispatchPolicy([EngineSpec(a, "a"), EngineSpec(b, "b")])
    with pytest.raises(ValueError, match="given once"):
        DispatchPolicy([EngineSpec(b, "x"), EngineSpec(StubEngine("c"), "x")])


VLLM_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_cpu_blocks="0",\
num_gpu_blocks="8",swap_space="4"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:num_requests_waiting{engine="0",model_name="m"} 0.0
vllm:num_requests_running{engine="0",model_name="m"} 2.0
"""


def test_vllm_metrics_are_parsed():
    assert parse_vllm_metrics(VLLM_METRICS) == {"capacity_tokens": 128, "usage": 0.25, "waiting": 0.0, "running": 2.0}
    old = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\nnot a metric line\nvllm:cache_config_info{} 1\n'
    assert parse_vllm_metrics(old) == {"usage": 0.5}
    assert metrics_url_for("http://h:8000/v1/") == "http://h:8000/metrics"


def test_capacity_and_live_usage_come_from_the_servers_metrics():
    pytest.importorskip("httpx")
    from rstar_env_testkit.replay_server import ReplayServer

    a = StubEngine("a")
    with ReplayServer() as server:
        # 8 blocks x 16 = 128 tokens, three quarters of them in use by other clients: 32 free, less than the 40
        # each request needs.
        server.metrics = VLLM_METRICS.replace("} 0.25", "} 0.75")
        policy = DispatchPolicy([EngineSpec(a, "a", metrics_url=metrics_url_for(server.base_url))], refresh_s=0.02)

        async def run():
            tasks = [asyncio.create_task(policy.generate([_request(f"p{i}")])) for i in range(4)]
            for _ in range(500):  # the first read of the metrics, which every request waits for
                await asyncio.sleep(0.01)
                if policy.stats()[0]["capacity_unit"] == "tokens":
                    break
            await asyncio.sleep(0.05)
            before = len(a.held)
            server.metrics = VLLM_METRICS.replace("} 0.25", "} 0.0")  # the others are done
            for _ in range(200):
                await asyncio.sleep(0.01)
                if len(a.held) == 3:
                    break
            after = len(a.held)
            for _ in range(500):
                a.finish(3)
                await asyncio.sleep(0.01)
                if all(t.done() for t in tasks):
                    break
            await asyncio.gather(*tasks)
            return before, after

        before, after = asyncio.run(run())
        asyncio.run(policy.aclose())
    (stats,) = policy.stats()
    assert (stats["capacity"], stats["capacity_unit"], stats["capacity_source"]) == (128, "tokens", "vllm_metrics")
    assert before == 0  # the cache was full: requests waited in the dispatcher
    assert after == 3  # then three of 40 fit in 128; the fourth waited for one to end
    assert stats["peak_in_flight_cost"] <= 128 and stats["requests"] == 4


def test_a_server_without_metrics_keeps_its_concurrency_limit():
    pytest.importorskip("httpx")
    from rstar_env_testkit.replay_server import ReplayServer

    a = StubEngine("a")
    with ReplayServer() as server:
        policy = DispatchPolicy([EngineSpec(a, "a", max_concurrency=2, metrics_url=metrics_url_for(server.base_url))])

        async def run():
            tasks = [asyncio.create_task(policy.generate([_request(f"p{i}")])) for i in range(3)]
            for _ in range(500):  # the first read of the metrics (a 404), which every request waits for
                await asyncio.sleep(0.01)
                if "metrics_error" in policy.stats()[0]:
                    break
            await asyncio.sleep(0.05)
            held = len(a.held)
            for _ in range(500):
                a.finish(3)
                await asyncio.sleep(0.01)
                if all(t.done() for t in tasks):
                    break
            await asyncio.gather(*tasks)
            return held

        assert asyncio.run(run()) == 2
        asyncio.run(policy.aclose())
    (stats,) = policy.stats()
    assert stats["capacity_unit"] == "requests" and "404" in stats["metrics_error"]


# -- end to end: eval over two replay servers, one of which dies mid-run ------------------------------------------
def test_eval_over_two_endpoints_survives_one_dying(tmp_path):
    pytest.importorskip("httpx")
    from rstar_env.cli import main
    from rstar_env.rollout.evaluate import read_trajectories
    from rstar_env_testkit.replay_server import ReplayServer, reply

    right = reply("<answer>\\boxed{7}</answer>", delay_s=0.02)
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"id": f"q{i}", "problem": f"{i} + 7 - {i}?", "answer": "7"}) + "\n" for i in range(20))
    )
    out = tmp_path / "eval.jsonl"
    with ReplayServer([], default=right) as alive, ReplayServer([], default=right) as doomed:

        def kill() -> None:
            for _ in range(3000):
                if len(doomed.requests) >= 3:
                    doomed.close()
                    return
                time.sleep(0.002)

        killer = threading.Thread(target=kill, daemon=True)
        killer.start()
        result = CliRunner().invoke(
            main,
            [
                "eval",
                "--served-model",
                "m",
                "--dataset",
                str(data),
                "--samples",
                "2",
                "--out",
                str(out),
                "--width",
                "8",
                "--json",
                "--endpoint",
                doomed.base_url,
                "--endpoint",
                alive.base_url,
                "--engine-concurrency",
                "4",
            ],
        )
        killer.join(timeout=10)
    assert result.exit_code == 0, result.output
    summary, _ = json.JSONDecoder().raw_decode(result.output[result.output.index("{") :])
    assert summary["episodes"] == 40 and summary["policy_errors"] == 0 and summary["pass@1"] == 1.0
    records = read_trajectories(out)
    assert len(records) == 40 and all(t.end_reason == "answer" for t in records)
    engines = {e["endpoint"]: e for e in summary["engines"]}
    assert set(engines) == {doomed.base_url, alive.base_url}
    assert engines[doomed.base_url]["requests"] >= 3
    served = sum(e["requests"] - e["failed"] for e in engines.values())
    assert served == 40  # one turn per episode: every episode's generation came back exactly once
    assert engines[alive.base_url]["busy_s"] > 0


def test_the_shared_admission_rule():
    from rstar_env.rollout.admission import pick_engine

    assert pick_engine([10, 50, 50], [40, 40, 40]) == 1  # most free; a tie goes to the lowest index
    assert pick_engine([10, 50, 60], [40, 40, 40], preferred=1) == 1  # affinity while it has room
    assert pick_engine([10, 50, 60], [40, 40, 40], preferred=0) == 2  # no room there: the most free instead
    assert pick_engine([10, 20], [40, 40]) is None  # no room anywhere: wait
    assert pick_engine([-1, 5], [40, 40], idle=[True, False]) == 0  # an idle engine always takes one
    assert pick_engine([3, 100], [1, 40], capacity=[4, 1000]) == 0  # fractions: 75% free beats 10%
    assert pick_engine([100, 100], [1, 1], eligible=[1]) == 1


def test_the_eval_table_shows_one_row_per_engine():
    from rstar_env.rollout.metrics import format_summary_rows

    rows = dict(
        format_summary_rows(
            {"episodes": 2, "engines": [{"endpoint": "http://a/v1", "requests": 3, "failed": 1, "busy_s": 1.25}]}
        )
    )
    assert rows["engine http://a/v1"] == "requests 3, failed 1, busy 1.2s"
