"""Answers the ``math`` reward used to reject though they are right (issue 34, finding 8), and the near misses
that must stay wrong: presentation-only LaTeX, word answers, several boxes in the gold, a decimal at the precision
it states, inline math over several lines."""

from __future__ import annotations

import pytest

from rstar_env.data.answers import text_answer
from rstar_env.data.numbers import strip_presentation
from rstar_plugins.rewards import MathReward
from rstar_plugins.rewards._worker import join_math_lines, stated_places


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("**346**", "346"),
        ("The answer is **346**.", "The answer is 346."),
        ("346 \\pmod{1000}", "346"),
        ("346 \\bmod 1000", "346"),
        ("\\underline{346}", "346"),
        ("\\color{red}346", "346"),
        ("\\textcolor{red}{346}", "346"),
        ("\\colorbox{yellow}{346}", "346"),
        ("\\phantom{9}346", "346"),
        ("3\\phantom{4}6", "36"),
        ("\\hphantom{\\frac{1}{2}}5", "5"),
        ("\\num{346}", "346"),
        ("\\operatorname{346}", "346"),
        ("346^{}", "346"),
        ("x_{}", "x"),
        ("\\langle 1,2\\rangle", "( 1,2)"),
        ("\\varnothing", "\\emptyset"),
        ("\\textcolor{red}{\\underline{3}}4", "34"),
        # What carries meaning stays.
        ("x**2 + y**2", "x**2 + y**2"),
        ("\\operatorname{lcm}(a,b)", "\\operatorname{lcm}(a,b)"),
        ("x^{2}", "x^{2}"),
        ("\\overline{AB}", "\\overline{AB}"),
        ("a \\bmod b", "a \\bmod b"),
        ("\\phantom{", "\\phantom{"),  # unbalanced: left alone
    ],
)
def test_strip_presentation(text: str, plain: str) -> None:
    assert strip_presentation(text) == plain


def test_strip_presentation_is_linear() -> None:
    nested = "\\underline{" * 3000 + "7" + "}" * 3000
    assert strip_presentation(nested) == "7"


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("Yes", "yes"),
        ("\\text{No}", "no"),
        ("**No**.", "no"),
        ("$\\text{Evelyn}$", "evelyn"),
        ("Even", "even"),
        ("YES", "yes"),
        ("no solution", "no solution"),
        ("does not exist", "does not exist"),
        # Case may carry meaning, or it is no word: left to math-verify.
        ("abc", None),
        ("AB", None),
        ("ABCD", None),
        ("A", None),
        ("x", None),
        ("12", None),
        ("sqrt x", None),
        ("\\text{(C)}", None),
        ("infinity", None),
    ],
)
def test_text_answer(text: str, words: str | None) -> None:
    assert text_answer(text) == words


def test_stated_places_and_joined_lines() -> None:
    assert stated_places("(0.6,2.6667]") == 4 and stated_places("0.3333") == 4
    assert stated_places("0.333") is None and stated_places("0.0833333333333333") is None  # too few, or 6+
    assert join_math_lines("$(1,\n2)$") == "$(1, 2)$"
    assert join_math_lines("costs $5 and\nthen $10") == "costs $5 and\nthen $10"  # prose between dollars


@pytest.fixture(scope="module")
def reward(math_reward: MathReward) -> MathReward:
    return math_reward  # conftest's: one worker, no verdict cache


RIGHT = [
    ("Yes", "yes"),
    ("yes", "\\text{Yes}"),
    ("\\text{odd}", "Odd"),
    ("\\varnothing", "\\emptyset"),
    ("\\emptyset", "\\varnothing"),
    ("(1,2)", "\\langle 1,2\\rangle"),
    ("346", "**346**"),
    ("346", "346 \\pmod{1000}"),
    ("346", "\\underline{346}"),
    ("346", "\\color{red}346"),
    ("346", "\\textcolor{red}{346}"),
    ("346", "\\phantom{9}346"),
    ("346", "\\num{346}"),
    ("346", "\\operatorname{346}"),
    ("346", "346^{}"),
    ("36", "3\\phantom{4}6"),
    # several boxes in the gold are one list
    ("$\\boxed{1}\\boxed{2}$", "$\\boxed{1,2}$"),
    ("\\boxed{1}, \\boxed{2}", "1, 2"),
    ("\\boxed{1} and \\boxed{2}", "\\{1,2\\}"),
    # a decimal at the precision it states, for an exact fraction
    ("\\frac{1}{3}", "0.3333"),
    ("\\frac{8}{3}", "2.6667"),
    ("$(\\frac{3}{5},\\frac{8}{3}]$", "$(0.6,2.6667]$"),
    # inline math over several lines
    ("(1,2)", "$(1,\n2)$"),
    ("x+1", "The answer is $x\n+1$."),
    # set against relation, both ways
    ("-2 \\le x \\le 7", "x \\in [-2,7]"),
    ("x \\in [-2,7]", "-2 \\le x \\le 7"),
]
WRONG = [
    ("no", "yes"),
    ("Yes", "no"),
    ("Evelyn", "Carla"),
    ("346", "**345**"),
    ("346", "\\phantom{3}46"),
    ("346", "3\\phantom{4}6"),
    ("346", "345 \\pmod{1000}"),
    ("1346", "346 \\pmod{1000}"),
    ("346", "\\color{red}345"),
    ("346", "\\textcolor{red}{345}"),
    ("346", "\\underline{345}"),
    ("(1,2)", "\\langle 2,1\\rangle"),
    ("\\emptyset", "\\{0\\}"),
    ("\\boxed{1}, \\boxed{2}", "2"),
    ("\\boxed{1}\\boxed{2}", "\\boxed{1,3}"),
    ("\\boxed{1} and \\boxed{2}", "1, 2, 3"),
    ("\\frac{1}{3}", "0.3334"),
    ("\\frac{1}{3}", "0.33"),
    ("\\frac{1}{3}", "0.3"),
    ("\\frac{2}{3}", "0.67"),
    ("\\frac{1}{4}", "0.2501"),
    ("\\pi", "3.1416"),
    ("(\\frac{3}{5},\\frac{8}{3}]", "(0.6,2.6666]"),
    ("(1,2)", "$(1,\n3)$"),
    ("-2 \\le x \\le 7", "x \\in (-2,7]"),
    ("abc", "ABC"),
]


@pytest.mark.parametrize(("gold", "pred"), RIGHT)
def test_right_answers_are_accepted(reward: MathReward, gold: str, pred: str) -> None:
    result = reward.score_sync(f"<answer>{pred}</answer>", gold)
    assert result.reward == 1.0, result


@pytest.mark.parametrize(("gold", "pred"), WRONG)
def test_near_misses_stay_wrong(reward: MathReward, gold: str, pred: str) -> None:
    result = reward.score_sync(f"<answer>{pred}</answer>", gold)
    assert result.reward == 0.0, result
    if text_answer(gold) is not None:
        assert result.reason == "mismatch", result  # a word gold is a gold, not a data problem (bad_gold)
