"""The single-machine GRPO-RoC trainer with the real SmolLM2: it learns, resumes exactly, saves on Ctrl-C."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

torch = pytest.importorskip("torch")

from rstar_env.cli import main  # noqa: E402
from rstar_env.config import ConfigError, load_config  # noqa: E402
from rstar_trainers.local.config import trainer_config  # noqa: E402
from rstar_trainers.local.trainer import LocalTrainer  # noqa: E402

ROWS = [
    {"problem": "What is 2 + 2?", "answer": "4", "id": "a"},
    {"problem": "What is 3 + 5?", "answer": "8", "id": "b"},
]


def run_config(tmp_path, **trainer):
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    settings = {
        "output_dir": str(tmp_path / "run"),
        "steps": 4,
        "prompts_per_step": 2,
        "group_size": 4,
        "oversample": 2,
        "lr": 5e-5,
        "max_new_tokens": 10,
        "max_response_tokens": 12,
        "seed": 0,
        "tensorboard": False,
        "save_model": False,
        **trainer,
    }
    return load_config(
        {
            "env": {"max_turns": 1, "system_prompt": "Answer with just the number."},
            "tools": [],
            "reward": {"name": "math", "options": {"last_number": True}},
            "sampler": "roc",
            "dataset": str(data),
            "trainer": settings,
        }
    )


def make(run, smollm2, **kwargs):
    model, tokenizer = smollm2
    return LocalTrainer(run, trainer_config(run), model_and_tokenizer=(copy.deepcopy(model), tokenizer), **kwargs)


def test_grpo_roc_raises_the_reward(tmp_path, smollm2):
    trainer = make(run_config(tmp_path), smollm2)
    try:
        rewards = [trainer.train_step()["reward"] for _ in range(4)]
    finally:
        trainer.close()
    # Fixed seed: 0.125 at the first step; the policy then answers with the right number far more often.
    assert max(rewards[1:]) >= rewards[0] + 0.25, rewards
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert {
        "reward",
        "accuracy",
        "groups_kept",
        "tool_error_ratio_correct",
        "loss",
        "entropy",
        "grad_norm",
        "time/generation_s",
        "time/train_s",
        "sampler/kept_pos/error_penalty",
    } <= set(metrics[0])
    # Rollouts went through the dispatcher: one engine, every turn of every episode one request, none failed.
    assert metrics[0]["engines/0/requests"] >= 1 and metrics[0]["engines/0/failed"] == 0


def test_resume_continues_exactly(tmp_path, smollm2):
    straight = make(run_config(tmp_path / "a", steps=2, max_new_tokens=6), smollm2, resume=False)
    straight.train()
    straight.close()

    halves = run_config(tmp_path / "b", steps=2, max_new_tokens=6)
    first = make(halves, smollm2, resume=False)
    first.train(max_steps=1)
    first.close()
    second = make(halves, smollm2)  # picks up the checkpoint of step 1
    assert second.step == 1
    second.train()
    second.close()

    for p, q in zip(straight.model.parameters(), second.model.parameters(), strict=True):
        assert torch.equal(p, q)
    read = lambda d: [json.loads(x) for x in (d / "run" / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    a, b = read(tmp_path / "a"), read(tmp_path / "b")
    assert [m["reward"] for m in a] == [m["reward"] for m in b]
    assert [m["loss"] for m in a] == [m["loss"] for m in b]
    saved = sorted(p.name for p in (tmp_path / "b" / "run" / "checkpoints").glob("step_*"))
    assert saved == ["step_000002"]  # keep_checkpoints: last (the default) keeps what resuming needs


def test_keep_checkpoints_none_leaves_the_model_and_refuses_to_restart(tmp_path, smollm2):
    run = run_config(tmp_path, steps=1, max_new_tokens=4, save_model=True, keep_checkpoints="none")
    trainer = make(run, smollm2)
    trainer.train()
    trainer.close()
    root = tmp_path / "run"
    assert (root / "model" / "config.json").exists()
    assert not list((root / "checkpoints").glob("step_*")) and not (root / "checkpoints" / "latest").exists()
    with pytest.raises(ConfigError, match=r"finished run \(step 1.*keep_checkpoints: none.*--fresh"):
        make(run, smollm2)


def test_ctrl_c_saves_a_checkpoint(tmp_path, smollm2):
    trainer = make(run_config(tmp_path, steps=3, max_new_tokens=4), smollm2)

    def interrupt(metrics):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        trainer.train(on_step=interrupt)
    trainer.close()
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "step_000001"


def test_plot_and_filter_hard_from_a_run(tmp_path, smollm2):
    pytest.importorskip("matplotlib")
    rows = str(tmp_path / "rows.jsonl")
    trainer = make(run_config(tmp_path, steps=1, max_new_tokens=6, eval_dataset=rows, eval_at_start=True), smollm2)
    reports = []
    trainer.train(on_eval=lambda name, report: reports.append(name))
    trainer.close()
    # The held-out set was rolled out before the first step and after the last, with the same settings.
    assert reports == ["eval_start", "eval"]
    for name in reports:
        report = json.loads((tmp_path / "run" / f"{name}.json").read_text())
        assert report["episodes"] == len(ROWS) and 0 <= report["pass@1"] <= 1
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1, 1] and "eval_start/pass@1" in metrics[0]
    assert metrics[1]["mem/peak_rss_gib"] > 0.1
    runner = CliRunner()
    result = runner.invoke(main, ["plot", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "curves.png").stat().st_size > 10_000
    out = tmp_path / "hard.jsonl"
    result = runner.invoke(main, ["filter-hard", str(tmp_path / "run" / "trajectories.jsonl"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    hard = [json.loads(line) for line in out.read_text().splitlines()]
    trajectories = [json.loads(x) for x in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    always = {t["id"] for t in trajectories} - {t["id"] for t in trajectories if t["reward"] < 1}
    assert {h["id"] for h in hard} == {t["id"] for t in trajectories} - always
    assert all(0 <= h["metadata"]["pass_rate"] < 1 for h in hard)


def test_trained_weights_save_and_reload(tmp_path, smollm2):
    from rstar_env.rollout.local import load_model

    trainer = make(run_config(tmp_path), smollm2)
    path = trainer.save_model()
    trainer.close()
    reloaded, tokenizer = load_model(path, cache=False)
    ids = torch.tensor([tokenizer.encode("What is 2 + 2?")])
    with torch.no_grad():
        assert torch.allclose(reloaded(ids).logits, trainer.model.eval()(ids).logits, atol=1e-5)


def test_trainer_section_errors_name_the_key(tmp_path):
    run = run_config(tmp_path, group_sizes=3)
    with pytest.raises(ConfigError, match=r"trainer\.group_sizes: unknown key"):
        trainer_config(run)
    other = load_config({"trainer": {"backend": "openrlhf", "group_size": 16, "lr": 1e-6, "cluster": {}}})
    with pytest.raises(ConfigError, match="rstar-env launch openrlhf"):
        trainer_config(other)
    with pytest.warns(UserWarning, match=r"ignoring trainer keys \['cluster'\]"):
        local = trainer_config(other, force_local=True, model="smollm2")
    assert (local.group_size, local.lr, local.model) == (16, 1e-6, "smollm2")
