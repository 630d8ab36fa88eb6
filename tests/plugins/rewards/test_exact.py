"""The ``math`` reward's ``exact_symbolic`` option, and the two forms the peer suites accept that it once rejected
(a ``,\\!`` thousands separator; a gold of several boxes answered as one set), with the near misses that must stay
wrong."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator

import pytest

from rstar_env.config import ConfigError, load_config
from rstar_env.plugins import load_reward
from rstar_plugins.rewards import MathReward
from rstar_plugins.rewards import extract as extract_module
from rstar_plugins.rewards._worker import EXACT_SYMBOLIC, compare, exact_decimals, is_symbolic, read_answer, with_mode
from rstar_plugins.rewards.math_reward import MathOptions

# A decimal a tool-using model gets by printing the value (Python prints it for it), for a symbolic gold.
DECIMALS_OF_SYMBOLIC_GOLDS = [
    ("\\frac{\\sqrt{3}}{2}", "0.866025"),
    ("\\pi", "3.141593"),
    ("\\ln 2", "0.693147"),
    ("\\frac{\\sqrt{3}}{2}", "0.8660254037844386"),  # every digit Python prints
    ("e", "2.718282"),
    ("2\\pi", "6.283185"),
    ("\\sin 1", "0.841471"),
    ("\\sqrt[3]{2}", "1.259921"),
    ("\\{\\sqrt{2}, -\\sqrt{2}\\}", "\\{1.414214, -1.414214\\}"),  # inside a set too
]
# Exact answers, some with a decimal that is exactly what it writes: right under either setting.
EXACT_ANSWERS = [
    ("\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}"),
    ("\\frac{\\sqrt{3}}{2}", "\\sqrt{3}/2"),
    ("\\frac{\\sqrt{3}}{2}", "0.5\\sqrt{3}"),
    ("\\frac{\\sqrt{3}}{10}", "0.1\\sqrt{3}"),
    ("2\\pi", "\\frac{4\\pi}{2}"),
    ("\\log_2 8", "3"),
    ("\\log_2 8", "3.0"),  # a symbolic gold whose value is rational: the decimal is exact
    ("\\sin\\frac{\\pi}{6}", "0.5"),
    ("\\sqrt{4}", "2.0"),
]
# A rational gold keeps today's rules: an exact decimal, or a stated rounding of four digits or more.
RATIONAL_GOLDS = [("\\frac{1}{4}", "0.25", 1.0), ("\\frac{1}{3}", "0.3333", 1.0), ("\\frac{1}{4}", "0.2501", 0.0)]


def framed(pred: str) -> str:
    return f"<answer>{pred}</answer>"


@pytest.fixture(scope="module")
def default(math_reward: MathReward) -> MathReward:
    return math_reward  # conftest's: one worker, no verdict cache


@pytest.fixture(scope="module")
def exact() -> Iterator[MathReward]:
    # Without the parsers' warm-up, as conftest's default: a dozen answers within the default 3 s limit.
    with MathReward(workers=1, cache_size=0, exact_symbolic=True, warm_up=False) as reward:
        yield reward


# -- the option --------------------------------------------------------------------------------------------------------
def test_the_option_is_declared_off_by_default_and_checked_by_configs() -> None:
    assert MathOptions().exact_symbolic is False
    assert MathOptions(exact_symbolic=True).exact_symbolic is True
    config = load_config({"reward": {"name": "math", "options": {"exact_symbolic": True}}})
    assert config.reward.options == {"exact_symbolic": True}
    with pytest.raises(ConfigError, match=r"reward\.options\.exact_symbolic: Input should be a valid boolean"):
        load_config({"reward": {"name": "math", "options": {"exact_symbolic": "sometimes"}}})
    reward = load_reward("math", exact_symbolic=True, workers=1)
    try:
        assert reward.exact_symbolic is True
    finally:
        reward.close()


def test_the_mode_travels_with_the_gold() -> None:
    assert with_mode("\\pi", False) == "\\pi"
    assert with_mode("\\pi", True) == EXACT_SYMBOLIC + "\\pi"
    reward = MathReward(exact_symbolic=True)
    staged = reward._prepare(framed("3.141593"), "\\pi")
    assert isinstance(staged, tuple) and staged[1] == EXACT_SYMBOLIC + "\\pi"
    assert reward._pool is None  # preparing never starts a worker


# -- decimals of symbolic golds ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("gold", "pred"), DECIMALS_OF_SYMBOLIC_GOLDS)
def test_a_decimal_is_refused_for_a_symbolic_gold_under_exact_symbolic(exact: MathReward, gold: str, pred: str) -> None:
    result = exact.score_sync(framed(pred), gold)
    assert (result.reward, result.reason) == (0.0, "mismatch")


@pytest.mark.parametrize(("gold", "pred"), DECIMALS_OF_SYMBOLIC_GOLDS[:4])
def test_without_it_the_decimal_scores_as_math_verify_scores_it(default: MathReward, gold: str, pred: str) -> None:
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    assert verify(parse(f"${gold}$"), parse(pred))  # math-verify's own verdict: the shortcut exists there
    assert default.score_sync(framed(pred), gold).reward == 1.0


@pytest.mark.parametrize(("gold", "pred"), EXACT_ANSWERS)
def test_exact_answers_are_right_either_way(default: MathReward, exact: MathReward, gold: str, pred: str) -> None:
    assert exact.score_sync(framed(pred), gold).reward == 1.0
    assert default.score_sync(framed(pred), gold).reward == 1.0


@pytest.mark.parametrize(("gold", "pred", "expected"), RATIONAL_GOLDS)
def test_a_rational_gold_keeps_its_rules(default: MathReward, exact: MathReward, gold, pred, expected) -> None:
    assert exact.score_sync(framed(pred), gold).reward == expected
    assert default.score_sync(framed(pred), gold).reward == expected


def test_what_counts_as_symbolic() -> None:
    for gold in ("\\pi", "e", "\\sqrt{2}", "\\ln 2", "\\sin 1", "\\frac{\\sqrt{3}}{2}", "x = \\sqrt{2}", "\\sqrt{4}"):
        assert is_symbolic(read_answer(gold)), gold
    for gold in ("\\frac{1}{4}", "3", "0.25", "\\{1, 2\\}", "1.5\\pi", "\\text{odd}"):
        assert not is_symbolic(read_answer(gold)), gold


def test_decimals_read_as_the_exact_numbers_they_write() -> None:
    from sympy import Rational, sqrt

    assert exact_decimals(read_answer("0.866025"))[0] == Rational(173205, 200000)
    assert exact_decimals(read_answer("0.1\\sqrt{3}"))[0] == sqrt(3) / 10
    assert exact_decimals(read_answer("0.866025"))[1:] == read_answer("0.866025")[1:]  # the texts stay
    # In the worker: the decimal is a mismatch only when the gold is symbolic and the mode asks for it.
    assert compare("0.866025", with_mode("\\frac{\\sqrt{3}}{2}", True))[0] == "mismatch"
    assert compare("0.866025", with_mode("\\frac{\\sqrt{3}}{2}", False))[0] == "verified"
    assert compare("0.333333", with_mode("\\frac{1}{3}", True))[0] == "verified"


def test_a_pathological_answer_still_ends_at_the_timeout_under_exact_symbolic() -> None:
    with MathReward(workers=1, timeout_s=1.0, cache_size=0, exact_symbolic=True, warm_up=False) as reward:
        result = reward.score_sync(framed("0.5^{5^{5^{5^5}}} + \\sqrt{2}"), "\\sqrt{2}")
    assert result.reward == 0.0 and result.reason in ("timeout", "mismatch")


# -- finding 5: a ,\! thousands separator ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("32349", "32,\\!349"),
        ("32,\\!349", "32349"),
        ("32349", "32,\\! 349"),  # Math-Verify's test: the separator then a space
        ("11111111100", "11,\\! 111,\\! 111,\\! 100"),
        ("676,\\!000", "\\boxed{676000}"),
        ("1,\\!000,\\!000,\\!000", "10^9"),
        ("32349", "32\\,349"),
        ("32349", "32{,}349"),
    ],
)
def test_a_thin_space_thousands_separator_reads_as_one_number(default: MathReward, gold: str, pred: str) -> None:
    assert default.score_sync(framed(pred), gold).reward == 1.0


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("32,\\!349", "32349.5"),
        ("32,\\!349", "3,2349"),
        ("32,\\!349", "32, 349"),
        ("32,\\!349", "32,\\!350"),
        ("32349", "32, 349"),  # a comma and a space is a list, never one number
        ("100,\\!000", "100"),
        ("15", "1,\\!5"),  # no group of three: not a separator
    ],
)
def test_near_misses_of_the_separator_stay_wrong(default: MathReward, gold: str, pred: str) -> None:
    assert default.score_sync(framed(pred), gold).reward == 0.0


# -- finding 5: a gold of several boxes -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("\\(\\boxed{1}\\) and \\(\\boxed{-2}\\).", "$\\boxed{-2,1}$."),
        ("\\(\\boxed{2}\\) and \\(\\boxed{3}\\)", "\\boxed{2, 3}"),
        ("\\[\\boxed{-1}\\] or \\[\\boxed{4}\\]", "$\\boxed{4, -1}$"),
        ("\\boxed{2}, \\boxed{3}", "\\boxed{2, 3}"),
        ("\\boxed{2} and \\boxed{3}", "\\boxed{3, 2}"),
        ("\\boxed{2, 3}", "\\(\\boxed{3}\\) and \\(\\boxed{2}\\)"),  # the reverse
    ],
)
def test_a_gold_of_several_boxes_answered_as_one_set(default: MathReward, gold: str, pred: str) -> None:
    assert default.score_sync(framed(pred), gold).reward == 1.0


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("\\boxed{2}, \\boxed{3}", "\\boxed{2}"),
        ("\\boxed{2}, \\boxed{3}", "\\boxed{2, 4}"),
        ("\\boxed{2}, \\boxed{3}", "\\boxed{2, 3, 4}"),
        ("\\(\\boxed{1}\\) and \\(\\boxed{-2}\\).", "\\boxed{1}"),
        ("\\(\\boxed{2}\\) and \\(\\boxed{3}\\)", "\\boxed{2, 3, 4}"),
        ("\\boxed{2, 3}", "\\(\\boxed{3}\\) and \\(\\boxed{4}\\)"),
    ],
)
def test_part_of_the_boxes_or_one_more_stays_wrong(default: MathReward, gold: str, pred: str) -> None:
    assert default.score_sync(framed(pred), gold).reward == 0.0


def test_boxes_in_their_own_delimiters_are_one_run() -> None:
    found = extract_module.locate("\\(\\boxed{1}\\) and \\(\\boxed{-2}\\).", answer_block=False)
    assert found is not None and found.shown == "1, -2" and found.single is None
    # Prose between them still ends the run: only the last box is the answer.
    found = extract_module.locate("\\(\\boxed{1}\\) is wrong, so \\(\\boxed{-2}\\).", answer_block=False)
    assert found is not None and found.shown == "-2"


def test_joining_boxes_reads_a_bounded_gap_per_box(monkeypatch: pytest.MonkeyPatch) -> None:
    """Work, not time: the separator pattern only ever sees gaps of at most ``_MAX_GAP`` characters, one per box, so
    extraction stays linear in the response however its boxes are spaced."""
    seen: list[int] = []
    pattern = extract_module._BETWEEN_BOXES

    class Counting:
        def fullmatch(self, text: str) -> re.Match[str] | None:
            seen.append(len(text))
            return pattern.fullmatch(text)

    monkeypatch.setattr(extract_module, "_BETWEEN_BOXES", Counting())
    n = 2_000
    for unit in ("\\(\\boxed{1}\\) and ", "\\boxed{1}" + " " * 100, "\\[\\boxed{1}\\] or "):
        seen.clear()
        found = extract_module.locate(unit * n, answer_block=False)
        assert found is not None
        assert len(seen) <= n and max(seen, default=0) <= extract_module._MAX_GAP
