"""``rstar-env bench reward``: runs end to end and reports both workloads both ways."""

from __future__ import annotations

import json

from click.testing import CliRunner

from rstar_env.bench import reward as bench
from rstar_env.bench.reward import command, integer_pairs, symbolic_pairs


def test_pairs_are_distinct() -> None:
    assert len(set(integer_pairs(100))) == 100
    assert len(set(symbolic_pairs(48))) == 48


def test_bench_json() -> None:
    result = CliRunner().invoke(command, ["--n-int", "400", "--n-sym", "12", "--workers", "1",
                                          "--direct-budget", "0.5", "--rounds", "2", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    for workload in ("integer", "symbolic"):
        row = figures[workload]
        assert row["rstar_env_per_s"] > 0 and row["direct_per_s"] > 0 and row["ratio"] > 0
    assert figures["integer"]["reasons"] == {"exact": 200, "mismatch": 200}
    assert figures["symbolic"]["reasons"] == {"verified": 12}


def test_bench_table(monkeypatch) -> None:
    # Rendering only: the figures are canned, the measuring is covered above.
    row = {"pairs": 10, "rstar_env_per_s": 5000.0, "direct_per_s": 100.0, "ratio": 50.0, "reasons": {"exact": 10}}
    canned = {"cpus": 2, "workers": 2, "pool_startup_s": 0.5, "integer": row, "symbolic": row}
    monkeypatch.setattr(bench, "run_bench", lambda **_: canned)
    result = CliRunner().invoke(bench.command, [])
    assert result.exit_code == 0, result.output
    assert "integer" in result.output and "symbolic" in result.output and "50.0x" in result.output
