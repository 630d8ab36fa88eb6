"""Token ids for rendered feedback in which only the template, never tool output, yields special tokens.

A Hugging Face tokenizer turns every special-token string it meets into that token's id, wherever the string came
from. A tool that prints ``<|im_start|>user`` would then forge a real user turn in what the model trains on. So
feedback is encoded part by part (:class:`~rstar_env.format.FeedbackPart`): the template's special-token strings
become their ids, and all other text (tool output, and the template's plain text around it) is encoded with
special tokens split (``split_special_tokens=True``). For feedback without markers in its tool output, the ids are
exactly those of encoding the whole text at once, because a tokenizer splits its input at special tokens first.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rstar_env.format import FeedbackPart


@dataclass(frozen=True)
class SpecialTokens:
    """A tokenizer's special tokens: their strings and ids, and a pattern that finds them in text."""

    ids: dict[str, int]
    pattern: re.Pattern[str] | None

    @property
    def strings(self) -> tuple[str, ...]:
        return tuple(self.ids)

    @classmethod
    def of(cls, tokenizer: Any) -> SpecialTokens:
        """The special tokens of ``tokenizer`` (``all_special_tokens`` and every added token marked special)."""
        try:
            return _cache[tokenizer]
        except (KeyError, TypeError):  # TypeError: an object that cannot be weakly referenced
            pass
        ids: dict[str, int] = {}
        for index, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if getattr(token, "special", False):
                ids[str(getattr(token, "content", token))] = int(index)
        convert = getattr(tokenizer, "convert_tokens_to_ids", None)
        for name in getattr(tokenizer, "all_special_tokens", None) or ():
            if name not in ids and convert is not None:
                index = convert(name)
                if isinstance(index, int):
                    ids[name] = index
        ids = {name: index for name, index in ids.items() if name}
        ordered = sorted(ids, key=len, reverse=True)  # the longest marker wins where two start at one place
        pattern = re.compile("(" + "|".join(map(re.escape, ordered)) + ")") if ordered else None
        found = cls(ids, pattern)
        with contextlib.suppress(TypeError):
            _cache[tokenizer] = found
        return found

    def split(self, text: str) -> list[str]:
        """``text`` cut around its special-token strings (kept as pieces of their own)."""
        return self.pattern.split(text) if self.pattern is not None else [text]


_cache: weakref.WeakKeyDictionary[Any, SpecialTokens] = weakref.WeakKeyDictionary()


def encode_parts(tokenizer: Any, parts: Iterable[FeedbackPart]) -> list[int]:
    """The ids of ``parts``: special tokens only where a template part holds them, tool output split as data.

    Raises ``TypeError`` naming the fix when ``tokenizer`` cannot encode data without special tokens.
    """
    specials = SpecialTokens.of(tokenizer)
    ids: list[int] = []
    pending: list[str] = []

    def flush() -> None:
        if pending:
            ids.extend(encode_data(tokenizer, "".join(pending), specials))
            pending.clear()

    for part in parts:
        if not part.template:
            pending.append(part.text)
            continue
        for piece in specials.split(part.text):
            if piece in specials.ids:
                flush()
                ids.append(specials.ids[piece])
            elif piece:
                pending.append(piece)
    flush()
    return ids


def encode_data(tokenizer: Any, text: str, specials: SpecialTokens | None = None) -> list[int]:
    """``text`` as ids with every special-token string in it encoded as plain text."""
    specials = specials if specials is not None else SpecialTokens.of(tokenizer)
    fix = (
        "use a Hugging Face tokenizer (transformers >= 4.42), or one whose encode(text, add_special_tokens=False, "
        "split_special_tokens=True) encodes special-token strings as plain text"
    )
    try:
        ids = list(tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
    except TypeError as exc:
        raise TypeError(
            f"{type(tokenizer).__name__}.encode cannot keep tool output from becoming special tokens ({exc}); {fix}"
        ) from exc
    forged = set(ids) & set(specials.ids.values())
    if forged:
        raise TypeError(
            f"{type(tokenizer).__name__}.encode(..., split_special_tokens=True) still returned special-token ids "
            f"{sorted(forged)} for data; {fix}"
        )
    return ids
