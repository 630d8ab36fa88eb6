"""Answer normalisation for datasets: the integer an answer denotes, and its canonical text."""

from __future__ import annotations

import json
import re
from typing import Any

from rstar_env.data.numbers import parse_number


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
    ``"1/2"``, ``"1,2"``, ``"x=3"``, ``"50%"``, booleans. Numbers are read by
    :func:`rstar_env.data.numbers.parse_number`, the reader the ``math`` reward uses.
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
    if "=" in s:  # "x=3" names a variable's value; a dataset's answer field should hold the value alone
        return None
    # The reward's reader (rstar_env.data.numbers), so a dataset and the verifier agree on what a number is.
    number = parse_number(s)
    if number is None or number.percent or number.value.denominator != 1:
        return None
    return int(number.value)


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


