"""Event-driven collection: no episode waits for another; the local policy's micro-batching queue."""

from __future__ import annotations

import asyncio

import pytest

from rstar_env.rollout.collect import collect, iter_collect, jobs_for
from rstar_env.rollout.policy import Generation
from rstar_env.testing import answer, tool_call


class GatedPolicy:
    """Answers each episode by its problem: ``slow`` episodes wait on an event the test controls; others call the
    echo tool ``turns - 1`` times and answer. Records the order of events."""

    tokenizer = None

    def __init__(self, turns: int = 3) -> None:
        self.turns = turns
        self.gate = asyncio.Event()
        self.log: list[tuple[str, int]] = []
        self.calls = 0

    async def generate(self, requests):
        (request,) = requests  # the collector asks per episode
        self.calls += 1
        trajectory = request.trajectory
        turn = len(trajectory.turns)
        name = trajectory.id
        self.log.append((name, turn))
        if name.startswith("slow"):
            await self.gate.wait()
        if turn < self.turns - 1:
            return [Generation(tool_call("echo", text=f"{name}-{turn}"), finish_reason="tool_call")]
        return [Generation(answer(trajectory.answer))]

    async def aclose(self):
        pass


def test_a_slow_episode_does_not_delay_a_fast_ones_next_turn(echo_plugins):
    policy = GatedPolicy(turns=3)
    rows = [
        {"id": "slow", "problem": "slow?", "answer": "1"},
        {"id": "fast", "problem": "fast?", "answer": "2"},
        {"id": "next", "problem": "next?", "answer": "3"},
    ]

    async def run():
        done = []
        async for _job, trajectory in iter_collect(
            policy, jobs_for(rows), width=2, tools=["echo"], reward="exact_test", max_turns=3
        ):
            done.append(trajectory.id)
            if trajectory.id == "next":
                policy.gate.set()  # only now does the slow episode's first generation return
        return done

    done = asyncio.run(run())
    # While "slow" waited on its first generation, "fast" ran all three turns, ended, and its slot took "next",
    # which ran to the end too: no round barrier held either of them back.
    assert done == ["fast", "next", "slow"]
    assert policy.log.index(("slow", 1)) > policy.log.index(("next", 2))
    assert policy.log[:2] == [("slow", 0), ("fast", 0)]  # jobs start in the order given


def test_collect_keeps_job_order_and_samples(echo_plugins):
    policy = GatedPolicy(turns=2)
    policy.gate.set()
    rows = [{"id": f"p{i}", "problem": f"{i}?", "answer": str(i)} for i in range(3)]
    trajectories = asyncio.run(
        collect(policy, jobs_for(rows, samples=2), width=4, tools=["echo"], reward="exact_test", max_turns=2)
    )
    assert [(t.id, t.metadata["sample"]) for t in trajectories] == [(f"p{i}", k) for i in range(3) for k in range(2)]
    assert all(t.reward == 1.0 and len(t.turns) == 2 for t in trajectories)
    assert policy.calls == 12


def test_width_bounds_episodes_in_flight(echo_plugins):
    live, peak = set(), [0]

    class Counting(GatedPolicy):
        async def generate(self, requests):
            live.add(requests[0].episode)
            peak[0] = max(peak[0], len(live))
            await asyncio.sleep(0)
            out = await super().generate(requests)
            if not out[0].text.startswith("<tool_call>"):
                live.discard(requests[0].episode)
            return out

    policy = Counting(turns=2)
    policy.gate.set()
    rows = [{"id": f"p{i}", "problem": f"{i}?", "answer": str(i)} for i in range(7)]
    trajectories = asyncio.run(
        collect(policy, jobs_for(rows), width=3, tools=["echo"], reward="exact_test", max_turns=2)
    )
    assert len(trajectories) == 7
    assert peak[0] == 3


def test_an_error_in_one_episode_stops_the_run_and_is_raised(echo_plugins):
    class Broken(GatedPolicy):
        async def generate(self, requests):
            if requests[0].trajectory.id == "bad":
                raise RuntimeError("policy bug")
            return await super().generate(requests)

    policy = Broken(turns=2)
    policy.gate.set()
    rows = [{"id": "ok", "problem": "1?", "answer": "1"}, {"id": "bad", "problem": "2?", "answer": "2"}]
    with pytest.raises(RuntimeError, match="policy bug"):
        asyncio.run(collect(policy, jobs_for(rows), width=2, tools=["echo"], reward="exact_test", max_turns=2))


def test_failed_generation_ends_only_its_episode(echo_plugins):
    class Failing(GatedPolicy):
        async def generate(self, requests):
            if requests[0].trajectory.id == "bad":
                return [Generation("", finish_reason="error", metadata={"error": "HTTP 500"})]
            return await super().generate(requests)

    policy = Failing(turns=2)
    policy.gate.set()
    rows = [{"id": "ok", "problem": "1?", "answer": "1"}, {"id": "bad", "problem": "2?", "answer": "2"}]
    ok, bad = asyncio.run(collect(policy, jobs_for(rows), width=2, tools=["echo"], reward="exact_test", max_turns=2))
    assert ok.reward == 1.0 and bad.end_reason == "policy_error"


def test_the_episode_key_is_stable_across_turns_and_unique(echo_plugins):
    keys: dict[str, set[str]] = {}

    class Keyed(GatedPolicy):
        async def generate(self, requests):
            keys.setdefault(requests[0].trajectory.id, set()).add(requests[0].episode)
            return await super().generate(requests)

    policy = Keyed(turns=3)
    policy.gate.set()
    rows = [{"id": f"p{i}", "problem": f"{i}?", "answer": str(i)} for i in range(4)]
    asyncio.run(collect(policy, jobs_for(rows), width=2, tools=["echo"], reward="exact_test", max_turns=3))
    assert all(len(k) == 1 for k in keys.values())
    assert len(set().union(*keys.values())) == 4


# -- the local policy's micro-batching queue ---------------------------------------------------------------------
@pytest.fixture
def local_policy(smollm2):
    pytest.importorskip("torch")
    from rstar_env.rollout.local import TransformersPolicy
    from rstar_env.rollout.policy import SamplingParams

    model, tokenizer = smollm2
    return TransformersPolicy(
        model, tokenizer=tokenizer, batch_size=4, sampling=SamplingParams(max_new_tokens=4, seed=0)
    )


def _request(policy, text: str):
    from rstar_env.rollout.policy import Request
    from rstar_env.trajectory import Trajectory

    ids = policy.tokenizer.encode(text)
    return Request(Trajectory(problem=text, answer=""), context_ids=ids)


def test_requests_sent_together_share_a_forward_batch(local_policy):
    async def run():
        return await asyncio.gather(
            *(local_policy.generate([_request(local_policy, f"Count to {i}.")]) for i in range(6))
        )

    results = asyncio.run(run())
    assert all(len(g) == 1 and g[0].token_ids for g in results)
    # Six single requests at once with batch_size 4: two forward batches (4 + 2), not six.
    assert (local_policy.batches, local_policy.rows_batched) == (2, 6)


def test_requests_queue_while_the_model_runs_and_go_next(local_policy):
    import threading

    running, release, sizes = threading.Event(), threading.Event(), []
    real = local_policy.generate_sync

    def held(requests):  # the first batch holds the model until the test lets it go
        sizes.append(len(requests))
        running.set()
        release.wait(timeout=60)
        return real(requests)

    local_policy.generate_sync = held

    async def run():
        first = asyncio.create_task(local_policy.generate([_request(local_policy, "Hello.")]))
        while not running.is_set():
            await asyncio.sleep(0.001)
        later = asyncio.gather(*(local_policy.generate([_request(local_policy, f"Say {i}.")]) for i in range(3)))
        await asyncio.sleep(0)  # the three are queued now
        release.set()
        return await first, await later

    first, later = asyncio.run(run())
    assert first[0].token_ids and all(g[0].token_ids for g in later)
    # The three that arrived while the model was busy went together in the very next batch, with no window wait.
    assert sizes == [1, 3]
    assert (local_policy.batches, local_policy.rows_batched) == (2, 4)


def test_a_request_without_context_ids_fails_its_caller_only(local_policy):
    from rstar_env.rollout.policy import Request
    from rstar_env.trajectory import Trajectory

    with pytest.raises(ValueError, match="needs context_ids"):
        asyncio.run(local_policy.generate([Request(Trajectory(problem="x", answer=""))]))
    assert local_policy.batches == 0
