"""Datasets: math problems with reference answers, from files, the HF hub, memory, or a seeded generator.

Every source becomes a :class:`Dataset` of :class:`Problem` records ``{problem, answer, id, metadata}``::

    load_dataset("train.jsonl")                                  # .jsonl / .json / .parquet (+ .gz for JSON)
    load_dataset("dapo-math-17k.parquet")                        # DAPO rows are recognised; see PRESETS
    load_dataset("hf:HuggingFaceH4/aime_2024", preset="aime")    # HF hub (needs ``datasets``)
    load_dataset("arithmetic:level=2,n=200,seed=0")             # generated offline, no download
    load_dataset([{"question": "1+1?", "answer": "2"}])          # in memory: a list of dicts
    load_dataset(datasets.load_dataset("json", data_files=...))  # a datasets.Dataset / IterableDataset / DatasetDict
    load_dataset("aime")                                         # a preset's own data (PRESETS; from the HF hub)

Source syntax (a string; a :class:`os.PathLike` is always a file):

* a path ending in ``.jsonl``, ``.json``, ``.parquet``, ``.jsonl.gz`` or ``.json.gz``: a local file. A ``.json``
  file holds a list of objects, or an object with a ``"data"`` list, or one list per split
  (``{"train": [...], "test": [...]}``, chosen by ``split``).
* ``[gen:]KIND[:key=value,...]`` with KIND ``arithmetic``, ``word`` or ``mix``: a generated set; keys ``n``
  (default 1000), ``level`` (``1``..``5``, ``mixed`` or a range ``2-4``; default 1) and ``seed`` (default 0).
  E.g. ``"arithmetic"``, ``"word:level=3"``, ``"gen:mix:level=mixed,n=5000,seed=7"``.
* ``hf:NAME[:CONFIG]`` or a bare ``owner/name[:CONFIG]`` that is not an existing path: a HF hub dataset, loaded
  with ``datasets.load_dataset(NAME, CONFIG, split=split)``.
* a preset name (``dapo``, ``aime``): that preset's hub dataset (:attr:`Preset.hub`), read with the preset.

Rows without an answer are bad rows unless ``allow_unscored=True`` keeps them (answer ``None``: the env runs them
unscored, reward 0, ``info["unscored"]``). A bad row (no problem, no answer, a line that is not JSON, ...) stops
loading with an error that names it, or, with ``on_bad_row="skip"``, is skipped and counted:
``dataset.stats["bad_rows"]`` and the reasons in ``dataset.bad_rows``.

Ids are stable (the row's own id, or a hash of the normalised problem text; generated ids encode the spec and the
index), so an evaluation can resume by skipping the ids it has finished. ``import rstar_env.data`` uses only the
standard library; ``pyarrow`` and ``datasets`` (the ``data`` extra) are imported when a source needs them.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import math
import os
import random
import re
import sys
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import IO, Any, Literal, overload

__all__ = [
    "DEFAULT_FIELDS",
    "GENERATED_KINDS",
    "PRESETS",
    "WORD_TEMPLATES",
    "DataError",
    "Dataset",
    "Preset",
    "Problem",
    "generate_problems",
    "integer_answer",
    "load_dataset",
    "normalize_answer",
    "normalize_problem_text",
    "parse_generated_spec",
    "save_jsonl",
    "stable_id",
    "strip_dapo_boilerplate",
]

GeneratedKind = Literal["arithmetic", "word", "mix"]
GENERATED_KINDS: tuple[str, ...] = ("arithmetic", "word", "mix")
LevelSpec = int | str | tuple[int, int]
"""A generator difficulty: ``1``..``5``, ``"mixed"`` (uniform over 1..5), or an inclusive range ``(lo, hi)``
(also written ``"lo-hi"``)."""

_log = logging.getLogger("rstar_env.data")
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".jsonl.gz", ".json.gz")
_INSTALL_HINT = "pip install 'rstar-env[data]'"


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


def _available(row: Mapping[str, Any]) -> str:
    keys: list[str] = []
    for key, value in row.items():
        keys.append(str(key))
        if isinstance(value, Mapping):
            keys.extend(f"{key}.{sub}" for sub in value)
    return ", ".join(keys) if keys else "none"


# ------------------------------------------------------------------------------------------------ presets

PresetTransform = Callable[[Problem, Mapping[str, Any], str], Problem]


@dataclass(frozen=True)
class Preset:
    """Preprocessing for a known dataset format.

    ``fields`` are tried before :data:`DEFAULT_FIELDS`; ``transform(problem, row, where)`` returns the cleaned
    problem (``where`` names the row, for error messages); ``detect(row)`` says whether ``preset="auto"`` applies it;
    ``hub`` is the HF hub dataset (``NAME[:CONFIG]``) that ``load_dataset(name)`` reads.
    """

    name: str
    fields: Mapping[str, tuple[str, ...]]
    transform: PresetTransform
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
            "fix the row or load the file without preset='aime'"
        )
    meta = dict(problem.metadata)
    if str(value) != problem.answer.strip():
        meta["raw_answer"] = problem.answer
    return Problem(problem.problem.strip(), str(value), _aime_id(row) or problem.id, meta)


PRESETS: dict[str, Preset] = {
    "dapo": Preset(
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
    "aime": Preset(
        name="aime",
        fields={"problem": ("problem", "Problem", "question", "Question"), "answer": ("answer", "Answer")},
        transform=_aime_transform,
        hub="HuggingFaceH4/aime_2024",
    ),
}
"""Built-in presets. ``dapo``: DAPO-Math-17k (verl parquet: chat ``prompt``, ``reward_model.ground_truth``,
``extra_info.index``; also the processed copies with a string prompt and ``solution``). ``aime``: AIME files."""


# ------------------------------------------------------------------------------------------------ readers

class _BadRow(str):
    """What a reader yields in place of a row it could not read (the reason), so loading can skip it."""


RowStream = Iterator[tuple[str, Mapping[str, Any] | _BadRow]]


def _open_text(path: Path) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def _read_jsonl(path: Path) -> RowStream:
    with _open_text(path) as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path} line {lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, _BadRow(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})")
                continue
            if not isinstance(row, Mapping):
                yield where, _BadRow(f"{where}: expected a JSON object per line, got {type(row).__name__}")
                continue
            yield where, row


def _read_json(path: Path, split: str) -> RowStream:
    with _open_text(path) as fh:
        try:
            data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise DataError(
                f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); a file with one object "
                "per line must be named .jsonl"
            ) from None
    if isinstance(data, Mapping):
        for key in ("data", split):
            if isinstance(data.get(key), list):
                data = data[key]
                break
        else:
            raise DataError(
                f"{path}: a .json dataset is a list of objects, or an object with a 'data' (or {split!r}) list; "
                f"this object has keys {', '.join(map(str, data)) or 'none'}"
            )
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a list of objects, got {type(data).__name__}")
    for i, row in enumerate(data):
        where = f"{path} item {i}"
        if not isinstance(row, Mapping):
            yield where, _BadRow(f"{where}: expected an object, got {type(row).__name__}")
            continue
        yield where, row


def _read_parquet(path: Path) -> RowStream:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            f"reading {path.name} needs pyarrow, which is not installed: {_INSTALL_HINT} "
            "(or convert the file to .jsonl)"
        ) from None
    row_no = 0
    # Batches keep memory flat on big files (DAPO's parquet repeats each problem ~100 times).
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            row_no += 1
            yield f"{path} row {row_no}", row


def _read_hf(name: str, config: str | None, split: str) -> RowStream:
    try:
        import datasets as hf_datasets
    except ImportError:
        raise ImportError(
            f"loading the hub dataset {name!r} needs the HF `datasets` package: {_INSTALL_HINT}; "
            "or download the data and pass a local .jsonl/.json/.parquet path"
        ) from None
    try:
        ds = hf_datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # the hub raises many types (ConnectionError, DatasetNotFoundError, ValueError, ...)
        raise DataError(
            f"could not load the hub dataset {name!r} (config {config!r}, split {split!r}): "
            f"{type(exc).__name__}: {exc}. If the hub is unreachable (offline machine, no HF_TOKEN for a gated set), "
            "download the data elsewhere and pass a local .jsonl/.json/.parquet path; "
            "otherwise check the name and split"
        ) from exc
    for i, row in enumerate(ds):
        yield f"hub dataset {name} split {split} row {i}", row


def _read_memory(rows: Iterable[Any], name: str = "") -> RowStream:
    prefix = f"{name} " if name else ""
    for i, row in enumerate(rows):
        if isinstance(row, Problem):
            row = row.to_dict()
        if not isinstance(row, Mapping):
            yield f"{prefix}row {i}", _BadRow(f"{prefix}row {i}: expected a dict or Problem, got {type(row).__name__}")
            continue
        yield f"{prefix}row {i}", row


def _hf_object_rows(source: Any, split: str) -> tuple[str, RowStream] | None:
    """Rows of a ``datasets`` object (``Dataset``, ``IterableDataset``, or a split of a ``DatasetDict``); ``None``
    for anything else. ``datasets`` is never imported here: an object of it means the caller has imported it."""
    hf = sys.modules.get("datasets")
    kinds = {n: getattr(hf, n, None) for n in ("Dataset", "IterableDataset", "DatasetDict", "IterableDatasetDict")}
    kinds = {n: t for n, t in kinds.items() if isinstance(t, type)}
    if not isinstance(source, tuple(kinds.values())):
        return None
    if isinstance(source, tuple(t for n, t in kinds.items() if n.endswith("Dict"))):
        if split not in source:
            raise DataError(
                f"the {type(source).__name__} has no split {split!r}; its splits are {', '.join(source) or 'none'}: "
                "pass split=... (dataset.split in a config)"
            )
        source = source[split]
    info = getattr(source, "info", None)
    label = getattr(info, "dataset_name", None)
    name = f"datasets.{type(source).__name__}" + (f" {label}" if label else "")
    return name, _read_memory(source, name)


# --------------------------------------------------------------------------------------------- load_dataset


def parse_generated_spec(spec: str) -> dict[str, Any] | None:
    """``"[gen:]KIND[:key=value,...]"`` -> ``{"kind", "n", "level", "seed"}``; ``None`` if not a generated spec.

    Raises :class:`DataError` for a generated spec with an unknown key or a bad value.
    """
    text = spec.strip()
    explicit = text.startswith("gen:")
    if explicit:
        text = text[4:]
    kind, _, params = text.partition(":")
    if kind not in GENERATED_KINDS:
        if explicit:
            raise DataError(f"unknown generated set {kind!r} in {spec!r}: choose one of {', '.join(GENERATED_KINDS)}")
        return None
    out: dict[str, Any] = {"kind": kind, "n": 1000, "level": 1, "seed": 0}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in ("n", "level", "seed"):
            raise DataError(f"bad parameter {item!r} in {spec!r}: expected n=INT, level=1..5|mixed|LO-HI, seed=INT")
        if key == "level":
            out["level"] = _parse_level(value, spec)
        else:
            try:
                out[key] = int(value)
            except ValueError:
                raise DataError(f"bad {key}={value!r} in {spec!r}: expected an integer") from None
    return out


def _parse_level(value: Any, context: str) -> int | str | tuple[int, int]:
    if isinstance(value, bool):
        raise DataError(f"bad level {value!r} in {context}")
    if isinstance(value, int):
        levels: tuple[int, int] = (value, value)
    elif isinstance(value, tuple) and len(value) == 2:
        levels = (int(value[0]), int(value[1]))
    elif isinstance(value, str) and value.strip() == "mixed":
        return "mixed"
    elif isinstance(value, str) and re.fullmatch(r"\s*\d\s*(-\s*\d\s*)?", value):
        lo, _, hi = value.partition("-")
        levels = (int(lo), int(hi or lo))
    else:
        raise DataError(f"bad level {value!r} in {context}: expected 1..5, 'mixed' or a range like '2-4'")
    if not 1 <= levels[0] <= levels[1] <= 5:
        raise DataError(f"bad level {value!r} in {context}: levels run from 1 to 5")
    return levels[0] if levels[0] == levels[1] else levels


def _resolve_source(source: Any, split: str) -> tuple[str, RowStream | list[Problem]]:
    hf_rows = _hf_object_rows(source, split)
    if hf_rows is not None:
        return hf_rows
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes, Mapping)):
        return "memory", _read_memory(source)
    if isinstance(source, os.PathLike):
        return str(source), _read_file(Path(source), split)
    if not isinstance(source, str):
        raise DataError(
            f"dataset source must be a path (str or Path), a generated-set spec, a preset or hub name, a list of "
            f"dicts, or a datasets.Dataset / IterableDataset; got {type(source).__name__}"
        )
    spec = parse_generated_spec(source)
    if spec is not None:
        problems = generate_problems(spec["n"], kind=spec["kind"], level=spec["level"], seed=spec["seed"])
        return source, problems
    if source.startswith("hf:"):
        name, _, config = source[3:].partition(":")
        return source, _read_hf(name, config or None, split)
    path = Path(source).expanduser()
    if source.lower().endswith(_FILE_SUFFIXES) or path.exists():
        return source, _read_file(path, split)
    preset = PRESETS.get(source)
    if preset is not None and preset.hub is not None:
        name, _, config = preset.hub.partition(":")
        return source, _read_hf(name, config or None, split)
    if "/" in source and not source.startswith((".", "/", "~")):
        name, _, config = source.partition(":")
        return source, _read_hf(name, config or None, split)
    raise DataError(
        f"unknown dataset source {source!r}: not an existing file, not a generated set ({', '.join(GENERATED_KINDS)}, "
        f"e.g. 'arithmetic:level=2,n=200'), not a preset ({', '.join(PRESETS)}), and not a hub name ('owner/name' or "
        "'hf:name')"
    )


def _read_file(path: Path, split: str) -> RowStream:
    if not path.exists():
        raise FileNotFoundError(
            f"dataset file not found: {path} (resolved to {path.resolve()}); check the path, or use a generated set "
            "such as 'arithmetic' for an offline run"
        )
    if path.is_dir():
        raise DataError(f"{path} is a directory: pass one .jsonl, .json or .parquet file inside it")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        return _read_jsonl(path)
    if name.endswith((".json", ".json.gz")):
        return _read_json(path, split)
    if name.endswith(".parquet"):
        return _read_parquet(path)
    raise DataError(f"{path}: unsupported file type; use .jsonl, .json, .parquet (or .jsonl.gz / .json.gz)")


def _extract(
    row: Mapping[str, Any], where: str, fields: Mapping[str, str], preset: Preset | None, allow_unscored: bool = False
) -> Problem:
    found: dict[str, Any] = {}
    used_top: set[str] = set()
    for name in ("problem", "answer", "id"):
        if name in fields:
            value = _lookup(row, fields[name])
            if value is _MISSING:
                raise DataError(
                    f"{where}: has no field {fields[name]!r} (mapped to {name!r} by fields=); "
                    f"its fields are: {_available(row)}"
                )
            key = fields[name]
        else:
            candidates = (*(preset.fields.get(name, ()) if preset else ()), *DEFAULT_FIELDS[name])
            key, value = next(((k, v) for k in candidates if (v := _lookup(row, k)) is not _MISSING), ("", _MISSING))
            if value is _MISSING:
                if name == "id" or (name == "answer" and allow_unscored):
                    continue
                tried = ", ".join(dict.fromkeys(candidates))
                hint = " (or allow_unscored=True to keep rows without one, unscored)" if name == "answer" else ""
                raise DataError(
                    f"{where}: no {name} field (tried {tried}); its fields are: {_available(row)}. "
                    f"Name the right one with fields={{{name!r}: '<key>'}}{hint}"
                )
        if value is None or (name != "id" and isinstance(value, str) and not value.strip()):
            if name == "answer" and allow_unscored:
                continue
            hint = "; or allow_unscored=True keeps it, unscored" if name == "answer" else ""
            raise DataError(f"{where}: the {name} field {key!r} is empty; fix or drop that row{hint}")
        found[name] = value
        used_top.add(key if key in row else key.split(".")[0])
    text = _problem_text(found["problem"])
    if not text.strip():
        raise DataError(f"{where}: the problem text is empty; fix or drop that row")
    metadata = {str(k): v for k, v in row.items() if k not in used_top and k != "metadata"}
    if isinstance(row.get("metadata"), Mapping):
        metadata.update(row["metadata"])
    problem = Problem(
        problem=text,
        answer=_scalar_text(found["answer"]).strip() if "answer" in found else None,
        id=_scalar_text(found["id"]) if "id" in found else "",
        metadata=metadata,
    )
    if preset is not None:
        problem = preset.transform(problem, row, where)
    if not problem.id:
        problem.id = stable_id(problem.problem)
    return problem


def load_dataset(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any] | Problem] | Dataset | Any,
    *,
    split: str = "train",
    fields: Mapping[str, str] | None = None,
    preset: str | Preset | None = "auto",
    integer_answers_only: bool = False,
    dedup: bool = True,
    limit: int | None = None,
    shuffle: bool = False,
    seed: int = 0,
    on_bad_row: Literal["error", "skip"] = "error",
    allow_unscored: bool = False,
) -> Dataset:
    """Load problems from ``source`` (see the module docstring for the syntax) as a :class:`Dataset`.

    - ``split``: the HF split, or the key of a per-split ``.json`` object; other files ignore it.
    - ``fields``: ``{"problem": key, "answer": key, "id": key}``, any subset; keys may be dotted paths into nested
      objects (``"reward_model.ground_truth"``). Unnamed fields try :data:`DEFAULT_FIELDS` (after the preset's).
      A chat list (``[{"role", "content"}, ...]``) as the problem gives its last user message. Rows without an id
      get :func:`stable_id` of the problem text. Unused top-level keys of a row go to ``metadata``.
    - ``preset``: a name in :data:`PRESETS` (``"dapo"``, ``"aime"``), a :class:`Preset`, ``"auto"`` (the
      default: rows that look like DAPO get the ``dapo`` preset, others none) or ``None``.
    - ``integer_answers_only``: keep rows whose answer denotes an integer (:func:`integer_answer`), with the answer
      rewritten to canonical form (``"042"`` -> ``"42"``; the original kept in ``metadata["raw_answer"]``).
    - ``dedup``: keep the first row of each :func:`normalize_problem_text`. Generated sets are not de-duplicated
      again (the generator avoids repeats where the level allows), so their ``n`` is exact.
    - ``shuffle``/``seed``: shuffle deterministically before ``limit`` keeps the first ``limit`` problems.

    - ``on_bad_row``: ``"error"`` (the default) stops at the first row that cannot be read, naming it;
      ``"skip"`` skips such rows, counts them in ``stats["bad_rows"]``, keeps each reason in ``bad_rows`` and logs a
      summary (logger ``rstar_env.data``).
    - ``allow_unscored``: keep rows with no answer (missing, ``None`` or empty) with ``answer=None``; the env runs
      them unscored. Without it such a row is a bad row.

    ``source`` may also be a ``datasets.Dataset``, ``IterableDataset`` or ``DatasetDict`` (its ``split``), or any
    iterable of dicts.

    Ids are made unique in order: a repeated id gets ``#2``, ``#3``, ... so resuming by id is safe.

    Raises ``FileNotFoundError`` for a missing file, ``ImportError`` naming the extra for a missing optional
    package, and :class:`DataError` for a row that cannot be read (naming the row and its fields) or a source that
    yields no problems.
    """
    if isinstance(source, Dataset) and fields is None and not (integer_answers_only or shuffle or limit):
        return source
    if limit is not None and limit < 0:
        raise DataError(f"limit must be >= 0 or None, got {limit}")
    if on_bad_row not in ("error", "skip"):
        raise DataError(f"on_bad_row must be 'error' or 'skip', got {on_bad_row!r}")
    if fields is not None:
        unknown = set(fields) - {"problem", "answer", "id"}
        if unknown:
            raise DataError(f"fields= maps only 'problem', 'answer' and 'id'; unknown: {', '.join(sorted(unknown))}")
    chosen: Preset | None
    if preset is None or preset == "none":
        chosen = None
    elif isinstance(preset, Preset):
        chosen = preset
    elif preset == "auto":
        chosen = None
    elif preset in PRESETS:
        chosen = PRESETS[preset]
    else:
        raise DataError(f"unknown preset {preset!r}: choose one of {', '.join(PRESETS)}, 'auto' or None")
    auto = preset == "auto"
    if auto and isinstance(source, str) and source in PRESETS and not Path(source).exists():
        chosen, auto = PRESETS[source], False  # a preset's own data is read with that preset

    name, rows = _resolve_source(source, split)
    generated = isinstance(rows, list)
    stats = {"rows": 0, "kept": 0, "non_integer": 0, "duplicates": 0, "bad_rows": 0}
    kept: list[Problem] = []
    bad: list[str] = []
    seen: set[str] = set()
    stop_early = limit is not None and not shuffle

    stream: Iterable[tuple[str, Any]] = ((p.id, p) for p in rows) if generated else rows
    for where, item in stream:
        stats["rows"] += 1
        if generated:
            problem = item
        else:
            try:
                if isinstance(item, _BadRow):
                    raise DataError(str(item))
                row_preset = chosen
                if auto and PRESETS["dapo"].detect is not None and PRESETS["dapo"].detect(item):
                    row_preset = PRESETS["dapo"]
                problem = _extract(item, where, fields or {}, row_preset, allow_unscored)
            except DataError as exc:
                if on_bad_row == "error":
                    raise DataError(f"{exc} (on_bad_row='skip' skips such rows and counts them)") from None
                stats["bad_rows"] += 1
                bad.append(str(exc))
                continue
        if integer_answers_only and problem.answer is not None:
            value = integer_answer(problem.answer)
            if value is None:
                stats["non_integer"] += 1
                continue
            if str(value) != problem.answer:
                problem.metadata.setdefault("raw_answer", problem.answer)
                problem.answer = str(value)
        if dedup and not generated:
            key = normalize_problem_text(problem.problem)
            if key in seen:
                stats["duplicates"] += 1
                continue
            seen.add(key)
        kept.append(problem)
        if stop_early and len(kept) >= (limit or 0):
            break

    if shuffle:
        random.Random(seed).shuffle(kept)
    if limit is not None:
        kept = kept[: max(limit, 0)]
    _make_ids_unique(kept)
    stats["kept"] = len(kept)
    if bad:
        shown = "; ".join(bad[:3]) + ("; ..." if len(bad) > 3 else "")
        _log.warning("dataset %r: skipped %d bad row(s) of %d: %s", name, len(bad), stats["rows"], shown)
    if not kept and limit != 0:
        raise DataError(
            f"dataset {name!r} has no problems left: {stats['rows']} rows read, {stats['non_integer']} dropped as "
            f"non-integer answers, {stats['duplicates']} as duplicates, {stats['bad_rows']} as bad rows"
            + (f" (first: {bad[0]})" if bad else "")
        )
    return Dataset(kept, name=name, stats=stats, bad_rows=bad)


def _make_ids_unique(problems: list[Problem]) -> None:
    counts: dict[str, int] = {}
    taken = {p.id for p in problems}
    for p in problems:
        n = counts.get(p.id, 0) + 1
        counts[p.id] = n
        if n > 1:
            candidate = f"{p.id}#{n}"
            while candidate in taken:
                n += 1
                candidate = f"{p.id}#{n}"
            counts[p.id] = n
            taken.add(candidate)
            p.id = candidate


# ------------------------------------------------------------------------------------------ generated sets
#
# Offline problems with exactly computed integer answers. Level 1 is one-step small-number work a 135M model can
# learn; levels 4-5 use numbers large enough that calling the Python tool is the sensible way to solve them.
# Problem i depends only on (kind, level, seed, i), so a longer run extends a shorter one and ids stay stable.

_ARITH_LEVELS: dict[int, dict[str, Any]] = {
    1: {"leaves": (2, 2), "lo": 1, "hi": 9, "ops": "+-", "nonneg": True, "cap": 18, "div": 0},
    2: {"leaves": (2, 3), "lo": 2, "hi": 12, "ops": "+-*", "nonneg": True, "cap": 400, "div": 0},
    3: {"leaves": (3, 3), "lo": 2, "hi": 99, "ops": "+-*", "nonneg": False, "cap": 10**5, "div": 0},
    4: {"leaves": (4, 4), "lo": 2, "hi": 999, "ops": "+-*/", "nonneg": False, "cap": 10**8, "div": 12},
    5: {"leaves": (5, 6), "lo": 11, "hi": 9999, "ops": "+-*/", "nonneg": False, "cap": 10**15, "div": 99},
}

_Expr = int | tuple[str, "_Expr", "_Expr"]


def _build_expr(rng: random.Random, leaves: int, cfg: Mapping[str, Any]) -> _Expr:
    if leaves == 1:
        return rng.randint(cfg["lo"], cfg["hi"])
    op = rng.choice(cfg["ops"])
    if op == "/" and leaves != 2:
        op = rng.choice("+-*")
    if op == "/":
        # Exact by construction: the dividend is a multiple of the divisor.
        divisor = rng.randint(2, cfg["div"])
        quotient = rng.randint(max(1, cfg["lo"] // divisor), max(2, cfg["hi"] // divisor))
        return ("/", divisor * quotient, divisor)
    left = rng.randint(1, leaves - 1)
    return (op, _build_expr(rng, left, cfg), _build_expr(rng, leaves - left, cfg))


def _eval_expr(expr: _Expr, nonneg: bool) -> int | None:
    """Exact value, or ``None`` when a division is inexact or (``nonneg``) any intermediate goes negative."""
    if isinstance(expr, int):
        return expr
    op, left_e, right_e = expr
    left, right = _eval_expr(left_e, nonneg), _eval_expr(right_e, nonneg)
    if left is None or right is None:
        return None
    if op == "+":
        value = left + right
    elif op == "-":
        value = left - right
    elif op == "*":
        value = left * right
    else:
        if right == 0 or Fraction(left, right).denominator != 1:
            return None
        value = left // right
    return None if nonneg and value < 0 else value


def _render_expr(expr: _Expr, top: bool = True) -> str:
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    # Every sub-expression is parenthesised: no precedence rules to get wrong, and the text is valid Python.
    text = f"{_render_expr(left, False)} {op} {_render_expr(right, False)}"
    return text if top else f"({text})"


def _gen_arithmetic(rng: random.Random, level: int) -> tuple[str, int, dict[str, Any]]:
    cfg = _ARITH_LEVELS[level]
    for _ in range(10_000):
        expr = _build_expr(rng, rng.randint(*cfg["leaves"]), cfg)
        value = _eval_expr(expr, cfg["nonneg"])
        if value is not None and abs(value) <= cfg["cap"]:
            text = _render_expr(expr)
            prompt = f"What is {text}?" if level <= 2 else f"Compute {text}."
            return prompt, value, {"expression": text}
    raise RuntimeError(f"could not generate an arithmetic problem at level {level}")  # unreachable in practice


_NAMES = (
    "Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jia",
    "Kofi", "Lena", "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq",
)  # fmt: skip
_ITEMS = (
    ("pencil", "pencils"), ("notebook", "notebooks"), ("apple", "apples"), ("ticket", "tickets"),
    ("sandwich", "sandwiches"), ("book", "books"), ("candle", "candles"), ("mug", "mugs"),
)  # fmt: skip
_WordResult = tuple[str, int, dict[str, Any]]


def _dollars(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def _w_shopping(rng: random.Random, level: int) -> _WordResult:
    name = rng.choice(_NAMES)
    if level == 1:
        item, price, bill = rng.choice(_ITEMS)[0], rng.randint(1, 4), 5
        text = (
            f"{name} buys one {item} that costs {price} dollars and pays with a {bill}-dollar bill. "
            f"How many dollars of change does {name} get?"
        )
        return text, bill - price, {"quantities": [1], "prices": [price], "paid": bill, "unit": "dollars"}
    n_types = {2: 1, 3: 2, 4: 3, 5: 3}[level]
    q_lo, q_hi = {2: (2, 5), 3: (2, 9), 4: (3, 20), 5: (12, 99)}[level]
    p_lo, p_hi = {2: (1, 9), 3: (2, 20), 4: (5, 99), 5: (105, 4999)}[level]
    items = rng.sample(_ITEMS, n_types)
    qty = [rng.randint(q_lo, q_hi) for _ in items]
    prices = [rng.randint(p_lo, p_hi) for _ in items]
    cost = sum(q * p for q, p in zip(qty, prices, strict=True))
    if level == 5:  # prices in cents: the arithmetic is what makes the tool worth calling
        bills = -(-cost // 10_000)
        paid = bills * 10_000
        parts = [f"{q} {it[1]} at {_dollars(p)} each" for q, p, it in zip(qty, prices, items, strict=True)]
        text = (
            f"{name} buys {', '.join(parts[:-1])} and {parts[-1]}, and pays with {bills} hundred-dollar bills. "
            f"How much change does {name} get, in cents?"
        )
        return text, paid - cost, {"quantities": qty, "prices": prices, "paid": paid, "unit": "cents"}
    paid = next((b for b in (10, 20, 50, 100) if b >= cost), -(-cost // 100) * 100)
    pay = f"a {paid}-dollar bill" if paid <= 100 else f"{paid // 100} hundred-dollar bills"
    parts = [f"{q} {it[1]} at {p} dollars each" for q, p, it in zip(qty, prices, items, strict=True)]
    bought = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    text = f"{name} buys {bought}, and pays with {pay}. How many dollars of change does {name} get?"
    return text, paid - cost, {"quantities": qty, "prices": prices, "paid": paid, "unit": "dollars"}


def _w_travel(rng: random.Random, level: int) -> _WordResult:
    name = rng.choice(_NAMES)
    if level == 1:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        text = (
            f"{name} walks {a} km to the park and then {b} km to a friend's house. "
            f"How many km does {name} walk in total?"
        )
        return text, a + b, {"legs_km": [a, b]}
    if level == 2:
        v, t = rng.randrange(10, 65, 5), rng.randint(2, 5)
        text = f"A car drives at {v} km per hour for {t} hours. How many km does it drive?"
        return text, v * t, {"speed": v, "hours": t}
    if level == 3:
        v, t = rng.randint(35, 95), rng.randint(2, 9)
        text = f"A train travels {v * t} km at a constant {v} km per hour. How many hours does the trip take?"
        return text, t, {"distance": v * t, "speed": v}
    if level == 4:
        while True:
            v1, t1, v2, m = (
                rng.randint(40, 120),
                rng.randint(1, 5),
                rng.randint(30, 110),
                rng.choice((15, 20, 30, 40, 45)),
            )
            if v2 * m % 60 == 0:
                break
        text = (
            f"{name} drives {t1} hours at {v1} km per hour, then {m} minutes at {v2} km per hour. "
            f"How many km does {name} drive in total?"
        )
        return text, v1 * t1 + v2 * m // 60, {"speeds": [v1, v2], "minutes": [60 * t1, m]}
    while True:
        v1, v2, minutes = rng.randint(40, 150), rng.randint(40, 150), rng.randint(30, 600)
        if (v1 + v2) * minutes % 60 == 0:
            break
    distance = (v1 + v2) * minutes // 60
    text = (
        f"Two trains start at the same time from stations {distance} km apart and travel toward each other, "
        f"one at {v1} km per hour and the other at {v2} km per hour. After how many minutes do they meet?"
    )
    return text, minutes, {"distance": distance, "speeds": [v1, v2]}


def _w_sequence(rng: random.Random, level: int) -> _WordResult:
    if level == 1:
        n = rng.randint(3, 6)
        text = f"What is the sum of the whole numbers from 1 to {n}?"
        return text, n * (n + 1) // 2, {"first": 1, "step": 1, "last": n}
    if level == 2:
        a = rng.randint(1, 20)
        b = a + rng.randint(10, 40)
        text = f"What is the sum of the whole numbers from {a} to {b}?"
        return text, (a + b) * (b - a + 1) // 2, {"first": a, "step": 1, "last": b}
    if level == 3:
        a, d, n = rng.randint(1, 20), rng.randint(2, 9), rng.randint(10, 30)
        text = f"What is the sum of the first {n} terms of the sequence {a}, {a + d}, {a + 2 * d}, ...?"
        return text, n * (2 * a + (n - 1) * d) // 2, {"first": a, "step": d, "last": a + (n - 1) * d}
    if level == 4:
        n = rng.randint(20, 200)
        text = f"What is the sum of the squares of the whole numbers from 1 to {n}?"
        return text, n * (n + 1) * (2 * n + 1) // 6, {"squares_to": n}
    bound = rng.randint(1_000, 100_000)
    a, b = rng.sample(range(3, 14), 2)

    def multiples_sum(k: int) -> int:
        m = (bound - 1) // k
        return k * m * (m + 1) // 2

    value = multiples_sum(a) + multiples_sum(b) - multiples_sum(math.lcm(a, b))
    text = f"What is the sum of all positive integers less than {bound} that are multiples of {a} or {b}?"
    return text, value, {"below": bound, "divisors": [a, b]}


def _w_remainder(rng: random.Random, level: int) -> _WordResult:
    if level <= 3:
        lo_hi = {1: ((2, 5), (6, 20)), 2: ((3, 12), (20, 200)), 3: ((7, 97), (1000, 99_999))}[level]
        b = rng.randint(*lo_hi[0])
        a = rng.randint(*lo_hi[1])
        return f"What is the remainder when {a} is divided by {b}?", a % b, {"base": a, "exponent": 1, "modulus": b}
    base, exp, mod = (
        (rng.randint(2, 9), rng.randint(10, 30), rng.randint(7, 60))
        if level == 4
        else (rng.randint(11, 99), rng.randint(100, 999), rng.randint(1000, 9999))
    )
    text = f"What is the remainder when {base} raised to the power {exp} is divided by {mod}?"
    return text, pow(base, exp, mod), {"base": base, "exponent": exp, "modulus": mod}


def _w_counting(rng: random.Random, level: int) -> _WordResult:
    if level == 1:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        text = f"A box holds {a} red balls and {b} blue balls. How many balls are in the box?"
        return text, a + b, {"counts": [a, b]}
    if level == 2:
        n, k = rng.randint(20, 100), rng.randint(2, 9)
        text = f"How many whole numbers from 1 to {n} are multiples of {k}?"
        return text, n // k, {"upto": n, "any_of": [k], "none_of": []}
    if level == 3:
        n = rng.randint(100, 1000)
        a, b = rng.sample(range(2, 13), 2)
        text = f"How many whole numbers from 1 to {n} are divisible by {a} or by {b}?"
        return text, n // a + n // b - n // math.lcm(a, b), {"upto": n, "any_of": [a, b], "none_of": []}
    if level == 4:
        n, k = rng.randint(8, 25), rng.randint(2, 6)
        text = f"In how many ways can a team of {k} people be chosen from a group of {n} people?"
        return text, math.comb(n, k), {"choose_from": n, "choose": k}
    n = rng.randint(10_000, 1_000_000)
    a, b, c = rng.sample(range(2, 21), 3)

    def count(*divisors: int) -> int:
        return n // math.lcm(*divisors)

    either = count(a) + count(b) - count(a, b)
    either_and_c = count(a, c) + count(b, c) - count(a, b, c)
    text = f"How many integers from 1 to {n} are divisible by {a} or by {b}, but not by {c}?"
    return text, either - either_and_c, {"upto": n, "any_of": [a, b], "none_of": [c]}


def _w_sharing(rng: random.Random, level: int) -> _WordResult:
    name = rng.choice(_NAMES)
    if level == 1:
        k, each = rng.randint(2, 5), rng.randint(1, 4)
        text = f"{name} shares {k * each} cookies equally among {k} children. How many cookies does each child get?"
        return text, each, {"total": k * each, "groups": k}
    if level == 2:
        k = rng.randint(3, 9)
        total = k * rng.randint(3, 12)
        text = f"{name} packs {total} eggs into boxes of {k}. How many boxes does {name} fill?"
        return text, total // k, {"total": total, "groups": k}
    if level == 3:
        guests, size = rng.randint(20, 200), rng.randint(4, 12)
        text = (
            f"Juice comes in packs of {size} bottles. "
            f"How many packs are needed so that each of {guests} guests gets one bottle?"
        )
        return text, -(-guests // size), {"guests": guests, "pack": size}
    count = 2 if level == 4 else rng.randint(3, 4)
    periods = rng.sample(range(6, 61) if level == 4 else range(12, 91), count)
    listed = ", ".join(map(str, periods[:-1])) + f" and {periods[-1]}"
    text = (
        f"Buses on {count} routes leave the station every {listed} minutes respectively. All of them leave "
        "together now. After how many minutes do they next all leave together?"
    )
    return text, math.lcm(*periods), {"periods": periods}


_WORD_TEMPLATES: dict[str, Callable[[random.Random, int], _WordResult]] = {
    "shopping": _w_shopping,
    "travel": _w_travel,
    "sequence": _w_sequence,
    "remainder": _w_remainder,
    "counting": _w_counting,
    "sharing": _w_sharing,
}
WORD_TEMPLATES: tuple[str, ...] = tuple(_WORD_TEMPLATES)


def _level_tag(level: int | str | tuple[int, int]) -> str:
    if isinstance(level, tuple):
        return f"{level[0]}-{level[1]}"
    return str(level)


def generate_problems(
    n: int, *, kind: GeneratedKind | str = "arithmetic", level: LevelSpec = 1, seed: int = 0
) -> list[Problem]:
    """``n`` deterministic problems with exact integer answers.

    ``kind``: ``"arithmetic"`` (a parenthesised expression: ``3 + 4`` at level 1, ``(17 * 23) - 45`` at level 3,
    five or six 2-4 digit operands with exact ``/`` at level 5), ``"word"`` (templates in :data:`WORD_TEMPLATES`:
    change when shopping, speed/time/distance, sums of sequences, remainders and modular powers, counting, sharing
    and common periods), or ``"mix"`` (each problem arithmetic or word with equal odds). ``level``: see
    :data:`LevelSpec`; a mixed level draws each problem's level uniformly from the range.

    Problem ``i`` depends only on ``(kind, level, seed, i)``; ids are ``"{kind}-L{level}-s{seed}-{i:06d}"``.
    ``metadata`` holds ``kind``, ``level``, and the expression or the template and its parameters. Repeats are
    avoided while the level's problem space allows (level-1 arithmetic has only ~130 distinct problems).
    """
    if kind not in GENERATED_KINDS:
        raise DataError(f"unknown generated kind {kind!r}: choose one of {', '.join(GENERATED_KINDS)}")
    if n < 0:
        raise DataError(f"n must be >= 0, got {n}")
    parsed = _parse_level(level, f"generate_problems(level={level!r})")
    lo, hi = (1, 5) if parsed == "mixed" else (parsed, parsed) if isinstance(parsed, int) else parsed
    tag = _level_tag(parsed)
    problems: list[Problem] = []
    seen: set[str] = set()
    for i in range(n):
        # Level, kind and template come from a per-problem stream so retries for repeats cannot skew their mix.
        pick = random.Random(f"rstar-env|{kind}|{tag}|{seed}|{i}")
        lvl = pick.randint(lo, hi)
        this_kind = kind if kind != "mix" else pick.choice(("arithmetic", "word"))
        template = pick.choice(WORD_TEMPLATES)
        for attempt in range(25):
            rng = random.Random(f"rstar-env|{kind}|{tag}|{seed}|{i}|{attempt}")
            if this_kind == "arithmetic":
                text, value, extra = _gen_arithmetic(rng, lvl)
                meta: dict[str, Any] = {"kind": "arithmetic", "level": lvl, **extra}
            else:
                text, value, params = _WORD_TEMPLATES[template](rng, lvl)
                meta = {"kind": "word", "level": lvl, "template": template, "params": params}
            if text not in seen:
                break
        seen.add(text)
        problems.append(Problem(text, str(value), f"{kind}-L{tag}-s{seed}-{i:06d}", meta))
    return problems


# ----------------------------------------------------------------------------------------- tool-use SFT data
# Made by driving the env (sandbox, reward), so it lives in its own module and is imported on first use: this one
# stays standard-library only.
_SFT_NAMES = ("generate_tool_sft", "parse_tool_sft_spec", "sft_tokens", "SFTTokens")


def __getattr__(name: str) -> Any:
    if name in _SFT_NAMES:
        from rstar_env import sft_data

        return getattr(sft_data, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
