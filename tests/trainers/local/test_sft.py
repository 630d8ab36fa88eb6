"""Local SFT: a few steps teach the real SmolLM2 the tool-call format; exact resume (on a 2-layer model); compare
writes both arms."""

from __future__ import annotations

import copy
import json

import pytest

torch = pytest.importorskip("torch")

from rstar_env import threads  # noqa: E402
from rstar_env.config import ConfigError, load_config  # noqa: E402
from rstar_env.data import generate_problems  # noqa: E402
from rstar_env.rollout.sft_data import generate_tool_sft, sft_tokens  # noqa: E402
from rstar_trainers.local.config import sft_config, trainer_config  # noqa: E402
from rstar_trainers.local.heldout import evaluate_model  # noqa: E402
from rstar_trainers.local.loss import masked_token_logprobs, token_logprobs  # noqa: E402
from rstar_trainers.local.sft import SFTTrainer, lr_factor  # noqa: E402

ENV = {"max_turns": 2, "system_prompt": "Use the python tool, then answer as <answer>\\boxed{N}</answer>."}
TOOLS = [{"name": "python", "options": {"timeout_s": 4, "description": "Run Python."}}]


def sft_run(tmp_path, **sft):
    settings = {
        "backend": "local",
        "stage": "sft",
        "output_dir": str(tmp_path / "sft"),
        "max_epochs": 1,
        "train_batch_size": 8,
        "micro_train_batch_size": 4,
        "lr": 3e-4,
        "lr_scheduler": "constant",
        "tensorboard": False,
        "save_hf": False,
        "max_len": 256,
        "seed": 0,
        **sft,
    }
    return load_config({"env": ENV, "tools": TOOLS, "reward": "math", "trainer": settings})


def test_masked_logprobs_equal_the_full_ones_where_the_loss_reads(smollm2):
    model, tokenizer = smollm2
    ids = torch.tensor([tokenizer.encode("What is 2 + 3? The answer is 5.")] * 2)
    mask = torch.zeros_like(ids)
    mask[0, 5:] = 1
    mask[1, 3:7] = 1
    with torch.no_grad():
        full, full_entropy = token_logprobs(model(input_ids=ids).logits, ids)
        part, part_entropy = masked_token_logprobs(model, ids, torch.ones_like(ids), mask)
    select = mask[:, 1:].bool()
    assert torch.allclose(part[select], full[select], atol=1e-4)
    assert torch.allclose(part_entropy[select], full_entropy[select], atol=1e-3)
    assert not part[~select].any()


def test_a_few_sft_steps_teach_well_formed_calls(tmp_path, smollm2):
    model, tokenizer = smollm2
    run = sft_run(tmp_path, gradient_checkpointing=False)  # 8 short rows fit; recomputing them costs a third
    rows = generate_tool_sft(40, seed=0, level=2, fix=0.0, no_tool=0.0, config=run)
    examples = [sft_tokens(r["messages"], tokenizer) for r in rows]
    trainer = SFTTrainer(
        run,
        sft_config(run.trainer),
        model_and_tokenizer=(copy.deepcopy(model), tokenizer),
        examples=examples,
        resume=False,
    )
    held_out = [p.to_dict() for p in generate_problems(4, level=2, seed=99)]

    def share() -> float:
        report, _ = evaluate_model(
            trainer.model, tokenizer, run, held_out, max_new_tokens=64, max_response_tokens=256, temperature=0.0
        )
        return report["tool_call_share"]

    before = share()
    trainer.train()
    assert trainer.step == 5
    losses = [json.loads(line)["loss"] for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]
    after = share()
    assert before == 0.0 and after >= 0.75, (before, after)


def test_resume_continues_exactly(tmp_path, tiny_llama, monkeypatch):
    model, tokenizer = tiny_llama  # the mechanics of resuming: any model shows them
    # Bit for bit needs one thread count: `auto` follows the load, and the other test processes beside this one vary it.
    monkeypatch.setenv(threads.ENV_VAR, "1")
    ids = [tokenizer.encode(f"Question {i}? Answer: {i * 7}.") for i in range(6)]
    from rstar_env.rollout.sft_data import SFTTokens

    examples = [SFTTokens(x, [0] * 4 + [1] * (len(x) - 4)) for x in ids]

    def make(name):
        run = sft_run(
            tmp_path / name,
            train_batch_size=4,
            micro_train_batch_size=2,
            lr=1e-4,
            lr_scheduler="cosine_with_min_lr",
            lr_warmup_ratio=0.5,
            max_epochs=2,
        )
        return SFTTrainer(
            run, sft_config(run.trainer), model_and_tokenizer=(copy.deepcopy(model), tokenizer), examples=examples
        )

    straight = make("a")
    straight.train()
    assert straight.step == 3
    first = make("b")
    first.train(max_steps=2)
    second = make("b")  # picks up the checkpoint of step 2
    assert second.step == 2
    second.train()
    for (name, a), b in zip(straight.model.named_parameters(), second.model.parameters(), strict=True):
        assert torch.equal(a, b), name
    rows = [json.loads(line) for line in (tmp_path / "b" / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[-1]["loss"] == pytest.approx(
        json.loads((tmp_path / "a" / "sft" / "metrics.jsonl").read_text().splitlines()[-1])["loss"], abs=1e-6
    )


def test_sft_schema_is_the_openrlhf_one(tmp_path):
    openrlhf = load_config("configs/sft.yaml")
    with pytest.warns(UserWarning, match="no effect here"):
        local = sft_config(openrlhf.trainer)
    assert (local.lr, local.max_len, local.train_batch_size, local.lr_scheduler) == (
        5e-6,
        8192,
        128,
        "cosine_with_min_lr",
    )
    with pytest.raises(ConfigError, match=r"trainer\.lr_scheduler"):
        sft_config({"stage": "sft", "lr_scheduler": "sawtooth"})
    quick = trainer_config(load_config("configs/quickstart.yaml"))
    assert quick.sft is not None and sft_config(quick.sft).max_epochs >= 1
    assert load_config("configs/quickstart.yaml").reward.options == {}  # the strict math reward
    assert lr_factor("cosine_with_min_lr", 0, 10, 2) == 0.5
    assert lr_factor("cosine_with_min_lr", 10, 10, 2) == pytest.approx(0.1)


def test_compare_writes_both_arms_and_the_figure(tmp_path, smollm2):
    from rstar_trainers.local.compare import run_compare

    rows = [
        {"problem": "What is 2 + 2?", "answer": "4", "id": "a"},
        {"problem": "What is 3 + 5?", "answer": "8", "id": "b"},
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = load_config(
        {
            "env": ENV,
            "tools": TOOLS,
            "reward": "math",
            "sampler": "roc",
            "dataset": str(data),
            "trainer": {
                "output_dir": str(tmp_path / "run"),
                "prompts_per_step": 2,
                "group_size": 2,
                "oversample": 2,
                "max_new_tokens": 6,
                "max_response_tokens": 40,
                "tensorboard": False,
            },
        }
    )
    settings = trainer_config(run)
    summary = run_compare(
        run, settings, out=tmp_path / "cmp", model="unused", seeds=[0], steps=1, model_and_tokenizer=smollm2
    )
    for arm in ("grpo", "roc"):
        metrics = (tmp_path / "cmp" / f"{arm}-seed0" / "metrics.jsonl").read_text().splitlines()
        assert len(metrics) == 1 and "tool_error_ratio_correct" in json.loads(metrics[0])
        assert summary["arms"][arm]["metrics"]["0"][0]["step"] == 1
    png = (tmp_path / "cmp" / "compare.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| grpo |" in table and "| roc |" in table
