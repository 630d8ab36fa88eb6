"""``grpo`` and ``reject_equal``: keep whole groups, cut oversampled ones uniformly, drop what cannot serve."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar_env.plugins import list_plugins, load_sampler
from rstar_env.sampler import Sampler
from rstar_plugins.samplers import GRPOSampler, RejectEqualSampler, RoCSampler


@dataclass(frozen=True)
class T:
    reward: float
    num_tool_calls: int = 0
    num_tool_errors: int = 0
    num_answer_blocks: int = 1
    num_assistant_turns: int = 1


def test_all_three_are_registered() -> None:
    names = {info.name: info.cls for info in list_plugins("sampler")}
    assert names["grpo"] is GRPOSampler
    assert names["reject_equal"] is RejectEqualSampler
    assert names["roc"] is RoCSampler
    for name in ("grpo", "reject_equal", "roc"):
        assert isinstance(load_sampler(name), Sampler)


def test_grpo_keeps_a_full_group() -> None:
    group = [T(1), T(1), T(1), T(1)]  # equal rewards are kept by plain GRPO
    assert GRPOSampler().select(group, 4, np.random.default_rng(0)) == [0, 1, 2, 3]


def test_grpo_drops_a_short_group() -> None:
    assert GRPOSampler().select([T(1), T(0)], 4, np.random.default_rng(0)) is None


def test_grpo_cuts_an_oversampled_group_uniformly() -> None:
    group = [T(float(i % 2)) for i in range(8)]
    for seed in range(10):
        expected = sorted(int(i) for i in np.random.default_rng(seed).choice(8, size=4, replace=False))
        assert GRPOSampler().select(group, 4, np.random.default_rng(seed)) == expected
    assert GRPOSampler(subsample="first").select(group, 4, np.random.default_rng(0)) == [0, 1, 2, 3]
    generator = np.random.default_rng(1)
    counts = np.zeros(8)
    for _ in range(4000):
        counts[GRPOSampler().select(group, 2, generator)] += 1
    assert np.all(np.abs(counts / 4000 - 0.25) < 0.03)


def test_reject_equal() -> None:
    sampler = RejectEqualSampler()
    assert sampler.select([T(1)] * 4, 4, np.random.default_rng(0)) is None
    assert sampler.select([T(0)] * 4, 4, np.random.default_rng(0)) is None
    assert sampler.select([T(1), T(0), T(0), T(0)], 4, np.random.default_rng(0)) == [0, 1, 2, 3]
    assert sampler.select([T(1), T(0)], 4, np.random.default_rng(0)) is None
    assert RejectEqualSampler(subsample="first").select([T(1), T(0), T(1)], 2, None) == [0, 1]


def test_option_and_argument_errors() -> None:
    with pytest.raises(ValueError, match="subsample"):
        GRPOSampler(subsample="last")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep"):
        GRPOSampler().select([T(1)], 0, np.random.default_rng(0))
    with pytest.raises(TypeError, match="Generator"):
        GRPOSampler().select([T(1), T(0)], 1, "seed")


@settings(max_examples=200, deadline=None)
@given(
    rewards=st.lists(st.sampled_from([0.0, 1.0]), min_size=0, max_size=24),
    keep=st.integers(1, 26),
    seed=st.integers(0, 2**31),
)
def test_properties(rewards: list[float], keep: int, seed: int) -> None:
    group = [T(r) for r in rewards]
    for sampler in (GRPOSampler(), RejectEqualSampler()):
        selection = sampler.select(group, keep, np.random.default_rng(seed))
        dropped = len(group) < keep or (isinstance(sampler, RejectEqualSampler) and len(set(rewards)) <= 1)
        if dropped:
            assert selection is None
        else:
            assert selection is not None and len(selection) == keep and selection == sorted(set(selection))
            assert sampler.select(group, keep, np.random.default_rng(seed)) == selection
