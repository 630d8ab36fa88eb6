"""Row formats: preprocessing for known dataset layouts (DAPO-Math-17k, AIME files)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .answers import integer_answer
from .records import DataError, Problem, _problem_text

RowTransform = Callable[[Problem, Mapping[str, Any], str], Problem]


@dataclass(frozen=True)
class RowFormat:
    """Preprocessing for a known dataset format.

    ``fields`` are tried before :data:`DEFAULT_FIELDS`; ``transform(problem, row, where)`` returns the cleaned
    problem (``where`` names the row, for error messages); ``detect(row)`` says whether ``row_format="auto"``
    applies it; ``hub`` is the HF hub dataset (``NAME[:CONFIG]``) that ``load_dataset(name)`` reads.
    """

    name: str
    fields: Mapping[str, tuple[str, ...]]
    transform: RowTransform
    detect: Callable[[Mapping[str, Any]], bool] | None = None
    hub: str | None = None


# The exact wording varies between copies of DAPO-Math-17k ($Answer / $ANSWER / \boxed{$Answer}, with or without
# "you do not need to use a \boxed command"), so match the shape, not the string.
_DAPO_PREFIX = re.compile(
    r"\A\s*Solve the following math problem[^\n]*?is the answer to the problem\.?[ \t]*(?:\n+|\Z)", re.IGNORECASE
)
_DAPO_PREFIX_LOOSE = re.compile(r"\A\s*Solve the following math problem[^\n]*\n+", re.IGNORECASE)
_DAPO_SUFFIXES = (
    re.compile(r"\n*[ \t]*Remember to put your answer on its own line after[^\n]*\s*\Z", re.IGNORECASE),
    re.compile(r"\s*Please reason step by step, and put your final answer within \\boxed\{\}\.?\s*\Z", re.IGNORECASE),
)


def strip_dapo_boilerplate(text: str) -> str:
    """The bare problem inside DAPO's prompt ``"Solve the following math problem ... Answer: $Answer ...\\n\\n
    {problem}\\n\\nRemember to put your answer on its own line after "Answer:"."``; other text is returned stripped."""
    s = text
    stripped = _DAPO_PREFIX.sub("", s, count=1)
    if stripped == s:
        stripped = _DAPO_PREFIX_LOOSE.sub("", s, count=1)
    s = stripped
    for suffix in _DAPO_SUFFIXES:
        s = suffix.sub("", s, count=1)
    return s.strip()


def _looks_like_dapo(row: Mapping[str, Any]) -> bool:
    if row.get("data_source") == "math_dapo":
        return True
    prompt = row.get("prompt")
    return _problem_text(prompt).lstrip().startswith("Solve the following math problem") if prompt else False


def _dapo_transform(problem: Problem, row: Mapping[str, Any], where: str) -> Problem:
    text = strip_dapo_boilerplate(problem.problem)
    if not text:
        raise DataError(f"{where}: nothing is left of the prompt after removing DAPO's instructions")
    meta = dict(problem.metadata)
    meta.pop("prompt", None)
    meta.pop("reward_model", None)
    for key in ("data_source", "ability"):
        if key in row:
            meta[key] = row[key]
    return Problem(text, None if problem.answer is None else problem.answer.strip(), problem.id, meta)


_AIME_URL = re.compile(r"AIME_(I{1,2})_Problems/Problem_(\d+)")


def _aime_id(row: Mapping[str, Any]) -> str | None:
    """``2024-I-3`` style ids from whatever the file offers: an ``ID`` column, a year plus an AoPS url, or a year
    plus part and problem-number columns."""
    for key in ("ID", "Id"):
        if row.get(key) not in (None, ""):
            return str(row[key])
    year = next((row[k] for k in ("year", "Year") if row.get(k) not in (None, "")), None)
    url = next((str(row[k]) for k in ("url", "URL", "link") if row.get(k)), "")
    m = _AIME_URL.search(url)
    if year is not None and m:
        return f"{year}-{m.group(1)}-{int(m.group(2))}"
    part = next((row[k] for k in ("part", "Part") if row.get(k) not in (None, "")), None)
    number = next(
        (row[k] for k in ("problem_number", "Problem Number", "number", "No") if row.get(k) not in (None, "")), None
    )
    if year is not None and number is not None:
        return f"{year}-{part}-{number}" if part else f"{year}-{number}"
    if year is not None and row.get("id") not in (None, ""):
        return f"{year}-{row['id']}"
    return None


def _aime_transform(problem: Problem, row: Mapping[str, Any], where: str) -> Problem:
    if problem.answer is None:  # kept unscored (allow_unscored)
        return Problem(problem.problem.strip(), None, _aime_id(row) or problem.id, dict(problem.metadata))
    value = integer_answer(problem.answer)
    if value is None or not 0 <= value <= 999:
        raise DataError(
            f"{where}: AIME answers are integers 0-999, got {problem.answer!r}; "
            "fix the row or load the file without row_format='aime'"
        )
    meta = dict(problem.metadata)
    if str(value) != problem.answer.strip():
        meta["raw_answer"] = problem.answer
    return Problem(problem.problem.strip(), str(value), _aime_id(row) or problem.id, meta)


ROW_FORMATS: dict[str, RowFormat] = {
    "dapo": RowFormat(
        name="dapo",
        fields={
            "problem": ("prompt", "problem"),
            "answer": ("reward_model.ground_truth", "solution", "answer"),
            "id": ("extra_info.index", "id"),
        },
        transform=_dapo_transform,
        detect=_looks_like_dapo,
        hub="BytedTsinghua-SIA/DAPO-Math-17k",
    ),
    "aime": RowFormat(
        name="aime",
        fields={"problem": ("problem", "Problem", "question", "Question"), "answer": ("answer", "Answer")},
        transform=_aime_transform,
        hub="HuggingFaceH4/aime_2024",
    ),
}
"""Built-in row formats. ``dapo``: DAPO-Math-17k (verl parquet: chat ``prompt``, ``reward_model.ground_truth``,
``extra_info.index``; also the processed copies with a string prompt and ``solution``). ``aime``: AIME files."""
