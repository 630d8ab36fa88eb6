"""GRPO-RoC's advantages and token-level clipped policy loss, on plain tensors."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


def group_advantages(rewards: Sequence[float], eps: float = 1e-6) -> list[float]:
    """``(r - mean) / (std + eps)`` over one group's *kept* trajectories (unbiased std, as OpenRLHF's group_norm)."""
    r = torch.tensor(rewards, dtype=torch.float64)
    if len(r) < 2:
        return [0.0] * len(r)
    return ((r - r.mean()) / (r.std() + eps)).tolist()


@dataclass
class LossParts:
    loss: torch.Tensor
    """What to backpropagate: this micro-batch's share of the token-level mean."""
    policy: float
    kl: float
    entropy: float
    clip_fraction: float


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, *, entropy_grad: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next token and the entropy of each position's distribution, both shaped like
    ``input_ids[:, 1:]``. The entropy carries gradients only with ``entropy_grad`` (an entropy bonus)."""
    logp_all = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    logp = logp_all.gather(-1, input_ids[:, 1:, None])[..., 0]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    total_tokens: int,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
) -> LossParts:
    """The token-level PPO-clip loss with clip-higher.

    Per token: ``w * max(-A * ratio, -A * clip(ratio, 1 - clip_low, 1 + clip_high))``, ``w`` being
    ``token_weights`` (shaped like ``logp``, detached here; the truncated importance-sampling weights of the
    sampler against the trainer) or 1 where ``None``. Tokens are averaged over the whole mini-batch
    (``total_tokens`` action tokens across all its micro-batches), so every token counts once whatever its
    sequence's length, and gradient accumulation over micro-batches is exact. ``mask`` is 1 on tokens the policy
    generated: prompt and tool output never enter the loss, whatever their weight. ``advantages`` is per sequence
    ``[B]``. ``clip_fraction`` counts clipped tokens, unweighted; the KL and entropy terms are unweighted.
    """
    mask = mask.to(logp.dtype)
    adv = advantages[:, None].to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if token_weights is not None:
        per_token = per_token * token_weights.detach().to(per_token.dtype)
    policy = (per_token * mask).sum() / total_tokens
    loss = policy
    kl_value = torch.zeros(())
    if ref_logp is not None and kl_coef > 0:
        delta = ref_logp - logp
        kl_value = ((torch.exp(delta) - delta - 1.0) * mask).sum() / total_tokens  # k3: unbiased, non-negative
        loss = loss + kl_coef * kl_value
    entropy_value = torch.zeros(())
    if entropy is not None:
        entropy_value = (entropy * mask).sum() / total_tokens
        if entropy_coef > 0:
            loss = loss - entropy_coef * entropy_value
    with torch.no_grad():
        clip_fraction = (((clipped > unclipped).to(logp.dtype) * mask).sum() / total_tokens).item()
    return LossParts(loss, policy.item(), float(kl_value), float(entropy_value), clip_fraction)


def masked_token_logprobs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    mask: torch.Tensor,
    *,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`token_logprobs` of ``model`` on ``input_ids``, computed only where ``mask[:, 1:]`` is 1 (zeros
    elsewhere), shaped like ``input_ids[:, 1:]``.

    The decoder's hidden states at those positions alone go through the output layer: the ``[B, T, vocab]`` logits
    (and their log-softmax, exp and gradients, several GB in fp32 for a 49k vocabulary at a few hundred tokens) are
    never built for prompt and tool-output tokens, which the loss does not read. A model without
    ``get_decoder``/``get_output_embeddings`` falls back to full logits.
    """
    select = mask[:, 1:].bool()
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if decoder is None or head is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
        logp, entropy = token_logprobs(logits, input_ids, entropy_grad=entropy_grad)
        return logp * select, entropy * select
    # use_cache=False: a training forward has no use for a KV cache (it would hold every layer's keys and values).
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
    hidden = hidden[:, :-1][select]
    logp_all = torch.log_softmax(head(hidden).float(), dim=-1)
    picked = logp_all.gather(-1, input_ids[:, 1:][select][:, None])[:, 0]
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        ent = -(logp_all.exp() * logp_all).sum(-1)
    logp = torch.zeros(select.shape, dtype=picked.dtype, device=picked.device).masked_scatter(select, picked)
    entropy = torch.zeros(select.shape, dtype=ent.dtype, device=ent.device).masked_scatter(select, ent)
    return logp, entropy
