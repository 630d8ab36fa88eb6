"""The rollout engine's log-prob mismatch with the trainer: measured each step when the engine is a separate copy
of the weights (vLLM), taken out of the clipped ratio, and corrected by truncated importance sampling (``tis_cap``).

The engine here is our own transformers loop on a tiny random Llama whose recorded log-probs the test skews by a
known amount per token, standing in for an engine whose numerics differ from the trainer's."""

from __future__ import annotations

import copy
import json
import math

import pytest

torch = pytest.importorskip("torch")

from rstar_env.config import ConfigError, load_config  # noqa: E402
from rstar_trainers.local.config import trainer_config  # noqa: E402
from rstar_trainers.local.trainer import LocalTrainer, Sample, tis_weights  # noqa: E402

LOWER, HIGHER = 0.3, 0.1
"""The skew: the engine's log-prob is the model's minus LOWER on even generated tokens, plus HIGHER on odd ones, so
``trainer - sampler`` is +0.3 (weight e^0.3 = 1.35) or -0.1 (weight e^-0.1 = 0.905)."""


def run_config(tmp_path, **trainer):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(
            json.dumps({"problem": f"What is {n} + 1?", "answer": str(n + 1), "id": str(n)}) + "\n" for n in range(2)
        )
    )
    return load_config(
        {
            "env": {"max_turns": 1, "system_prompt": "Answer with just the number."},
            "tools": [],
            "reward": {"name": "math", "options": {"last_number": True}},
            "sampler": "grpo",
            "dataset": str(data),
            "trainer": {
                "output_dir": str(tmp_path / "run"),
                "steps": 1,
                "prompts_per_step": 2,
                "group_size": 3,
                "oversample": 1,
                "lr": 1e-3,
                "max_new_tokens": 6,
                "max_response_tokens": 8,
                "seed": 0,
                "tensorboard": False,
                "save_model": False,
                "save_trajectories": False,
                **trainer,
            },
        }
    )


class Skewed:
    """One trainer step whose kept samples carry the skewed log-probs and advantages set here (a random model
    scores 0 everywhere, which would make every advantage 0); counts the teacher-forced passes."""

    def __init__(self, tmp_path, tiny_llama, *, separate: bool, **trainer) -> None:
        model, tokenizer = tiny_llama
        run = run_config(tmp_path, **trainer)
        self.trainer = LocalTrainer(run, trainer_config(run), model_and_tokenizer=(copy.deepcopy(model), tokenizer))
        self.trainer.separate_rollout_engine = separate  # as _rollout_engine sets it for a vLLM engine
        self.samples: list[Sample] = []
        self.forward_passes = 0
        select, per_sample = self.trainer.select, self.trainer._per_sample_logprobs

        def skewed_select(groups):
            samples, selection = select(groups)
            for n, sample in enumerate(samples):
                sample.advantage = 1.0 if n % 2 == 0 else -0.5  # unequal, so no loss below sums to 0 by symmetry
                generated = [i for i, m in enumerate(sample.action_mask) if m]
                for k, i in enumerate(generated):
                    sample.logprobs[i] += -LOWER if k % 2 == 0 else HIGHER
            self.samples = samples
            return samples, selection

        def counted(model, samples):
            self.forward_passes += 1
            return per_sample(model, samples)

        self.trainer.select = skewed_select
        self.trainer._per_sample_logprobs = counted

    def step(self) -> dict:
        try:
            return self.trainer.train_step()
        finally:
            self.trainer.close()

    def token_counts(self) -> tuple[int, int]:
        """(even, odd) generated tokens of the kept samples, as the loss sees them (next-token positions)."""
        even = odd = 0
        for sample in self.samples:
            generated = [i for i, m in enumerate(sample.action_mask) if m and i > 0]
            even += len(generated[::2])
            odd += len(generated[1::2])
        return even, odd


@pytest.fixture
def tiny(tiny_llama):
    return tiny_llama


@pytest.mark.parametrize("updates", [1, 2])
def test_a_separate_engine_logs_the_gap_and_the_ratio_starts_at_one(tmp_path, tiny, updates):
    skewed = Skewed(tmp_path, tiny, separate=True, updates_per_step=updates)
    metrics = skewed.step()
    even, odd = skewed.token_counts()
    assert even > 0 and odd > 0 and metrics["train/samples"] == 6
    # One update per step: its own forward pass is the old policy's (no update has happened yet); with two, the
    # second mini-batch comes after an update, so a teacher-forced pass of the old weights runs first.
    assert skewed.forward_passes == (0 if updates == 1 else 1)
    assert metrics["logprob_gap/tokens"] == even + odd
    assert metrics["logprob_gap/mean_abs"] == pytest.approx((LOWER * even + HIGHER * odd) / (even + odd), abs=1e-3)
    assert metrics["logprob_gap/max_abs"] == pytest.approx(LOWER, abs=1e-3)
    assert metrics["logprob_gap/outside_clip"] == pytest.approx(even / (even + odd))  # 0.3 > log(1.28); 0.1 is not
    # The old policy is the trainer's own pass, not the engine's skewed log-probs: nothing is clipped, and the
    # policy loss of ratio 1 is minus the token-averaged advantage.
    assert metrics["clip_fraction"] == 0.0
    tokens = [sum(s.action_mask[1:]) for s in skewed.samples]
    expected = -sum(s.advantage * n for s, n in zip(skewed.samples, tokens, strict=True)) / sum(tokens)
    if updates == 1:
        assert metrics["loss"] == pytest.approx(expected, abs=1e-5)
    assert not any(key.startswith("tis/") for key in metrics)


def test_the_update_pass_as_old_policy_gives_the_weights_of_a_separate_teacher_forced_pass(tmp_path, tiny):
    """The single-pass shortcut changes no weight: the same step with the old policy taken from a teacher-forced
    pass beforehand (our own engine's path, its log-probs replaced by that pass's) ends at the same weights."""
    shortcut = Skewed(tmp_path / "a", tiny, separate=True)
    shortcut.step()
    reference = Skewed(tmp_path / "b", tiny, separate=False)
    select = reference.trainer.select

    def exact_old(groups):
        samples, selection = select(groups)
        with torch.no_grad():
            forced = reference.trainer._per_sample_logprobs(reference.trainer.model, samples)
        for sample, row in zip(samples, forced, strict=True):
            sample.logprobs = [0.0, *row.tolist()]
        return samples, selection

    reference.trainer.select = exact_old
    reference.step()
    assert [s.input_ids for s in shortcut.samples] == [s.input_ids for s in reference.samples]
    changed = 0
    for (name, a), b in zip(
        shortcut.trainer.model.named_parameters(), reference.trainer.model.parameters(), strict=True
    ):
        assert torch.allclose(a, b, atol=1e-6), name
        changed += int(not torch.equal(a, tiny[0].get_parameter(name)))
    assert changed > 0  # the step did update the weights


def test_our_own_engine_takes_the_sampler_logprobs_with_no_extra_pass(tmp_path, tiny):
    skewed = Skewed(tmp_path, tiny, separate=False)
    metrics = skewed.step()
    assert skewed.forward_passes == 0
    assert not any(key.startswith(("logprob_gap/", "tis/")) for key in metrics)
    # the skewed log-probs were the old policy: ratio e^0.3 = 1.35 > 1.28 on even tokens of positive advantage
    assert metrics["clip_fraction"] > 0.0


@pytest.mark.parametrize("separate", [True, False], ids=["vllm-like", "transformers"])
def test_tis_cap_weights_each_token_and_logs_the_weights(tmp_path, tiny, separate):
    cap = 1.2  # e^0.3 = 1.35 is capped, e^-0.1 = 0.905 is not
    skewed = Skewed(tmp_path, tiny, separate=separate, tis_cap=cap)
    metrics = skewed.step()
    even, odd = skewed.token_counts()
    assert skewed.forward_passes == 0  # the trainer's old log-probs, also on our own engine: the update's own pass
    assert metrics["tis/capped_share"] == pytest.approx(even / (even + odd))
    weight_mean = (cap * even + math.exp(-HIGHER) * odd) / (even + odd)
    assert metrics["tis/weight_mean"] == pytest.approx(weight_mean, abs=1e-3)
    assert "logprob_gap/mean_abs" in metrics
    # Ratio 1 everywhere (old = the trainer's pass): the loss is -sum(A * w) / tokens with the capped weights.
    weighted = total = 0.0
    for sample in skewed.samples:
        generated = [i for i, m in enumerate(sample.action_mask) if m and i > 0]
        weighted += sample.advantage * (cap * len(generated[::2]) + math.exp(-HIGHER) * len(generated[1::2]))
        total += len(generated)
    assert metrics["loss"] == pytest.approx(-weighted / total, abs=1e-3)
    assert metrics["clip_fraction"] == 0.0


def test_tis_weights_by_hand():
    # positions 1..3 generated; position 4 is tool output with a huge gap that must not count
    sample = Sample([5, 6, 7, 8, 9], [0, 1, 1, 1, 0], 1.0, [0.0, -1.0, -2.0, -3.0, -4.0])
    forced = torch.tensor([-0.5, -2.2, -1.5, 4.0])  # next-token positions: ids[1:]
    weights, stats = tis_weights([forced], [sample], cap=2.0)
    expected = torch.tensor([math.exp(0.5), math.exp(-0.2), 2.0, 1.0])  # e^1.5 = 4.48 capped at 2; masked: 1
    assert torch.allclose(weights[0], expected, atol=1e-6)
    assert stats["tis/capped_share"] == pytest.approx(1 / 3)
    assert stats["tis/weight_mean"] == pytest.approx((math.exp(0.5) + math.exp(-0.2) + 2.0) / 3, rel=1e-6)


def test_tis_cap_is_validated(tmp_path):
    for bad in (0, -1.5):
        with pytest.raises(ConfigError, match=r"trainer\.tis_cap: .*must be above 0"):
            trainer_config(run_config(tmp_path, tis_cap=bad))
    with pytest.raises(ConfigError, match="tis_cap needs temperature 1 and top_p 1"):
        trainer_config(run_config(tmp_path, tis_cap=2.0, temperature=0.7))
    assert trainer_config(run_config(tmp_path, tis_cap=2.0)).tis_cap == 2.0
    assert trainer_config(run_config(tmp_path)).tis_cap is None
