"""The ``format`` reward: the documented scale, the penalty form, registration."""

from __future__ import annotations

import asyncio

import pytest

from rstar_env.plugins import load_reward
from rstar_env.reward import Reward, score_many
from rstar_plugins.rewards import FormatReward
from rstar_plugins.rewards.format_reward import FORMAT_SCORES, format_verdict


@pytest.mark.parametrize(
    ("response", "reason", "score"),
    [
        ("Done.\n<answer>The answer is $\\boxed{42}$.</answer>", "ok", 1.0),
        ("<answer>\\boxed{1}</answer> wait <answer>\\boxed{2}</answer>", "multiple_blocks", 0.5),
        ("<answer>42</answer>", "no_boxed", 0.25),
        ("<answer>\\boxed{}</answer>", "no_boxed", 0.25),
        ("<answer>\\boxed{3}</answer><answer>3</answer>", "no_boxed", 0.25),
        ("So the answer is $\\boxed{42}$.", "no_block", 0.25),
        ("<answer>\\boxed{42}", "no_block", 0.25),  # unclosed block
        ("I am not sure.", "no_answer", 0.0),
        ("", "no_answer", 0.0),
    ],
)
def test_scale(response: str, reason: str, score: float) -> None:
    assert format_verdict(response) == reason
    result = asyncio.run(FormatReward().score(response, "ignored"))
    assert (result.reward, result.reason) == (score, reason)
    penalised = asyncio.run(FormatReward(penalty=True).score(response, "ignored"))
    assert penalised.reward == score - 1.0


def test_scale_is_monotone_and_bounded() -> None:
    assert FORMAT_SCORES["ok"] == 1.0 and FORMAT_SCORES["no_answer"] == 0.0
    assert all(0.0 <= v <= 1.0 for v in FORMAT_SCORES.values())


def test_extracted_answer_is_reported() -> None:
    result = FormatReward().score_sync("<answer>so \\boxed{\\frac{1}{2}}</answer>")
    assert result.extracted == "\\frac{1}{2}"


def test_registered_and_batch() -> None:
    reward = load_reward("format", penalty=False)
    assert isinstance(reward, FormatReward) and isinstance(reward, Reward) and reward.name == "format"
    pairs = [("<answer>\\boxed{1}</answer>", "1"), ("nothing", "1")]
    assert [r.reward for r in asyncio.run(score_many(reward, pairs))] == [1.0, 0.0]
