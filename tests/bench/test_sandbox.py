"""``rstar-env bench sandbox``: backends with options run side by side in one run."""

from __future__ import annotations

import errno
import json

import pytest
from click.testing import CliRunner

from rstar_env.bench.sandbox import command, parse_backend


def test_a_backend_spec_carries_its_options() -> None:
    assert parse_backend("local") == ("local", {})
    assert parse_backend("local:pid_namespace=false,spares=2,isolation=none") == (
        "local",
        {"pid_namespace": False, "spares": 2, "isolation": "none"},
    )
    with pytest.raises(ValueError, match="not KEY=VALUE"):
        parse_backend("local:pid_namespace")


def test_two_settings_of_the_local_pool_are_measured_in_one_run() -> None:
    backends = ["--backend", "local", "--backend", "local:pid_namespace=false"]
    args = [*backends, "--no-baseline", "--workload", "print", "--repeats", "0", "--concurrency", "2"]
    result = CliRunner().invoke(command, [*args, "--calls", "6", "--budget-s", "20", "--json"])
    assert result.exit_code == 0, result.output
    rows = [row for row in json.loads(result.output)["rows"] if "ops" in row]
    assert [row["backend"] for row in rows] == ["local", "local:pid_namespace=false"]
    assert all(row["ops"] == 6 and row["failures"] == 0 for row in rows), rows


def test_an_unknown_backend_in_a_spec_is_refused() -> None:
    result = CliRunner().invoke(command, ["--backend", "nowhere:x=1", "--calls", "1"])
    assert result.exit_code != 0 and "unknown backend" in result.output


def test_the_page_cache_channel_reports_its_bits_per_second_with_the_probe_refused() -> None:
    pytest.importorskip("pyseccomp")
    args = ["--workload", "pagecache", "--backend", "local", "--no-baseline", "--rounds", "1", "--json"]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    timing, pagemap = json.loads(result.output)["channels"]
    assert timing["channel"] == "pagecache" and pagemap["channel"] == "pagecache (pagemap)", (timing, pagemap)
    assert timing["rwf_nowait"] == [errno.errorcode[errno.EOPNOTSUPP]], timing  # the probe itself is refused
    for row in (timing, pagemap):
        assert row["bits"] == 64 and 0 <= row["wrong"] <= 64, row
        assert row["bits_per_s"] >= 0 and row["seconds"] > 0, row
