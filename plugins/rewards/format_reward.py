"""The ``format`` reward: does the final response state its answer the way the prompt asks?

The rStar2-Agent prompt asks for exactly one ``<answer>...</answer>`` block with the result in ``\\boxed{}``.
The gold answer is ignored: this scores form, not correctness. The scale:

============================================  =====  ===================
response                                      score  reason
============================================  =====  ===================
one answer block, a non-empty ``\\boxed{}``    1.0    ``ok``
several answer blocks, the last one boxed     0.5    ``multiple_blocks``
answer block(s), the last one not boxed       0.25   ``no_boxed``
no answer block, but a ``\\boxed{}``           0.25   ``no_block``
neither                                       0.0    ``no_answer``
============================================  =====  ===================

With ``penalty=True`` the reward is ``score - 1`` (0 for a compliant answer, down to -1), for adding to a
correctness reward as a penalty term. An unclosed ``<answer>`` does not count as a block.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from rstar_env.format import answer_blocks, extract_answer, last_boxed
from rstar_env.plugins import plugin_options
from rstar_env.trajectory import RewardResult

FORMAT_SCORES: dict[str, float] = {
    "ok": 1.0,
    "multiple_blocks": 0.5,
    "no_boxed": 0.25,
    "no_block": 0.25,
    "no_answer": 0.0,
}


def format_verdict(response: str) -> str:
    """The ``reason`` code of the table in the module docstring."""
    blocks = answer_blocks(response)
    if blocks:
        inner = last_boxed(blocks[-1])
        if inner is None or not inner.strip():
            return "no_boxed"
        return "ok" if len(blocks) == 1 else "multiple_blocks"
    inner = last_boxed(response)
    return "no_block" if inner is not None and inner.strip() else "no_answer"


class FormatOptions(BaseModel):
    """The ``format`` reward's options, checked when a config loads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    penalty: bool = False
    """Score ``score - 1`` (0 for a compliant answer, down to -1), to add to a correctness reward as a penalty."""


class FormatReward:
    """Answer-format compliance in [0, 1] (or [-1, 0] with ``penalty=True``); see the module docstring."""

    name: ClassVar[str] = "format"
    options_model: ClassVar[type[BaseModel]] = FormatOptions

    def __init__(self, options: FormatOptions | None = None, **settings: Any) -> None:
        self.options = plugin_options(FormatOptions, options, settings)
        self.penalty = self.options.penalty

    async def score(self, response: str, answer: str = "") -> RewardResult:
        return self.score_sync(response, answer)

    async def score_batch(self, pairs: list[tuple[str, str]]) -> list[RewardResult]:
        return [self.score_sync(response, answer) for response, answer in pairs]

    def score_sync(self, response: str, answer: str = "") -> RewardResult:
        """Blocking form of ``score`` (pure string work, microseconds)."""
        reason = format_verdict(response)
        value = FORMAT_SCORES[reason]
        return RewardResult(value - 1.0 if self.penalty else value, extract_answer(response), reason)

    async def aclose(self) -> None:
        """Nothing to release; present so every built-in reward can be closed the same way."""

    def close(self) -> None:
        """Nothing to release; present so every built-in reward can be closed the same way."""
