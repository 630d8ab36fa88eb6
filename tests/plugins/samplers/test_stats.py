"""Sampling statistics: hand-computed figures, drop reasons, JSON-safety."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import numpy as np
import pytest

from rstar_plugins.samplers import RoCSampler, batch_stats, drop_reason, group_stats


@dataclass(frozen=True)
class T:
    reward: float
    num_tool_calls: int = 2
    num_tool_errors: int = 0
    num_answer_blocks: int = 1
    num_assistant_turns: int = 2


def test_drop_reasons() -> None:
    assert drop_reason([T(1), T(0)], None, 4) == "too_small"
    assert drop_reason([T(1)] * 4, None, 4) == "all_correct"
    assert drop_reason([T(0)] * 4, None, 4) == "all_wrong"
    assert drop_reason([T(1), T(0), T(0), T(1)], None, 4) == "other"
    assert drop_reason([T(1), T(0)], [0, 1], 2) is None


def test_hand_computed_batch() -> None:
    kept_group = [
        T(1, num_tool_calls=4, num_tool_errors=0),  # kept positive, penalty 0
        T(1, num_tool_calls=4, num_tool_errors=2),  # dropped positive, p_err 0.5
        T(1, num_tool_calls=2, num_tool_errors=2, num_answer_blocks=0),  # dropped positive, 1 + 1
        T(0, num_tool_calls=0),  # kept negative
    ]
    groups = [kept_group, [T(1)] * 4, [T(0)] * 4, [T(1), T(0)]]
    selections: list[list[int] | None] = [[0, 3], None, None, None]
    stats = batch_stats(groups, selections, keep=2, prefix="roc/")
    assert stats["roc/groups"] == 4.0 and stats["roc/groups_kept"] == 1.0 and stats["roc/groups_dropped"] == 3.0
    assert stats["roc/dropped_all_correct"] == 1.0 and stats["roc/dropped_all_wrong"] == 1.0
    assert stats["roc/dropped_equal_rewards"] == 2.0 and stats["roc/dropped_too_small"] == 0.0
    assert stats["roc/dropped_other"] == 1.0 and stats["roc/drop_frac"] == 0.75
    assert stats["roc/rollouts"] == 14.0 and stats["roc/rollouts_kept"] == 2.0
    assert stats["roc/positives_kept"] == 1.0 and stats["roc/negatives_kept"] == 1.0
    assert stats["roc/kept_pos/tool_error_ratio"] == 0.0
    assert stats["roc/dropped_pos/tool_error_ratio"] == pytest.approx(4 / 6)  # pooled: 4 errors of 6 calls
    assert stats["roc/dropped_pos/format_penalty"] == 0.5
    assert stats["roc/dropped_pos/penalty"] == pytest.approx((0.5 + 2.0) / 2)
    assert stats["roc/kept_neg/no_tool_frac"] == 1.0
    assert "roc/kept_neg/tool_error_ratio" not in stats  # no calls: no ratio rather than NaN
    assert stats["roc/dropped_neg/n"] == 0.0
    assert stats["roc/reward_mean_kept"] == 0.5 and stats["roc/pos_frac_kept"] == 0.5


def test_group_stats_and_json_safety() -> None:
    group = [T(1, num_tool_errors=i % 3) for i in range(6)] + [T(0)] * 10
    selection = RoCSampler().select(group, 8, np.random.default_rng(0))
    stats = group_stats(group, selection, 8)
    assert stats["groups_kept"] == 1.0 and stats["rollouts_kept"] == 8.0
    assert stats["kept_pos/penalty"] <= stats["dropped_pos/penalty"]  # RoC keeps the cleaner positives
    assert all(isinstance(v, float) and math.isfinite(v) for v in stats.values())
    assert json.loads(json.dumps(stats, allow_nan=False)) == stats


def test_empty_batch_and_mismatched_lengths() -> None:
    stats = batch_stats([], [], keep=4)
    assert stats["groups"] == 0.0 and "drop_frac" not in stats
    with pytest.raises(ValueError, match="selections"):
        batch_stats([[T(1)]], [], keep=1)
    with pytest.raises(ValueError, match="outside"):
        batch_stats([[T(1), T(0)]], [[0, 5]], keep=2)
