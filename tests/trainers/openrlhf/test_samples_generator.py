"""The RoC samples generator on fabricated rollouts, through OpenRLHF's real SamplesGenerator code.

vLLM and Ray are replaced by the stand-ins of ``rstar_env_testkit.openrlhf_stubs`` (as OpenRLHF's own tests do);
the engines return fabricated executor results, which OpenRLHF's real ``_process_response_into_experience`` turns
into Experiences.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("openrlhf")
torch = pytest.importorskip("torch")

from rstar_env.config import load_config  # noqa: E402

G = 4  # kept per prompt; rolled out: 2G = 8


def _fresh(name: str) -> bool:
    """Modules imported against the stand-ins, dropped before and after each test."""
    return name.startswith("openrlhf.trainer") or name == "rstar_trainers.openrlhf.samples_generator"


@pytest.fixture
def sg(monkeypatch):
    """Fresh imports of OpenRLHF's samples generator and ours, against the CPU stand-ins; undone afterwards."""
    from rstar_env_testkit.openrlhf_stubs import cpu_stub_modules
    from rstar_trainers.openrlhf import patch

    patch.uninstall()
    for name in [n for n in sys.modules if _fresh(n)]:
        monkeypatch.delitem(sys.modules, name)
    for name, module in cpu_stub_modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    ours = importlib.import_module("rstar_trainers.openrlhf.samples_generator")
    yield ours, importlib.import_module("openrlhf.trainer.ppo_utils.samples_generator")
    patch.uninstall()
    for name in [n for n in sys.modules if _fresh(n)]:
        monkeypatch.delitem(sys.modules, name)


def response(prompt: str, index: int, reward: float, *, calls: int = 1, errors: int = 0, blocks: int = 1):
    """One fabricated result of our AgentExecutor.execute (what the vLLM engine actor returns)."""
    from rstar_env.trajectory import Trajectory

    obs = [1, 2, 3] + [10 + index] * (5 + index)
    trajectory = Trajectory(
        problem=prompt, answer="42", reward=reward, end_reason="answer", metadata={"rollout": index}
    )
    return {
        "rstar_trajectory": trajectory.to_dict(),
        "prompt": prompt,
        "label": "42",
        "images": None,
        "mm_train_inputs": None,
        "reward": reward,
        "scores": reward,
        "observation_tokens": obs,
        "action_ranges": [(3, len(obs))],
        "rollout_log_probs": None,
        "truncated": False,
        "extra_logs": {
            "num_tool_calls": float(calls),
            "num_tool_errors": float(errors),
            "num_answer_blocks": float(blocks),
            "num_assistant_turns": 2.0,
            "rollout": float(index),
        },
    }


# The rollouts each prompt gets: (reward, tool errors) per rollout index.
GROUPS = {
    "all-right": [(1.0, 0)] * 8,  # no signal: dropped
    "mixed": [(1.0, 1), (1.0, 1), (1.0, 0), (1.0, 0), (0.0, 0), (0.0, 1), (0.0, 0), (0.0, 0)],
    "all-wrong": [(0.0, 0)] * 8,  # dropped
    "one-right": [(0.0, 0)] * 7 + [(1.0, 0)],
}


class Engine:
    """A vLLM engine actor stand-in: ``generate_responses.remote`` returns the fabricated group directly."""

    def __init__(self):
        self.requests = []
        self.generate_responses = SimpleNamespace(remote=self._generate)
        self.get_num_unfinished_requests = SimpleNamespace(remote=lambda: 0)

    def _generate(self, *, prompt, label, sampling_params, max_length, hf_tokenizer, num_samples, images=None):
        self.requests.append((prompt, num_samples))
        pattern = GROUPS[prompt] if num_samples == 8 else [(float(i % 2), 0) for i in range(num_samples)]
        return [response(prompt, i, r, calls=1, errors=e) for i, (r, e) in enumerate(pattern[:num_samples])]


def make_generator(sg, tmp_path, *, prompts, refill=False, sampler="roc", oversample=2, ckpt=None):
    ours, _ = sg
    run = load_config(
        {
            "sampler": sampler,
            "trainer": {
                "backend": "openrlhf",
                "group_size": G,
                "oversample": oversample,
                "refill": refill,
                "seed": 0,
                "output_dir": str(tmp_path),
            },
        }
    )
    args = SimpleNamespace(
        ckpt=SimpleNamespace(path=str(tmp_path / "checkpoints"), load_enable=True) if ckpt else None,
        rollout=SimpleNamespace(batch_size=2, n_samples_per_prompt=G, vllm_generate_batch_size=2),
        algo=SimpleNamespace(
            dynamic_filtering_enable=False,
            dynamic_filtering_range=(0, 1),
            advantage=SimpleNamespace(is_correction_level="off"),
        ),
        vllm=SimpleNamespace(enable_sleep=False),
    )
    loader = [("src", [p], ["42"], [None]) for p in prompts]
    engine = Engine()
    generator = ours.RocSamplesGenerator(SimpleNamespace(args=args), loader, loader, None, [engine], run_config=run)
    return generator, engine


def test_roc_rolls_out_2g_and_keeps_g_per_group(sg, tmp_path):
    generator, engine = make_generator(sg, tmp_path, prompts=["all-right", "mixed", "all-wrong", "one-right"])
    samples, _, consumed, exhausted = generator.generate_samples(max_len=64, temperature=1.0)
    assert engine.requests == [("all-right", 8), ("mixed", 8)]  # 2 prompts per step, 2G rollouts each
    assert consumed == 2 and not exhausted
    # "all-right" has no signal and is dropped; "mixed" keeps G = 4.
    assert [s.prompts[0] for s in samples] == ["mixed"] * G
    kept = [int(s.info["rollout"].item()) for s in samples]
    # neg_keep = round(4 * 4 / 8) = 2, pos_keep = 2: the two clean positives (2, 3), two random negatives.
    assert sorted(k for k in kept if k < 4) == [2, 3]
    assert len([k for k in kept if k >= 4]) == 2
    assert generator.last_stats.groups == 2 and generator.last_stats.dropped == 1
    assert all(float(s.info["roc/drop_rate"]) == 0.5 for s in samples)

    # What group_norm sees: rewards reshaped to (-1, n_samples_per_prompt = G), one prompt per row.
    rewards = torch.cat([s.rewards for s in samples]).reshape(-1, G)
    assert rewards.shape == (1, G) and rewards.sum().item() == 2

    samples, _, consumed, exhausted = generator.generate_samples(max_len=64, temperature=1.0)
    assert [s.prompts[0] for s in samples] == ["one-right"] * G
    # A group with one positive keeps it (min_positive caps at what exists) and 3 negatives.
    assert sorted(float(s.rewards) for s in samples) == [0.0, 0.0, 0.0, 1.0]
    samples, _, consumed, exhausted = generator.generate_samples(max_len=64, temperature=1.0)
    assert samples == [] and consumed == 0 and exhausted


def test_refill_rolls_out_more_prompts_for_dropped_groups(sg, tmp_path):
    generator, engine = make_generator(
        sg, tmp_path, prompts=["all-right", "mixed", "all-wrong", "one-right"], refill=True
    )
    samples, _, consumed, _ = generator.generate_samples(max_len=64)
    assert [p for p, _ in engine.requests] == ["all-right", "mixed", "all-wrong", "one-right"]
    assert consumed == 4 and len(samples) == 2 * G
    assert {s.prompts[0] for s in samples} == {"mixed", "one-right"}


def test_selection_is_deterministic_for_a_seed(sg, tmp_path):
    picks = []
    for _ in range(2):
        generator, _ = make_generator(sg, tmp_path, prompts=["mixed"])
        samples, *_ = generator.generate_samples(max_len=64)
        picks.append([int(s.info["rollout"].item()) for s in samples])
    assert picks[0] == picks[1]


def test_evaluation_is_not_down_sampled(sg, tmp_path):
    generator, engine = make_generator(sg, tmp_path, prompts=["all-right", "mixed", "all-wrong"])
    samples = generator.generate_eval_samples(max_len=64, n_samples_per_prompt=3, temperature=0.6)
    assert engine.requests == [("all-right", 3), ("mixed", 3), ("all-wrong", 3)]
    assert len(samples) == 9  # every rollout, equal-reward groups included
    assert "roc/drop_rate" not in samples[0].info


def test_select_groups_rejects_mixed_or_partial_groups(sg):
    ours, _ = sg
    from rstar_env.plugins import load_sampler

    def exp(prompt, reward):
        info = {k: torch.tensor([1.0]) for k in ours.SUMMARY_KEYS}
        return SimpleNamespace(prompts=[prompt], rewards=torch.tensor([reward]), info=info)

    sampler, rng = load_sampler("roc"), __import__("numpy").random.default_rng(0)
    with pytest.raises(ValueError, match="whole groups"):
        ours.select_groups([exp("a", 1.0)] * 3, rollouts_per_prompt=2, keep=1, sampler=sampler, rng=rng)
    with pytest.raises(ValueError, match="mix prompts"):
        ours.select_groups([exp("a", 1.0), exp("b", 0.0)], rollouts_per_prompt=2, keep=1, sampler=sampler, rng=rng)
    bare = SimpleNamespace(prompts=["a"], rewards=torch.tensor([1.0]), info={})
    with pytest.raises(ValueError, match="extra_logs"):
        ours.select_groups([bare, bare], rollouts_per_prompt=2, keep=1, sampler=sampler, rng=rng)


def test_a_group_with_an_episode_the_system_failed_is_never_trained_on(sg):
    """Issue 41: an env_error (a sandbox with no room in time, a pool that died) is not the model's doing: its
    group is dropped whole, as the local trainer does, and counted among the dropped groups."""
    ours, _ = sg

    def exp(reward, end):
        info = {k: torch.tensor([1.0]) for k in ours.SUMMARY_KEYS} | {f"end_{end}": torch.tensor([1.0])}
        return SimpleNamespace(prompts=["a"], rewards=torch.tensor([reward]), info=info)

    class KeepAll:
        def select(self, group, keep, rng):
            return list(range(keep))

    group_ok, group_failed = [exp(1.0, "answer"), exp(0.0, "answer")], [exp(1.0, "answer"), exp(0.0, "env_error")]
    kept, stats = ours.select_groups(
        group_ok + group_failed, rollouts_per_prompt=2, keep=2, sampler=KeepAll(), rng=np.random.default_rng(0)
    )
    assert kept == group_ok and (stats.groups, stats.kept, stats.dropped) == (2, 1, 1)


def test_group_size_must_match_n_samples_per_prompt(sg, tmp_path):
    ours, _ = sg
    run = load_config({"trainer": {"backend": "openrlhf", "group_size": 8}})
    args = SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=4))
    with pytest.raises(ValueError, match=r"n_samples_per_prompt is 4 but trainer\.group_size is 8"):
        ours.RocSamplesGenerator(SimpleNamespace(args=args), [], None, None, [], run_config=run)


def test_install_patches_sync_and_async_trainer_modules(sg, monkeypatch):
    ours, openrlhf_sg = sg
    from rstar_trainers.openrlhf import patch

    original = openrlhf_sg.SamplesGenerator
    fakes = {}
    for name in patch.TRAINER_MODULES:  # the real ones import DeepSpeed; their globals are what matters
        fakes[name] = ModuleType(name)
        fakes[name].SamplesGenerator = original
        monkeypatch.setitem(sys.modules, name, fakes[name])
    assert patch.install()
    for module in (openrlhf_sg, *fakes.values()):
        assert module.SamplesGenerator is ours.RocSamplesGenerator
    assert issubclass(ours.RocSamplesGenerator, original)
    assert patch.install()  # idempotent: still one import hook, still OpenRLHF's class as the base
    assert sum(isinstance(f, patch.PatchFinder) for f in sys.meta_path) == 1
    assert getattr(openrlhf_sg, patch.ORIGINAL_ATTR) is original
    patch.uninstall()
    assert all(m.SamplesGenerator is original for m in (openrlhf_sg, *fakes.values()))
    monkeypatch.setenv(patch.DISABLE_ENV, "1")
    assert not patch.install() and openrlhf_sg.SamplesGenerator is original


def test_import_hook_patches_a_module_when_it_is_first_imported(tmp_path, monkeypatch):
    from rstar_trainers.openrlhf import patch

    (tmp_path / "late_trainer_mod.py").write_text("class SamplesGenerator:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = patch.PatchFinder(("late_trainer_mod",), lambda m: seen.append(m.SamplesGenerator.__name__))
    sys.meta_path.insert(0, finder)
    try:
        module = importlib.import_module("late_trainer_mod")
    finally:
        sys.meta_path.remove(finder)
        sys.modules.pop("late_trainer_mod", None)
    assert seen == ["SamplesGenerator"] and module.__spec__.loader.get_source("late_trainer_mod")
    hook_module, _, hook_name = patch.SETUP_HOOK.rpartition(".")
    assert getattr(importlib.import_module(hook_module), hook_name) is patch.worker_setup


def test_a_sampler_with_bad_output_is_named_at_the_first_group(sg):
    """The same validation as the local trainer's (rstar_env.sampler.checked_select)."""
    from rstar_env.sampler import SamplerError

    ours, _ = sg

    class KeepAll:
        name = "keep_all_test"

        def select(self, group, keep, rng):
            return list(range(len(group)))

    info = {"num_tool_calls": 1, "num_tool_errors": 0, "num_answer_blocks": 1, "num_assistant_turns": 1}
    experiences = [SimpleNamespace(prompts=["p"], rewards=float(i % 2), info=info) for i in range(4)]
    with pytest.raises(SamplerError, match=r"sampler 'keep_all_test' returned \[0, 1, 2, 3\] .*4 indices, not 2"):
        ours.select_groups(experiences, rollouts_per_prompt=4, keep=2, sampler=KeepAll(), rng=np.random.default_rng(0))


def test_step_statistics_match_the_local_trainer(sg, tmp_path):
    """The generator logs batch_stats of the whole step (what the local trainer logs), before and after selection."""
    from rstar_plugins.samplers.stats import batch_stats

    generator, _ = make_generator(sg, tmp_path, prompts=["mixed", "one-right"])
    samples, *_ = generator.generate_samples(max_len=64)
    stats = generator.last_step_stats
    # Hand count: "mixed" has 4 positives with 2 errors in 4 calls, "one-right" 1 clean positive: 2 / 5 calls.
    assert stats["all_pos/n"] == 5 and stats["all_pos/tool_error_ratio"] == pytest.approx(2 / 5)
    assert stats["positives"] == 5 and stats["negatives"] == 11
    # "mixed" keeps its two clean positives (2 of 4), "one-right" its only one; negatives: 2 + 3 of 11.
    assert stats["positives_kept"] == 3 and stats["negatives_kept"] == 5
    assert stats["kept_pos/tool_error_ratio"] == 0.0 and stats["dropped_pos/tool_error_ratio"] == 1.0
    assert stats["groups_dropped"] == 0 and stats["rollouts_kept"] == 2 * G
    # The same function the local trainer calls, on the same groups and selections.
    from rstar_trainers.openrlhf.samples_generator import _Record

    groups = [
        [
            _Record(reward=r, num_tool_calls=1, num_tool_errors=e, num_answer_blocks=1, num_assistant_turns=2)
            for r, e in GROUPS[p]
        ]
        for p in ("mixed", "one-right")
    ]
    kept = {p: sorted(int(s.info["rollout"].item()) for s in samples if s.prompts[0] == p) for p in GROUPS}
    assert stats == batch_stats(groups, [kept["mixed"], kept["one-right"]], G, sampler=generator.sampler.inner)
    # Logged through OpenRLHF's info (it logs the batch mean: the same value on every kept sample).
    for sample in samples:
        assert float(sample.info["roc/all_pos/tool_error_ratio"]) == pytest.approx(0.4)
        assert float(sample.info["roc/negatives_kept"]) == 5
        assert not hasattr(sample, "rstar_trajectory")  # never shipped to the training actors


def test_trajectories_jsonl_feeds_filter_hard(sg, tmp_path):
    import json

    from rstar_env.rollout.hard import filter_hard

    generator, _ = make_generator(sg, tmp_path, prompts=["all-right", "mixed", "all-wrong", "one-right"])
    generator.generate_samples(max_len=64)
    generator.generate_samples(max_len=64)
    rows = [json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 2 * G  # every rollout, kept or dropped, of both steps
    assert [r["metadata"]["step"] for r in rows] == [1] * 16 + [2] * 16
    assert sum(r["metadata"]["kept"] for r in rows) == 2 * G  # "mixed" and "one-right" keep G each
    assert not any(r["metadata"]["kept"] for r in rows if r["problem"] in ("all-right", "all-wrong"))
    seen, hard = filter_hard([tmp_path / "trajectories.jsonl"], tmp_path / "hard.jsonl")
    assert (seen, hard) == (4, 3)  # "all-right" is solved every time
    problems = {json.loads(line)["problem"] for line in (tmp_path / "hard.jsonl").read_text().splitlines()}
    assert problems == {"mixed", "all-wrong", "one-right"}


def test_plain_grpo_still_logs_stats_and_trajectories(sg, tmp_path):
    generator, engine = make_generator(sg, tmp_path, prompts=["a", "b"], sampler="grpo", oversample=1)
    samples, *_ = generator.generate_samples(max_len=64)
    assert engine.requests == [("a", G), ("b", G)] and len(samples) == 2 * G
    assert generator.last_step_stats["rollouts_kept"] == 2 * G
    assert len((tmp_path / "trajectories.jsonl").read_text().splitlines()) == 2 * G


def test_resume_drops_rows_after_the_checkpoint_and_continues_numbering(sg, tmp_path):
    import json

    generator, _ = make_generator(sg, tmp_path, prompts=["mixed", "one-right", "mixed", "one-right"], ckpt=True)
    generator.generate_samples(max_len=64)
    generator.generate_samples(max_len=64)
    # The run saved global_step1 and died after rolling out step 2: resume from 1.
    (tmp_path / "checkpoints" / "_actor").mkdir(parents=True)
    (tmp_path / "checkpoints" / "_actor" / "latest").write_text("global_step1")
    generator, _ = make_generator(sg, tmp_path, prompts=["mixed", "one-right"], ckpt=True)
    steps = [json.loads(row)["metadata"]["step"] for row in (tmp_path / "trajectories.jsonl").open()]
    assert steps == [1] * 16
    generator.generate_samples(max_len=64)
    steps = [json.loads(row)["metadata"]["step"] for row in (tmp_path / "trajectories.jsonl").open()]
    assert steps == [1] * 16 + [2] * 16


def test_a_batch_with_every_group_dropped_keeps_the_step_number(sg, tmp_path):
    """OpenRLHF skips the update (and its global step) when every group is dropped: the rows carry the step the
    next batch trains."""
    import json

    generator, _ = make_generator(sg, tmp_path, prompts=["all-right", "all-wrong", "mixed", "one-right"])
    samples, *_ = generator.generate_samples(max_len=64)
    assert samples == []
    generator.generate_samples(max_len=64)
    steps = [json.loads(row)["metadata"]["step"] for row in (tmp_path / "trajectories.jsonl").open()]
    assert steps == [1] * 32
    assert generator.trajectory_log.step == 1


def test_plain_grpo_groups_with_a_system_failure_are_never_trained_on_either(sg, monkeypatch):
    """With ``sampler: grpo`` and ``oversample: 1`` the generator passes OpenRLHF's groups through without a
    sampler; a group with an env_error episode is still left out whole."""
    ours, _ = sg

    def exp(prompt, end):
        info = {k: torch.tensor([1.0]) for k in ours.SUMMARY_KEYS} | {f"end_{end}": torch.tensor([1.0])}
        return SimpleNamespace(prompts=[prompt], rewards=torch.tensor([1.0]), info=info)

    run = load_config({"sampler": "grpo", "trainer": {"backend": "openrlhf", "group_size": 2, "oversample": 1}})
    args = SimpleNamespace(rollout=SimpleNamespace(n_samples_per_prompt=2))
    generator = ours.RocSamplesGenerator(SimpleNamespace(args=args), [], None, None, [], run_config=run)
    ok, failed = [exp("a", "answer"), exp("a", "max_turns")], [exp("b", "answer"), exp("b", "env_error")]
    monkeypatch.setattr(generator, "_generate_queued", lambda *a, **k: (ok + failed, 2, False))

    experiences, consumed, exhausted = generator._generate_vllm(iter(()), 2, None)

    assert experiences == ok and (consumed, exhausted) == (2, False)
    assert ours.without_failed_groups(failed + ok, 2) == (ok, 1)
