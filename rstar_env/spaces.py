"""Gymnasium spaces for text observations and actions."""

from __future__ import annotations

import string
from typing import Any

import numpy as np
from gymnasium.spaces import Text

# Sampling draws from a readable alphabet; membership admits every character, because a model's action and a
# tool's output can hold any Unicode text (and the env must accept whatever it emits).
_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n" + "éπ√∑≤≥→∞αβγ中文"


class UnicodeText(Text):
    """A :class:`gymnasium.spaces.Text` whose ``contains`` accepts any ``str`` within the length bounds."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )
