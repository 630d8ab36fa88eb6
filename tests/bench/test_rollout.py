"""``rstar-env bench rollout``'s simulation: dynamic beats static pinning and lockstep, and never overflows."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rstar_env.bench.rollout_sim import EngineModel, Workload, compare, lower_bound, simulate
from rstar_env.cli import main


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dynamic_beats_static_and_lockstep_with_no_over_capacity_moment(seed):
    results = {r["scheduler"]: r for r in compare(Workload(seed=seed))}
    dynamic = results["dynamic"]
    assert dynamic["makespan_s"] < results["static"]["makespan_s"] < results["lockstep"]["makespan_s"]
    assert dynamic["over_capacity"] == 0 and dynamic["peak_over_capacity"] == [0, 0, 0, 0]
    assert results["static"]["over_capacity"] > 0
    for r in results.values():
        assert r["makespan_s"] >= r["lower_bound_s"] and r["ratio"] >= 1.0
        assert all(0 <= b <= 100.0001 for b in r["busy_pct"])


def test_one_engine_without_tools_is_the_same_for_every_scheduler_that_has_no_barrier():
    workload = Workload(prompts=4, samples=2, turns=1, tool_mean_s=0.0, width=8, engines=(EngineModel(100.0, 10**9),))
    static, dynamic = simulate(workload, "static"), simulate(workload, "dynamic")
    # Unlimited capacity, one turn: both run every episode at once; the makespan is the longest generation.
    longest = max(t for turns in workload.draw() for t, _ in turns) / 100.0
    assert static["makespan_s"] == pytest.approx(longest) == pytest.approx(dynamic["makespan_s"])
    assert lower_bound(workload) == pytest.approx(longest)


def test_unknown_scheduler_is_named():
    with pytest.raises(ValueError, match="choose one of"):
        simulate(Workload(), "fifo")


def test_the_bench_command_prints_the_table_and_json():
    result = CliRunner().invoke(main, ["bench", "rollout"])
    assert result.exit_code == 0, result.output
    assert "| dynamic |" in result.output and "lower bound" in result.output
    result = CliRunner().invoke(main, ["bench", "rollout", "--json", "--seed", "1"])
    data = json.loads(result.output)
    assert [r["scheduler"] for r in data["schedulers"]] == ["lockstep", "static", "dynamic"]


def test_the_long_tail_scenario_bounds():
    from rstar_env.bench.longtail import LongTail, bounds, list_schedule, responder, rows

    assert list_schedule([3, 1, 1, 1], 2) == 3  # first free slot, in order
    assert list_schedule([1, 1, 1, 1, 4], 2) == 6
    scenario = LongTail()
    b = bounds(scenario)
    assert b["ideal_s"] >= max(b["packing_bound_s"], b["longest_episode_s"])
    delays = scenario.delays()
    assert {d for episode in delays for d in episode} == {0.2, 2.0} and len(delays) == 64
    # The server's answer to each turn: two python calls, then the boxed answer, after that turn's delay.
    respond = responder(scenario)
    problem = rows(scenario)[5]["problem"]
    first = respond({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": problem}]})
    assert "<tool_call>" in first["content"] and first.get("delay_s", 0.0) == delays[5][0]
    last = respond(
        {
            "messages": [
                {"role": "user", "content": problem},
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "r"},
                {"role": "assistant", "content": "b"},
            ]
        }
    )
    assert "\\boxed{5}" in last["content"] and last.get("delay_s", 0.0) == delays[5][2]


def test_the_long_tail_scenario_runs_through_its_in_process_endpoint():
    """`bench rollout --longtail`'s run, scaled down: every episode through the policy, the env and the python
    tool, answered by the bench's own MockTransport handler (no server)."""
    from rstar_env.bench.longtail import LongTail, run

    result = run(LongTail(episodes=6, width=3, fast_s=0.01, slow_s=0.05))
    assert (result["episodes"], result["pass@1"], result["policy_errors"], result["env_errors"]) == (6, 1.0, 0, 0)
    assert result["requests"] == 6 * 3 and 1 <= result["max_in_flight"] <= 3
