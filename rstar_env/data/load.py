"""``load_dataset``: any source to a :class:`~rstar_env.data.records.Dataset`."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from .answers import integer_answer
from .generators import GENERATED_KINDS, generate_problems, parse_generated_spec
from .readers import RowStream, _BadRow, _hf_object_rows, _read_file, _read_hf, _read_memory
from .records import (
    _MISSING,
    DEFAULT_FIELDS,
    DataError,
    Dataset,
    Problem,
    _available,
    _lookup,
    field_text,
    normalize_problem_text,
    problem_field_text,
    stable_id,
)
from .row_formats import ROW_FORMATS, RowFormat

_log = logging.getLogger("rstar_env.data")
_FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".jsonl.gz", ".json.gz")


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
            f"dataset source must be a path (str or Path), a generated-set spec, a row format or hub name, a list of "
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
    row_format = ROW_FORMATS.get(source)
    if row_format is not None and row_format.hub is not None:
        name, _, config = row_format.hub.partition(":")
        return source, _read_hf(name, config or None, split)
    if "/" in source and not source.startswith((".", "/", "~")):
        name, _, config = source.partition(":")
        return source, _read_hf(name, config or None, split)
    raise DataError(
        f"unknown dataset source {source!r}: not an existing file, not a generated set ({', '.join(GENERATED_KINDS)}, "
        f"e.g. 'arithmetic:level=2,n=200'), not a row format with hub data ({', '.join(ROW_FORMATS)}), and not a "
        "hub name ('owner/name' or 'hf:name')"
    )


def _extract(
    row: Mapping[str, Any],
    where: str,
    fields: Mapping[str, str],
    row_format: RowFormat | None,
    allow_unscored: bool = False,
) -> Problem:
    found: dict[str, Any] = {}
    keys: dict[str, str] = {}
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
            candidates = (*(row_format.fields.get(name, ()) if row_format else ()), *DEFAULT_FIELDS[name])
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
        keys[name] = key
        used_top.add(key if key in row else key.split(".")[0])
    text = problem_field_text(found["problem"], where, keys["problem"])
    if not text.strip():
        raise DataError(f"{where}: the problem text is empty; fix or drop that row")
    metadata = {str(k): v for k, v in row.items() if k not in used_top and k != "metadata"}
    if isinstance(row.get("metadata"), Mapping):
        metadata.update(row["metadata"])
    problem = Problem(
        problem=text,
        answer=field_text(found["answer"], where, "answer", keys["answer"]).strip() if "answer" in found else None,
        id=field_text(found["id"], where, "id", keys["id"]) if "id" in found else "",
        metadata=metadata,
    )
    if row_format is not None:
        problem = row_format.transform(problem, row, where)
    if not problem.id:
        problem.id = stable_id(problem.problem)
    return problem


def load_dataset(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any] | Problem] | Dataset | Any,
    *,
    split: str = "train",
    fields: Mapping[str, str] | None = None,
    row_format: str | RowFormat | None = "auto",
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
      objects (``"reward_model.ground_truth"``). Unnamed fields try :data:`DEFAULT_FIELDS` (after the row format's).
      A chat list (``[{"role", "content"}, ...]``) as the problem gives its last user message. Rows without an id
      get :func:`stable_id` of the problem text. Unused top-level keys of a row go to ``metadata``.
    - ``row_format``: how rows of a known dataset are read: a name in :data:`ROW_FORMATS` (``"dapo"``, ``"aime"``),
      a :class:`RowFormat`, ``"auto"`` (the default: rows that look like DAPO are read as ``dapo``, others plainly)
      or ``None``.
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
    chosen: RowFormat | None
    if row_format is None or row_format == "none":
        chosen = None
    elif isinstance(row_format, RowFormat):
        chosen = row_format
    elif row_format == "auto":
        chosen = None
    elif row_format in ROW_FORMATS:
        chosen = ROW_FORMATS[row_format]
    else:
        raise DataError(f"unknown row format {row_format!r}: choose one of {', '.join(ROW_FORMATS)}, 'auto' or None")
    auto = row_format == "auto"
    if auto and isinstance(source, str) and source in ROW_FORMATS and not Path(source).exists():
        chosen, auto = ROW_FORMATS[source], False  # a row format's own data is read with that format

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
                row_reader = chosen
                if auto and ROW_FORMATS["dapo"].detect is not None and ROW_FORMATS["dapo"].detect(item):
                    row_reader = ROW_FORMATS["dapo"]
                problem = _extract(item, where, fields or {}, row_reader, allow_unscored)
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
