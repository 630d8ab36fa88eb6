"""The exact fast path of the math reward: what reads as a number, and when a pair is decided in-process."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rstar_env.data.numbers import Number, compare_numbers, parse_number


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42),
        ("042", 42),
        ("-7", -7),
        ("+5", 5),
        ("- 5", -5),
        ("5.", 5),
        ("5.00", 5),
        ("{7}", 7),
        ("1,000", 1000),
        ("1{,}000", 1000),
        ("1\\,000", 1000),
        ("32,\\!349", 32349),  # the MATH dataset's thousands separator: a comma and a negative thin space
        ("32,\\! 349", 32349),
        ("1,\\!000,\\!000", 10**6),
        ("\\$16,\\!386.20", Fraction(163862, 10)),
        ("1 000", 1000),
        ("1,000,000", 10**6),
        ("\\frac{1}{2}", Fraction(1, 2)),
        ("\\dfrac{3}{4}", Fraction(3, 4)),
        ("\\tfrac34", Fraction(3, 4)),
        ("\\frac12", Fraction(1, 2)),
        ("\\frac1{2}", Fraction(1, 2)),
        ("-\\frac{1}{2}", Fraction(-1, 2)),
        ("\\frac{-1}{2}", Fraction(-1, 2)),
        ("3/4", Fraction(3, 4)),
        (".5", Fraction(1, 2)),
        ("$18.90$", Fraction(189, 10)),
        ("\\$18.90", Fraction(189, 10)),
        ("30^\\circ", 30),
        ("30^{\\circ}", 30),
        ("45°", 45),
        ("5\\text{ cm}", 5),
        ("\\text{5}", 5),
        ("\\text{6 apples}", 6),
        ("\\textbf{15}", 15),
        ("x=5", 5),
        ("x = -3", -3),
        ("a_1 = 4", 4),
        ("\\left. 7 \\right.", 7),
        ("\u22123", -3),
    ],
)
def test_reads_as_number(text: str, value: Fraction | int) -> None:
    number = parse_number(text)
    assert number is not None and number.value == value


@pytest.mark.parametrize(
    "text",
    [
        "x^2",
        "2 3",
        "5\\text{ or }6",
        "5\\text{ m}^2",
        "\\text{5 and a half}",
        "\\text{3 hundred}",
        "10^6",
        "\\frac{1}{0}",
        "1/0",
        "\\sqrt{2}",
        "(1,2)",
        "1,2",
        "1, 2",
        "32, 349",  # a list
        "3,\\!2349",  # a comma and a thin space before four digits: no thousands group
        "1,\\!5",
        "\\{1\\}",
        "x=5,y=6",
        "2\\pi",
        "",
        "  ",
        "1" * 100,
        "5 \\pm 2",
        "\\pi",
    ],
)
def test_not_a_plain_number(text: str) -> None:
    assert parse_number(text) is None


def test_percent_is_flagged() -> None:
    number = parse_number("50\\%")
    assert number == Number(Fraction(50), percent=True)
    assert parse_number("50%") == number


@pytest.mark.parametrize(
    ("pred", "gold", "decided"),
    [
        ("1/2", "0.5", True),
        ("0.50", "\\frac{1}{2}", True),
        ("50\\%", "50", True),
        ("50\\%", "0.5", True),
        ("40\\%", "0.5", False),
        ("12", "21", False),
        ("\\frac13", "\\frac14", False),
        ("0.1000001", "0.1", False),  # two terminating decimals: a real difference, not a rounding
        ("1.9999999", "2", False),
        ("3.5", "3", False),
        # A decimal of 4+ significant digits that is the exact gold rounded to the places it states is equal.
        ("0.333333", "\\frac{1}{3}", True),
        ("0.3333", "\\frac{1}{3}", True),
        ("2.6667", "8/3", True),
        ("0.6667", "2/3", True),
        ("0.08333", "\\frac{1}{12}", True),
        ("0.3334", "\\frac{1}{3}", None),  # a wrong rounding, but close: math-verify decides
        ("0.33", "\\frac{1}{3}", False),
        ("0.67", "2/3", False),  # too coarse to tell from a wrong answer
        ("0.2501", "1/4", False),  # a gold with an exact decimal form must be written exactly
        ("0.1", "\\frac{1}{3}", False),
    ],
)
def test_compare_numbers(pred: str, gold: str, decided: bool | None) -> None:
    p, g = parse_number(pred), parse_number(gold)
    assert p is not None and g is not None
    assert compare_numbers(p, g) is decided


@settings(max_examples=200, deadline=None)
@given(num=st.integers(-(10**6), 10**6), den=st.integers(1, 10**4))
def test_fraction_spellings_agree(num: int, den: int) -> None:
    value = Fraction(num, den)
    spellings = [
        f"\\frac{{{num}}}{{{den}}}",
        f"\\dfrac{{{num}}}{{{den}}}",
        f"{num}/{den}",
        f"$\\frac{{{num}}}{{{den}}}$.",
    ]
    parsed = [parse_number(s) for s in spellings]
    assert all(p is not None and p.value == value for p in parsed)
    assert all(compare_numbers(p, parsed[0]) is True for p in parsed if p is not None)


@settings(max_examples=200, deadline=None)
@given(a=st.integers(-(10**12), 10**12), b=st.integers(-(10**12), 10**12))
def test_integers_decide_exactly(a: int, b: int) -> None:
    pa, pb = parse_number(f"{a:,}" if a % 2 else str(a)), parse_number(str(b))
    assert pa is not None and pb is not None
    assert compare_numbers(pa, pb) is (a == b)


def test_fast_path_is_fast(count_work) -> None:
    # In-process, about a hundred lines of Python per answer (microseconds; sympy would run thousands): counted.
    for text in ("1,234", "\\dfrac{3}{4}", "42", "x = 17", "30^\\circ", "1" * 60, "x" * 10_000):
        _, work = count_work(parse_number, text)
        assert work < 400, (text, work)
    pairs = [(parse_number(str(k)), parse_number(f"{k},000")) for k in range(1, 200)]
    assert all(p is not None and q is not None for p, q in pairs)


def test_datasets_read_the_thin_space_separator_as_the_reward_does() -> None:
    from rstar_env.data.answers import integer_answer, normalize_answer

    # MATH writes its answers' thousands this way: the dataset's integer filter and the reward agree on them.
    assert integer_answer("676,\\!000") == 676000 and normalize_answer("$1,\\!000,\\!000$") == "1000000"
    assert integer_answer("3,\\!2349") is None and integer_answer("32, 349") is None
