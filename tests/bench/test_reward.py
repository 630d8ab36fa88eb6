"""``rstar-env bench reward``: runs end to end and reports every workload both ways, and the agreement figures."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rstar_env.bench import reward as bench
from rstar_env.bench.reward import command, integer_pairs, load_cases, mixed_pairs, symbolic_pairs


def test_pairs_are_distinct() -> None:
    assert len(set(integer_pairs(100))) == 100
    assert len(set(symbolic_pairs(48))) == 48


def test_mixed_pairs_are_the_labelled_set_framed() -> None:
    cases = load_cases()
    pairs = mixed_pairs(len(cases) + 5)
    assert len(pairs) == len(cases) + 5
    assert {(p[2], p[1]) for p in pairs} == {(c["pred"], str(c["gold"])) for c in cases}
    assert all(response == f"<answer>{pred}</answer>" for response, _, pred in pairs)


def test_bench_json(tmp_path) -> None:
    # A small labelled set: the mixed workload warms up on every dev case both ways first (math-verify called
    # directly, with no budget), which on the whole set is most of this test's time; 8 dev cases exercise it.
    cases = load_cases()
    small = [c for c in cases if c["split"] == "dev"][:8] + [c for c in cases if c["split"] == "heldout"][:24]
    labelled = tmp_path / "cases.jsonl"
    labelled.write_text("".join(json.dumps(c) + "\n" for c in small), encoding="utf-8")
    result = CliRunner().invoke(
        command,
        [
            "--cases",
            str(labelled),
            "--n-int",
            "400",
            "--n-sym",
            "12",
            "--n-mix",
            "24",
            "--workers",
            "1",
            "--direct-budget",
            "0.5",
            "--rounds",
            "2",
            "--no-agreement",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["mixed"]["pairs"] == 24 and "agreement" not in figures
    assert figures["mixed_warm_up_pairs"] == 8
    for workload in ("integer", "symbolic", "mixed"):
        row = figures[workload]
        assert row["rstar_env_per_s"] > 0 and row["direct_per_s"] > 0 and row["ratio"] > 0
    assert figures["integer"]["reasons"] == {"exact": 200, "mismatch": 200}
    symbolic = figures["symbolic"]["reasons"]  # all right; identical-looking ones are decided without math-verify
    assert set(symbolic) <= {"verified", "exact"} and sum(symbolic.values()) == 12 and symbolic["verified"] >= 10


def test_bench_table(monkeypatch) -> None:
    # Rendering only: the figures are canned, the measuring is covered above.
    row = {"pairs": 10, "rstar_env_per_s": 5000.0, "direct_per_s": 100.0, "ratio": 50.0, "reasons": {"exact": 10}}
    canned = {
        "cpus": 2,
        "workers": 2,
        "load_avg": 1.0,
        "pool_startup_s": 0.5,
        "integer": row,
        "symbolic": row,
        "mixed": row,
    }
    agree = {
        "split": "heldout",
        "cases": 10,
        "rows": [],
        "false_accepts_direct_avoids": [],
        "rstar_env": {"agree": 10, "false_accepts": [], "false_rejects": []},
        "direct": {"agree": 8, "false_accepts": ["a"], "false_rejects": ["b"]},
    }
    monkeypatch.setattr(bench, "run_bench", lambda **_: canned)
    monkeypatch.setattr(bench, "agreement", lambda *_: dict(agree))
    result = CliRunner().invoke(bench.command, [], terminal_width=160)
    assert result.exit_code == 0, result.output
    for text in ("integer", "symbolic", "mixed", "50.0x", "10/10", "8/10", "80.0"):
        assert text in result.output, text
