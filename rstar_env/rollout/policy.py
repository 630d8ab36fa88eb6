"""The policy contract: given the episodes in flight, produce each one's next assistant action.

A policy sees each episode as a :class:`Request`: the :class:`~rstar_env.trajectory.Trajectory` so far (prompt,
problem, every earlier action and tool result) plus, for token-level policies, the exact token ids of the context.
It returns one :class:`Generation` per request. Token-level policies (a local model) return the ids they sampled and
their log-probs, so trainers learn on exactly those ids; text-level policies (an OpenAI-compatible endpoint) return
text only.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from rstar_env.trajectory import Trajectory

FinishReason = Literal["stop", "tool_call", "length", "error"]
"""``stop``: end-of-turn token. ``tool_call``: stopped after ``</tool_call>``. ``length``: the per-turn token cap.
``error``: the backend failed for this request (the text says why); the collector ends that episode."""


@dataclass
class Request:
    """One episode's next turn to generate."""

    trajectory: Trajectory
    context_ids: list[int] | None = None
    """Prompt ids + every action's and feedback's ids so far (token-level policies); what the trainer scores."""
    max_new_tokens: int | None = None
    """The per-turn cap, already lowered to what the episode's length budget leaves."""
    episode: str | None = None
    """A key that stays the same across one episode's turns (the collector sets it); a multi-engine dispatcher
    sends later turns to the engine that served the earlier ones, whose prefix cache holds the context."""
    seed: int | None = None
    """This request's own sampling stream (the collector derives it from run seed, problem id, sample index and
    turn): a policy draws the request's tokens from it alone, so batch composition and tool timing do not change
    what is drawn. ``None``: the policy's own stream."""


@dataclass
class Generation:
    """What a policy produced for one request."""

    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: FinishReason = "stop"
    metadata: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by policies. The rStar2-Agent recipe samples at temperature 1.0."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 512
    """Per assistant turn."""
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")


@runtime_checkable
class Policy(Protocol):
    """Generates the next assistant action for a batch of episodes."""

    tokenizer: object | None
    """A tokenizer for token-level truth (the env encodes prompt and feedback with it), or ``None``."""

    async def generate(self, requests: Sequence[Request]) -> list[Generation]:
        """One :class:`Generation` per request, in order. Must not raise for one bad request: return
        ``finish_reason="error"`` for it instead."""
        ...

    async def aclose(self) -> None:
        """Release connections, worker threads, ..."""
        ...


def end_of_turn_ids(tokenizer: Any, configured: int | Iterable[int] | None = None) -> set[int]:
    """The ids that end an assistant turn: the tokenizer's EOS, the model's configured ``eos_token_id`` (an id or a
    list, from its generation config) and ``<|im_end|>`` when the vocabulary has it. One definition for every
    engine, so they stop on the same tokens."""
    ids = {tokenizer.eos_token_id}
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(end, int) and end != tokenizer.unk_token_id:
        ids.add(end)
    return {i for i in ids if i is not None}
