"""Answer normalisation for datasets: the integer an answer denotes, and its canonical text."""

from __future__ import annotations

import json
import re
from typing import Any


def _match_brace(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


_WRAPPER = re.compile(r"\\(?:boxed|fbox|text|mathrm|textbf)\s*\{")
_INT = re.compile(r"[+-]?\d+")
_INT_GROUPED = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+")
_INT_POINT_ZERO = re.compile(r"([+-]?\d+)\.0*")


def _unwrap(text: str) -> str:
    s = text.strip()
    while True:
        before = s
        s = s.strip().rstrip(".").strip()
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)].strip()
        m = _WRAPPER.match(s)
        if m and _match_brace(s, m.end() - 1) == len(s) - 1:
            s = s[m.end() : -1]
        if s == before:
            return s


def integer_answer(answer: Any) -> int | None:
    """The integer an answer denotes, or ``None``.

    Accepts ``42``, ``"042"``, ``"-7"``, ``"1,000"``, ``"1{,}000"``, ``"12.0"``, ``"$\\boxed{12}$"``; rejects
    ``"1/2"``, ``"1,2"``, ``"x=3"``, booleans.
    """
    if isinstance(answer, bool):
        return None
    if isinstance(answer, int):
        return answer
    if isinstance(answer, float):
        return int(answer) if answer.is_integer() else None
    if not isinstance(answer, str):
        return None
    s = _unwrap(answer)
    s = s.replace("{,}", ",").replace("\\,", "").replace("\\!", "").replace("\u2212", "-").replace(" ", "")
    if _INT.fullmatch(s):
        return int(s)
    if _INT_GROUPED.fullmatch(s):
        return int(s.replace(",", ""))
    m = _INT_POINT_ZERO.fullmatch(s)
    if m:
        return int(m.group(1))
    return None


def normalize_answer(answer: Any) -> str:
    """``str(int)`` when the answer denotes an integer (``"042"`` -> ``"42"``), else the stripped text."""
    as_int = integer_answer(answer)
    if as_int is not None:
        return str(as_int)
    return _scalar_text(answer).strip()


def _scalar_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return _scalar_text(value[0])
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)


