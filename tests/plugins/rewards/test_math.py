"""The ``math`` reward: accuracy on the labelled set, the fast path, time/memory bounds, threads, loops, cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rstar_env.plugins import load_reward
from rstar_env.reward import Reward, score_many
from rstar_env.trajectory import RewardResult
from rstar_plugins.rewards import MathReward
from rstar_plugins.rewards.math_reward import REASONS
from rstar_plugins.rewards.pool import VerifierPool

CASES_PATH = Path(__file__).resolve().parents[2] / "fixtures" / "reward_cases.jsonl"
CASES = [json.loads(line) for line in CASES_PATH.read_text().splitlines() if line.strip()]


def boxed(answer: str) -> str:
    return f"Checked with the tool.\n\n<answer>\nThe final answer is $\\boxed{{{answer}}}$.\n</answer>"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped before, or between the open and the read
        return False


@pytest.fixture(scope="module")
def reward() -> Iterator[MathReward]:
    r = MathReward(workers=2, timeout_s=3.0)
    yield r
    r.close()


@pytest.fixture(scope="module")
def fast_timeout_reward() -> Iterator[MathReward]:
    r = MathReward(workers=1, timeout_s=1.0, cache_size=0)
    r.start(wait=True)  # so the timing assertions measure comparisons, not the worker start
    yield r
    r.close()


# -- the labelled set ------------------------------------------------------------------------------------------------
def test_labelled_set_is_large_and_balanced() -> None:
    assert len(CASES) >= 200
    assert len({c["id"] for c in CASES}) == len(CASES)
    positives = sum(c["expected"] == 1.0 for c in CASES)
    assert 0.3 < positives / len(CASES) < 0.8
    categories = {c["category"] for c in CASES}
    for needed in (
        "integer",
        "fraction",
        "thousands",
        "units",
        "degrees",
        "percent",
        "interval",
        "set",
        "tuple",
        "matrix",
        "plus_minus",
        "equation",
        "symbolic",
        "multiple_boxes",
        "answer_unboxed",
        "no_answer",
    ):
        assert needed in categories


def test_labelled_set_accuracy(reward: MathReward) -> None:
    results = asyncio.run(reward.score_batch([(c["response"], c["gold"]) for c in CASES]))
    misses = [
        (c["id"], c["gold"], r.extracted, c["expected"], r.reason)
        for c, r in zip(CASES, results, strict=True)
        if r.reward != c["expected"]
    ]
    accuracy = 1 - len(misses) / len(CASES)
    assert accuracy >= 0.99, f"accuracy {accuracy:.3f} on {len(CASES)} cases; misses: {misses}"
    assert all(r.reason in REASONS for r in results)


@pytest.mark.parametrize(
    "case", [c for c in CASES if c["category"] in ("integer", "thousands")][:12], ids=lambda c: c["id"]
)
def test_labelled_integers_one_by_one(reward: MathReward, case: dict) -> None:
    result = asyncio.run(reward.score(case["response"], case["gold"]))
    assert result.reward == case["expected"]


# -- contract -------------------------------------------------------------------------------------------------------
def test_registered_and_protocol() -> None:
    r = load_reward("math", timeout_s=2.0, workers=1)
    try:
        assert isinstance(r, MathReward) and isinstance(r, Reward)
        assert r.name == "math" and r.timeout_s == 2.0
    finally:
        r.close()


def test_bad_options_say_what_is_wrong() -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        MathReward(timeout_s=0)
    with pytest.raises(ValueError, match="workers"):
        MathReward(workers=0)


def test_result_fields(reward: MathReward) -> None:
    ok = asyncio.run(reward.score(boxed("\\dfrac{3}{4}"), "0.75"))
    assert ok == RewardResult(1.0, "\\dfrac{3}{4}", "exact")
    wrong = asyncio.run(reward.score(boxed("x^2"), "y^2"))
    assert (wrong.reward, wrong.extracted, wrong.reason) == (0.0, "x^2", "mismatch")
    right = asyncio.run(reward.score(boxed("(x+1)^2"), "x^2+2x+1"))
    assert (right.reward, right.reason) == (1.0, "verified")


@pytest.mark.parametrize("response", ["no answer here", "<answer></answer>", "<answer>\\boxed{}</answer>", ""])
def test_no_answer(reward: MathReward, response: str) -> None:
    result = asyncio.run(reward.score(response, "5"))
    assert (result.reward, result.extracted, result.reason) == (0.0, None, "no_answer")


def test_extraction_flags() -> None:
    strict = MathReward(fallback=False)
    response = "so the answer is \\boxed{5}"
    assert strict.extract(response) is None
    assert asyncio.run(strict.score(response, "5")).reason == "no_answer"
    assert asyncio.run(MathReward().score(response, "5")).reward == 1.0
    assert strict._pool is None  # decided without starting any worker


def test_fast_path_never_starts_workers() -> None:
    r = MathReward()
    pairs = [(boxed(str(k)), str(k if k % 3 else k + 1)) for k in range(300)]
    results = asyncio.run(r.score_batch(pairs))
    assert [x.reward for x in results] == [0.0 if k % 3 == 0 else 1.0 for k in range(300)]
    assert {x.reason for x in results} == {"exact", "mismatch"}
    assert r._pool is None


def test_score_batch_keeps_order_and_matches_score(reward: MathReward) -> None:
    pairs = [
        (boxed("\\sqrt{12}"), "2\\sqrt3"),
        (boxed("7"), "7"),
        (boxed("\\{1,2\\}"), "\\{1,2,3\\}"),
        ("nothing", "1"),
        (boxed("8"), "7"),
        (boxed("[1,2)"), "[1, 2)"),
    ]
    batch = asyncio.run(reward.score_batch(pairs))
    one_by_one = [asyncio.run(reward.score(r, a)) for r, a in pairs]
    assert batch == one_by_one
    assert [x.reward for x in batch] == [1.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert asyncio.run(score_many(reward, pairs)) == batch


def test_bad_gold_is_reported(reward: MathReward) -> None:
    result = asyncio.run(reward.score(boxed("x+1"), "   "))
    assert (result.reward, result.reason) == (0.0, "bad_gold")


def test_verdict_cache(reward: MathReward) -> None:
    key_response, gold = boxed("\\frac{\\sqrt{2}}{2}"), "\\frac{1}{\\sqrt{2}}"
    first = reward.score_sync(key_response, gold)
    located = reward.locate(key_response)
    assert located is not None
    assert reward._cache_get((located.text, gold)) == ("verified", "")
    assert reward.score_sync(key_response, gold) == first


# -- time and memory bounds -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "answer",
    ["5^{5^{5^5}}", "10^{10^{10}}", "+".join(["x^{99}"] * 3000)],
    ids=["power-tower", "huge-power", "huge-string"],
)
def test_pathological_answer_costs_at_most_the_timeout(fast_timeout_reward: MathReward, answer: str) -> None:
    # These answers run for hours without a timeout: the reason says the 1 s timeout (or the length cap) ended it.
    # wait_for only stops a hung test.
    result = asyncio.run(asyncio.wait_for(fast_timeout_reward.score(boxed(answer), "5"), 30))
    assert result.reward == 0.0
    # mismatch only if sympy finishes in time; a 21 kB answer is also past the default max_answer_chars
    assert result.reason in ("timeout", "mismatch", "answer too long")
    # The pool is still usable afterwards.
    assert asyncio.run(fast_timeout_reward.score(boxed("x+1"), "1+x")).reward == 1.0


def test_power_tower_times_out(fast_timeout_reward: MathReward) -> None:
    result = fast_timeout_reward.score_sync(boxed("5^{5^{5^5}}"), "5")
    assert (result.reward, result.reason) == (0.0, "timeout")


def test_hard_kill_when_the_worker_ignores_its_timer() -> None:
    # Simulates code stuck where no signal handler runs: the worker's own timer is set far past the hard limit.
    # Warm parsers: with a 0.5 s hard limit, a cold worker's first parse on a loaded machine can run into it.
    with VerifierPool(workers=1, timeout_s=0.5) as pool:
        pool.config.worker_timer = False
        pool.start(wait=True)
        [old_pid] = pool.pids()
        # The hard kill is what ended it (counted: kills == 1); the result's timeout only stops a hung test.
        [future] = pool.submit([("\\boxed{5^{5^{5^5}}}", "5")])
        code, detail = future.result(timeout=30)
        assert code == "timeout" and "worker killed and replaced" in detail, detail
        assert pool.kills == 1 and not _alive(old_pid)
        assert pool.run("x+1", True, "1+x")[0] == "verified"  # the replacement works
        [new_pid] = pool.pids()
        assert new_pid != old_pid
        # Forked from the same template: a restart costs a fork, not a fresh interpreter's imports.
        template = pool.template_pid()
        assert template is not None and _parent(new_pid) == template == _parent(old_pid, default=template)


def _parent(pid: int, default: int | None = None) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return default


def test_a_killed_template_is_replaced_when_a_worker_next_starts() -> None:
    with VerifierPool(workers=1, timeout_s=0.5) as pool:
        pool.config.worker_timer = False
        pool.start(wait=True)
        [worker] = pool.pids()
        first = pool.template_pid()
        assert first is not None and _parent(worker) == first
        os.kill(first, signal.SIGKILL)
        # The running worker does not need its template; a replacement does.
        assert pool.run("x+1", True, "1+x")[0] == "verified"
        code, detail = pool.run("5^{5^{5^5}}", True, "5")
        assert code == "timeout" and "worker killed and replaced" in detail, detail
        assert pool.run("x+2", True, "2+x")[0] == "verified"
        second = pool.template_pid()
        assert second not in (None, first) and [_parent(pid) for pid in pool.pids()] == [second]
    assert pool.template_pid() is None and not _alive(second)


def test_a_pool_works_in_a_process_with_more_than_1024_files_open() -> None:
    # A trainer holds many descriptors, so the pool's own (pipes, the workers' pidfds) may be numbered past 1024,
    # where select() cannot watch them.
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the hard limit on open files is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200) if soft != resource.RLIM_INFINITY else soft, hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with VerifierPool(workers=1, timeout_s=0.5) as pool:
            pool.config.worker_timer = False

            def verdict(pred: str, gold: str) -> tuple[str, str]:
                # A hang guard: a dispatcher thread that died on a descriptor leaves the future unsettled.
                return pool.submit([(f"\\boxed{{{pred}}}", gold)])[0].result(timeout=60)

            assert verdict("x+1", "1+x")[0] == "verified"
            code, detail = verdict("5^{5^{5^5}}", "5")  # the hard kill waits on the worker's pidfd
            assert code == "timeout" and pool.kills == 1, detail
            assert verdict("x+2", "2+x")[0] == "verified"
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_workers_have_a_memory_limit(reward: MathReward) -> None:
    reward.start(wait=True)
    assert reward._pool is not None
    for pid in reward._pool.pids():
        limits = Path(f"/proc/{pid}/limits").read_text()
        line = next(line for line in limits.splitlines() if line.startswith("Max address space"))
        assert str(reward.memory_mb * 1024 * 1024) in line


# -- threads, event loops, cleanup ----------------------------------------------------------------------------------
def test_score_from_threads_and_loops(reward: MathReward) -> None:
    results: list[RewardResult] = []
    errors: list[BaseException] = []

    def in_thread(use_loop: bool) -> None:
        try:
            if use_loop:
                results.append(asyncio.run(reward.score(boxed("2\\sqrt{2}"), "\\sqrt{8}")))
            else:
                results.append(reward.score_sync(boxed("\\frac{\\pi}{2}"), "\\pi/2"))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=in_thread, args=(i % 2 == 0,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert [r.reward for r in results] == [1.0] * 4
    # Several loops in turn in this thread: nothing is bound to a loop.
    for _ in range(3):
        assert asyncio.run(reward.score(boxed("3+2i"), "2i+3")).reward == 1.0


def test_score_does_not_block_the_loop(fast_timeout_reward: MathReward) -> None:
    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        task = asyncio.create_task(ticker())
        await fast_timeout_reward.score(boxed("5^{5^{5^5}}"), "5")
        task.cancel()
        return ticks

    assert asyncio.run(main()) > 10  # the loop kept running while the comparison hung (~80 ticks when idle)


def test_close_stops_workers_and_reuse_restarts() -> None:
    # Without the parsers' warm-up (1.7 CPU-s less to start; the default 3 s limit leaves a cold parse room): the
    # lifecycle is under test.
    r = MathReward(workers=1, warm_up=False)
    assert r.score_sync(boxed("x+1"), "1+x").reward == 1.0
    assert r._pool is not None
    template = r._pool.template_pid()
    assert template is not None and Path(f"/proc/{template}/cmdline").read_bytes().split(b"\0")[-2] == b"cold"
    pids = r._pool.pids()
    r.close()
    r.close()
    assert pids and not any(_alive(pid) for pid in pids)
    assert r.score_sync(boxed("x+2"), "2+x").reward == 1.0  # restarts on use
    r.close()


def test_no_worker_outlives_the_interpreter(tmp_path: Path) -> None:
    script = tmp_path / "leak.py"
    script.write_text(
        "from rstar_plugins.rewards import MathReward\n"
        "r = MathReward(workers=2, warm_up=False)\n"
        "assert r.score_sync('<answer>\\\\boxed{x+1}</answer>', '1+x').reward == 1.0\n"
        "r.start(wait=True)\n"
        "print(' '.join(map(str, [*r._pool.pids(), r._pool.template_pid()])), flush=True)\n"
        # exits without close(): atexit must clean up
    )
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=True)
    pids = [int(p) for p in out.stdout.split()]
    assert len(pids) == 3  # two workers and their template
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_child_gets_its_own_workers_and_leaves_the_parents_alone() -> None:
    r = MathReward(workers=1, warm_up=False)
    try:
        assert r.score_sync(boxed("x+1"), "1+x").reward == 1.0
        assert r._pool is not None
        parent_pids = r._pool.pids()
        child = os.fork()
        if child == 0:  # pragma: no cover - runs in the child
            ok = r.score_sync(boxed("x+2"), "2+x").reward == 1.0 and r._pool.pids() != parent_pids
            r.close()
            os._exit(0 if ok else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert r._pool.pids() == parent_pids and all(_alive(p) for p in parent_pids)
        assert r.score_sync(boxed("x+3"), "3+x").reward == 1.0
    finally:
        r.close()
