"""Datasets: math problems with reference answers, from files, the HF hub, memory, or a seeded generator.

Every source becomes a :class:`Dataset` of :class:`Problem` records ``{problem, answer, id, metadata}``::

    load_dataset("train.jsonl")                                  # .jsonl / .json / .parquet (+ .gz for JSON)
    load_dataset("dapo-math-17k.parquet")                        # DAPO rows are recognised; see ROW_FORMATS
    load_dataset("hf:HuggingFaceH4/aime_2024", row_format="aime")  # HF hub (needs ``datasets``)
    load_dataset("arithmetic:level=2,n=200,seed=0")             # generated offline, no download
    load_dataset([{"question": "1+1?", "answer": "2"}])          # in memory: a list of dicts
    load_dataset(datasets.load_dataset("json", data_files=...))  # a datasets.Dataset / IterableDataset / DatasetDict
    load_dataset("aime")                                         # a row format's own data (from the HF hub)

Source syntax (a string; a :class:`os.PathLike` is always a file):

* a path ending in ``.jsonl``, ``.json``, ``.parquet``, ``.jsonl.gz`` or ``.json.gz``: a local file. A ``.json``
  file holds a list of objects, or an object with a ``"data"`` list, or one list per split
  (``{"train": [...], "test": [...]}``, chosen by ``split``).
* ``[gen:]KIND[:key=value,...]`` with KIND ``arithmetic``, ``word`` or ``mix``: a generated set; keys ``n``
  (default 1000), ``level`` (``1``..``5``, ``mixed`` or a range ``2-4``; default 1) and ``seed`` (default 0).
  E.g. ``"arithmetic"``, ``"word:level=3"``, ``"gen:mix:level=mixed,n=5000,seed=7"``.
* ``hf:NAME[:CONFIG]`` or a bare ``owner/name[:CONFIG]`` that is not an existing path: a HF hub dataset, loaded
  with ``datasets.load_dataset(NAME, CONFIG, split=split)``.
* a row format's name (``dapo``, ``aime``): its hub dataset (:attr:`RowFormat.hub`), read in that format.

Rows without an answer are bad rows unless ``allow_unscored=True`` keeps them (answer ``None``: the env runs them
unscored, reward 0, ``info["unscored"]``). A bad row (no problem, no answer, a line that is not JSON, ...) stops
loading with an error that names it, or, with ``on_bad_row="skip"``, is skipped and counted:
``dataset.stats["bad_rows"]`` and the reasons in ``dataset.bad_rows``.

Ids are stable (the row's own id, or a hash of the normalised problem text; generated ids encode the spec and the
index), so an evaluation can resume by skipping the ids it has finished. ``import rstar_env.data`` uses only the
standard library; ``pyarrow`` and ``datasets`` (the ``data`` extra) are imported when a source needs them.

A row's fields must be text (an answer or id may also be a number): anything else, such as a ``...`` placeholder
left in a row, is a bad row, never a string like ``"Ellipsis"``.

The package, bottom up: :mod:`.answers` (answer normalisation), :mod:`.records` (``Problem``, ``Dataset``, ids,
field reading), :mod:`.row_formats` (known dataset layouts), :mod:`.readers` (files, the hub, memory),
:mod:`.generators` (offline generated sets) and :mod:`.load` (``load_dataset``). Tool-use SFT data drives the env,
so it lives above it, in :mod:`rstar_env.rollout.sft_data`.
"""

from __future__ import annotations

from .answers import integer_answer, normalize_answer
from .generators import (
    GENERATED_KINDS,
    WORD_TEMPLATES,
    GeneratedKind,
    LevelSpec,
    generate_problems,
    parse_generated_spec,
)
from .load import load_dataset
from .records import (
    DEFAULT_FIELDS,
    DataError,
    Dataset,
    Problem,
    check_row,
    field_text,
    normalize_problem_text,
    problem_field_text,
    save_jsonl,
    stable_id,
)
from .row_formats import ROW_FORMATS, RowFormat, strip_dapo_boilerplate

__all__ = [
    "DEFAULT_FIELDS",
    "GENERATED_KINDS",
    "ROW_FORMATS",
    "WORD_TEMPLATES",
    "DataError",
    "Dataset",
    "GeneratedKind",
    "LevelSpec",
    "Problem",
    "RowFormat",
    "check_row",
    "field_text",
    "generate_problems",
    "integer_answer",
    "load_dataset",
    "normalize_answer",
    "normalize_problem_text",
    "parse_generated_spec",
    "problem_field_text",
    "save_jsonl",
    "stable_id",
    "strip_dapo_boilerplate",
]
