"""Generated sets: offline problems with exactly computed integer answers."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any, Literal

from .records import DataError, Problem

GeneratedKind = Literal["arithmetic", "word", "mix"]
GENERATED_KINDS: tuple[str, ...] = ("arithmetic", "word", "mix")
LevelSpec = int | str | tuple[int, int]
"""A generator difficulty: ``1``..``5``, ``"mixed"`` (uniform over 1..5), or an inclusive range ``(lo, hi)``
(also written ``"lo-hi"``)."""


def parse_generated_spec(spec: str) -> dict[str, Any] | None:
    """``"[gen:]KIND[:key=value,...]"`` -> ``{"kind", "n", "level", "seed"}``; ``None`` if not a generated spec.

    Raises :class:`DataError` for a generated spec with an unknown key or a bad value.
    """
    text = spec.strip()
    explicit = text.startswith("gen:")
    if explicit:
        text = text[4:]
    kind, _, params = text.partition(":")
    if kind not in GENERATED_KINDS:
        if explicit:
            raise DataError(f"unknown generated set {kind!r} in {spec!r}: choose one of {', '.join(GENERATED_KINDS)}")
        return None
    out: dict[str, Any] = {"kind": kind, "n": 1000, "level": 1, "seed": 0}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not eq or key not in ("n", "level", "seed"):
            raise DataError(f"bad parameter {item!r} in {spec!r}: expected n=INT, level=1..5|mixed|LO-HI, seed=INT")
        if key == "level":
            out["level"] = _parse_level(value, spec)
        else:
            try:
                out[key] = int(value)
            except ValueError:
                raise DataError(f"bad {key}={value!r} in {spec!r}: expected an integer") from None
    return out


def _parse_level(value: Any, context: str) -> int | str | tuple[int, int]:
    if isinstance(value, bool):
        raise DataError(f"bad level {value!r} in {context}")
    if isinstance(value, int):
        levels: tuple[int, int] = (value, value)
    elif isinstance(value, tuple) and len(value) == 2:
        levels = (int(value[0]), int(value[1]))
    elif isinstance(value, str) and value.strip() == "mixed":
        return "mixed"
    elif isinstance(value, str) and re.fullmatch(r"\s*\d\s*(-\s*\d\s*)?", value):
        lo, _, hi = value.partition("-")
        levels = (int(lo), int(hi or lo))
    else:
        raise DataError(f"bad level {value!r} in {context}: expected 1..5, 'mixed' or a range like '2-4'")
    if not 1 <= levels[0] <= levels[1] <= 5:
        raise DataError(f"bad level {value!r} in {context}: levels run from 1 to 5")
    return levels[0] if levels[0] == levels[1] else levels


# learn; levels 4-5 use numbers large enough that calling the Python tool is the sensible way to solve them.
# Problem i depends only on (kind, level, seed, i), so a longer run extends a shorter one and ids stay stable.

_ARITH_LEVELS: dict[int, dict[str, Any]] = {
    1: {"leaves": (2, 2), "lo": 1, "hi": 9, "ops": "+-", "nonneg": True, "cap": 18, "div": 0},
    2: {"leaves": (2, 3), "lo": 2, "hi": 12, "ops": "+-*", "nonneg": True, "cap": 400, "div": 0},
    3: {"leaves": (3, 3), "lo": 2, "hi": 99, "ops": "+-*", "nonneg": False, "cap": 10**5, "div": 0},
    4: {"leaves": (4, 4), "lo": 2, "hi": 999, "ops": "+-*/", "nonneg": False, "cap": 10**8, "div": 12},
    5: {"leaves": (5, 6), "lo": 11, "hi": 9999, "ops": "+-*/", "nonneg": False, "cap": 10**15, "div": 99},
}

_Expr = int | tuple[str, "_Expr", "_Expr"]


def _build_expr(rng: random.Random, leaves: int, cfg: Mapping[str, Any]) -> _Expr:
    if leaves == 1:
        return rng.randint(cfg["lo"], cfg["hi"])
    op = rng.choice(cfg["ops"])
    if op == "/" and leaves != 2:
        op = rng.choice("+-*")
    if op == "/":
        # Exact by construction: the dividend is a multiple of the divisor.
        divisor = rng.randint(2, cfg["div"])
        quotient = rng.randint(max(1, cfg["lo"] // divisor), max(2, cfg["hi"] // divisor))
        return ("/", divisor * quotient, divisor)
    left = rng.randint(1, leaves - 1)
    return (op, _build_expr(rng, left, cfg), _build_expr(rng, leaves - left, cfg))


def _eval_expr(expr: _Expr, nonneg: bool) -> int | None:
    """Exact value, or ``None`` when a division is inexact or (``nonneg``) any intermediate goes negative."""
    if isinstance(expr, int):
        return expr
    op, left_e, right_e = expr
    left, right = _eval_expr(left_e, nonneg), _eval_expr(right_e, nonneg)
    if left is None or right is None:
        return None
    if op == "+":
        value = left + right
    elif op == "-":
        value = left - right
    elif op == "*":
        value = left * right
    else:
        if right == 0 or Fraction(left, right).denominator != 1:
            return None
        value = left // right
    return None if nonneg and value < 0 else value


def _render_expr(expr: _Expr, top: bool = True) -> str:
    if isinstance(expr, int):
        return str(expr)
    op, left, right = expr
    # Every sub-expression is parenthesised: no precedence rules to get wrong, and the text is valid Python.
    text = f"{_render_expr(left, False)} {op} {_render_expr(right, False)}"
    return text if top else f"({text})"


def _gen_arithmetic(rng: random.Random, level: int) -> tuple[str, int, dict[str, Any]]:
    cfg = _ARITH_LEVELS[level]
    for _ in range(10_000):
        expr = _build_expr(rng, rng.randint(*cfg["leaves"]), cfg)
        value = _eval_expr(expr, cfg["nonneg"])
        if value is not None and abs(value) <= cfg["cap"]:
            text = _render_expr(expr)
            prompt = f"What is {text}?" if level <= 2 else f"Compute {text}."
            return prompt, value, {"expression": text}
    raise RuntimeError(f"could not generate an arithmetic problem at level {level}")  # unreachable in practice


_NAMES = (
    "Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jia",
    "Kofi", "Lena", "Mateo", "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sam", "Tariq",
)  # fmt: skip
_ITEMS = (
    ("pencil", "pencils"), ("notebook", "notebooks"), ("apple", "apples"), ("ticket", "tickets"),
    ("sandwich", "sandwiches"), ("book", "books"), ("candle", "candles"), ("mug", "mugs"),
)  # fmt: skip
_WordResult = tuple[str, int, dict[str, Any]]


def _dollars(cents: int) -> str:
    return f"${cents // 100}.{cents % 100:02d}"


def _w_shopping(rng: random.Random, level: int) -> _WordResult:
    name = rng.choice(_NAMES)
    if level == 1:
        item, price, bill = rng.choice(_ITEMS)[0], rng.randint(1, 4), 5
        text = (
            f"{name} buys one {item} that costs {price} dollars and pays with a {bill}-dollar bill. "
            f"How many dollars of change does {name} get?"
        )
        return text, bill - price, {"quantities": [1], "prices": [price], "paid": bill, "unit": "dollars"}
    n_types = {2: 1, 3: 2, 4: 3, 5: 3}[level]
    q_lo, q_hi = {2: (2, 5), 3: (2, 9), 4: (3, 20), 5: (12, 99)}[level]
    p_lo, p_hi = {2: (1, 9), 3: (2, 20), 4: (5, 99), 5: (105, 4999)}[level]
    items = rng.sample(_ITEMS, n_types)
    qty = [rng.randint(q_lo, q_hi) for _ in items]
    prices = [rng.randint(p_lo, p_hi) for _ in items]
    cost = sum(q * p for q, p in zip(qty, prices, strict=True))
    if level == 5:  # prices in cents: the arithmetic is what makes the tool worth calling
        bills = -(-cost // 10_000)
        paid = bills * 10_000
        parts = [f"{q} {it[1]} at {_dollars(p)} each" for q, p, it in zip(qty, prices, items, strict=True)]
        text = (
            f"{name} buys {', '.join(parts[:-1])} and {parts[-1]}, and pays with {bills} hundred-dollar bills. "
            f"How much change does {name} get, in cents?"
        )
        return text, paid - cost, {"quantities": qty, "prices": prices, "paid": paid, "unit": "cents"}
    paid = next((b for b in (10, 20, 50, 100) if b >= cost), -(-cost // 100) * 100)
    pay = f"a {paid}-dollar bill" if paid <= 100 else f"{paid // 100} hundred-dollar bills"
    parts = [f"{q} {it[1]} at {p} dollars each" for q, p, it in zip(qty, prices, items, strict=True)]
    bought = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    text = f"{name} buys {bought}, and pays with {pay}. How many dollars of change does {name} get?"
    return text, paid - cost, {"quantities": qty, "prices": prices, "paid": paid, "unit": "dollars"}


def _w_travel(rng: random.Random, level: int) -> _WordResult:
    name = rng.choice(_NAMES)
    if level == 1:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        text = (
            f"{name} walks {a} km to the park and then {b} km to a friend's house. "
            f"How many km does {name} walk in total?"
        )
        return text, a + b, {"legs_km": [a, b]}
    if level == 2:
        v, t = rng.randrange(10, 65, 5), rng.randint(2, 5)
        text = f"A car drives at {v} km per hour for {t} hours. How many km does it drive?"
        return text, v * t, {"speed": v, "hours": t}
    if level == 3:
        v, t = rng.randint(35, 95), rng.randint(2, 9)
        text = f"A train travels {v * t} km at a constant {v} km per hour. How many hours does the trip take?"
        return text, t, {"distance": v * t, "speed": v}
    if level == 4:
        while True:
            v1, t1, v2, m = (
                rng.randint(40, 120),
                rng.randint(1, 5),
                rng.randint(30, 110),
                rng.choice((15, 20, 30, 40, 45)),
            )
            if v2 * m % 60 == 0:
                break
        text = (
            f"{name} drives {t1} hours at {v1} km per hour, then {m} minutes at {v2} km per hour. "
            f"How many km does {name} drive in total?"
        )
        return text, v1 * t1 + v2 * m // 60, {"speeds": [v1, v2], "minutes": [60 * t1, m]}
    while True:
        v1, v2, minutes = rng.randint(40, 150), rng.randint(40, 150), rng.randint(30, 600)
        if (v1 + v2) * minutes % 60 == 0:
            break
    distance = (v1 + v2) * minutes // 60
    text = (
        f"Two trains start at the same time from stations {distance} km apart and travel toward each other, "
        f"one at {v1} km per hour and the other at {v2} km per hour. After how many minutes do they meet?"
    )
    return text, minutes, {"distance": distance, "speeds": [v1, v2]}


def _w_sequence(rng: random.Random, level: int) -> _WordResult:
    if level == 1:
        n = rng.randint(3, 6)
        text = f"What is the sum of the whole numbers from 1 to {n}?"
        return text, n * (n + 1) // 2, {"first": 1, "step": 1, "last": n}
    if level == 2:
        a = rng.randint(1, 20)
        b = a + rng.randint(10, 40)
        text = f"What is the sum of the whole numbers from {a} to {b}?"
        return text, (a + b) * (b - a + 1) // 2, {"first": a, "step": 1, "last": b}
    if level == 3:
        a, d, n = rng.randint(1, 20), rng.randint(2, 9), rng.randint(10, 30)
        text = f"What is the sum of the first {n} terms of the sequence {a}, {a + d}, {a + 2 * d}, ...?"
        return text, n * (2 * a + (n - 1) * d) // 2, {"first": a, "step": d, "last": a + (n - 1) * d}
    if level == 4:
        n = rng.randint(20, 200)
        text = f"What is the sum of the squares of the whole numbers from 1 to {n}?"
        return text, n * (n + 1) * (2 * n + 1) // 6, {"squares_to": n}
    bound = rng.randint(1_000, 100_000)
    a, b = rng.sample(range(3, 14), 2)

    def multiples_sum(k: int) -> int:
        m = (bound - 1) // k
        return k * m * (m + 1) // 2

    value = multiples_sum(a) + multiples_sum(b) - multiples_sum(math.lcm(a, b))
    text = f"What is the sum of all positive integers less than {bound} that are multiples of {a} or {b}?"
    return text, value, {"below": bound, "divisors": [a, b]}


def _w_remainder(rng: random.Random, level: int) -> _WordResult:
    if level <= 3:
        lo_hi = {1: ((2, 5), (6, 20)), 2: ((3, 12), (20, 200)), 3: ((7, 97), (1000, 99_999))}[level]
        b = rng.randint(*lo_hi[0])
        a = rng.randint(*lo_hi[1])
        return f"What is the remainder when {a} is divided by {b}?", a % b, {"base": a, "exponent": 1, "modulus": b}
    base, exp, mod = (
        (rng.randint(2, 9), rng.randint(10, 30), rng.randint(7, 60))
        if level == 4
        else (rng.randint(11, 99), rng.randint(100, 999), rng.randint(1000, 9999))
    )
    text = f"What is the remainder when {base} raised to the power {exp} is divided by {mod}?"
    return text, pow(base, exp, mod), {"base": base, "exponent": exp, "modulus": mod}


def _w_counting(rng: random.Random, level: int) -> _WordResult:
    if level == 1:
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        text = f"A box holds {a} red balls and {b} blue balls. How many balls are in the box?"
        return text, a + b, {"counts": [a, b]}
    if level == 2:
        n, k = rng.randint(20, 100), rng.randint(2, 9)
        text = f"How many whole numbers from 1 to {n} are multiples of {k}?"
        return text, n // k, {"upto": n, "any_of": [k], "none_of": []}
    if level == 3:
        n = rng.randint(100, 1000)
        a, b = rng.sample(range(2, 13), 2)
        text = f"How many whole numbers from 1 to {n} are divisible by {a} or by {b}?"
        return text, n // a + n // b - n // math.lcm(a, b), {"upto": n, "any_of": [a, b], "none_of": []}
    if level == 4:
        n, k = rng.randint(8, 25), rng.randint(2, 6)
        text = f"In how many ways can a team of {k} people be chosen from a group of {n} people?"
        return text, math.comb(n, k), {"choose_from": n, "choose": k}
    n = rng.randint(10_000, 1_000_000)
    a, b, c = rng.sample(range(2, 21), 3)

    def count(*divisors: int) -> int:
        return n // math.lcm(*divisors)

    either = count(a) + count(b) - count(a, b)
    either_and_c = count(a, c) + count(b, c) - count(a, b, c)
    text = f"How many integers from 1 to {n} are divisible by {a} or by {b}, but not by {c}?"
    return text, either - either_and_c, {"upto": n, "any_of": [a, b], "none_of": [c]}


def _w_sharing(rng: random.Random, level: int) -> _WordResult:
    name = rng.choice(_NAMES)
    if level == 1:
        k, each = rng.randint(2, 5), rng.randint(1, 4)
        text = f"{name} shares {k * each} cookies equally among {k} children. How many cookies does each child get?"
        return text, each, {"total": k * each, "groups": k}
    if level == 2:
        k = rng.randint(3, 9)
        total = k * rng.randint(3, 12)
        text = f"{name} packs {total} eggs into boxes of {k}. How many boxes does {name} fill?"
        return text, total // k, {"total": total, "groups": k}
    if level == 3:
        guests, size = rng.randint(20, 200), rng.randint(4, 12)
        text = (
            f"Juice comes in packs of {size} bottles. "
            f"How many packs are needed so that each of {guests} guests gets one bottle?"
        )
        return text, -(-guests // size), {"guests": guests, "pack": size}
    count = 2 if level == 4 else rng.randint(3, 4)
    periods = rng.sample(range(6, 61) if level == 4 else range(12, 91), count)
    listed = ", ".join(map(str, periods[:-1])) + f" and {periods[-1]}"
    text = (
        f"Buses on {count} routes leave the station every {listed} minutes respectively. All of them leave "
        "together now. After how many minutes do they next all leave together?"
    )
    return text, math.lcm(*periods), {"periods": periods}


_WORD_TEMPLATES: dict[str, Callable[[random.Random, int], _WordResult]] = {
    "shopping": _w_shopping,
    "travel": _w_travel,
    "sequence": _w_sequence,
    "remainder": _w_remainder,
    "counting": _w_counting,
    "sharing": _w_sharing,
}
WORD_TEMPLATES: tuple[str, ...] = tuple(_WORD_TEMPLATES)


def _level_tag(level: int | str | tuple[int, int]) -> str:
    if isinstance(level, tuple):
        return f"{level[0]}-{level[1]}"
    return str(level)


def generate_problems(
    n: int, *, kind: GeneratedKind | str = "arithmetic", level: LevelSpec = 1, seed: int = 0
) -> list[Problem]:
    """``n`` deterministic problems with exact integer answers.

    ``kind``: ``"arithmetic"`` (a parenthesised expression: ``3 + 4`` at level 1, ``(17 * 23) - 45`` at level 3,
    five or six 2-4 digit operands with exact ``/`` at level 5), ``"word"`` (templates in :data:`WORD_TEMPLATES`:
    change when shopping, speed/time/distance, sums of sequences, remainders and modular powers, counting, sharing
    and common periods), or ``"mix"`` (each problem arithmetic or word with equal odds). ``level``: see
    :data:`LevelSpec`; a mixed level draws each problem's level uniformly from the range.

    Problem ``i`` depends only on ``(kind, level, seed, i)``; ids are ``"{kind}-L{level}-s{seed}-{i:06d}"``.
    ``metadata`` holds ``kind``, ``level``, and the expression or the template and its parameters. Repeats are
    avoided while the level's problem space allows (level-1 arithmetic has only ~130 distinct problems).
    """
    if kind not in GENERATED_KINDS:
        raise DataError(f"unknown generated kind {kind!r}: choose one of {', '.join(GENERATED_KINDS)}")
    if n < 0:
        raise DataError(f"n must be >= 0, got {n}")
    parsed = _parse_level(level, f"generate_problems(level={level!r})")
    lo, hi = (1, 5) if parsed == "mixed" else (parsed, parsed) if isinstance(parsed, int) else parsed
    tag = _level_tag(parsed)
    problems: list[Problem] = []
    seen: set[str] = set()
    for i in range(n):
        # Level, kind and template come from a per-problem stream so retries for repeats cannot skew their mix.
        pick = random.Random(f"rstar-env|{kind}|{tag}|{seed}|{i}")
        lvl = pick.randint(lo, hi)
        this_kind = kind if kind != "mix" else pick.choice(("arithmetic", "word"))
        template = pick.choice(WORD_TEMPLATES)
        for attempt in range(25):
            rng = random.Random(f"rstar-env|{kind}|{tag}|{seed}|{i}|{attempt}")
            if this_kind == "arithmetic":
                text, value, extra = _gen_arithmetic(rng, lvl)
                meta: dict[str, Any] = {"kind": "arithmetic", "level": lvl, **extra}
            else:
                text, value, params = _WORD_TEMPLATES[template](rng, lvl)
                meta = {"kind": "word", "level": lvl, "template": template, "params": params}
            if text not in seen:
                break
        seen.add(text)
        problems.append(Problem(text, str(value), f"{kind}-L{tag}-s{seed}-{i:06d}", meta))
    return problems
