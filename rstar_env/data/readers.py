"""Readers: the rows of a file (JSONL, JSON, parquet), a HF hub dataset, a ``datasets`` object, or memory."""

from __future__ import annotations

import gzip
import json
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .records import DataError, Problem

_INSTALL_HINT = "pip install 'rstar-env[data]'"


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
