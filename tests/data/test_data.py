"""Datasets: file loaders, field mapping, filters, row formats, the hub path, and the generated offline sets."""

from __future__ import annotations

import ast
import gzip
import itertools
import json
import math
import operator
import os
import random
import re
import subprocess
import sys
import types
from fractions import Fraction
from pathlib import Path
from statistics import mean

import pytest

from rstar_env.data import (
    ROW_FORMATS,
    WORD_TEMPLATES,
    DataError,
    Dataset,
    Problem,
    generate_problems,
    integer_answer,
    load_dataset,
    normalize_answer,
    parse_generated_spec,
    save_jsonl,
    stable_id,
    strip_dapo_boilerplate,
)

# ------------------------------------------------------------------------------------------------ helpers


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def dapo_prompt(problem: str) -> str:
    # The wording of BytedTsinghua-SIA/DAPO-Math-17k's user turn.
    return (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
        f"{problem}\n\n"
        'Remember to put your answer on its own line after "Answer:".'
    )


def dapo_row(problem: str, answer: str, index: str) -> dict:
    return {
        "data_source": "math_dapo",
        "prompt": [{"content": dapo_prompt(problem), "role": "user"}],
        "ability": "MATH",
        "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": index},
    }


ROWS = [
    {"problem": "What is 2 + 2?", "answer": "4", "id": "a"},
    {"problem": "What is 3 * 3?", "answer": "9", "id": "b", "source": "handmade"},
]

# ----------------------------------------------------------------------------------------------- records


def test_problem_round_trip_and_from_dict_errors():
    p = Problem("What is 1 + 1?", "2", "x1", {"level": 1})
    again = Problem.from_dict(json.loads(json.dumps(p.to_dict())))
    assert again == p
    assert Problem.from_dict({"problem": "q", "answer": 3, "id": 7}) == Problem("q", "3", "7", {})
    with pytest.raises(DataError, match=r"missing answer, id.*got problem"):
        Problem.from_dict({"problem": "q"})


def test_save_jsonl_round_trips_through_load(tmp_path):
    problems = generate_problems(20, kind="mix", level="mixed", seed=3)
    path = save_jsonl(problems, tmp_path / "sub" / "gen.jsonl")
    assert path.exists() and not (tmp_path / "sub" / "gen.jsonl.tmp").exists()
    loaded = load_dataset(path)
    assert loaded.to_list() == problems


def test_dataset_sequence_sample_and_exclude():
    ds = load_dataset(ROWS)
    assert len(ds) == 2 and ds[0].id == "a" and [p.id for p in ds] == ["a", "b"]
    assert isinstance(ds[1:], Dataset) and ds[1:].ids == ["b"]
    assert ds.sample(random.Random(0)).id in {"a", "b"}
    assert ds.sample(5) == ds.sample(random.Random(5))
    assert {ds.sample(random.Random(s)).id for s in range(20)} == {"a", "b"}
    assert ds.exclude(["a"]).ids == ["b"]
    with pytest.raises(DataError, match="empty"):
        ds.exclude(["a", "b"]).sample()


# ----------------------------------------------------------------------------------------------- loaders


def test_jsonl_with_default_field_names_and_stable_ids(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        json.dumps({"question": "How many legs has a cat?", "final_answer": 4, "topic": "animals"})
        + "\n\n"  # a blank line is skipped, and line numbers still count it
        + json.dumps({"prompt": "  What is   7 - 2?  ", "label": "5", "uid": "u-2"})
        + "\n",
        encoding="utf-8",
    )
    ds = load_dataset(path)
    assert [p.problem for p in ds] == ["How many legs has a cat?", "  What is   7 - 2?  "]
    assert [p.answer for p in ds] == ["4", "5"]
    assert ds[0].id == stable_id("How many legs has a cat?") and ds[0].id.startswith("p-")
    assert ds[0].id == load_dataset(path)[0].id  # stable across loads
    assert ds[0].metadata == {"topic": "animals"}
    assert ds[1].id == "u-2"
    assert ds.stats == {"rows": 2, "kept": 2, "non_integer": 0, "duplicates": 0, "bad_rows": 0}


def test_stable_id_ignores_whitespace_and_case():
    assert stable_id("What is  2+2?") == stable_id("what is 2+2? ")
    assert stable_id("What is 2+2?") != stable_id("What is 2+3?")


def test_json_list_data_object_and_per_split(tmp_path):
    (tmp_path / "list.json").write_text(json.dumps(ROWS))
    (tmp_path / "obj.json").write_text(json.dumps({"version": 1, "data": ROWS}))
    (tmp_path / "split.json").write_text(json.dumps({"train": ROWS[:1], "test": ROWS[1:]}))
    assert load_dataset(tmp_path / "list.json").ids == ["a", "b"]
    assert load_dataset(str(tmp_path / "obj.json")).ids == ["a", "b"]
    assert load_dataset(tmp_path / "split.json").ids == ["a"]
    assert load_dataset(tmp_path / "split.json", split="test").ids == ["b"]
    (tmp_path / "bad.json").write_text(json.dumps({"rows": ROWS}))
    with pytest.raises(DataError, match=r"'data'.*keys rows"):
        load_dataset(tmp_path / "bad.json")


def test_gzipped_jsonl(tmp_path):
    path = tmp_path / "d.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in ROWS))
    assert load_dataset(path).ids == ["a", "b"]


def test_parquet_with_nested_answer_field(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [
        {"q": "What is 6 * 7?", "meta": {"gt": "42", "src": "x"}},
        {"q": "What is 6 + 7?", "meta": {"gt": "13", "src": "y"}},
    ]
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    ds = load_dataset(path, fields={"problem": "q", "answer": "meta.gt"})
    assert [(p.problem, p.answer) for p in ds] == [("What is 6 * 7?", "42"), ("What is 6 + 7?", "13")]
    with pytest.raises(DataError, match=r"row 1: has no field 'meta\.missing'.*meta\.gt"):
        load_dataset(path, fields={"problem": "q", "answer": "meta.missing"})


def test_dapo_parquet_end_to_end(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    # DAPO's parquet repeats each problem many times; de-duplication collapses them.
    rows = [dapo_row("Find $x$ if $2x = 10$.", "5", "id-1")] * 3 + [dapo_row("Compute $3^3$.", "27", "id-2")]
    path = tmp_path / "dapo-math-17k.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    ds = load_dataset(path, row_format="dapo")
    assert [(p.problem, p.answer, p.id) for p in ds] == [
        ("Find $x$ if $2x = 10$.", "5", "id-1"),
        ("Compute $3^3$.", "27", "id-2"),
    ]
    assert ds.stats["duplicates"] == 2
    assert ds[0].metadata == {"data_source": "math_dapo", "ability": "MATH"}


def test_fields_mapping_explicit_nested_and_list_index():
    rows = [{"uid": 17, "body": {"text": "What is 5 + 5?"}, "sols": ["10"], "answer": "wrong"}]
    ds = load_dataset(rows, fields={"problem": "body.text", "answer": "sols.0", "id": "uid"})
    assert (ds[0].problem, ds[0].answer, ds[0].id) == ("What is 5 + 5?", "10", "17")
    # A literal key containing a dot wins over the nested reading.
    ds = load_dataset([{"a.b": "literal q", "a": {"b": "nested q"}, "answer": "1"}], fields={"problem": "a.b"})
    assert ds[0].problem == "literal q"
    with pytest.raises(DataError, match="unknown: question"):
        load_dataset(rows, fields={"question": "body.text"})


def test_chat_list_problem_takes_last_user_turn():
    rows = [
        {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "1 + 2?"}], "answer": 3}
    ]
    assert load_dataset(rows)[0].problem == "1 + 2?"


def test_missing_file_error_names_path(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match=r"dataset file not found: .*nope\.jsonl"):
        load_dataset(missing)
    with pytest.raises(FileNotFoundError, match=r"nope\.parquet"):
        load_dataset(str(tmp_path / "nope.parquet"))


def test_missing_field_error_names_line_and_fields(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], {"text": "What is 1 + 1?", "answer": "2", "meta": {"k": 1}}])
    with pytest.raises(DataError) as info:
        load_dataset(path)
    message = str(info.value)
    assert "d.jsonl line 2" in message
    assert "no problem field" in message and "question" in message  # what was tried
    assert "text, answer, meta, meta.k" in message  # what exists
    assert "fields={'problem': '<key>'}" in message  # the fix
    with pytest.raises(DataError, match=r"line 1: has no field 'solution' \(mapped to 'answer'.*problem, answer, id"):
        load_dataset(path, fields={"answer": "solution"})


def test_non_string_fields_are_refused_naming_the_row_and_field():
    # Python's Ellipsis, left from a `{"problem": ..., "answer": ...}` template, must not become "Ellipsis".
    with pytest.raises(DataError, match=r"row 0: the problem \(field 'problem'\) is `\.\.\.` \(Python's Ellipsis"):
        load_dataset([{"problem": ..., "answer": "1"}])
    with pytest.raises(DataError, match=r"row 1: the answer field 'answer' is `\.\.\.`.*string or a number"):
        load_dataset([{"problem": "1 + 1?", "answer": "2"}, {"problem": "2 + 2?", "answer": ...}])
    for bad in (True, {"value": 4}, ["4", "5"], object(), float("nan")):
        with pytest.raises(DataError, match=r"row 0: the answer field 'answer' is"):
            load_dataset([{"problem": "2 + 2?", "answer": bad}])
    with pytest.raises(DataError, match=r"the id field 'id' is a dict \(\{'n': 1\}\)"):
        load_dataset([{"problem": "2 + 2?", "answer": "4", "id": {"n": 1}}])
    with pytest.raises(DataError, match=r"problem's last user message \(field 'prompt'\) is a list"):
        load_dataset([{"prompt": [{"role": "user", "content": ["2 + 2?"]}], "answer": "4"}])
    # Numbers are answers and ids; a one-element list is its element.
    ds = load_dataset(
        [
            {"problem": "2 + 2?", "answer": 4, "id": 7},
            {"problem": "1/2?", "answer": [0.5]},
            {"problem": "6 / 2?", "answer": 3.0},
        ]
    )
    assert [(p.answer, p.id) for p in ds][:1] == [("4", "7")] and [p.answer for p in ds][1:] == ["0.5", "3"]
    skipped = load_dataset([{"problem": ..., "answer": "1"}, {"problem": "ok?", "answer": "1"}], on_bad_row="skip")
    assert skipped.stats["bad_rows"] == 1 and "Ellipsis" in skipped.bad_rows[0]


def test_bad_rows_name_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"d\.jsonl line 2: not valid JSON"):
        load_dataset(path)
    path.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps({"problem": "q", "answer": None}) + "\n")
    with pytest.raises(DataError, match=r"line 2: the answer field 'answer' is empty"):
        load_dataset(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(DataError, match="line 1: expected a JSON object"):
        load_dataset(path)


def test_unknown_sources_and_unsupported_files(tmp_path):
    with pytest.raises(DataError, match=r"unknown dataset source 'arithmetics'.*arithmetic.*owner/name"):
        load_dataset("arithmetics")
    (tmp_path / "d.csv").write_text("problem,answer\n")
    with pytest.raises(DataError, match="unsupported file type"):
        load_dataset(tmp_path / "d.csv")
    with pytest.raises(DataError, match="is a directory"):
        load_dataset(tmp_path)
    with pytest.raises(DataError, match="unknown row format 'gsm'"):
        load_dataset(ROWS, row_format="gsm")


# ------------------------------------------------------------------------------------------------ filters


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42),
        ("042", 42),
        ("-7", -7),
        ("+3", 3),
        ("1,000", 1000),
        ("1{,}000", 1000),
        ("12.0", 12),
        ("\\boxed{12}", 12),
        ("$\\boxed{ 007 }$", 7),
        ("\\(25\\)", 25),
        ("\u22125", -5),
        (17, 17),
        (3.0, 3),
        ("1/2", None),
        ("1,2", None),
        ("1,0000", None),
        ("x = 3", None),
        ("\\frac{1}{2}", None),
        ("2.5", None),
        ("", None),
        (True, None),
        (2.5, None),
    ],
)
def test_integer_answer(text, value):
    assert integer_answer(text) == value


def test_normalize_answer():
    assert normalize_answer(" 042 ") == "42"
    assert normalize_answer("\\frac{1}{2}") == "\\frac{1}{2}"


def test_integer_answers_only_filters_and_canonicalises():
    rows = [
        {"problem": "p1", "answer": "042"},
        {"problem": "p2", "answer": "1,000"},
        {"problem": "p3", "answer": "\\boxed{12}"},
        {"problem": "p4", "answer": "\\frac{1}{2}"},
        {"problem": "p5", "answer": "x=3"},
        {"problem": "p6", "answer": "7"},
    ]
    ds = load_dataset(rows, integer_answers_only=True)
    assert [(p.problem, p.answer) for p in ds] == [("p1", "42"), ("p2", "1000"), ("p3", "12"), ("p6", "7")]
    assert ds[0].metadata["raw_answer"] == "042" and "raw_answer" not in ds[3].metadata
    assert ds.stats["non_integer"] == 2
    with pytest.raises(DataError, match=r"no problems left.*2 dropped as non-integer"):
        load_dataset(rows[3:5], integer_answers_only=True)


def test_dedup_by_normalised_text_and_unique_ids():
    rows = [
        {"problem": "What is 2+2?", "answer": "4"},
        {"problem": "  what is   2+2? ", "answer": "4"},
        {"problem": "What is 2+3?", "answer": "5"},
    ]
    ds = load_dataset(rows)
    assert [p.problem for p in ds] == ["What is 2+2?", "What is 2+3?"]
    assert ds.stats["duplicates"] == 1
    raw = load_dataset(rows, dedup=False)
    assert len(raw) == 3
    # Same hashed id for both spellings, made unique in order so resuming by id stays exact.
    assert raw.ids == [raw[0].id, raw[0].id + "#2", stable_id("What is 2+3?")]
    assert len(set(raw.ids)) == 3
    dup = load_dataset([{"problem": f"q{i}", "answer": "1", "id": "same"} for i in range(3)])
    assert dup.ids == ["same", "same#2", "same#3"]


def test_limit_and_deterministic_shuffle():
    rows = [{"problem": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(50)]
    assert [p.answer for p in load_dataset(rows, limit=3)] == ["1", "2", "3"]
    a = load_dataset(rows, shuffle=True, seed=1, limit=10)
    b = load_dataset(rows, shuffle=True, seed=1, limit=10)
    c = load_dataset(rows, shuffle=True, seed=2, limit=10)
    assert a.ids == b.ids and a.ids != c.ids and len(a) == 10
    assert a.ids != load_dataset(rows, limit=10).ids


# ---------------------------------------------------------------------------------------------- row formats


def test_strip_dapo_boilerplate_variants():
    problem = "Let $f(x) = x^2$.\n\nFind $f(3)$."
    assert strip_dapo_boilerplate(dapo_prompt(problem)) == problem
    upper = (
        "Solve the following math problem step by step. The last line of your response should be of the form "
        "Answer: $ANSWER (without quotes) where $ANSWER is the answer to the problem.\n\n"
        f"{problem}\n\n"
        'Remember to put your answer on its own line after "Answer:", and you do not need to use a \\boxed command.'
    )
    assert strip_dapo_boilerplate(upper) == problem
    assert strip_dapo_boilerplate("Find $f(3)$.") == "Find $f(3)$."


def test_dapo_preset_on_real_row_shape():
    rows = [
        dapo_row("Compute $1+1$.", "2", "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"),
        dapo_row("Compute $1+1$.", "2", "another-uuid"),  # DAPO repeats problems under fresh uuids
        dapo_row("What is $\\binom{5}{2}$?", "10", "c3"),
    ]
    ds = load_dataset(rows, row_format="dapo")
    assert [(p.problem, p.answer, p.id) for p in ds] == [
        ("Compute $1+1$.", "2", "9a9b6eb4-a1cb-49d1-8c1e-62eaf2f74079"),
        ("What is $\\binom{5}{2}$?", "10", "c3"),
    ]
    # The default row format, "auto", recognises DAPO rows; row_format=None leaves the instructions in place.
    assert load_dataset(rows).to_list() == ds.to_list()
    raw = load_dataset(rows, row_format=None, dedup=False)
    assert raw[0].problem.startswith("Solve the following math problem") and raw[0].answer == "2"


def test_dapo_preset_on_processed_copy():
    # open-r1/DAPO-Math-17k-Processed: a bare string prompt and the answer in `solution`.
    rows = [{"prompt": "In triangle $ABC$ ... find $a+b+c$.", "solution": "34", "data_source": "math_dapo"}]
    ds = load_dataset(rows, row_format="dapo")
    assert (ds[0].problem, ds[0].answer) == ("In triangle $ABC$ ... find $a+b+c$.", "34")


def test_aime_preset_ids_and_answers():
    rows = [
        {
            "id": 60,
            "problem": "Every morning Aya goes for a walk...",
            "answer": "204",
            "year": "2024",
            "url": "https://artofproblemsolving.com/wiki/index.php/2024_AIME_I_Problems/Problem_1",
        },
        {"ID": "2023-II-15", "Problem": "For each positive integer $n$ ...", "Answer": 23, "Year": 2023},
        {"ID": "1983-1", "Question": "Let $x$, $y$ and $z$ all exceed 1 ...", "Answer": "060"},
        {"Year": 2020, "Part": "I", "Problem Number": 3, "Question": "A positive integer ...", "Answer": 7},
    ]
    ds = load_dataset(rows, row_format="aime")
    assert ds.ids == ["2024-I-1", "2023-II-15", "1983-1", "2020-I-3"]
    assert [p.answer for p in ds] == ["204", "23", "60", "7"]
    assert ds[2].metadata["raw_answer"] == "060"
    assert ROW_FORMATS["aime"].name == "aime"
    with pytest.raises(DataError, match=r"row 0: AIME answers are integers 0-999, got '1/2'"):
        load_dataset([{"problem": "p", "answer": "1/2"}], row_format="aime")
    with pytest.raises(DataError, match="got '1000'"):
        load_dataset([{"problem": "p", "answer": "1000"}], row_format="aime")


# ------------------------------------------------------------------------------- optional dependencies / hub


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    path = tmp_path / "d.parquet"
    path.write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match=r"needs pyarrow.*pip install 'rstar-env\[data\]'"):
        load_dataset(path)


def test_hub_without_datasets_package(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match=r"rstar-env\[data\].*local \.jsonl"):
        load_dataset("hf:HuggingFaceH4/aime_2024")


def test_hub_unreachable_suggests_local_file(monkeypatch):
    def unreachable(name, config=None, split=None):
        raise ConnectionError("Couldn't reach 'owner/set' on the Hub")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=unreachable))
    with pytest.raises(DataError) as info:
        load_dataset("owner/set", split="test")
    message = str(info.value)
    assert "'owner/set'" in message and "split 'test'" in message and "ConnectionError" in message
    assert "unreachable" in message and "local .jsonl" in message


def test_hub_rows_are_loaded_with_name_config_and_split(monkeypatch):
    calls = []

    def fake_load(name, config=None, split=None):
        calls.append((name, config, split))
        return [{"question": "What is 9 - 4?", "answer": "#### 5"}, {"question": "What is 1 + 0?", "answer": "1"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load))
    ds = load_dataset("hf:openai/gsm8k:main", split="test", integer_answers_only=True)
    assert calls == [("openai/gsm8k", "main", "test")]
    assert [p.answer for p in ds] == ["1"]
    assert load_dataset("openai/gsm8k").name == "openai/gsm8k" and calls[-1] == ("openai/gsm8k", None, "train")


def test_import_is_light():
    code = (
        "import sys, rstar_env.data; "
        "bad = [m for m in ('pyarrow', 'datasets', 'torch') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ------------------------------------------------------------------------------------------ generated sets

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _eval_exact(node: ast.AST) -> Fraction:
    """An independent evaluator: Python's own parser, exact rational arithmetic."""
    if isinstance(node, ast.Expression):
        return _eval_exact(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval_exact(node.left), _eval_exact(node.right))
    raise AssertionError(f"unexpected syntax {ast.dump(node)}")


def _expression_of(problem: Problem) -> str:
    text = problem.problem
    for prefix, suffix in (("What is ", "?"), ("Compute ", ".")):
        if text.startswith(prefix) and text.endswith(suffix):
            return text[len(prefix) : -len(suffix)]
    raise AssertionError(f"unexpected phrasing: {text}")


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_arithmetic_answers_are_exact(level):
    for p in generate_problems(200, kind="arithmetic", level=level, seed=11):
        expr = _expression_of(p)
        assert expr == p.metadata["expression"]
        value = _eval_exact(ast.parse(expr, mode="eval"))
        assert value.denominator == 1, p.problem
        assert p.answer == str(int(value)) and int(p.answer) == integer_answer(p.answer)
        assert p.metadata == {"kind": "arithmetic", "level": level, "expression": expr}


def test_level_one_is_genuinely_easy():
    for p in generate_problems(300, kind="arithmetic", level=1, seed=0):
        a, op, b = _expression_of(p).split()
        assert op in "+-" and 1 <= int(a) <= 9 and 1 <= int(b) <= 9 and 0 <= int(p.answer) <= 18
    for p in generate_problems(300, kind="word", level=1, seed=0):
        assert 0 <= int(p.answer) <= 21 and all(int(n) <= 20 for n in _numbers(p.problem)), p.problem


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+", text)


def test_difficulty_grows_with_level():
    def stats(kind: str, level: int) -> tuple[float, float, float]:
        ps = generate_problems(300, kind=kind, level=level, seed=5)
        ops = mean(sum(_expression_of(p).count(f" {o} ") for o in "+-*/") for p in ps) if kind == "arithmetic" else 0
        digits = mean(max(len(n) for n in _numbers(p.problem)) for p in ps)
        answer_digits = mean(len(p.answer.lstrip("-")) for p in ps)
        return ops, digits, answer_digits

    arithmetic = [stats("arithmetic", level) for level in range(1, 6)]
    for easier, harder in itertools.pairwise(arithmetic):
        assert harder[0] > easier[0] or (harder[0] == easier[0] == 2)  # operators per problem (L2 vs L3 both)
        assert harder[1] > easier[1]  # longest operand
        assert harder[2] > easier[2]  # size of the answer
    # Word problems get harder in kind (modular powers, combinations), not always in operand size; the size of
    # the answer is the measurable proxy that grows at every step.
    word = [stats("word", level) for level in range(1, 6)]
    for easier, harder in itertools.pairwise(word):
        assert harder[2] > easier[2]
    assert word[0][1] < word[4][1]  # and the numbers in the text are larger at the top than at the bottom


def _word_answer(template: str, level: int, params: dict) -> int:
    """Recompute a word problem's answer from its parameters by brute force, independently of the generator."""
    if template == "shopping":
        return params["paid"] - sum(q * p for q, p in zip(params["quantities"], params["prices"], strict=True))
    if template == "travel":
        if "legs_km" in params:
            return sum(params["legs_km"])
        if "hours" in params:
            return params["speed"] * params["hours"]
        if "minutes" in params:
            km = sum(Fraction(v * m, 60) for v, m in zip(params["speeds"], params["minutes"], strict=True))
            assert km.denominator == 1
            return int(km)
        if "speeds" in params:
            minutes = Fraction(params["distance"] * 60, sum(params["speeds"]))
            assert minutes.denominator == 1
            return int(minutes)
        t = Fraction(params["distance"], params["speed"])
        assert t.denominator == 1
        return int(t)
    if template == "sequence":
        if "squares_to" in params:
            return sum(i * i for i in range(1, params["squares_to"] + 1))
        if "below" in params:
            return sum(i for i in range(1, params["below"]) if any(i % d == 0 for d in params["divisors"]))
        return sum(range(params["first"], params["last"] + 1, params["step"]))
    if template == "remainder":
        return params["base"] ** params["exponent"] % params["modulus"]
    if template == "counting":
        if "counts" in params:
            return sum(params["counts"])
        if "choose" in params:
            n, k = params["choose_from"], params["choose"]
            return math.factorial(n) // (math.factorial(k) * math.factorial(n - k))
        n = params["upto"]
        hits: set[int] = set()
        for d in params["any_of"]:
            hits |= set(range(d, n + 1, d))
        for d in params["none_of"]:
            hits -= set(range(d, n + 1, d))
        return len(hits)
    if template == "sharing":
        if "periods" in params:
            step = max(params["periods"])
            t = step
            while any(t % p for p in params["periods"]):
                t += step
            return t
        if "guests" in params:
            return -(-params["guests"] // params["pack"])
        assert params["total"] % params["groups"] == 0
        return params["total"] // params["groups"]
    raise AssertionError(template)


@pytest.mark.parametrize("level", [1, 2, 3, 4, 5])
def test_word_problem_answers_are_exact(level):
    ps = generate_problems(60, kind="word", level=level, seed=2)
    assert {p.metadata["template"] for p in ps} == set(WORD_TEMPLATES)
    for p in ps:
        meta = p.metadata
        assert meta["kind"] == "word" and meta["level"] == level
        assert p.answer == str(_word_answer(meta["template"], level, meta["params"])), p.problem
        assert int(p.answer) >= 0


def test_generator_is_deterministic_and_prefix_stable():
    a = generate_problems(100, kind="mix", level="mixed", seed=0)
    assert a == generate_problems(100, kind="mix", level="mixed", seed=0)
    assert a[:40] == generate_problems(40, kind="mix", level="mixed", seed=0)
    assert [p.problem for p in a] != [p.problem for p in generate_problems(100, kind="mix", level="mixed", seed=1)]
    assert a[0].id == "mix-Lmixed-s0-000000" and len(set(p.id for p in a)) == 100
    assert {p.metadata["kind"] for p in a} == {"arithmetic", "word"}
    assert {p.metadata["level"] for p in a} == {1, 2, 3, 4, 5}
    # A subprocess with another hash seed produces the same set: nothing depends on hash() or set order.
    code = (
        "from rstar_env.data import generate_problems as g; "
        "print(g(30, kind='mix', level='mixed', seed=0)[-1].to_dict())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "123"},
    )
    assert out.stdout.strip() == str(a[29].to_dict())


def test_generator_avoids_repeats_where_possible():
    ps = generate_problems(400, kind="word", level=3, seed=0)
    assert len({p.problem for p in ps}) == 400
    tiny = generate_problems(200, kind="arithmetic", level=1, seed=0)
    assert len({p.problem for p in tiny}) > 100  # ~126 distinct exist; repeats only once they run out
    assert len(tiny) == 200 and len(set(p.id for p in tiny)) == 200


def test_level_ranges_and_mixed_levels():
    ps = generate_problems(200, kind="arithmetic", level=(2, 3), seed=0)
    assert {p.metadata["level"] for p in ps} == {2, 3} and ps[0].id.startswith("arithmetic-L2-3-s0-")
    assert generate_problems(5, kind="word", level="2-3", seed=0) == generate_problems(5, kind="word", level=(2, 3))
    for bad in (0, 6, "hard", (4, 2)):
        with pytest.raises(DataError, match="level"):
            generate_problems(3, level=bad)
    with pytest.raises(DataError, match="unknown generated kind"):
        generate_problems(3, kind="geometry")


def test_generated_spec_syntax():
    assert parse_generated_spec("arithmetic") == {"kind": "arithmetic", "n": 1000, "level": 1, "seed": 0}
    assert parse_generated_spec("gen:word:level=3, n=20,seed=4") == {"kind": "word", "n": 20, "level": 3, "seed": 4}
    assert parse_generated_spec("mix:level=mixed")["level"] == "mixed"
    assert parse_generated_spec("mix:level=2-4")["level"] == (2, 4)
    assert parse_generated_spec("data/train.jsonl") is None
    with pytest.raises(DataError, match=r"bad parameter 'size=3'.*n=INT"):
        parse_generated_spec("arithmetic:size=3")
    with pytest.raises(DataError, match="bad n='ten'"):
        parse_generated_spec("arithmetic:n=ten")
    with pytest.raises(DataError, match="unknown generated set 'algebra'"):
        parse_generated_spec("gen:algebra")
    ds = load_dataset("arithmetic:level=2,n=50,seed=3")
    assert ds.to_list() == generate_problems(50, kind="arithmetic", level=2, seed=3)
    assert ds.name == "arithmetic:level=2,n=50,seed=3"
    # n is exact: generated sets are not de-duplicated again, even where level 1 must repeat.
    assert len(load_dataset("arithmetic:n=300")) == 300
    assert len(load_dataset("word:n=100", limit=7)) == 7


# ------------------------------------------------------------------------------ data inputs (issue 19)


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_path_objects_lists_and_iterables_are_sources(tmp_path):
    path = _write_jsonl(tmp_path / "p.jsonl", ['{"problem": "1+1?", "answer": "2"}'])
    assert [p.answer for p in load_dataset(path)] == ["2"]  # a Path, not only a str
    rows = [{"question": "2+2?", "answer": 4}]
    assert [p.answer for p in load_dataset(rows)] == ["4"]
    assert [p.problem for p in load_dataset(r for r in rows)] == ["2+2?"]  # any iterable of dicts

    def stream():  # a stream is read only as far as `limit` needs
        yield from ({"problem": f"q{i}?", "answer": str(i)} for i in range(3))
        raise AssertionError("read past the limit")

    assert len(load_dataset(stream(), limit=3)) == 3
    with pytest.raises(DataError, match=r"a list of dicts, or a datasets.Dataset"):
        load_dataset(42)


def test_hugging_face_dataset_objects_are_sources():
    hf = pytest.importorskip("datasets")
    table = hf.Dataset.from_list([{"question": "What is 3 * 3?", "answer": "9"}, {"question": "1 - 1?", "answer": "0"}])
    for source in (table, table.to_iterable_dataset(), hf.DatasetDict({"test": table})):
        ds = load_dataset(source, split="test")
        assert [(p.problem, p.answer) for p in ds] == [("What is 3 * 3?", "9"), ("1 - 1?", "0")]
        assert ds.name.startswith("datasets.")
    with pytest.raises(DataError, match=r"no split 'train'; its splits are test"):
        load_dataset(hf.DatasetDict({"test": table}))


def test_preset_name_reads_the_presets_hub_dataset(monkeypatch):
    calls = []

    def fake_load(name, config=None, split=None):
        calls.append((name, config, split))
        return [{"problem": "Find x.", "answer": "$\\boxed{042}$", "url": "AIME_I_Problems/Problem_3", "year": 2024}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load))
    ds = load_dataset("aime")
    assert calls == [(ROW_FORMATS["aime"].hub, None, "train")]
    assert (ds[0].answer, ds[0].id) == ("42", "2024-I-3")  # read with the aime preset itself


def test_bad_rows_stop_loading_or_are_skipped_and_counted(tmp_path, caplog):
    path = _write_jsonl(
        tmp_path / "mixed.jsonl",
        ['{"problem": "a?", "answer": "1"}', '{"problem": "no answer here"}', "not json", "[1, 2]",
         '{"problem": "", "answer": "3"}', '{"problem": "b?", "answer": "2"}'],
    )  # fmt: skip
    with pytest.raises(DataError, match=r"line 2: no answer field.*on_bad_row='skip'"):
        load_dataset(path)
    ds = load_dataset(path, on_bad_row="skip")
    assert [p.problem for p in ds] == ["a?", "b?"]
    assert ds.stats["bad_rows"] == 4 and ds.stats["rows"] == 6 and len(ds.bad_rows) == 4
    assert "line 2: no answer field" in ds.bad_rows[0] and "line 3: not valid JSON" in ds.bad_rows[1]
    assert "line 4: expected a JSON object" in ds.bad_rows[2] and "line 5: the problem field" in ds.bad_rows[3]
    assert "skipped 4 bad row(s) of 6" in caplog.text
    with pytest.raises(DataError, match="on_bad_row must be"):
        load_dataset(path, on_bad_row="ignore")
    with pytest.raises(DataError, match="4 as bad rows"):
        load_dataset([{"problem": "x"}] * 4, on_bad_row="skip")


def test_rows_without_an_answer_are_refused_unless_kept_unscored(tmp_path):
    rows = [{"problem": "p1", "answer": None}, {"problem": "p2", "answer": ""}, {"problem": "p3"}]
    with pytest.raises(DataError, match=r"row 0: the answer field 'answer' is empty.*allow_unscored=True"):
        load_dataset(rows)
    ds = load_dataset(rows, allow_unscored=True, integer_answers_only=True)
    assert [(p.problem, p.answer) for p in ds] == [("p1", None), ("p2", None), ("p3", None)]
    back = load_dataset(ds.save_jsonl(tmp_path / "unscored.jsonl"), allow_unscored=True)
    assert [p.answer for p in back] == [None, None, None]  # never the string "None"


def test_env_takes_every_data_input(math_env, echo_plugins, tmp_path):
    path = _write_jsonl(tmp_path / "one.jsonl", ['{"problem": "From a Path?", "answer": "1"}'])
    hf = pytest.importorskip("datasets")
    inputs = [path, str(path), [{"problem": "From a list?", "answer": "1"}],
              hf.Dataset.from_list([{"problem": "From datasets?", "answer": "1"}]),
              {"source": "arithmetic:n=5", "limit": 1}]  # fmt: skip
    for source, needle in zip(inputs, ["From a Path?", "From a Path?", "From a list?", "From datasets?", "What is"],
                              strict=True):  # fmt: skip
        env = math_env(tools=["echo"], reward="exact_test", dataset=source)
        assert needle in env.reset(seed=0)[0]
    with pytest.raises(DataError, match="on_bad_row='skip'"):  # rows given in memory are read at once
        math_env(tools=["echo"], reward="exact_test", dataset=[{"problem": "no answer"}])


def test_unscored_episodes_are_marked_and_never_judged(math_env, echo_plugins):
    env = math_env(tools=["echo"], reward="exact_test")
    with pytest.raises(ValueError, match=r"no answer to score against.*allow_unscored"):
        env.reset(options={"problem": "x", "answer": None})
    env = math_env(tools=["echo"], reward="exact_test", dataset={"allow_unscored": True})
    _, info = env.reset(options={"problem": "x", "answer": None})
    assert info["unscored"] is True
    # Before: the answer became the string "None", and \boxed{None} scored 1.0.
    _, reward, terminated, _, info = env.step("<answer>\\boxed{None}</answer>")
    assert (reward, terminated, info["unscored"]) == (0.0, True, True)
    traj = info["trajectory"]
    assert traj.reward_result.reason == "unscored" and traj.metadata["unscored"] is True
    _, info = env.reset(options={"problem": "y", "answer": "4"})
    assert "unscored" not in info  # a scored row after an unscored one is scored
    assert env.step("<answer>\\boxed{4}</answer>")[1] == 1.0
