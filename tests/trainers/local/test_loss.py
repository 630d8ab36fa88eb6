"""The GRPO-RoC loss and selection, checked against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rstar_env.plugins import load_sampler  # noqa: E402
from rstar_env.trajectory import RewardResult, ToolCall, ToolResult, Trajectory, Turn  # noqa: E402
from rstar_trainers.local.loss import clipped_policy_loss, group_advantages, token_logprobs  # noqa: E402
from rstar_trainers.local.trainer import DataCursor, select_groups  # noqa: E402


def test_group_advantages_by_hand():
    # rewards 1, 0, 0, 1: mean 0.5, unbiased std sqrt(1/3)
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], eps=0.0)
    unit = 0.5 / math.sqrt(1 / 3)
    assert adv == pytest.approx([unit, -unit, -unit, unit], rel=1e-12)
    assert group_advantages([1.0, 1.0], eps=1e-6) == [0.0, 0.0]
    assert group_advantages([3.0]) == [0.0]


def test_clipped_loss_by_hand():
    # Two sequences, three positions each; the mask keeps 2 + 1 = 3 action tokens.
    logp = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 0.3, 0.3]]))
    old = torch.log(torch.tensor([[0.25, 0.4, 0.1], [0.4, 0.3, 0.3]]))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -2.0])
    parts = clipped_policy_loss(logp, old, adv, mask, total_tokens=3, clip_low=0.2, clip_high=0.28)
    # seq 0, t0: ratio 2.0, A=1 -> max(-2.0, -1.28) = -1.28 (clipped at 1 + 0.28)
    # seq 0, t1: ratio 1.0 -> -1.0
    # seq 1, t0: ratio 0.5, A=-2 -> max(1.0, 2 * 0.8 = 1.6) = 1.6 (clipped at 1 - 0.2)
    expected = (-1.28 - 1.0 + 1.6) / 3
    assert parts.loss.item() == pytest.approx(expected, rel=1e-6)
    assert parts.clip_fraction == pytest.approx(2 / 3)


def test_masked_tokens_get_no_gradient():
    logits = torch.randn(1, 5, 11, requires_grad=True)
    ids = torch.randint(0, 11, (1, 5))
    logp, entropy = token_logprobs(logits, ids)
    assert not entropy.requires_grad
    mask = torch.tensor([[0, 1, 0, 1]])  # tool output at positions 0 and 2
    parts = clipped_policy_loss(logp, logp.detach(), torch.tensor([1.0]), mask, total_tokens=2)
    parts.loss.backward()
    grad = logits.grad[0]
    assert grad[0].abs().sum() == 0 and grad[2].abs().sum() == 0  # positions predicting masked tokens
    assert grad[1].abs().sum() > 0 and grad[3].abs().sum() > 0
    assert grad[4].abs().sum() == 0  # the last position predicts nothing


def test_kl_and_entropy_terms():
    logp = torch.log(torch.tensor([[0.5]]))
    ref = torch.log(torch.tensor([[0.25]]))
    parts = clipped_policy_loss(
        logp,
        logp,
        torch.tensor([0.0]),
        torch.tensor([[1]]),
        total_tokens=1,
        ref_logp=ref,
        kl_coef=0.1,
        entropy=torch.tensor([[2.0]]),
        entropy_coef=0.01,
    )
    k3 = math.exp(math.log(0.5)) - math.log(0.5) - 1  # exp(ref - logp) - (ref - logp) - 1 with ref - logp = ln .5
    assert parts.kl == pytest.approx(k3)
    assert parts.loss.item() == pytest.approx(0.1 * k3 - 0.01 * 2.0, abs=1e-7)


def test_token_weights_scale_each_clipped_term_and_carry_no_gradient():
    # The by-hand case of test_clipped_loss_by_hand, each kept token weighted (truncated importance sampling).
    logp = torch.log(torch.tensor([[0.5, 0.4, 0.9], [0.2, 0.3, 0.3]])).requires_grad_(True)
    old = torch.log(torch.tensor([[0.25, 0.4, 0.1], [0.4, 0.3, 0.3]]))
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.0, -2.0])
    weights = torch.tensor([[0.5, 2.0, 50.0], [1.5, 7.0, 7.0]], requires_grad=True)  # masked tokens: any weight
    kwargs = {"total_tokens": 3, "clip_low": 0.2, "clip_high": 0.28}
    parts = clipped_policy_loss(logp, old, adv, mask, token_weights=weights, **kwargs)
    # per token as before (-1.28, -1.0, 1.6), times its weight; the clip count is unweighted
    assert parts.loss.item() == pytest.approx((-1.28 * 0.5 - 1.0 * 2.0 + 1.6 * 1.5) / 3, rel=1e-6)
    assert parts.policy == pytest.approx(parts.loss.item())
    assert parts.clip_fraction == pytest.approx(2 / 3)
    parts.loss.backward()
    assert weights.grad is None  # detached: the weights are constants of the step
    # d/dlogp of -A * w * ratio on the one unclipped token (seq 0, t1): -1 * 2.0 * 1.0 / 3
    assert logp.grad[0, 1].item() == pytest.approx(-2.0 / 3, rel=1e-6)
    assert logp.grad[0, 2].item() == 0.0 and logp.grad[1, 1].item() == 0.0  # masked, whatever the weight

    plain = clipped_policy_loss(logp.detach(), old, adv, mask, **kwargs)
    ones = clipped_policy_loss(logp.detach(), old, adv, mask, token_weights=torch.ones(2, 3), **kwargs)
    assert plain.loss.item() == pytest.approx((-1.28 - 1.0 + 1.6) / 3, rel=1e-6)  # None: the unweighted loss
    assert torch.equal(ones.loss, plain.loss)


def traj(reward: float, errors: int, calls: int = 2) -> Trajectory:
    tool_calls = [
        ToolCall("r", "python", {}, ToolResult("x", "exception" if i < errors else None)) for i in range(calls)
    ]
    return Trajectory(
        problem="p",
        answer="1",
        id="p",
        turns=[Turn("c", tool_calls), Turn("<answer>\\boxed{1}</answer>")],
        reward=reward,
        reward_result=RewardResult(reward),
        end_reason="answer",
    )


def test_grpo_and_roc_differ_exactly_where_they_should():
    # 2G = 8 rollouts, G = 4: positives 0..3 with 2, 1, 0, 2 tool errors of 2 calls; negatives 4..7.
    group = [
        traj(1.0, 2),
        traj(1.0, 1),
        traj(1.0, 0),
        traj(1.0, 2),
        traj(0.0, 0),
        traj(0.0, 1),
        traj(0.0, 2),
        traj(0.0, 0),
    ]
    roc = load_sampler("roc")
    grpo = load_sampler("grpo")
    kept_roc, sel_roc = select_groups(roc, [group], 4, np.random.default_rng(0))
    _kept_grpo, sel_grpo = select_groups(grpo, [group], 4, np.random.default_rng(0))
    # RoC: neg_keep = round(4 * 4 / 8) = 2, pos_keep = 2; the two positives with the fewest tool errors.
    positives = [i for i in sel_roc[0] if group[i].reward > 0]
    assert sorted(positives) == [1, 2]
    assert len([i for i in sel_roc[0] if group[i].reward == 0]) == 2
    # GRPO: a uniform subsample that ignores tool errors entirely.
    assert len(sel_grpo[0]) == 4
    # Advantages are normalised over the kept four: two +, two - of equal size.
    assert sorted(round(a, 4) for _, a in kept_roc) == [-0.866, -0.866, 0.866, 0.866]
    # An all-correct group carries no signal: RoC drops it.
    _, sel = select_groups(roc, [[traj(1.0, 0)] * 8], 4, np.random.default_rng(0))
    assert sel == [None]


def test_data_cursor_walks_seeded_epochs():
    cursor = DataCursor()
    first = cursor.take(3, 5, seed=0) + cursor.take(3, 5, seed=0)
    assert sorted(first[:5]) == [0, 1, 2, 3, 4] and cursor.epoch == 1 and cursor.position == 1
    again = DataCursor()
    assert again.take(6, 5, seed=0) == first


def test_a_group_with_a_failed_episode_is_never_trained_on():
    from rstar_trainers.local.trainer import rollout_metrics

    group = [traj(1.0, 0), traj(1.0, 1), traj(0.0, 0), traj(0.0, 1)]
    failed = traj(0.0, 0)
    failed.end_reason, failed.reward_result, failed.error = "policy_error", None, "engine down"
    kept, sel = select_groups(load_sampler("grpo"), [group, [*group[:3], failed]], 2, np.random.default_rng(0))
    assert sel[0] is not None and sel[1] is None
    assert all(not t.failed for t, _ in kept)
    metrics = rollout_metrics([group, [*group[:3], failed]], sel, 2)
    assert metrics["groups_failed"] == 1.0 and metrics["policy_errors"] == 1.0
    assert metrics["reward"] == pytest.approx(4 / 7)  # the failure is not a zero reward
