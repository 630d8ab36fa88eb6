"""Records: :class:`Problem`, :class:`Dataset`, :class:`DataError`, ids, and how a row's fields are read."""

from __future__ import annotations

import hashlib
import json
import math
import numbers
import os
import random
import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from .answers import _scalar_text


class DataError(ValueError):
    """A dataset could not be loaded or a row could not be read; the message names the row and the fix."""


# --------------------------------------------------------------------------------------------------- records


@dataclass
class Problem:
    """One problem: the text the model is given, the reference answer, a stable id, and free-form metadata.

    ``answer`` is ``None`` only for rows kept unscored (``load_dataset(..., allow_unscored=True)``).
    """

    problem: str
    answer: str | None
    id: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{"problem", "answer", "id", "metadata"}``; usable as ``env.reset(options=...)``."""
        return {"problem": self.problem, "answer": self.answer, "id": self.id, "metadata": dict(self.metadata)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Problem:
        """Inverse of :meth:`to_dict`; ``metadata`` may be absent. For arbitrary rows use :func:`load_dataset`."""
        missing = [key for key in ("problem", "answer", "id") if key not in data]
        if missing:
            raise DataError(
                f"Problem.from_dict needs keys problem, answer, id; missing {', '.join(missing)} "
                f"(got {', '.join(map(str, data)) or 'no keys'}). Use load_dataset(..., fields=...) to map other names."
            )
        return cls(
            problem=str(data["problem"]),
            answer=None if data["answer"] is None else str(data["answer"]),
            id=str(data["id"]),
            metadata=dict(data.get("metadata") or {}),
        )


class Dataset(Sequence[Problem]):
    """An ordered, immutable list of problems. Indexing with a slice gives a :class:`Dataset`.

    ``stats`` counts what loading saw: ``rows`` read, ``kept``, ``non_integer``, ``duplicates`` and ``bad_rows``
    dropped; ``bad_rows`` lists why each bad row was skipped (``on_bad_row="skip"``).
    """

    def __init__(
        self,
        problems: Iterable[Problem],
        *,
        name: str = "",
        stats: Mapping[str, int] | None = None,
        bad_rows: Sequence[str] = (),
    ):
        self._problems: list[Problem] = list(problems)
        self.name = name
        self.stats: dict[str, int] = dict(stats or {"rows": len(self._problems), "kept": len(self._problems)})
        self.bad_rows: list[str] = list(bad_rows)

    def __len__(self) -> int:
        return len(self._problems)

    @overload
    def __getitem__(self, index: int) -> Problem: ...

    @overload
    def __getitem__(self, index: slice) -> Dataset: ...

    def __getitem__(self, index: int | slice) -> Problem | Dataset:
        if isinstance(index, slice):
            return Dataset(self._problems[index], name=self.name)
        return self._problems[index]

    def __iter__(self) -> Iterator[Problem]:
        return iter(self._problems)

    def __repr__(self) -> str:
        return f"Dataset(name={self.name!r}, len={len(self)})"

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self._problems]

    def sample(self, rng: Any = None) -> Problem:
        """One problem drawn uniformly. ``rng``: a ``random.Random``, a ``numpy.random.Generator``, an int seed, or
        ``None`` (the ``random`` module's global state)."""
        if not self._problems:
            raise DataError(f"cannot sample from the empty dataset {self.name!r}")
        n = len(self._problems)
        if rng is None:
            return self._problems[random.randrange(n)]
        if isinstance(rng, int):
            rng = random.Random(rng)
        if hasattr(rng, "integers"):  # numpy Generator; numpy itself is never imported here
            return self._problems[int(rng.integers(n))]
        return self._problems[rng.randrange(n)]

    def exclude(self, ids: Iterable[str]) -> Dataset:
        """The problems whose id is not in ``ids``, in order: what a resumed evaluation still has to do."""
        done = set(ids)
        return Dataset((p for p in self._problems if p.id not in done), name=self.name)

    def to_list(self) -> list[Problem]:
        return list(self._problems)

    def save_jsonl(self, path: str | os.PathLike[str]) -> Path:
        return save_jsonl(self._problems, path)


def save_jsonl(problems: Iterable[Problem | Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """Write one ``Problem.to_dict()`` per line (UTF-8, parents created) and return the path.

    The file is written beside the target and renamed into place, so a crash never leaves half a dataset.
    :func:`load_dataset` reads it back unchanged.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for item in problems:
            row = item.to_dict() if isinstance(item, Problem) else Problem.from_dict(item).to_dict()
            fh.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    tmp.replace(target)
    return target


# ------------------------------------------------------------------------------------------- normalisation

_WS = re.compile(r"\s+")


def normalize_problem_text(text: str) -> str:
    """The key for de-duplication and hashed ids: NFKC, case-folded, whitespace collapsed."""
    return _WS.sub(" ", unicodedata.normalize("NFKC", text)).strip().casefold()


def stable_id(problem_text: str) -> str:
    """``p-`` + 16 hex digits of the SHA-256 of the normalised text: the same across runs and machines."""
    digest = hashlib.sha256(normalize_problem_text(problem_text).encode("utf-8")).hexdigest()
    return f"p-{digest[:16]}"


# ------------------------------------------------------------------------------------------- field mapping

DEFAULT_FIELDS: dict[str, tuple[str, ...]] = {
    "problem": ("problem", "question", "prompt", "Problem", "Question", "query", "input"),
    "answer": ("answer", "final_answer", "ground_truth", "label", "Answer", "reward_model.ground_truth"),
    "id": ("id", "uid", "idx", "ID", "unique_id", "extra_info.index", "index"),
}
"""Keys tried, in order, when ``fields`` does not name one. ``solution`` is deliberately absent: in most sets it
holds a worked solution, not the final answer."""

_MISSING = object()


def _lookup(row: Mapping[str, Any], key: str) -> Any:
    """``row[key]``, else the dotted path through nested mappings (and list indices): ``reward_model.ground_truth``."""
    if key in row:
        return row[key]
    node: Any = row
    for part in key.split("."):
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, (list, tuple)) and part.lstrip("-").isdigit() and -len(node) <= int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _problem_text(value: Any) -> str:
    """Text of a problem field; a chat list (``[{"role": "user", "content": ...}]``) gives its last user turn."""
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, Mapping) for m in value):
        users = [m for m in value if m.get("role", "user") == "user"]
        chosen = users[-1] if users else value[-1]
        return str(chosen.get("content", ""))
    return _scalar_text(value)


def _describe(value: Any) -> str:
    if value is Ellipsis:
        return "`...` (Python's Ellipsis: a placeholder left in the row?)"
    shown = repr(value)
    return f"a {type(value).__name__} ({shown[:60] + '...' if len(shown) > 60 else shown})"


def field_text(value: Any, where: str, name: str, key: str) -> str:
    """The text of a row's ``answer`` or ``id`` field: a string as is, a number as its text (``42`` -> ``"42"``,
    ``12.0`` -> ``"12"``), a one-element list as its element. Anything else (a bool, ``None``, Python's ``...``, a
    dict, a longer list, an object) is refused with a :class:`DataError` naming the row and the field: turned into
    text, it would become a reference answer that nothing matches (``"Ellipsis"``)."""
    if isinstance(value, (list, tuple)) and len(value) == 1:
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            raise DataError(f"{where}: the {name} field {key!r} is {value!r}, not a usable {name}; fix or drop it")
        return _scalar_text(int(value) if isinstance(value, float) and value.is_integer() else value)
    raise DataError(
        f"{where}: the {name} field {key!r} is {_describe(value)}; an {name} must be a string or a number (or a "
        "list holding one): fix or drop that row"
    )


def problem_field_text(value: Any, where: str, key: str) -> str:
    """The text of a row's ``problem`` field: a string, or a chat list (``[{"role", "content"}, ...]``) whose last
    user turn has string content. Anything else is refused with a :class:`DataError` naming the row and the field."""
    chosen, what = value, "problem"
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, Mapping) for m in value):
        users = [m for m in value if m.get("role", "user") == "user"]
        chosen, what = (users[-1] if users else value[-1]).get("content", ""), "problem's last user message"
    if isinstance(chosen, str):
        return chosen
    raise DataError(
        f"{where}: the {what} (field {key!r}) is {_describe(chosen)}; a problem must be a string (or a chat list "
        "of {'role', 'content'} messages): fix or drop that row"
    )


def _available(row: Mapping[str, Any]) -> str:
    keys: list[str] = []
    for key, value in row.items():
        keys.append(str(key))
        if isinstance(value, Mapping):
            keys.extend(f"{key}.{sub}" for sub in value)
    return ", ".join(keys) if keys else "none"


def check_row(row: Mapping[str, Any], where: str) -> None:
    """Refuse a ``{problem, answer[, id]}`` row given in memory (reset options) whose fields are of the wrong type,
    as :func:`~rstar_env.data.load_dataset` does for a dataset's rows; a missing or ``None`` field is left to the
    caller (``answer: None`` is an unscored episode)."""
    if row.get("problem") is not None:
        problem_field_text(row["problem"], where, "problem")
    for name in ("answer", "id"):
        if row.get(name) is not None:
            field_text(row[name], where, name, name)
