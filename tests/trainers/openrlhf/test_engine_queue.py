"""The shared engine queue of the OpenRLHF path: stub engine actors of unequal speed, on a virtual clock."""

from __future__ import annotations

import importlib
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("openrlhf")
torch = pytest.importorskip("torch")

from rstar_env.config import load_config  # noqa: E402
from rstar_trainers.openrlhf.engine_queue import EngineLoad, SharedQueue  # noqa: E402


class Clock:
    """Virtual time: a ref is done at its time; ``wait`` jumps to the earliest pending one."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy_until: dict[int, float] = {}

    def wait(self, refs, num_returns=1, timeout=None):
        first = min(refs, key=lambda r: (r.done_at, r.seq))
        self.now = max(self.now, first.done_at)
        return [first], [r for r in refs if r is not first]

    @staticmethod
    def get(ref):
        return ref.value if isinstance(ref, Ref) else ref  # OpenRLHF also ray.get()s plain values


class Ref:
    count = 0

    def __init__(self, value, done_at: float) -> None:
        Ref.count += 1
        self.value, self.done_at, self.seq = value, done_at, Ref.count


def _run(speeds, capacity, prompts, cost=1.0):
    clock = Clock()
    loads = [EngineLoad(capacity, 64) for _ in speeds]
    queue = SharedQueue(loads, clock.wait, clock.get)

    def submit(engine, item):
        # Each request takes 1 / speed of the engine's time; requests in flight run side by side.
        return Ref((engine, item), clock.now + 1.0 / speeds[engine])

    done = []
    queue.run(list(range(prompts)), submit, lambda item: cost, lambda item, result: done.append(result) or [])
    return clock.now, loads, queue, done, None


def test_a_fast_engine_takes_more_prompts_and_no_engine_exceeds_its_capacity():
    makespan, loads, _, done, _ = _run(speeds=[1.0, 4.0], capacity=2.0, prompts=20)
    assert sorted(item for _, item in done) == list(range(20))  # every prompt once
    assert all(load.peak_used <= 2.0 and load.peak_in_flight <= 2 for load in loads)
    assert loads[1].served > 2 * loads[0].served  # the 4x faster engine is fed as it frees room
    # Static pinning (10 prompts each, 2 at a time) takes 5 s on the slow engine; the shared queue far less.
    assert makespan < 5.0 / 2
    assert sum(load.over_capacity for load in loads) == 0


def test_a_request_waits_for_room_and_goes_where_room_frees():
    makespan, _, queue, _, _ = _run(speeds=[1.0, 1.0], capacity=1.0, prompts=3)
    # Two run at once (one per engine); the third waits in the shared queue and starts when the first ends.
    assert queue.order == [0, 1, 0]
    assert makespan == pytest.approx(2.0)


def test_an_oversized_request_runs_alone_on_an_idle_engine():
    _, loads, _, done, _ = _run(speeds=[1.0], capacity=1.0, prompts=2, cost=3.0)
    assert len(done) == 2 and loads[0].peak_in_flight == 1 and loads[0].over_capacity == 2


# -- through RocSamplesGenerator, with OpenRLHF's real code and the CPU stand-ins -----------------------------------
def _fresh(name: str) -> bool:
    return name.startswith("openrlhf.trainer") or name == "rstar_trainers.openrlhf.samples_generator"


@pytest.fixture
def sg(monkeypatch):
    from rstar_env_testkit.openrlhf_stubs import cpu_stub_modules
    from rstar_trainers.openrlhf import patch

    patch.uninstall()
    for name in [n for n in sys.modules if _fresh(n)]:
        monkeypatch.delitem(sys.modules, name)
    stubs = cpu_stub_modules()
    clock = Clock()
    stubs["ray"].wait, stubs["ray"].get = clock.wait, clock.get  # refs complete on the virtual clock
    for name, module in stubs.items():
        monkeypatch.setitem(sys.modules, name, module)
    yield importlib.import_module("rstar_trainers.openrlhf.samples_generator"), clock
    patch.uninstall()
    for name in [n for n in sys.modules if _fresh(n)]:
        monkeypatch.delitem(sys.modules, name)


def _response(prompt: str, index: int, reward: float):
    obs = [1, 2, 3] + [10 + index] * 5
    return {
        "prompt": prompt,
        "label": "1",
        "images": None,
        "mm_train_inputs": None,
        "reward": reward,
        "scores": reward,
        "observation_tokens": obs,
        "action_ranges": [(3, len(obs))],
        "rollout_log_probs": None,
        "truncated": False,
        "extra_logs": {
            "num_tool_calls": 1.0,
            "num_tool_errors": 0.0,
            "num_answer_blocks": 1.0,
            "num_assistant_turns": 2.0,
            "rollout": float(index),
        },
    }


class TimedEngine:
    """A vLLM engine actor stand-in whose requests take ``1 / speed`` of virtual time."""

    def __init__(self, clock: Clock, speed: float) -> None:
        self.clock, self.speed = clock, speed
        self.requests: list[tuple[str, int]] = []
        self.generate_responses = SimpleNamespace(remote=self._generate)
        self.get_num_unfinished_requests = SimpleNamespace(remote=lambda: 0)

    def _generate(self, *, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples, images=None):
        self.requests.append((prompt, num_samples))
        group = [_response(prompt, i, float(i % 2)) for i in range(num_samples)]  # mixed: RoC keeps the group
        return Ref(group, self.clock.now + 1.0 / self.speed)


def test_roc_generator_feeds_unequal_engines_from_one_queue(sg):
    ours, clock = sg
    G, prompts = 2, 12
    run = load_config(
        {
            "sampler": "roc",
            "trainer": {
                "backend": "openrlhf",
                "group_size": G,
                "oversample": 2,
                "seed": 0,
                # 2 prompts in flight per engine: each costs 2G x max_len = 4 x 64 tokens.
                "engine_capacity_tokens": 2 * 4 * 64,
            },
        }
    )
    args = SimpleNamespace(
        rollout=SimpleNamespace(batch_size=prompts, n_samples_per_prompt=G, vllm_generate_batch_size=prompts),
        algo=SimpleNamespace(
            dynamic_filtering_enable=False,
            dynamic_filtering_range=(0, 1),
            advantage=SimpleNamespace(is_correction_level="off"),
        ),
        vllm=SimpleNamespace(enable_sleep=False),
    )
    loader = [("src", [f"p{i}"], ["1"], [None]) for i in range(prompts)]
    slow, fast = TimedEngine(clock, 1.0), TimedEngine(clock, 5.0)
    generator = ours.RocSamplesGenerator(SimpleNamespace(args=args), loader, loader, None, [slow, fast], run_config=run)
    samples, _, consumed, _ = generator.generate_samples(max_len=64, temperature=1.0)
    assert consumed == prompts
    # Every prompt's group came back whole (2G rollouts in one request) and RoC kept G of each.
    assert all(n == 2 * G for _, n in slow.requests + fast.requests)
    kept = [s.prompts[0] for s in samples]
    assert sorted(set(kept)) == sorted(f"p{i}" for i in range(prompts)) and len(kept) == prompts * G
    assert len(fast.requests) > 2 * len(slow.requests)
    loads = generator.engine_loads
    assert all(load.peak_used <= 2 * 4 * 64 and load.over_capacity == 0 for load in loads)
    # Static pinning, 6 prompts each at 2 at a time, ends at 3 s on the slow engine.
    assert clock.now < 3.0
