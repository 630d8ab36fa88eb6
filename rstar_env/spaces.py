"""Gymnasium spaces for text observations and actions.

:class:`UnicodeText` admits any Unicode text. Gymnasium stores a :class:`~gymnasium.spaces.Text` in shared memory
as indices into its character set, and drops every character outside it; for text a model or a tool wrote that is
silent corruption. So ``UnicodeText`` brings its own shared-memory layout: per sub-env, one int32 slot holding the
length, then the code points. ``AsyncVectorEnv(..., shared_memory=True)`` (gymnasium's default) thus carries any
text intact (see :class:`SharedTextBatch`), and text longer than the space's ``max_length`` raises instead of
being cut.
"""

from __future__ import annotations

import multiprocessing as mp
import string
from collections.abc import Sequence
from types import ModuleType
from typing import Any, overload

import numpy as np
from gymnasium.error import CustomSpaceError
from gymnasium.spaces import Text
from gymnasium.vector.utils.shared_memory import create_shared_memory, read_from_shared_memory, write_to_shared_memory

# Sampling draws from a readable alphabet; membership admits every character, because a model's action and a
# tool's output can hold any Unicode text (and the env must accept whatever it emits).
_SAMPLE_CHARSET = string.ascii_letters + string.digits + string.punctuation + " \n" + "éπ√∑≤≥→∞αβγ中文"


class UnicodeText(Text):
    """A :class:`gymnasium.spaces.Text` whose ``contains`` accepts any ``str`` within the length bounds."""

    def __init__(self, max_length: int, *, min_length: int = 0, seed: int | np.random.Generator | None = None):
        super().__init__(max_length=max_length, min_length=min_length, charset=_SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"

    def __eq__(self, other: Any) -> bool:
        return (
            isinstance(other, UnicodeText)
            and self.min_length == other.min_length
            and self.max_length == other.max_length
        )

    def __hash__(self) -> int:
        return hash((UnicodeText, self.min_length, self.max_length))


# -- shared memory (AsyncVectorEnv) -----------------------------------------------------------------------------------
# Slot 0 of each sub-env's block is the text's length, so any character (NUL included) survives the round trip.


@create_shared_memory.register(UnicodeText)
def _create_unicode_shared_memory(space: UnicodeText, n: int = 1, ctx: ModuleType = mp) -> Any:
    return ctx.Array(np.dtype(np.int32).char, n * (space.max_length + 1))  # type: ignore[attr-defined]


class SharedTextBatch(Sequence[str]):
    """A live view of the texts in a shared-memory block: what ``AsyncVectorEnv`` holds as its observations.

    Gymnasium reads shared memory once and relies on the result being a view that sees later writes (a numpy array
    does); a tuple of ``str`` would be stale after the first step. This view decodes on access, and a copy of it
    (``AsyncVectorEnv(copy=True)``, the default, deep-copies what it returns) is a plain tuple of ``str``.
    """

    def __init__(self, blocks: np.ndarray) -> None:
        self._blocks = blocks

    def __len__(self) -> int:
        return len(self._blocks)

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[str, ...]: ...

    def __getitem__(self, index: int | slice) -> str | tuple[str, ...]:
        if isinstance(index, slice):
            return tuple(self[i] for i in range(len(self))[index])
        block = self._blocks[index]
        return block[1 : 1 + int(block[0])].tobytes().decode("utf-32-le")

    def snapshot(self) -> tuple[str, ...]:
        return tuple(self[i] for i in range(len(self)))

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return self.snapshot()

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (and copies) as the texts, not the shared block
        return (tuple, (self.snapshot(),))

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and self.snapshot() == tuple(other)

    __hash__ = None  # type: ignore[assignment]  # mutable: it follows the shared memory

    def __repr__(self) -> str:
        return f"SharedTextBatch({self.snapshot()!r})"


@read_from_shared_memory.register(UnicodeText)
def _read_unicode_from_shared_memory(space: UnicodeText, shared_memory: Any, n: int = 1) -> SharedTextBatch:
    return SharedTextBatch(np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape((n, space.max_length + 1)))


@write_to_shared_memory.register(UnicodeText)
def _write_unicode_to_shared_memory(space: UnicodeText, index: int, value: str, shared_memory: Any) -> None:
    if not isinstance(value, str):
        raise CustomSpaceError(f"a UnicodeText observation must be a str, got {type(value).__name__}")
    if len(value) > space.max_length:
        raise CustomSpaceError(
            f"an observation of {len(value)} characters does not fit the observation space {space!r}: raise the "
            "env's max_action_chars (the observation bound follows it), or pass shared_memory=False to AsyncVectorEnv"
        )
    size = space.max_length + 1
    block = np.frombuffer(shared_memory.get_obj(), dtype=np.int32)[index * size : (index + 1) * size]
    codes = np.frombuffer(value.encode("utf-32-le"), dtype=np.int32)
    block[0] = len(codes)
    block[1 : 1 + len(codes)] = codes


# -- actions that carry their tokens ----------------------------------------------------------------------------------


class TokenAction(str):
    """An action's text together with the token ids (and log-probabilities) the policy generated for it.

    Gymnasium wrappers (``OrderEnforcing``, ``TimeLimit``, the env checker, your own) call ``step(action)`` with the
    action alone, so keyword arguments cannot pass through them; an action that carries its tokens can, and so can
    the pipes of ``AsyncVectorEnv`` (it pickles as itself). It *is* the text (a ``str``), so every space check and
    every wrapper that reads the action sees the text::

        env = gym.make("rstar_env/MathTool-v0", max_episode_steps=8)
        env.step(TokenAction(text, token_ids=ids, logprobs=lps))  # = env.unwrapped.step(text, token_ids=ids, ...)
    """

    token_ids: list[int] | None
    logprobs: list[float] | None

    def __new__(cls, text: str, token_ids: Any = None, logprobs: Any = None) -> TokenAction:
        if not isinstance(text, str):
            raise TypeError(f"TokenAction text must be a str, got {type(text).__name__}")
        self = super().__new__(cls, text)
        self.token_ids = None if token_ids is None else [int(t) for t in token_ids]
        self.logprobs = None if logprobs is None else [float(x) for x in logprobs]
        if self.token_ids is not None and self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"TokenAction has {len(self.token_ids)} token ids but {len(self.logprobs)} logprobs; "
                "pass one logprob per generated token"
            )
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (TokenAction, (str(self), self.token_ids, self.logprobs))

    def __repr__(self) -> str:
        n = "no" if self.token_ids is None else len(self.token_ids)
        return f"TokenAction({str.__repr__(self)}, {n} token ids)"
