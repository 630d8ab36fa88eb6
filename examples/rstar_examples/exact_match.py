"""A reward plugin: the response's last ``\\boxed{}`` (or ``<answer>`` block) equals the gold answer as a string."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from rstar_env.plugin import RewardResult, extract_answer


class ExactMatchOptions(BaseModel):
    case_sensitive: bool = False
    strip_spaces: bool = True


class ExactMatch:
    """Reward 1.0 on an exact (optionally case-insensitive) match, else 0.0; ``reason`` says which.

    ``score`` is a plain ``def`` (cheap string work): the env runs it in a thread."""

    name: ClassVar[str] = "exact_match"
    options_model: ClassVar[type[BaseModel]] = ExactMatchOptions

    def __init__(self, options: ExactMatchOptions | None = None) -> None:
        self.options = options or ExactMatchOptions()

    def score(self, response: str, answer: str) -> RewardResult:
        extracted = extract_answer(response)
        if extracted is None:
            return RewardResult(0.0, None, "no_answer")
        same = self._norm(extracted) == self._norm(answer)
        return RewardResult(1.0 if same else 0.0, extracted, "match" if same else "mismatch")

    def _norm(self, text: str) -> str:
        text = "".join(text.split()) if self.options.strip_spaces else text
        return text if self.options.case_sensitive else text.casefold()
