"""Numbers written in answers, read exactly: the one normaliser that datasets and the ``math`` reward share.

The reward's exact fast path: answers that are plain numbers, compared in-process without sympy.

Most RL math data (AIME, DAPO-Math, GSM8K) has integer or simple rational answers. Comparing them through
math-verify costs milliseconds of sympy and a process hop; comparing two :class:`~fractions.Fraction` values costs
microseconds. :func:`parse_number` normalises the usual LaTeX decorations away and reads what is left as an exact
rational; :func:`compare_numbers` decides a pair only when exact arithmetic settles it and returns ``None`` (defer
to math-verify) when it does not:

* equal values are equal (``"1/2"``, ``"0.5"``, ``"\\dfrac{1}{2}"``, ``"50\\%"`` against ``"50"``);
* two different values are a mismatch, except a decimal close to a value with no finite decimal expansion
  (``0.333333`` for ``1/3``): it may be a rounding. A decimal of four significant digits or more that is the gold
  rounded to the places it states is equal (``0.3333`` and ``0.33333`` for ``1/3``, ``2.6667`` for ``8/3``: the
  precision the answer states; ``0.33`` is too coarse to tell from a wrong answer, ``0.3334`` is a wrong rounding);
  other close pairs go to math-verify (it accepts six-digit rounding). Two different terminating decimals are a
  mismatch even when close (``0.1000001`` is not ``0.1``; math-verify's six-digit rounding says it is: one of its
  false positives this path removes).

:func:`strip_presentation` removes LaTeX that changes how an answer looks, never what it says (``\\phantom``,
``\\color``, ``\\underline``, ``**bold**``, a trailing ``\\pmod{n}``...); the reward applies it to both answers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction

# Decorations that carry no value: math-mode delimiters, LaTeX spacing, \left/\right, display-style fractions.
# "\\left." / "\\right." are null delimiters: the dot goes with them (else "\\left. 7" would read as .7).
_SPACING = re.compile(r"\\[,;:! ]|~|\\quad|\\qquad|\\(?:left|right)\.?|\\displaystyle")
# A comma and a negative thin space before a group of three digits, "32,\\!349" or "11,\\! 111": how LaTeX sources
# (the MATH dataset's answers among them) write a thousands separator, so the comma is not followed by a space.
# Before any other group it stays what it reads as, a comma and a space (a list).
_THIN_COMMA = re.compile(r",\s*\\!\s*(?=\d{3}(?!\d))")
_DOLLAR = re.compile(r"\\\$|\$")
# A trailing unit in text mode: "5\text{ cm}". Only at the very end, so "5\text{ or }6" is never read as 56 and
# "5\text{ m}^2" (not at the end) is left to math-verify.
_TRAILING_TEXT = re.compile(r"\\(?:text|textrm|textbf|mbox|mathrm|operatorname)\s*\{\s*[A-Za-z][A-Za-z .\-]*\}$")
_WHOLE_TEXT = re.compile(r"^\\(?:text|textrm|textbf|mbox|mathrm|mathbf|boxed)\s*\{([^{}]*)\}$")
_TEXT_WORDS = re.compile(r"(?<=\d)\s+([A-Za-z]+(?:\s+[A-Za-z]+)?)$")
# Words that change a number's value, so "\text{5 and a half}" or "\text{3 hundred}" is never read as the digits.
_VALUE_WORDS = frozenset(
    {
        "and",
        "or",
        "plus",
        "minus",
        "times",
        "over",
        "half",
        "third",
        "thirds",
        "quarter",
        "quarters",
        "hundred",
        "hundreds",
        "thousand",
        "thousands",
        "million",
        "millions",
        "billion",
        "percent",
        "dozen",
        "squared",
        "cubed",
    }
)
_DEGREES = re.compile(r"(?:\^\s*\{\s*\\circ\s*\}|\^\s*\\circ|\\circ|°|\\degree)$")
_PERCENT = re.compile(r"\\?%$")
# "x = 5", "n=12", "a_1 = 3": a single variable assigned a value; math-verify treats it as the value.
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?=(?!=)")

_INT = re.compile(r"[+-]?\d+")
_THOUSANDS = re.compile(r"[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?")  # standard grouping only: 1,000 and 7,425,000
# One comma that cannot be a thousands separator or a list is a decimal comma, as math-verify reads it: after a 0
# ("0,111"), after four digits or more ("1000,99"), or before exactly two ("1,22", "2,74"). "1,2" stays ambiguous
# (a list, or 1.2) and is left to math-verify, which reads it as a list.
_DECIMAL_COMMA = re.compile(r"[+-]?(?:0,\d+|\d{4,},\d+|\d{1,3},\d\d)")
_LIST_COMMA = re.compile(r",\s")
_LIST_COMMA_SPACED = re.compile(r",\s+")
_DECIMAL = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
_SLASH = re.compile(r"([+-]?\d+)/([+-]?\d+)")
_FRAC = re.compile(r"([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}")
_FRAC_SHORT = re.compile(r"([+-]?)\\frac(\d)(\d)")  # "\frac12"
_FRAC_MIXED = re.compile(r"([+-]?)\\frac(\d)\{([+-]?\d+)\}|([+-]?)\\frac\{([+-]?\d+)\}(\d)")

_SPACE_THOUSANDS = re.compile(r"[+-]?\d{1,3}(?: +\d{3})+(?:\.\d+)?")
_LOOSE_SPACE = re.compile(r"(?<!\d)\s+|\s+(?!\d)")

_MAX_CHARS = 200
"""Longer strings are not plain numbers worth parsing here (and huge digit strings stay out of int())."""


@dataclass(frozen=True)
class Number:
    """An answer read as an exact rational. ``inexact``: written as a decimal (possibly rounded);
    ``percent``: written with a percent sign (so 50% may mean 50 or 0.5); ``places`` and ``significant``: the
    decimal places and significant digits a decimal states (0 for other numbers)."""

    value: Fraction
    inexact: bool = False
    percent: bool = False
    places: int = field(default=0, compare=False)
    significant: int = field(default=0, compare=False)


_PRESENTATION = re.compile(r"\\(phantom|hphantom|vphantom|color|textcolor|colorbox|underline|num|operatorname)\s*\{")
_DROPPED = frozenset({"phantom", "hphantom", "vphantom", "color"})  # invisible, or a colour switch: gone
_RECOLOURED = frozenset({"textcolor", "colorbox"})  # colour first, then the content that stays
_BOLD = re.compile(r"(?<![\w*])\*\*([^*\n]{1,200}?)\*\*(?![\w*])")  # markdown **346**, never x**2
_EMPTY_SCRIPT = re.compile(r"[\^_]\{\s*\}")  # 346^{}
_MOD_TAIL = re.compile(
    r"\s*(?:\\pmod\s*\{[^{}]*\}|\\pmod\s*\d+|\\(?:bmod|mod)\s*\{?\s*\d+\s*\}?"
    r"|\(\s*\\(?:text|mathrm|operatorname)\s*\{\s*mod\s*\}\s*\d+\s*\)|\(\s*mod\s*\d+\s*\))\s*\.?\s*$"
)
_LETTER = re.compile(r"[A-Za-z]")


def strip_presentation(text: str) -> str:
    """``text`` without the LaTeX and markdown that change how an answer looks, never what it says.

    Removed: ``\\phantom{..}`` and its ``h``/``v`` forms (invisible: ``\\phantom{9}346`` reads 346 and
    ``3\\phantom{4}6`` reads 36), ``\\color{..}``; unwrapped: ``\\textcolor{c}{X}``, ``\\colorbox{c}{X}``,
    ``\\underline{X}``, ``\\num{X}``, ``\\operatorname{X}`` when ``X`` has no letter, markdown ``**X**``; an
    empty ``^{}``/``_{}`` and a trailing ``\\pmod{n}`` (``346 \\pmod{1000}`` is 346) go; ``\\langle``/``\\rangle``
    read as parentheses and ``\\varnothing`` as ``\\emptyset``. One pass over the braces: linear in the length.
    """
    if "\\" not in text and "{" not in text and "*" not in text and "mod" not in text:
        return text  # the common case, a plain number or expression: four scans of a short string
    if "\\" in text:
        text = _unwrap_commands(text)
        text = text.replace("\\langle", "(").replace("\\rangle", ")").replace("\\varnothing", "\\emptyset")
    if "{" in text:
        text = _EMPTY_SCRIPT.sub("", text)
    if "mod" in text[-60:]:
        tail = _MOD_TAIL.sub("", text[-60:])
        text = text[:-60] + tail if len(text) > 60 else tail
    if "**" in text:
        text = _BOLD.sub(r"\1", text)
    return text


def _brace_pairs(text: str) -> dict[int, int]:
    """The index of each ``{``'s matching ``}`` (unmatched ones are left out), in one pass."""
    pairs: dict[int, int] = {}
    stack: list[int] = []
    for i, char in enumerate(text):
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def _unwrap_commands(text: str) -> str:
    match = _PRESENTATION.search(text)
    if match is None:
        return text
    pairs = _brace_pairs(text)
    dropped = bytearray(len(text))  # 1 marks a character that goes
    position = 0
    while match is not None:
        name, open_at = match.group(1), match.end() - 1
        close = pairs.get(open_at)
        if close is None:
            break
        resume = close + 1
        if name in _DROPPED:
            dropped[match.start() : close + 1] = b"\x01" * (close + 1 - match.start())
        elif name in _RECOLOURED:
            second = close + 1
            while second < len(text) and text[second].isspace():
                second += 1
            end = pairs.get(second) if second < len(text) and text[second] == "{" else None
            if end is not None:
                dropped[match.start() : second + 1] = b"\x01" * (second + 1 - match.start())
                dropped[end] = 1
                resume = second + 1
        elif name != "operatorname" or _LETTER.search(text, open_at, close) is None:
            dropped[match.start() : open_at + 1] = b"\x01" * (open_at + 1 - match.start())
            dropped[close] = 1
            resume = open_at + 1  # the content stays, and is read for more of the same
        position = resume
        match = _PRESENTATION.search(text, position)
    return "".join(char for char, gone in zip(text, dropped, strict=True) if not gone)


def clean(text: str) -> str:
    """Strip the decorations that never change a numeric value (see module docstring). Not a general LaTeX
    normaliser: the result is only meant for :func:`parse_number`."""
    s = strip_presentation(text.strip()).replace("\u2212", "-")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _DOLLAR.sub("", s)
    if "\\!" in s:
        s = _THIN_COMMA.sub(",", s)
    s = _SPACING.sub(" ", s).strip()
    s = s.replace("{,}", ",")
    for _ in range(3):  # a few layers of decoration, e.g. "\text{5}^\circ."; bounded, no loops on odd input
        before = s
        s = s.rstrip(" .")
        whole = _WHOLE_TEXT.match(s)
        if whole:
            # Inside \\text{} letters are words, not variables: "\\text{6 apples}" is 6 with a unit.
            s = whole.group(1).strip()
            if whole.group(0).startswith("\\text"):
                s = _strip_unit_words(s)
        s = _TRAILING_TEXT.sub("", s).rstrip()
        s = _DEGREES.sub("", s).rstrip()
        if len(s) > 1 and s[0] == "{" and s[-1] == "}" and "{" not in s[1:-1] and "}" not in s[1:-1]:
            s = s[1:-1].strip()
        if s == before:
            break
    if _SPACE_THOUSANDS.fullmatch(s):  # "1\\,000" or "1 000": a thin-space thousands separator
        return s.replace(" ", "")
    if _LIST_COMMA.search(s):
        # "32, 349", "5, 125", "0, 346": a comma followed by a space separates the items of a list; it is never a
        # thousands separator. Left as is, so no number pattern matches and math-verify reads the list.
        return s
    # Whitespace between two digits stays, so "2 3" is never read as 23; all other whitespace goes.
    return _LOOSE_SPACE.sub("", s)


def _strip_unit_words(s: str) -> str:
    words = _TEXT_WORDS.search(s)
    if words and not any(w.lower() in _VALUE_WORDS for w in words.group(1).split()):
        return s[: words.start()]
    return s


def same_answer(pred: str, gold: str) -> bool:
    """Whether the two answers are the same text once decorations that never change a value are removed (``$``,
    spacing commands, ``\\left``/``\\right``, ``\\dfrac``): such a pair is right whatever it says, with no parsing.
    Only ever says yes; ``False`` means "not decided here"."""
    if len(pred) > _MAX_CHARS or len(gold) > _MAX_CHARS:
        return False
    a = _canonical(pred)
    return bool(a) and a == _canonical(gold)


def _canonical(text: str) -> str:
    # Spacing goes, except that a comma followed by a space (a list: "430, 760") stays apart from one that is not
    # (a thousands separator: "430,760").
    return _LOOSE_SPACE.sub("", _LIST_COMMA_SPACED.sub("\0", clean(text)))


_SET_BRACES = re.compile(r"\\\{(.*)\\\}", re.DOTALL)


def parse_number_set(text: str) -> frozenset[Fraction] | None:
    """A list of two or more distinct exact numbers, bare (``"5, 125"``) or in set braces (``"\\{1, 2, 3\\}"``),
    as the set math-verify reads it; ``None`` for anything else (a single number, a tuple or interval in
    brackets, a decimal that may be rounded, a repeated item)."""
    if len(text) > _MAX_CHARS or "," not in text or parse_number(text) is not None:
        return None  # "1,000" and "1,22" are one number each
    s = _DOLLAR.sub("", text).strip().rstrip(".").strip()
    braces = _SET_BRACES.fullmatch(s)
    if braces:
        s = braces.group(1)
    items = s.split(",")
    if len(items) < 2:
        return None
    values: set[Fraction] = set()
    for item in items:
        number = parse_number(item)
        if number is None or number.inexact or number.percent or not _INT.fullmatch(clean(item)):
            return None
        values.add(number.value)
    return frozenset(values) if len(values) == len(items) else None


def compare_number_sets(pred: str, gold: str) -> bool | None:
    """``True``/``False`` when both answers are sets of distinct integers (:func:`parse_number_set`), or one is
    such a set and the other a single integer (a set of two or more is never one number); ``None`` otherwise."""
    pred_set, gold_set = parse_number_set(pred), parse_number_set(gold)
    if pred_set is not None and gold_set is not None:
        return pred_set == gold_set
    if (pred_set is None) == (gold_set is None):
        return None
    single = parse_number(gold if pred_set is not None else pred)
    if single is None or single.inexact or single.percent:
        return None
    return False


def plain_commas(text: str) -> str | None:
    """A number written with commas, rewritten without them as math-verify's LaTeX reader needs (it would read
    "1,000" as the pair (1, 0)): thousands separators in the standard grouping go ("7,425,000" -> "7425000"), a
    decimal comma becomes a point ("1,22" -> "1.22"). ``None`` for anything else, lists included."""
    s = text.strip()
    if _THOUSANDS.fullmatch(s):
        return s.replace(",", "")
    if _DECIMAL_COMMA.fullmatch(s):
        return s.replace(",", ".")
    return None


def parse_number(text: str) -> Number | None:
    """``text`` as an exact number, or ``None`` when it is anything else (an expression, a set, words...)."""
    if len(text) > _MAX_CHARS:
        return None
    s = clean(text)
    s = _ASSIGNMENT.sub("", s, count=1)
    percent = False
    if _PERCENT.search(s):
        s = _PERCENT.sub("", s)
        percent = True
    if not s or len(s) > 60:  # 60 digits is far beyond any answer; keeps int() cheap
        return None
    if _INT.fullmatch(s):
        return Number(Fraction(int(s)), percent=percent)
    if _THOUSANDS.fullmatch(s):
        plain = s.replace(",", "")
        return _decimal(plain, percent) if "." in plain else Number(Fraction(plain), percent=percent)
    if _DECIMAL.fullmatch(s):
        return _decimal(s, percent)
    if _DECIMAL_COMMA.fullmatch(s) and not _THOUSANDS.fullmatch(s):
        return _decimal(s.replace(",", "."), percent)
    match = _SLASH.fullmatch(s)
    if match:
        return _fraction("", match.group(1), match.group(2), percent)
    match = _FRAC.fullmatch(s) or _FRAC_SHORT.fullmatch(s)
    if match:
        return _fraction(match.group(1), match.group(2), match.group(3), percent)
    match = _FRAC_MIXED.fullmatch(s)
    if match:
        groups = match.groups()
        sign, num, den = groups[0:3] if groups[1] is not None else groups[3:6]
        return _fraction(sign or "", num, den, percent)
    return None


def _decimal(s: str, percent: bool) -> Number:
    """A decimal, with the places and significant digits it states (``0.0830`` states 4 places, 3 digits)."""
    whole, _, places = s.lstrip("+-").partition(".")
    significant = len((whole + places).lstrip("0"))
    return Number(Fraction(s), inexact=True, percent=percent, places=len(places), significant=significant)


def _fraction(sign: str, num: str, den: str, percent: bool) -> Number | None:
    if int(den) == 0:
        return None
    value = Fraction(int(num), int(den))
    return Number(-value if sign == "-" else value, percent=percent)


def _terminates(value: Fraction) -> bool:
    """Has a finite decimal expansion (the denominator has no prime factor but 2 and 5)."""
    den = value.denominator
    for prime in (2, 5):
        while den % prime == 0:
            den //= prime
    return den == 1


def _maybe_rounding(a: Fraction, b: Fraction) -> bool:
    # A decimal may stand for a rounded non-terminating value (0.333333 for 1/3), which math-verify accepts at six
    # digits. Two terminating values that differ are simply different (0.1000001 is not 0.1, 1.9999999 is not 2).
    if _terminates(a) and _terminates(b):
        return False
    return abs(a - b) <= Fraction(1, 10_000) * max(1, abs(a), abs(b))


def compare_numbers(pred: Number, gold: Number) -> bool | None:
    """``True``/``False`` when the pair is decided exactly, ``None`` when math-verify should decide."""
    preds = [pred.value]
    if pred.percent and not gold.percent:
        preds.append(pred.value / 100)  # "50%" for 0.5: math-verify accepts both readings
    golds = [gold.value]
    if gold.percent and not pred.percent:
        golds.append(gold.value / 100)
    if any(p == g for p in preds for g in golds):
        return True
    if not (pred.inexact or gold.inexact):
        return False
    if _stated_rounding(pred, gold):
        return True
    if any(_maybe_rounding(p, g) for p in preds for g in golds):
        return None
    return False


def _stated_rounding(pred: Number, gold: Number) -> bool:
    """``pred`` is a decimal of four significant digits or more, ``gold`` an exact value with no finite decimal
    expansion, and ``gold`` rounded to the places ``pred`` states is ``pred`` (half a unit in its last place)."""
    if not pred.inexact or gold.inexact or pred.percent or gold.percent or pred.significant < 4:
        return False
    if _terminates(gold.value):
        return False  # a value with an exact decimal form must be written exactly
    return abs(pred.value - gold.value) <= Fraction(1, 2 * 10**pred.places)
