"""A verifier: the response's last ``\\boxed{}`` (or ``<answer>`` block) equals the gold answer as a string."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel

from rstar_env.format import extract_answer
from rstar_env.trajectory import RewardResult


class ExactMatchOptions(BaseModel):
    case_sensitive: bool = False
    strip_spaces: bool = True


class ExactMatch:
    """Reward 1.0 on an exact (optionally case-insensitive) match, else 0.0; ``reason`` says which."""

    name: ClassVar[str] = "exact_match"
    options_model: ClassVar[type[BaseModel]] = ExactMatchOptions

    def __init__(self, case_sensitive: bool = False, strip_spaces: bool = True) -> None:
        self.case_sensitive = case_sensitive
        self.strip_spaces = strip_spaces

    async def score(self, response: str, answer: str) -> RewardResult:
        extracted = extract_answer(response)
        if extracted is None:
            return RewardResult(0.0, None, "no_answer")
        same = self._norm(extracted) == self._norm(answer)
        return RewardResult(1.0 if same else 0.0, extracted, "match" if same else "mismatch")

    def _norm(self, text: str) -> str:
        text = "".join(text.split()) if self.strip_spaces else text
        return text if self.case_sensitive else text.casefold()
