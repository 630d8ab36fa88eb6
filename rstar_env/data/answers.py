"""Answer normalisation for datasets: the integer an answer denotes, and its canonical text."""

from __future__ import annotations

import json
import re
from typing import Any

from rstar_env.data.numbers import parse_number, strip_presentation


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
    # The reward's reader (rstar_env.data.numbers), so a dataset and the reward agree on what a number is.
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


_TEXT_WRAPPER = re.compile(
    r"^\\(?:text|textbf|textit|textrm|textsf|textnormal|mathrm|mathbf|mathit|mathsf|mbox|emph)\s*\{([^{}]*)\}$"
)
_PHRASE = re.compile(r"[A-Za-z]+(?:[ '-][A-Za-z]+)*")
_DIGIT = re.compile(r"\d")
_SHORT_WORDS = frozenset({"yes", "no", "odd", "all", "none", "true", "false"})
"""Answers of fewer than four letters that are words, not products of variables (``abc``) or labels (``AB``)."""
_MATH_WORDS = frozenset(
    {
        "sqrt",
        "frac",
        "dfrac",
        "cdot",
        "times",
        "infty",
        "infinity",
        "sinh",
        "cosh",
        "tanh",
        "arcsin",
        "arccos",
        "arctan",
        "log",
        "exp",
        "left",
        "right",
        "pmatrix",
        "begin",
        "end",
        "text",
        "mathrm",
        "boxed",
    }
)


def text_answer(answer: str) -> str | None:
    """The answer as lower-case words when it is a word or a phrase (``Yes``, ``\\text{odd}``, ``**No**.``,
    ``$\\text{Evelyn}$``), else ``None``.

    Only answers whose case carries no meaning qualify: ``yes``/``no``-like words, or a phrase with a word of
    four letters or more, not all capitals, that is not a LaTeX command's name. ``abc`` (a product), ``ABCD`` (a
    polygon) and single letters (a variable, a choice) are left to math-verify, where case matters.
    """
    answer = str(answer)
    if len(answer) > 400 or _DIGIT.search(answer) is not None:  # most answers: a number is never a phrase
        return None
    s = strip_presentation(answer.strip())
    for _ in range(4):  # a few layers: "$\text{Yes}$.", "**\textbf{No}**"
        before = s
        s = s.strip().rstrip(".").strip()
        for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ('"', '"'), ("'", "'")):
            if len(s) > len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)]
        wrapped = _TEXT_WRAPPER.match(s.strip())
        if wrapped:
            s = wrapped.group(1)
        if s == before:
            break
    s = " ".join(s.split())
    if not _PHRASE.fullmatch(s):
        return None
    phrase = s.lower()
    if phrase in _SHORT_WORDS:
        return phrase
    if any(len(w) >= 4 and not w.isupper() and w.lower() not in _MATH_WORDS for w in re.split(r"[ '-]", s)):
        return phrase
    return None


def _scalar_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, (list, tuple)) and len(value) == 1:
        return _scalar_text(value[0])
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, ensure_ascii=False, default=str)
    return str(value)
