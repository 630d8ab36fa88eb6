"""The records every part of rstar-env reads: what the policy said, what the tools did, how it scored.

A :class:`Trajectory` is built turn by turn by :class:`~rstar_env.env.MathToolEnv`, read by reward and sampler
plugins, written to JSONL by rollouts and evaluation, and consumed by trainers. All records round-trip through
JSON with ``to_dict()`` / ``from_dict()``.

Timing fields are excluded from equality, so two runs of the same scripted episode compare equal.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

from rstar_env.format import answer_blocks
from rstar_env.outcomes import TOOL_ERROR_KINDS, ToolErrorKind

# ToolErrorKind: why a tool call failed. ``bad_call``: malformed JSON, unknown tool or invalid arguments; the other
# names are the sandbox's statuses (rstar_env.outcomes): one vocabulary from the sandbox to the trajectory.

EndReason = Literal["answer", "max_turns", "length", "action_too_long", "time_limit", "env_error", "policy_error"]
"""Why an episode ended.

The model's own ends, all scored by the env's rules: ``answer`` (an action with no tool call), ``max_turns``,
``length`` (the response outgrew its budget), ``action_too_long`` (one action over ``max_action_chars``) and
``time_limit`` (cut by a wrapper such as gymnasium's ``TimeLimit``). The system's failures, never scored:
``env_error`` (the env, a tool plugin or the reward plugin failed) and ``policy_error`` (generation failed).
"""

SYSTEM_FAILURES: tuple[str, ...] = ("env_error", "policy_error")
"""End reasons that are failures of the system, not of the model: recorded and counted, never scored, never
trained on, and run again when an evaluation resumes."""


@dataclass
class ToolResult:
    """What a tool returns: the text the model sees, and a structured error kind (``None`` on success).

    Tool errors are counted from ``error``, never by searching ``text`` for the word "error".
    """

    text: str
    """What the model reads, inside ``<tool_response>``; the env cuts nothing, so the tool bounds its size."""
    error: ToolErrorKind | None = None
    """``None`` on success, else why the call failed: ``exception`` (the code raised, or the tool refused the
    arguments), ``timeout``, ``crash``, ``output_limit``; ``bad_call`` is the env's (a malformed call)."""
    duration_s: float = field(default=0.0, compare=False)
    """Seconds the call took, as the tool measured it (the env fills it in when left 0)."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """Anything else worth keeping in the trajectory (JSON-serialisable), e.g. the sandbox's status."""

    def __post_init__(self) -> None:
        if self.error is not None and self.error not in TOOL_ERROR_KINDS:
            raise ValueError(f"ToolResult.error must be None or one of {TOOL_ERROR_KINDS}, got {self.error!r}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolResult:
        return cls(**data)


@dataclass
class ToolCall:
    """One tool call the policy made, as parsed, with its outcome.

    ``name`` and ``arguments`` are ``None`` when the call could not be parsed; ``raw`` is always the text between
    the call markers, so nothing the model wrote is lost.
    """

    raw: str
    name: str | None
    arguments: dict[str, Any] | None
    result: ToolResult

    @property
    def error(self) -> ToolErrorKind | None:
        return self.result.error

    def to_dict(self) -> dict[str, Any]:
        return {"raw": self.raw, "name": self.name, "arguments": self.arguments, "result": self.result.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ToolCall:
        return cls(
            raw=data["raw"],
            name=data.get("name"),
            arguments=data.get("arguments"),
            result=ToolResult.from_dict(data["result"]),
        )


@dataclass
class Turn:
    """One assistant action and the environment's feedback to it.

    ``feedback`` is the rendered text appended to the conversation after the action (tool responses in chat
    template markers), or ``None`` when the episode ended on this action. Token fields are filled when a tokenizer
    or a token-level policy is involved: ``action_token_ids`` are the ids the policy generated (with their
    ``action_logprobs``), ``feedback_token_ids`` the ids appended by the environment.
    """

    action: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    feedback: str | None = None
    action_tokens: int | None = None
    feedback_tokens: int | None = None
    action_token_ids: list[int] | None = None
    action_logprobs: list[float] | None = None
    feedback_token_ids: list[int] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["tool_calls"] = [call.to_dict() for call in self.tool_calls]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Turn:
        data = dict(data)
        data["tool_calls"] = [ToolCall.from_dict(c) for c in data.get("tool_calls", [])]
        return cls(**data)


@dataclass
class RewardResult:
    """A reward plugin's verdict: the reward, the answer it extracted (``None`` if none), and why."""

    reward: float
    """The score: 1.0 / 0.0 for correctness, or any float for a shaped reward."""
    extracted: str | None = None
    """The answer read from the response, as the plugin understood it; ``None`` when it found none."""
    reason: str = ""
    """A short, stable code for why (``exact``, ``mismatch``, ``no_answer``, ``timeout``...), for counting."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RewardResult:
        return cls(**data)


@dataclass
class Trajectory:
    """One episode: the prompt, every turn with every tool call, the final answer, the reward, why it ended.

    The summary properties (``reward``, ``num_tool_calls``, ``num_tool_errors``, ``num_answer_blocks``,
    ``num_assistant_turns``) are what sampler plugins read; any object with those attributes will do for them.
    """

    problem: str
    answer: str
    prompt: str = ""
    turns: list[Turn] = field(default_factory=list)
    reward: float = 0.0
    reward_result: RewardResult | None = None
    end_reason: EndReason | None = None
    id: str | None = None
    prompt_token_ids: list[int] | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    duration_s: float = field(default=0.0, compare=False)
    error: str | None = None
    """What failed, for an episode that ended in a system failure (``env_error``/``policy_error``)."""

    # -- summary properties read by samplers and statistics ---------------------------------------------------
    @property
    def done(self) -> bool:
        return self.end_reason is not None

    @property
    def truncated(self) -> bool:
        """Ended by a budget (turns, length, action size, a time limit) rather than by an answer."""
        return self.end_reason in ("max_turns", "length", "action_too_long", "time_limit")

    @property
    def failed(self) -> bool:
        """Ended by a failure of the system (see :data:`SYSTEM_FAILURES`): not scored, not to be trained on."""
        return self.end_reason in SYSTEM_FAILURES

    @property
    def num_assistant_turns(self) -> int:
        return len(self.turns)

    @property
    def tool_calls(self) -> list[ToolCall]:
        return [call for turn in self.turns for call in turn.tool_calls]

    @property
    def num_tool_calls(self) -> int:
        return sum(len(turn.tool_calls) for turn in self.turns)

    @property
    def num_tool_errors(self) -> int:
        return sum(1 for turn in self.turns for call in turn.tool_calls if call.error is not None)

    def tool_error_counts(self) -> dict[str, int]:
        """Tool errors by kind, e.g. ``{"timeout": 1, "bad_call": 2}``."""
        counts: dict[str, int] = {}
        for call in self.tool_calls:
            if call.error is not None:
                counts[call.error] = counts.get(call.error, 0) + 1
        return counts

    @property
    def num_answer_blocks(self) -> int:
        """``<answer>...</answer>`` blocks over all assistant turns (more than one is a format fault)."""
        return sum(len(answer_blocks(turn.action)) for turn in self.turns)

    @property
    def final_answer(self) -> str | None:
        """The answer the reward plugin extracted, if any."""
        return self.reward_result.extracted if self.reward_result else None

    @property
    def response(self) -> str:
        """Everything after the prompt as one string: actions and feedback in order."""
        return "".join(turn.action + (turn.feedback or "") for turn in self.turns)

    @property
    def response_tokens(self) -> int | None:
        """Tokens after the prompt (actions and feedback), when every turn's counts are known."""
        total = 0
        for turn in self.turns:
            if turn.action_tokens is None:
                return None
            total += turn.action_tokens + (turn.feedback_tokens or 0)
        return total

    # -- serialisation ---------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "problem": self.problem,
            "answer": self.answer,
            "prompt": self.prompt,
            "turns": [turn.to_dict() for turn in self.turns],
            "reward": self.reward,
            "reward_result": self.reward_result.to_dict() if self.reward_result else None,
            "end_reason": self.end_reason,
            "prompt_token_ids": self.prompt_token_ids,
            "metadata": self.metadata,
            "duration_s": self.duration_s,
            "error": self.error,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        reward_result = data.get("reward_result")
        return cls(
            id=data.get("id"),
            problem=data["problem"],
            answer=data["answer"],
            prompt=data.get("prompt", ""),
            turns=[Turn.from_dict(t) for t in data.get("turns", [])],
            reward=float(data.get("reward", 0.0)),
            reward_result=RewardResult.from_dict(reward_result) if reward_result else None,
            end_reason=data.get("end_reason"),
            prompt_token_ids=data.get("prompt_token_ids"),
            metadata=dict(data.get("metadata", {})),
            duration_s=float(data.get("duration_s", 0.0)),
            error=data.get("error"),
        )

    def copy(self) -> Trajectory:
        """A deep copy that shares no mutable object with this one."""
        return copy.deepcopy(self)
