"""GRPO-RoC (``roc``): hand-computed examples and hypothesis properties of DESIGN.md's algorithm."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar_env.plugins import load_sampler
from rstar_env.sampler import Sampler, TrajectorySummary
from rstar_env.trajectory import ToolCall, ToolResult, Trajectory, Turn
from rstar_plugins.samplers import RoCSampler, error_penalty, format_penalty, penalty, roc_counts


@dataclass(frozen=True)
class T:
    """The five summary attributes, nothing else: samplers must work with any such object."""

    reward: float
    num_tool_calls: int = 1
    num_tool_errors: int = 0
    num_answer_blocks: int = 1
    num_assistant_turns: int = 2


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- penalties ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("traj", "p_err", "p_format"),
    [
        (T(1, num_tool_calls=4, num_tool_errors=1), 0.25, 0.0),
        (T(1, num_tool_calls=0, num_tool_errors=0), 0.5, 0.0),  # no tool call at all
        (T(1, num_tool_calls=2, num_tool_errors=2), 1.0, 0.0),
        (T(1, num_answer_blocks=0), 0.0, 1.0),  # no <answer> block
        (T(1, num_answer_blocks=2, num_assistant_turns=4), 0.0, 0.25),
        (T(1, num_answer_blocks=5, num_assistant_turns=2), 0.0, 1.0),  # capped at 1
    ],
)
def test_penalty_terms(traj: T, p_err: float, p_format: float) -> None:
    assert error_penalty(traj) == p_err
    assert format_penalty(traj) == p_format
    assert penalty(traj) == p_err + p_format
    assert penalty(traj, error_ratio=False) == p_format
    assert penalty(traj, answer_format=False) == p_err
    assert penalty(traj, error_ratio=False, answer_format=False) == 0.0


def test_tool_errors_come_from_structured_results_not_text() -> None:
    def call(text: str, error: str | None) -> ToolCall:
        return ToolCall(raw="{}", name="python", arguments={"code": "x"}, result=ToolResult(text, error))  # type: ignore[arg-type]

    traj = Trajectory(
        problem="p",
        answer="1",
        reward=1.0,
        turns=[
            Turn(
                action="<tool_call>..</tool_call>",
                tool_calls=[call("Error: all good, just printing", None), call("", "timeout")],
            ),
            Turn(action="<answer>\\boxed{1}</answer>"),
        ],
    )
    assert isinstance(traj, TrajectorySummary)
    assert (traj.num_tool_calls, traj.num_tool_errors, traj.num_answer_blocks) == (2, 1, 1)
    assert error_penalty(traj) == 0.5 and format_penalty(traj) == 0.0


# -- counts ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("num_pos", "num_neg", "keep", "expected"),
    [
        (5, 11, 8, (2, 6)),  # neg: round(5.5) = 6 (half to even)
        (3, 13, 8, (2, 6)),  # round(6.5) = 6 (half to even, not 7)
        (9, 7, 8, (4, 4)),  # round(3.5) = 4
        (15, 1, 8, (7, 1)),  # round(0.5) = 0, raised to min(2, 1) = 1
        (1, 15, 8, (1, 7)),  # round(7.5) = 8, positives raised to min(2, 1) = 1
        (6, 2, 4, (2, 2)),  # round(1.0) = 1, raised to 2
        (14, 2, 8, (6, 2)),  # round(1.0) = 1, raised to 2
        (16, 0, 8, (8, 0)),  # no negatives
        (2, 2, 2, (2, 0)),  # keep < min_pos + min_neg: positives' minimum applied last wins
        (3, 3, 1, (1, 0)),  # keep=1: capped at keep
        (8, 8, 16, (8, 8)),  # keep == n
        (10, 22, 16, (5, 11)),  # paper setting 2G=32 -> G=16
    ],
)
def test_counts_hand_computed(num_pos: int, num_neg: int, keep: int, expected: tuple[int, int]) -> None:
    assert roc_counts(num_pos, num_neg, keep) == expected


def test_counts_with_other_minimums() -> None:
    assert roc_counts(15, 1, 8, min_positive=0, min_negative=0) == (8, 0)
    assert roc_counts(12, 4, 8, min_negative=3) == (5, 3)
    assert roc_counts(1, 15, 8, min_positive=0) == (0, 8)


def test_counts_always_fit_the_group() -> None:
    # Exhaustive for every group up to 40 rollouts: exactly `keep`, never more from a side than it has.
    for mins in ((2, 2), (0, 0), (3, 1), (1, 4)):
        for n in range(1, 41):
            for keep in range(1, n + 1):
                for num_neg in range(n + 1):
                    num_pos = n - num_neg
                    pk, nk = roc_counts(num_pos, num_neg, keep, min_positive=mins[0], min_negative=mins[1])
                    assert pk + nk == keep
                    assert 0 <= pk <= num_pos and 0 <= nk <= num_neg, (num_pos, num_neg, keep, mins)


def test_counts_reject_impossible_keep() -> None:
    with pytest.raises(ValueError, match="keep"):
        roc_counts(2, 2, 5)


# -- hand-computed selections ---------------------------------------------------------------------------------------
def test_topk_example() -> None:
    group = [
        T(1, num_tool_calls=2, num_tool_errors=1, num_answer_blocks=1, num_assistant_turns=3),  # 0.5
        T(1, num_tool_calls=0, num_tool_errors=0, num_answer_blocks=1, num_assistant_turns=1),  # 0.5
        T(1, num_tool_calls=4, num_tool_errors=0, num_answer_blocks=1, num_assistant_turns=4),  # 0.0
        T(1, num_tool_calls=2, num_tool_errors=0, num_answer_blocks=2, num_assistant_turns=2),  # 0.5
        T(1, num_tool_calls=3, num_tool_errors=0, num_answer_blocks=0, num_assistant_turns=3),  # 1.0
        T(1, num_tool_calls=1, num_tool_errors=0, num_answer_blocks=1, num_assistant_turns=2),  # 0.0
        T(0),
        T(0),
    ]
    # 6 positives, 2 negatives, keep 4: neg_keep = round(1.0) = 1 -> raised to 2; pos_keep = 2.
    assert RoCSampler().select(group, 4, rng()) == [2, 5, 6, 7]
    # Ties in rollout order: with min_negative=1, 3 positives are kept and the first 0.5 (index 0) joins.
    [negative] = rng().choice([6, 7], size=1, replace=False)
    assert RoCSampler(min_negative=1).select(group, 4, rng()) == [0, 2, 5, int(negative)]
    # Only the error term: index 1 (no tool: 0.5) ties with 0 and 3; the format fault of 4 no longer counts.
    sel = RoCSampler(roc_answer_format=False, min_negative=1).select(group, 4, rng())
    assert sel is not None and [i for i in sel if i < 6] == [2, 3, 4]


def test_negatives_are_exactly_the_seeded_draw() -> None:
    group = [T(1)] * 5 + [T(0)] * 11
    pos_keep, neg_keep = roc_counts(5, 11, 8)
    for seed in range(20):
        expected_neg = np.random.default_rng(seed).choice(list(range(5, 16)), size=neg_keep, replace=False)
        selection = RoCSampler().select(group, 8, rng(seed))
        assert selection is not None
        assert [i for i in selection if i >= 5] == sorted(int(i) for i in expected_neg)
        assert [i for i in selection if i < 5] == [0, 1][:pos_keep]


def test_weighted_is_the_seeded_weighted_draw() -> None:
    group = [T(1, num_tool_calls=4, num_tool_errors=e) for e in (0, 1, 2, 3, 4)] + [T(0)] * 5
    sampler = RoCSampler(mode="weighted", eps=0.1)
    pos_keep, neg_keep = roc_counts(5, 5, 5)
    for seed in range(10):
        g = np.random.default_rng(seed)
        negs = g.choice(list(range(5, 10)), size=neg_keep, replace=False)
        w = 1.0 / (np.array([0.0, 0.25, 0.5, 0.75, 1.0]) + 0.1)
        poss = g.choice(list(range(5)), size=pos_keep, replace=False, p=w / w.sum())
        assert sampler.select(group, 5, rng(seed)) == sorted(int(i) for i in [*negs, *poss])


def test_weighted_frequencies_follow_inverse_penalty() -> None:
    # 2 positives (penalty 0 and 1), 2 negatives, keep 2 -> one positive drawn with p proportional to 1/(pen+eps).
    group = [T(1, num_tool_calls=1, num_tool_errors=0), T(1, num_tool_calls=1, num_tool_errors=1), T(0), T(0)]
    sampler = RoCSampler(mode="weighted", eps=1.0, min_positive=1, min_negative=1)
    generator = rng(123)
    trials = 4000
    first = sum(0 in (sampler.select(group, 2, generator) or []) for _ in range(trials))
    assert abs(first / trials - 2 / 3) < 0.03  # weights 1/1 and 1/2


def test_negative_draw_is_uniform() -> None:
    group = [T(1)] * 6 + [T(0)] * 10
    generator = rng(7)
    counts = np.zeros(16)
    trials = 4000
    for _ in range(trials):
        sel = RoCSampler().select(group, 8, generator)
        assert sel is not None
        counts[sel] += 1
    neg_keep = roc_counts(6, 10, 8)[1]
    freq = counts[6:] / trials
    assert np.all(np.abs(freq - neg_keep / 10) < 0.04)


def test_drops() -> None:
    sampler = RoCSampler()
    assert sampler.select([T(1)] * 8, 4, rng()) is None  # all correct
    assert sampler.select([T(0)] * 8, 4, rng()) is None  # all wrong
    assert sampler.select([T(0.5)] * 8, 4, rng()) is None  # equal, even if positive
    assert sampler.select([T(1), T(0), T(1)], 4, rng()) is None  # fewer than keep
    assert sampler.select([], 4, rng()) is None


def test_positive_rewards_of_different_size() -> None:
    group = [T(1.0), T(0.5), T(0.25), T(1.0)]  # all positive, not equal: no negatives to keep
    assert RoCSampler().select(group, 2, rng()) == [0, 1]


def test_registered_options_and_errors() -> None:
    sampler = load_sampler("roc", mode="weighted", min_positive=1, min_negative=3, eps=0.5)
    assert isinstance(sampler, RoCSampler) and isinstance(sampler, Sampler)
    assert (sampler.mode, sampler.min_positive, sampler.min_negative, sampler.eps) == ("weighted", 1, 3, 0.5)
    with pytest.raises(ValueError, match="mode"):
        RoCSampler(mode="best")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="eps"):
        RoCSampler(eps=0)
    with pytest.raises(ValueError, match="keep"):
        RoCSampler().select([T(1), T(0)], 0, rng())


def test_real_trajectories() -> None:
    def traj(reward: float, errors: list[str | None], blocks: int) -> Trajectory:
        calls = [ToolCall("{}", "python", {"code": "1"}, ToolResult("out", e)) for e in errors]  # type: ignore[arg-type]
        final = "<answer>\\boxed{1}</answer>" * blocks
        return Trajectory(
            problem="p", answer="1", reward=reward, turns=[Turn(action="call", tool_calls=calls), Turn(action=final)]
        )

    group = [
        traj(1, [None, "timeout"], 1),
        traj(1, [None], 1),
        traj(1, [], 1),
        traj(1, [None], 0),
        traj(0, [None], 1),
        traj(0, ["crash"], 0),
        traj(0, [], 1),
        traj(0, [None], 1),
    ]
    # 4 pos / 4 neg, keep 4: 2 + 2; positive penalties 0.5, 0.0, 0.5, 1.0 -> indices 1 and 0.
    selection = RoCSampler().select(group, 4, rng(3))
    assert selection is not None and [i for i in selection if i < 4] == [0, 1]


# -- properties -----------------------------------------------------------------------------------------------------
summaries = st.builds(
    lambda reward, calls, err_frac, blocks, turns: T(reward, calls, int(calls * err_frac), blocks, turns),
    reward=st.sampled_from([0.0, 1.0, 1.0, 0.0, 0.5, -1.0]),
    calls=st.integers(0, 6),
    err_frac=st.sampled_from([0.0, 0.0, 0.34, 0.5, 1.0]),
    blocks=st.integers(0, 3),
    turns=st.integers(1, 6),
)


@st.composite
def groups_and_keep(draw: st.DrawFn) -> tuple[list[T], int]:
    group = draw(st.lists(summaries, min_size=1, max_size=40))
    keep = draw(st.integers(1, len(group) + 2))
    return group, keep


@settings(max_examples=300, deadline=None)
@given(
    data=groups_and_keep(),
    seed=st.integers(0, 2**32 - 1),
    mode=st.sampled_from(["topk", "weighted"]),
    mins=st.sampled_from([(2, 2), (0, 0), (1, 3), (3, 1)]),
)
def test_properties(data: tuple[list[T], int], seed: int, mode: str, mins: tuple[int, int]) -> None:
    group, keep = data
    sampler = RoCSampler(mode=mode, min_positive=mins[0], min_negative=mins[1])  # type: ignore[arg-type]
    selection = sampler.select(group, keep, rng(seed))
    rewards = [t.reward for t in group]
    if len(group) < keep or len(set(rewards)) == 1:
        assert selection is None
        return
    assert selection is not None
    # Exactly `keep` distinct valid indices, in rollout order.
    assert len(selection) == keep and selection == sorted(set(selection))
    assert all(0 <= i < len(group) for i in selection)
    # Counts follow the formula.
    positives = [i for i, r in enumerate(rewards) if r > 0]
    negatives = [i for i, r in enumerate(rewards) if r <= 0]
    pos_keep, neg_keep = roc_counts(len(positives), len(negatives), keep, min_positive=mins[0], min_negative=mins[1])
    kept_pos = [i for i in selection if i in positives]
    assert len(kept_pos) == pos_keep and len(selection) - len(kept_pos) == neg_keep
    # Negatives are exactly rng.choice on the negatives with the same seed (drawn first).
    g = rng(seed)
    expected_neg = sorted(int(i) for i in g.choice(negatives, size=neg_keep, replace=False)) if neg_keep else []
    assert [i for i in selection if i in negatives] == expected_neg
    if mode == "topk":
        pens = {i: sampler.penalty(group[i]) for i in positives}
        dropped = [i for i in positives if i not in kept_pos]
        for k in kept_pos:
            for d in dropped:
                assert pens[d] >= pens[k], "a dropped positive has a strictly lower penalty than a kept one"
                if pens[d] == pens[k]:
                    assert k < d, "ties must be broken in rollout order"
    # Deterministic for a seed.
    assert sampler.select(group, keep, rng(seed)) == selection


@settings(max_examples=150, deadline=None)
@given(data=groups_and_keep(), seed=st.integers(0, 2**32 - 1))
def test_only_summary_attributes_are_read(data: tuple[list[T], int], seed: int) -> None:
    # Trajectories built from the same summaries select the same indices as the bare dataclass.
    group, keep = data

    def as_traj(t: T) -> Trajectory:
        calls = [
            ToolCall("{}", "python", {}, ToolResult("", "exception" if i < t.num_tool_errors else None))
            for i in range(t.num_tool_calls)
        ]
        turns = [Turn(action="think", tool_calls=calls if j == 0 else []) for j in range(t.num_assistant_turns)]
        turns[-1] = Turn(action="<answer>\\boxed{1}</answer>" * t.num_answer_blocks, tool_calls=turns[-1].tool_calls)
        return Trajectory(problem="p", answer="1", reward=t.reward, turns=turns)

    trajs = [as_traj(t) for t in group]
    for t, tr in zip(group, trajs, strict=True):
        assert (tr.num_tool_calls, tr.num_tool_errors, tr.num_answer_blocks, tr.num_assistant_turns) == (
            t.num_tool_calls,
            t.num_tool_errors,
            t.num_answer_blocks,
            t.num_assistant_turns,
        )
    sampler = RoCSampler()
    assert sampler.select(trajs, keep, rng(seed)) == sampler.select(group, keep, rng(seed))


# -- the reference implementation's turn counting and the no-call penalty ----------------------------------------
@pytest.mark.parametrize(
    ("traj", "all_turns", "after_first"),
    [
        (T(1, num_answer_blocks=1, num_assistant_turns=1), 0.0, 1.0),  # one turn: the reference counts none
        (T(1, num_answer_blocks=2, num_assistant_turns=1), 1.0, 1.0),
        (T(1, num_answer_blocks=1, num_assistant_turns=3), 0.0, 0.0),
        (T(1, num_answer_blocks=2, num_assistant_turns=3), 1 / 3, 0.5),  # (2 - 1) / 3 here, (2 - 1) / 2 there
        (T(1, num_answer_blocks=3, num_assistant_turns=5), 0.4, 0.5),
        (T(1, num_answer_blocks=0, num_assistant_turns=4), 1.0, 1.0),  # no block: 1 either way
    ],
)
def test_turn_count_options(traj: T, all_turns: float, after_first: float) -> None:
    assert format_penalty(traj) == pytest.approx(all_turns)
    assert format_penalty(traj, turn_count="after_first") == pytest.approx(after_first)
    assert RoCSampler(turn_count="after_first").format_penalty(traj) == pytest.approx(after_first)


def test_no_call_penalty_option() -> None:
    no_call = T(1, num_tool_calls=0, num_tool_errors=0)
    assert error_penalty(no_call) == 0.5
    assert error_penalty(no_call, no_call_penalty=1.0) == 1.0
    assert error_penalty(T(1, num_tool_calls=4, num_tool_errors=1), no_call_penalty=1.0) == 0.25  # calls: unchanged
    # The example: a correct one-turn rollout with no tool call, 0.5 here and 1.5 in the reference.
    one_turn = T(1, num_tool_calls=0, num_tool_errors=0, num_answer_blocks=1, num_assistant_turns=1)
    assert RoCSampler().penalty(one_turn) == 0.5
    assert RoCSampler(turn_count="after_first").penalty(one_turn) == 1.5


# Five positives (indices 0-4) and three negatives (5-7); keep 4 -> neg_keep = round(1.5) = 2, pos_keep = 2.
#                 p_err  p_format(all)  p_format(after_first)
HAND_GROUP = [
    T(1, num_tool_calls=0, num_tool_errors=0, num_answer_blocks=1, num_assistant_turns=1),  # 0.5  0    1
    T(1, num_tool_calls=2, num_tool_errors=1, num_answer_blocks=1, num_assistant_turns=3),  # 0.5  0    0
    T(1, num_tool_calls=1, num_tool_errors=0, num_answer_blocks=2, num_assistant_turns=2),  # 0    0.5  1
    T(1, num_tool_calls=2, num_tool_errors=0, num_answer_blocks=1, num_assistant_turns=3),  # 0    0    0
    T(1, num_tool_calls=1, num_tool_errors=1, num_answer_blocks=1, num_assistant_turns=2),  # 1    0    0
    T(0),
    T(0),
    T(0),
]


@pytest.mark.parametrize(
    ("options", "penalties", "kept_positives"),
    [
        ({}, [0.5, 0.5, 0.5, 0.0, 1.0], [0, 3]),  # our default keeps the no-tool rollout 0 (tie, rollout order)
        ({"turn_count": "after_first"}, [1.5, 0.5, 1.0, 0.0, 1.0], [1, 3]),  # the reference's count drops it
        ({"no_call_penalty": 1.0}, [1.0, 0.5, 0.5, 0.0, 1.0], [1, 3]),
        ({"turn_count": "after_first", "roc_error_ratio": False}, [1.0, 0.0, 1.0, 0.0, 0.0], [1, 3]),
    ],
)
def test_options_on_a_hand_computed_group(options: dict, penalties: list[float], kept_positives: list[int]) -> None:
    sampler = load_sampler("roc", **options)
    assert [sampler.penalty(t) for t in HAND_GROUP[:5]] == penalties
    for seed in range(5):
        chosen = sampler.select(HAND_GROUP, 4, rng(seed))
        assert chosen is not None and len(chosen) == 4
        assert [i for i in chosen if i < 5] == kept_positives
        assert len([i for i in chosen if i >= 5]) == 2


def test_stats_use_the_samplers_penalty_terms() -> None:
    from rstar_plugins.samplers import group_stats

    reference = RoCSampler(turn_count="after_first", no_call_penalty=1.0)
    selection = reference.select(HAND_GROUP, 4, rng(0))
    ours = group_stats(HAND_GROUP, selection, 4)
    theirs = group_stats(HAND_GROUP, selection, 4, sampler=reference)
    # Positives dropped: 0 (no call, one turn), 2 and 4.
    assert ours["dropped_pos/format_penalty"] == pytest.approx((0 + 0.5 + 0) / 3)
    assert theirs["dropped_pos/format_penalty"] == pytest.approx((1 + 1 + 0) / 3)
    assert ours["dropped_pos/error_penalty"] == pytest.approx((0.5 + 0 + 1) / 3)
    assert theirs["dropped_pos/error_penalty"] == pytest.approx((1 + 0 + 1) / 3)


def test_bad_reference_options_say_what_to_use() -> None:
    with pytest.raises(ValueError, match=r"turn_count: Input should be 'all' or 'after_first' \(got 'first'\)"):
        RoCSampler(turn_count="first")
    with pytest.raises(ValueError, match=r"no_call_penalty: Input should be less than or equal to 1 \(got 2\)"):
        RoCSampler(no_call_penalty=2)
