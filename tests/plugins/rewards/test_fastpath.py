"""The exact fast path is never wrong: on random integer lists, whenever it decides a pair, math-verify agrees.

Lists are written the ways models and datasets write them ("5, 125", "\\{5, 125\\}", "5,125"), numbers with and
without thousands separators, and wrong answers that look like right ones (a list's digits run together, a list
one item short). The fast path may decline (``None``: math-verify decides); it may never contradict it.
"""

from __future__ import annotations

import logging

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rstar_plugins.rewards import MathReward
from rstar_plugins.rewards._worker import compare

logging.getLogger("math_verify").setLevel(logging.CRITICAL)

_REWARD = MathReward(workers=1)  # only its in-process fast path is used here: no worker starts


def fast_verdict(pred: str, gold: str) -> bool | None:
    result = _REWARD._prepare(f"<answer>{pred}</answer>", gold)
    if isinstance(result, tuple):
        return None
    assert result.reason in ("exact", "mismatch"), result
    return result.reason == "exact"


def direct_verdict(pred: str, gold: str) -> bool:
    from math_verify import parse, verify

    return bool(verify(parse(f"${gold}$"), parse(f"${pred}$")))


def written(values: list[int], style: int) -> str:
    items = [f"{v:,}" if style == 3 and abs(v) >= 1000 else str(v) for v in values]
    if style == 0:
        return ", ".join(items)
    if style == 1:
        return "\\{" + ", ".join(items) + "\\}"
    if style == 2:
        return ",".join(items)
    return ", ".join(items)


ints = st.integers(min_value=-2000, max_value=100_000)
lists = st.lists(ints, min_size=1, max_size=4)


@st.composite
def pairs(draw) -> tuple[str, str]:
    gold_values = draw(lists)
    kind = draw(st.sampled_from(["same", "shuffled", "joined", "shorter", "other"]))
    if kind == "same":
        pred_values = list(gold_values)
    elif kind == "shuffled":
        pred_values = draw(st.permutations(gold_values))
    elif kind == "joined":  # "32, 349" against "32349": the digits run together
        pred_values = [int("".join(str(abs(v)) for v in gold_values))]
    elif kind == "shorter":
        pred_values = gold_values[:-1] or [gold_values[0] + 1]
    else:
        pred_values = draw(lists)
    return written(pred_values, draw(st.integers(0, 3))), written(gold_values, draw(st.integers(0, 3)))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs())
@example(("32, 349", "32349"))
@example(("5125", "5, 125"))
@example(("346", "0, 346"))
@example(("7,425,000", "7425000"))
@example(("1,000", "1000"))
@example(("-430,760", "-430, 760"))
def test_fast_path_agrees_with_math_verify_on_integer_lists(pair: tuple[str, str]) -> None:
    pred, gold = pair
    fast = fast_verdict(pred, gold)
    if fast is None:
        return
    # The reward's own math-verify path (same reading of gold and prediction) must say the same...
    slow = compare(pred, gold)[0] == "verified"
    assert fast == slow, (pred, gold, fast)
    # ...and so must math-verify called directly on the LaTeX, wherever commas cannot be thousands separators.
    if ", " in pred and ", " in gold:
        assert fast == direct_verdict(pred, gold), (pred, gold, fast)


def test_lists_are_never_one_number() -> None:
    for pred, gold in [
        ("32, 349", "32349"),
        ("\\boxed{5125}", "5, 125"),
        ("\\boxed{0, 346}", "346"),
        ("1, 000", "1000"),
    ]:
        assert _REWARD.score_sync(pred if pred.startswith("\\") else f"<answer>{pred}</answer>", gold).reward == 0.0
    assert fast_verdict("7,425,000", "7425000") is True
    assert fast_verdict("1,000", "1000") is True
