"""Where the ``math`` reward finds the final answer in a response, in time linear in the response's length.

The answer lives in the last ``<answer>...</answer>`` block (the rStar2-Agent prompt asks for it there). Its text
is what math-verify reads, as it reads a model's output: a box, several boxes read as one answer
(``\\boxed{1}, \\boxed{2}`` is the set ``{1, 2}``), a final "the final answer is $x$" after intermediate boxes, or a
bare expression. With no block (and ``fallback``), the response's final run of boxes is the answer; with
``boxes="last"``, only the response's last ``\\boxed{}`` is, which is the rStar reference's rule.

Nothing here runs a regular expression that can backtrack over the response: boxes are found by one pass over its
braces (:func:`rstar_env.format.boxed_spans`), blocks by plain ``str.find``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rstar_env.format import answer_blocks, boxed_spans, last_boxed

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
# What may stand between two boxes of one answer: "\boxed{1}, \boxed{2}", "$\boxed{1}$ and $\boxed{2}$",
# "\(\boxed{1}\) and \(\boxed{-2}\)" (the separators math-verify accepts between boxes, with the math delimiters it
# reads around them: $, $$, \( \), \[ \]). Matched only against a gap of at most _MAX_GAP characters.
_DELIMITERS = r"(?:[\s$]|\\[()\[\]])*"
_BETWEEN_BOXES = re.compile(rf"{_DELIMITERS}(?:,?\s*(?:and|or)|,)?{_DELIMITERS}")
_MAX_GAP = 24
_DIGIT = re.compile(r"\d")

Boxes = Literal["final", "last"]


@dataclass(frozen=True)
class Answer:
    """A located answer. ``text``: what math-verify reads; ``boxes``: the final run of boxes alone, written as
    boxes (a short stand-in for a long block), or ``None`` when the answer has no box; ``single``: the one plain
    answer the exact fast path may read, or ``None`` when there is not exactly one; ``shown``: the answer as
    reported in ``RewardResult.extracted``."""

    text: str
    boxes: str | None
    single: str | None
    shown: str


def _top_level(spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    out: list[tuple[int, int, str]] = []
    for span in spans:
        if not out or span[0] >= out[-1][1]:
            out.append(span)
    return out


def _final_run(text: str, spans: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """The last box and the boxes just before it that are joined to it only by separators."""
    run = [spans[-1]]  # built backwards, then turned: inserting at the front would be quadratic in the boxes
    for span in reversed(spans[:-1]):
        gap = text[span[1] : run[-1][0]]
        if len(gap) > _MAX_GAP or _BETWEEN_BOXES.fullmatch(gap) is None:
            break
        run.append(span)
    run.reverse()
    return run


def _as_boxes(run: list[tuple[int, int, str]]) -> str:
    return ", ".join(f"\\boxed{{{content}}}" for _, _, content in run)


def _from_boxes(text: str, spans: list[tuple[int, int, str]]) -> Answer | None:
    run = _final_run(text, _top_level(spans))
    contents = [content.strip() for _, _, content in run]
    if not any(contents):
        return None
    boxes = _as_boxes(run)
    return Answer(boxes, boxes, contents[0] if len(run) == 1 else None, ", ".join(contents))


def _from_block(block: str, boxed: bool) -> Answer | None:
    block = block.strip()
    if not block:
        return None
    spans = _top_level(boxed_spans(block)) if boxed and ("\\boxed" in block or "\\fbox" in block) else []
    if not spans:
        return Answer(block, None, block, block)
    run = _final_run(block, spans)
    contents = [content.strip() for _, _, content in run]
    if not any(contents):
        return None
    single = None
    if len(run) == 1:
        # The box is the whole answer only when no other number is written around it ("the answer is \boxed{5}",
        # not "\boxed{3}, so the final answer is 10"): otherwise math-verify reads the block and decides.
        outside = block[: run[0][0]] + block[run[0][1] :]
        if _DIGIT.search(outside) is None:
            single = contents[0]
    return Answer(block, _as_boxes(run), single, ", ".join(c for c in contents if c))


def locate(
    response: str,
    *,
    answer_block: bool = True,
    boxed: bool = True,
    fallback: bool = True,
    last_number: bool = False,
    boxes: Boxes = "final",
) -> Answer | None:
    """The final answer in ``response`` (see the module docstring), or ``None`` when there is none."""
    if answer_block:
        blocks = answer_blocks(response)
        if blocks:
            return _from_block(blocks[-1], boxed)
        if not fallback:
            return None
    if boxed and ("\\boxed" in response or "\\fbox" in response):
        if boxes == "last":
            inner = last_boxed(response)
            if inner is not None and inner.strip():
                inner = inner.strip()
                return Answer(f"\\boxed{{{inner}}}", f"\\boxed{{{inner}}}", inner, inner)
        else:
            spans = boxed_spans(response)
            if spans:
                found = _from_boxes(response, spans)
                if found is not None:
                    return found
    if last_number:
        numbers = _NUMBER.findall(response)
        if numbers:
            number = numbers[-1].replace(",", "")
            return Answer(number, None, number, number)
    return None
