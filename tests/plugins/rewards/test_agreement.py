"""The ``math`` reward against the labelled set ``tests/fixtures/verifier_cases.jsonl`` (cases written from the
documented behaviour of Math-Verify's test suite, the Qwen2.5-Math grader and verl's prime_math, plus this project's
corner cases), side by side with math-verify called directly with its defaults (``verify(parse(gold), parse(pred))``).

The acceptance measure is on the held-out part, never used to tune the reward: at least as many agreements as
math-verify, at least 97%, and no false accept that math-verify avoids. ``rstar-env bench reward`` prints the same
figures.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from rstar_env.bench.reward import CASES_PATH, agreement, load_cases


def test_the_labelled_set_is_well_formed() -> None:
    lines = [json.loads(line) for line in CASES_PATH.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(lines) >= 250
    assert all(set(c) >= {"id", "split", "source", "topic", "gold", "pred", "expected"} for c in lines)
    assert all(c["expected"] in (0, 1) and c["split"] in ("dev", "heldout") for c in lines)
    assert len({c["id"] for c in lines}) == len(lines)
    assert len({(c["gold"], c["pred"]) for c in lines}) == len(lines)
    splits = Counter(c["split"] for c in lines)
    assert splits["heldout"] >= 100 and splits["dev"] >= 100
    # Every suite, and both verdicts, are represented in the held-out part.
    heldout = load_cases(split="heldout")
    assert {c["source"] for c in heldout} == {"mv", "qwen", "verl", "proj"}
    assert {c["expected"] for c in heldout} == {0, 1}
    # Round 2 (issue 34): cases from Math-Verify's tests and the Qwen2.5-Math grader's, added after the rules they
    # measure were written and never used to tune them; all held out.
    second = [c for c in lines if c.get("round") == 2]
    assert len(second) >= 80 and all(c["split"] == "heldout" for c in second)
    # Round 3 (issue 42): Math-Verify's tests of the ",\\!" thousands separator, golds of several boxes in their own
    # delimiters, and the near misses of both. Written with the rules that read them, so dev, never held out.
    third = [c for c in lines if c.get("round") == 3]
    assert len(third) >= 20 and all(c["split"] == "dev" for c in third)
    assert {c["expected"] for c in third} == {0, 1}


@pytest.fixture(scope="module")
def heldout() -> dict:
    return agreement(split="heldout", workers=2)


def test_heldout_agreement_above_math_verify_and_97_percent(heldout: dict) -> None:
    n = heldout["cases"]
    ours, direct = heldout["rstar_env"]["agree"], heldout["direct"]["agree"]
    misses = [r for r in heldout["rows"] if r["ours"] != r["expected"]]
    assert ours > direct, misses
    assert ours >= 0.97 * n, misses


def test_no_false_accept_that_math_verify_avoids(heldout: dict) -> None:
    assert heldout["false_accepts_direct_avoids"] == []


@pytest.mark.parametrize(
    ("gold", "pred", "expected"),
    [
        ("\\{1,2,3\\}", "\\boxed{1}, \\boxed{2}, \\boxed{3}", 1.0),  # several boxes are one answer
        ("[1, 2, 3]", "[1, 2, 3]", 1.0),  # identical free text reads alike
        ("(1, 2, 3)", "(1, 2, 3)", 1.0),
        ("1,22", "1.22", 1.0),  # a decimal comma, not a pair
        ("10455", "We try \\boxed{3} and \\boxed{5}; the final answer is $10,455$.", 1.0),
        ("32349", "32, 349", 0.0),  # a list, never one number
        ("5, 125", "\\boxed{5125}", 0.0),
        ("346", "\\boxed{0, 346}", 0.0),
        ("33", "+033", 1.0),
        ("(0,\\infty)", "x > 0", 1.0),  # interval against inequality
        ("32349", "32,\\!349", 1.0),  # a thousands separator with a negative thin space (issue 42)
        ("32,\\!349", "32, 349", 0.0),  # ... and a list is still never that number
        ("\\(\\boxed{1}\\) and \\(\\boxed{-2}\\).", "$\\boxed{-2,1}$.", 1.0),  # a gold of several boxes
    ],
)
def test_corner_cases_from_the_peer_suites(math_reward: Any, gold: str, pred: str, expected: float) -> None:
    # conftest's reward: one worker, started once, and no verdict cache, so each case is scored afresh
    assert math_reward.score_sync(f"<answer>{pred}</answer>", gold).reward == expected
