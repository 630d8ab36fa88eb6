"""Mismatch correction with agent rollouts: the engine's per-token log-probs reach OpenRLHF's ``is_correction`` loss
(tool output excluded), and the local trainer's ``tis_cap`` and OpenRLHF's token-level TIS weight a recorded batch
identically.

The batch is recorded by our ``AgentExecutor`` under OpenRLHF's real ``MultiTurnAgentExecutor`` (a tool call, its
output, then the answer; the engine a local tiny Llama that reports its log-probs, as vLLM does with ``logprobs=1``)
and turned into an ``Experience`` by OpenRLHF's own ``SamplesGenerator`` code. The trainer's log-probs of the old
policy are the model's teacher-forced ones, skewed by +0.3 / -0.1 on alternate generated tokens (an engine whose
numerics differ), so that some weights exceed the cap and some do not.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("openrlhf") is None:  # looked up, not imported: OpenRLHF costs every worker seconds
    pytest.skip("openrlhf is not installed (the openrlhf extra)", allow_module_level=True)
torch = pytest.importorskip("torch")

from rstar_env.config import load_config  # noqa: E402
from rstar_trainers.local.loss import clipped_policy_loss, token_logprobs  # noqa: E402
from rstar_trainers.local.trainer import Sample, tis_weights  # noqa: E402
from rstar_trainers.openrlhf.config import trainer_config  # noqa: E402
from rstar_trainers.openrlhf.launch import rl_flags  # noqa: E402

from .test_agent import ANSWER, TOOL_CALL, experience_of, make_script, run_config, sampling  # noqa: E402

CAP = 1.2  # e^0.3 = 1.35 is capped, e^-0.1 = 0.905 is not
UP, DOWN = 0.3, -0.1
ADVANTAGES = (1.0, -0.5)
CONFIGS = Path(__file__).resolve().parents[3] / "configs"


@pytest.fixture
def recorded(tiny_llama, echo_plugins):
    """One recorded agent episode as OpenRLHF's Experience, and the tiny model's teacher-forced log-probs."""
    from rstar_env_testkit import openrlhf_stubs as testing
    from rstar_trainers.openrlhf import agent_func

    model, tokenizer = tiny_llama
    executor = agent_func.AgentExecutor(run_config=run_config(max_new_tokens_per_turn=200, max_response_tokens=1024))
    engine = testing.CPUEngine(model, tokenizer, script=make_script(tokenizer, {1: TOOL_CALL, 2: ANSWER}))
    result = asyncio.run(
        executor.execute("What is 6 * 7?", "42", sampling(testing, logprobs=1), 4096, tokenizer, engine)
    )
    assert len(result["action_ranges"]) == 2 and result["reward"] == 1.0  # a tool turn, then the right answer
    experience = experience_of(result)
    with torch.no_grad():
        forced, _ = token_logprobs(model(input_ids=experience.sequences).logits, experience.sequences)
    return experience, forced


def openrlhf_policy_loss(monkeypatch, **overrides):
    """OpenRLHF's ``PolicyLoss`` built as its actor builds it, from the flags our launcher emits for a stage config
    with ``overrides`` (parsed and validated by OpenRLHF's own parser)."""
    from rstar_env_testkit.cpu_standins import stand_in_modules
    from rstar_trainers.openrlhf.cli_args import check_args

    for name, module in stand_in_modules().items():  # flash-attn, which OpenRLHF's model package imports
        monkeypatch.setitem(sys.modules, name, module)
    from openrlhf.models.loss import PolicyLoss

    run = load_config(CONFIGS / "stage1_8k.yaml")
    flags = rl_flags(run, trainer_config(run, **overrides), prompt_data="p.jsonl", agent_func_path="agent.py")
    args = check_args("train_ppo_ray", flags)
    return PolicyLoss(
        clip_eps_low=args.actor.eps_clip_low_high[0],
        clip_eps_high=args.actor.eps_clip_low_high[1],
        dual_clip=args.actor.dual_clip,
        token_level_loss=args.actor.loss_agg_mode == "token-mean",
        policy_loss_type=args.actor.policy_loss_type,
        is_correction_level=args.algo.advantage.is_correction_level,
        is_correction_mode=args.algo.advantage.is_correction_mode,
        is_correction_gating=args.algo.advantage.is_correction_gating,
        is_correction_threshold=args.algo.advantage.is_correction_threshold,
    )


def test_tis_cap_gives_the_same_token_weights_on_both_trainers(recorded, monkeypatch):
    experience, forced = recorded
    mask = experience.action_mask.bool()  # [1, T-1], next-token positions, as OpenRLHF aligns it
    rollout = experience.rollout_log_probs.float()
    # The engine's log-probs are on the generated tokens only: 0 on the prompt and the tool output.
    assert (rollout[~mask] == 0).all() and (rollout[mask] < 0).all()
    assert torch.allclose(rollout[mask], forced[mask], atol=1e-4)  # the same model scored them

    # The trainer's old-policy log-probs: skewed on generated tokens; elsewhere the model's own (never weighted).
    generated = mask[0].nonzero()[:, 0]
    skew = torch.zeros_like(forced)
    skew[0, generated[::2]], skew[0, generated[1::2]] = UP, DOWN
    old = (forced + skew).repeat(2, 1)
    batch_mask, batch_rollout = mask.repeat(2, 1), rollout.repeat(2, 1)
    advantages = torch.tensor(ADVANTAGES)
    # The update's log-probs: the old ones moved a little, inside the clip range, so the ratio matters too.
    logp_values = old + 0.05 * torch.sin(torch.arange(old.shape[1], dtype=torch.float32))

    # The local trainer: tis_weights from its Samples (ids, per-token mask and sampler log-probs, 0 elsewhere).
    ids = experience.sequences[0].tolist()
    sample_mask = [0, *experience.action_mask[0].tolist()]
    sample_logprobs = [0.0, *experience.rollout_log_probs[0].tolist()]
    samples = [Sample(ids, sample_mask, a, sample_logprobs) for a in ADVANTAGES]
    weights, stats = tis_weights(list(old), samples, CAP)
    local_weights = torch.stack(weights)
    expected = torch.where(batch_mask, (old - batch_rollout).exp().clamp(max=CAP), torch.ones_like(old))
    assert torch.allclose(local_weights, expected)
    assert stats["tis/capped_share"] == pytest.approx(len(generated[::2]) / len(generated))

    local_logp = logp_values.clone().requires_grad_()
    local = clipped_policy_loss(
        local_logp,
        old,
        advantages,
        batch_mask,
        total_tokens=int(batch_mask.sum()),
        clip_low=0.2,
        clip_high=0.28,
        token_weights=local_weights,
    )
    local.loss.backward()

    # OpenRLHF: the PolicyLoss its actor builds from `tis_cap` (token level, clip mode, threshold [0, cap]).
    policy_loss = openrlhf_policy_loss(monkeypatch, tis_cap=CAP)
    assert policy_loss.is_correction_level == "token" and policy_loss.is_correction_mode == "clip"
    assert list(policy_loss.is_correction_threshold) == [0.0, CAP]
    theirs_logp = logp_values.clone().requires_grad_()
    loss, _, _, vllm_kl, capped = policy_loss(
        theirs_logp,
        old,
        advantages[:, None].expand_as(old),
        action_mask=batch_mask.float(),
        rollout_log_probs=batch_rollout,
    )
    loss.backward()

    assert float(loss.detach()) == pytest.approx(float(local.loss.detach()), rel=1e-6)
    assert torch.allclose(theirs_logp.grad, local_logp.grad, atol=1e-9)
    assert float(capped) == pytest.approx(stats["tis/capped_share"])  # OpenRLHF's is_filter_ratio: capped share
    assert float(vllm_kl) == pytest.approx(-float(skew[mask].mean()), abs=1e-4)
    # The weights themselves, read from the gradient: d loss / d logp = -A * ratio * w / tokens (no token clipped).
    ratio = (logp_values - old).exp()
    read = -theirs_logp.grad * int(batch_mask.sum()) / (advantages[:, None] * ratio)
    assert torch.allclose(read[batch_mask], local_weights[batch_mask], atol=1e-5)
    assert read[batch_mask].max() == pytest.approx(CAP) and read[batch_mask].min() == pytest.approx(math.exp(DOWN))
    assert (theirs_logp.grad[~batch_mask] == 0).all()  # tool output and prompt: no gradient, whatever their weight


@pytest.mark.parametrize(
    ("correction", "flags"),
    [
        ({"tis_cap": 2.0}, ["token", "clip", "ratio", [0.0, 2.0]]),
        ({"is_correction": {"level": "token", "mode": "mask"}}, ["token", "mask", "ratio", [0.5, 5.0]]),
        (
            {"is_correction": {"level": "seq", "gating": "binary_kl", "threshold": [0.01]}},
            ["seq", "mask", "binary_kl", [0.0, 0.01]],
        ),
    ],
    ids=["tis", "icepop", "seq-binary-kl"],
)
def test_correction_configs_become_openrlhf_flags(correction, flags):
    from rstar_trainers.openrlhf.cli_args import check_args

    run = load_config(CONFIGS / "stage1_8k.yaml")
    emitted = rl_flags(run, trainer_config(run, **correction), prompt_data="p.jsonl", agent_func_path="agent.py")
    advantage = check_args("train_ppo_ray", emitted).algo.advantage
    got = [advantage.is_correction_level, advantage.is_correction_mode, advantage.is_correction_gating]
    assert [*got, list(advantage.is_correction_threshold)] == flags


def test_correction_off_by_default_and_bad_settings_are_named():
    from rstar_env.config import ConfigError

    run = load_config(CONFIGS / "stage1_8k.yaml")
    assert not any(
        "is_correction" in f for f in rl_flags(run, trainer_config(run), prompt_data="p", agent_func_path="a")
    )
    with pytest.raises(ConfigError, match="tis_cap and is_correction both set"):
        trainer_config(run, tis_cap=2.0, is_correction={"level": "token"})
    with pytest.raises(ConfigError, match="mode clip needs level token and gating ratio"):
        trainer_config(run, is_correction={"level": "seq", "mode": "clip"})
    with pytest.raises(ConfigError, match="needs top_p 1"):
        trainer_config(run, tis_cap=2.0, top_p=0.9)
    with pytest.raises(ConfigError, match="partial_rollouts needs async_train"):
        trainer_config(run, partial_rollouts=True)
