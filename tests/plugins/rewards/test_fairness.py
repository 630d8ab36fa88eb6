"""The ``math`` reward's worker pool under a burst of pathological answers (issue 34, finding 5).

``5^{5^{5^k}}`` makes math-verify run to its timeout (sympy builds the power), and answers its worker's timer and
the preemption signal. Before the fair queue, 14 such answers ahead of a correct one on 2 workers held the queue
for longer than ``reward_timeout_s=20``: the correct answer and the last slow ones ended ``env_error``. The test
runs that scenario shorter (8 slow answers at ``timeout_s=1.5``: each one's work is CPU burnt to its timeout) and
checks what the first-come queue got wrong: the order in which the answers are scored. The pools whose correct
answer must be verified within a probe or an attempt keep the parsers' warm-up: a cold worker parses more slowly,
and on a loaded machine that once cost the correct answer its verdict. The others start without it (1.7 CPU-s).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from rstar_env.testing import aplay, make_env
from rstar_plugins.rewards import MathReward
from rstar_plugins.rewards.pool import VerifierPool, _Scheduler


def tower(k: int) -> str:
    return f"5^{{5^{{5^{{{k}}}}}}}"


@pytest.fixture
def shared_reward() -> Iterator[MathReward]:
    # Half the default timeout_s (3.0): the finding's scenario at half its length, and half its CPU.
    reward = MathReward(workers=2, cache_size=0, timeout_s=1.5)
    # The scenario is about the queue: start-up (seconds, more on a loaded machine) is paid before it.
    reward.start(wait=True)
    yield reward
    reward.close()


@pytest.fixture(scope="module")
def pool() -> Iterator[VerifierPool]:
    """One worker, 1.5 s timeout, 0.25 s probe, shared by the tests that leave it idle when they end (every
    comparison answered, no monkeypatch): a worker's start costs seconds of CPU, the scenarios do not need a fresh
    one. A slow answer that returns to the interpreter keeps its worker, so no test hands the next a restart."""
    with VerifierPool(workers=1, timeout_s=1.5, probe_s=0.25) as shared:
        shared.start(wait=True)
        yield shared


def test_slow_answers_do_not_push_a_correct_one_out_of_scoring(shared_reward: MathReward) -> None:
    # First come, the correct answer would wait 2 rounds of two slow answers run to their 1.5 s timeouts, and end
    # last. Fair, every verdict comes within the pool's 4 * timeout_s (6 s), well inside reward_timeout_s. (Four slow
    # answers tell the two orders apart as well as eight did, at half the CPU: each runs to its timeout either way.)
    envs = [make_env(tools=[], reward=shared_reward, reward_timeout_s=10) for _ in range(5)]
    answers = [tower(k) for k in range(5, 9)] + ["\\frac{x^2-1}{x-1}"]
    golds = ["5"] * 4 + ["x+1"]

    ended: list[str] = []  # the golds, in the order their episodes ended

    async def episode(env: object, pred: str, gold: str, delay: float) -> object:
        await asyncio.sleep(delay)  # the correct answer is queued last, behind every slow one
        trajectory = await aplay(env, [f"<answer>\\boxed{{{pred}}}</answer>"], problem="p", answer=gold)
        ended.append(gold)
        return trajectory

    async def run_all() -> list:
        return await asyncio.gather(
            *(
                episode(env, pred, gold, 0.2 if gold == "x+1" else 0.0)
                for env, pred, gold in zip(envs, answers, golds, strict=True)
            )
        )

    try:
        trajectories = asyncio.run(run_all())
    finally:
        for env in envs:
            env.close()
    outcomes = [(t.end_reason, t.reward, t.reward_result.reason if t.reward_result else None) for t in trajectories]
    *slow, correct = outcomes
    assert correct[:2] == ("answer", 1.0), outcomes
    assert slow == [("answer", 0.0, "timeout")] * 4, outcomes  # scored 0 with their reason, never env_error
    # First come, the correct answer waited 2 rounds of two slow answers run to their timeouts, so it ended last
    # (index 4); now it waits their probes, and ends before any of them (one round of slack, for a loaded machine).
    assert ended.index("x+1") <= 2, ended


def test_an_idle_pool_runs_a_slow_comparison_to_its_timeout(pool: VerifierPool) -> None:
    # Nothing waits, so nothing preempts it (past its 0.25 s probe): the same verdict and cost as a pool without a
    # fair queue, one attempt run to the worker's timer.
    preemptions = pool.preemptions
    code, detail = pool.run(tower(5), True, "5")
    assert code == "timeout" and detail == f"math-verify took longer than {pool.config.soft_timeout_s:.2f}s", detail
    assert pool.preemptions == preemptions, "a comparison was cut at its probe with nothing waiting"


def test_an_untried_comparison_overtakes_slow_ones_and_every_slow_one_ends_in_time(pool: VerifierPool) -> None:
    # latency_s: 4 x 1.5 = 6 s
    preemptions = pool.preemptions
    # One request each, as episodes score their answers.
    requests = [[(f"\\boxed{{{tower(k)}}}", "5")] for k in range(5, 9)] + [[("\\boxed{x+1}", "1+x")]]
    futures = [future for request in requests for future in pool.submit(request)]
    order: list[int] = []
    for i, future in enumerate(futures):
        future.add_done_callback(lambda _, i=i: order.append(i))
    _, pending = concurrent.futures.wait(futures, timeout=60)  # a hang guard: the pool's deadline is 6 s
    assert not pending, "the pool's deadline did not end the slow comparisons"
    verdicts = [future.result() for future in futures]
    for _ in range(300):  # the done callbacks run in the dispatcher thread (30 s at most: a hang guard)
        if len(order) == len(futures):
            break
        time.sleep(0.1)
    *slow, fast = verdicts
    assert fast == ("verified", ""), verdicts
    # Behind 4 slow answers it waited their probes, not their timeouts (first come, it would have ended last): the
    # first slow one yielded to it at least.
    assert order[0] == 4, order
    assert pool.preemptions > preemptions
    assert [code for code, _ in slow] == ["timeout"] * 4, verdicts
    # More slow answers than the worker had room for within latency_s: those end as congestion timeouts.
    assert any("while other answers waited" in detail for _, detail in slow), slow


def test_a_worker_that_reads_its_batch_late_still_yields_after_its_probe(monkeypatch) -> None:
    # Under load the worker may read a batch after the pool's probe clock has run out: the first SIGUSR1 then comes
    # before the worker's own probe has (or before it has read the batch at all), and it ignores it. CI once saw
    # that slow answer run its whole timeout ahead of the others. The pool keeps asking until it yields.
    original = _Scheduler.run_tasks
    stopped: list[int] = []

    def run_tasks_late(self: _Scheduler, slot, tasks, first: bool) -> None:
        if first and not stopped:
            pid = slot.worker.pid
            stopped.append(pid)
            os.kill(pid, signal.SIGSTOP)  # the batch waits in the pipe while the pool's clock runs
            threading.Timer(0.4, os.kill, (pid, signal.SIGCONT)).start()
        original(self, slot, tasks, first)

    monkeypatch.setattr(_Scheduler, "run_tasks", run_tasks_late)
    with VerifierPool(workers=1, timeout_s=1.5, probe_s=0.25) as pool:
        pool.start(wait=True)
        order: list[str] = []
        slow = pool.submit([(f"\\boxed{{{tower(5)}}}", "5")])[0]
        fast = pool.submit([("\\boxed{x+1}", "1+x")])[0]
        slow.add_done_callback(lambda _: order.append("slow"))
        fast.add_done_callback(lambda _: order.append("fast"))
        assert fast.result(timeout=30) == ("verified", "")
        assert slow.result(timeout=30)[0] == "timeout"
    assert stopped, "the worker was never held back: the scenario did not happen"
    # Preempted, the slow answer's full attempt comes after the fast one; ignored, its first attempt ran to its
    # timeout ahead of it.
    assert order == ["fast", "slow"], order


def test_within_one_request_the_order_is_first_come(pool: VerifierPool) -> None:
    # A trainer's batch: its caller waits for all of it, so a slow comparison there is never cut short.
    slow, fast = pool.run_many([(f"\\boxed{{{tower(5)}}}", "5"), ("\\boxed{x+1}", "1+x")])
    assert slow[0] == "timeout" and "took longer than" in slow[1], slow
    assert fast == ("verified", "")


def test_a_cancelled_comparison_is_never_run() -> None:
    with VerifierPool(workers=1, timeout_s=1.5, warm_up=False) as pool:
        pool.start(wait=True)
        busy = pool.submit([(f"\\boxed{{{tower(5)}}}", "5")])[0]
        time.sleep(0.2)  # the worker has the slow one; the next waits in the queue
        waiting = pool.submit([("\\boxed{x+1}", "1+x")])[0]
        assert waiting.cancel()  # its caller gave up (the env's own limit): the workers never see it
        assert busy.result(timeout=10)[0] == "timeout"
        assert waiting.cancelled()
        assert pool.run("x+2", True, "2+x") == ("verified", "")  # the queue goes on


def test_workers_that_cannot_start_are_a_system_failure_not_a_score(monkeypatch) -> None:
    # env_error stays for real failures: a broken install is never scored 0 (nor waited on forever).
    monkeypatch.setattr("rstar_plugins.rewards.pool._WORKER_MODULE", "rstar_plugins.rewards._no_such_worker")
    reward = MathReward(workers=1, cache_size=0, warm_up=False)
    env = make_env(tools=[], reward=reward, reward_timeout_s=30)
    try:
        with pytest.raises(RuntimeError, match=r"math-verify worker .* exited"):
            reward.score_sync("<answer>\\boxed{x+1}</answer>", "1+x")
        trajectory = asyncio.run(aplay(env, ["<answer>\\boxed{x+2}</answer>"], problem="p", answer="2+x"))
        assert trajectory.end_reason == "env_error" and "math-verify worker" in (trajectory.error or "")
    finally:
        env.close()
        reward.close()


def _scheduler(workers: int = 2) -> _Scheduler:
    """The queue alone, no worker processes: what is taken, in what order, counted."""
    from rstar_plugins.rewards.pool import _Config, _Slot

    config = _Config(timeout_s=3.0, soft_timeout_s=2.5, probe_s=0.5, latency_s=12.0, memory_mb=0, startup_timeout_s=9)
    scheduler = _Scheduler(config)
    scheduler.slots = [_Slot() for _ in range(workers)]
    return scheduler


def _clients_of_batches(scheduler: _Scheduler, batches: int) -> list[list[str]]:
    taken = []
    with scheduler.cv:
        for _ in range(batches):
            taken.append([task.client for task in scheduler._take_fresh_locked()])
    return taken


def test_one_clients_backlog_never_holds_another_clients_next_comparison() -> None:
    """Finding 41.3: 120 slow /verify requests of one client in flight, and an honest /verify got 503 after 16 s
    (and an honest episode's reward timed out): requests were served first come, whoever sent them. Now the honest
    client's comparison is in the very next batch a worker takes, behind at most one of the flood's."""
    scheduler = _scheduler()
    for _ in range(120):
        scheduler.submit([(f"\\boxed{{{tower(9)}}}", "5")], 12.0, "flood")
    scheduler.submit([("\\boxed{x+1}", "1+x")], 12.0, "honest")
    first = _clients_of_batches(scheduler, 1)[0]
    assert "honest" in first[:2], first
    assert scheduler.queued == 121 - len(first)


def test_clients_with_a_backlog_are_served_in_turn() -> None:
    scheduler = _scheduler(workers=8)  # small batches; taken one after another, they are the order of service
    scheduler.submit([("1", "1")] * 6, 12.0, "a")
    scheduler.submit([("2", "2")] * 3, 12.0, "b")
    scheduler.submit([("3", "3")] * 2, 12.0, None)  # the default client is a client like any other
    taken = [c for batch in _clients_of_batches(scheduler, 11) for c in batch]
    assert taken == ["a", "b", None, "a", "b", None, "a", "b", "a", "a", "a"], taken


def test_a_client_key_reaches_the_scheduler_through_the_pool(pool: VerifierPool) -> None:
    assert pool.run("x+2", True, "2+x", client="token-a") == ("verified", "")
    assert pool.run_many([("\\boxed{3}", "3")], client="token-b") == [("verified", "")]


def test_a_per_client_cap_leaves_workers_for_other_clients() -> None:
    """``max_per_client=1``: a flooding client has one comparison without a verdict at a time; the others' are taken
    meanwhile, and its next is taken once its verdict is in."""
    scheduler = _scheduler(workers=2)
    scheduler.config.max_per_client = 1
    flood = scheduler.submit([("1", "1")] * 5, 12.0, "flood")
    assert _clients_of_batches(scheduler, 2) == [["flood"], []]  # capped: the second worker finds nothing to take
    scheduler.submit([("2", "2")], 12.0, "honest")
    assert _clients_of_batches(scheduler, 1) == [["honest"]]
    flood[0].set_result(("verified", ""))  # its verdict: the flood may start another
    assert _clients_of_batches(scheduler, 1) == [["flood"]]
    assert scheduler.in_flight == {"flood": 1, "honest": 1}


def test_an_episodes_answer_is_queued_under_its_client(monkeypatch) -> None:
    """The env names its client to the reward (``rstar_env.reward.current_client``), and the ``math`` reward queues
    the comparison under it: a server's raw /verify traffic cannot hold an episode's scoring behind its backlog."""
    seen: list[object] = []
    submit = VerifierPool.submit

    def spy(self: VerifierPool, items, *, client=None):
        seen.append(client)
        return submit(self, items, client=client)

    monkeypatch.setattr(VerifierPool, "submit", spy)
    reward = MathReward(workers=1, cache_size=0, warm_up=False)
    env = make_env(tools=[], reward=reward)
    env.unwrapped.client = "alice"
    try:
        # Not decided by the fast path (numbers, plain text): it goes to math-verify in the pool.
        trajectory = asyncio.run(
            aplay(env, ["<answer>\\boxed{\\frac{x^2-1}{x-1}}</answer>"], problem="p", answer="x+1")
        )
    finally:
        env.close()
        reward.close()
    assert trajectory.reward == 1.0 and seen == ["alice"]
