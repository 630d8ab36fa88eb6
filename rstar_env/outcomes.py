"""One vocabulary for how a piece of code ended, from the sandbox to the tool to the trajectory.

=================  ==============================================================  ==========================
name               meaning                                                         used by
=================  ==============================================================  ==========================
``ok``             ran to the end                                                  ``ExecResult.status``
``exception``      raised an exception                                             status, ``ToolResult.error``
``timeout``        stopped at the wall-clock limit                                 status, ``ToolResult.error``
``crash``          the interpreter died (signal, memory, a dead sandbox)           status, ``ToolResult.error``
``output_limit``   printed more than is kept, and was stopped                      status, ``ToolResult.error``
``bad_call``       the tool call itself was wrong (bad JSON, unknown tool, args)   ``ToolResult.error``
=================  ==============================================================  ==========================

A sandbox status is an :class:`Outcome`, a ``str`` that equals its name. The sandbox's former spellings
``"error"`` (now ``"exception"``) and ``"crashed"`` (now ``"crash"``) are still accepted, with a
:class:`DeprecationWarning`, where a status is made (``ExecResult(status="crashed")``) and where one is compared
(``result.status == "crashed"`` is true for a crash); hashing uses the name, so a set or dict keyed by an old
spelling does not find it.
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

OutcomeName = Literal["ok", "exception", "timeout", "crash", "output_limit", "bad_call"]

OUTCOMES: tuple[str, ...] = ("ok", "exception", "timeout", "crash", "output_limit", "bad_call")
TOOL_ERROR_KINDS: tuple[str, ...] = ("exception", "timeout", "bad_call", "crash", "output_limit")
"""Why a tool call failed: every outcome but ``ok``."""

DEPRECATED_NAMES: dict[str, str] = {"error": "exception", "crashed": "crash"}
"""Former sandbox spellings -> their name now."""


def _warn(old: str, stacklevel: int) -> None:
    # stacklevel counts from the caller of _warn, so the warning points at the user's line.
    warnings.warn(
        f"the sandbox status {old!r} is now {DEPRECATED_NAMES[old]!r} (one vocabulary with ToolResult.error); "
        f"write {DEPRECATED_NAMES[old]!r}",
        DeprecationWarning,
        stacklevel=stacklevel + 1,
    )


class Outcome(str):
    """An outcome name (see the module docstring): a ``str`` equal to its name, and, while they are deprecated,
    to its former spelling (``Outcome("crash") == "crashed"``, with a warning)."""

    __slots__ = ()

    def __new__(cls, value: str, allowed: tuple[str, ...] = OUTCOMES, *, stacklevel: int = 2) -> Outcome:
        name = str(value)
        if name in DEPRECATED_NAMES:
            _warn(name, stacklevel=stacklevel + 1)
            name = DEPRECATED_NAMES[name]
        if name not in allowed:
            raise ValueError(f"unknown outcome {value!r}: expected one of {allowed}")
        return super().__new__(cls, name)

    def _equals(self, other: object) -> bool | None:
        """``True`` when ``other`` is this outcome's former name (the caller warns), else ``None``."""
        if isinstance(other, str) and not isinstance(other, Outcome) and DEPRECATED_NAMES.get(other) == str(self):
            return True
        return None

    def __eq__(self, other: object) -> bool:
        if self._equals(other):
            _warn(str(other), stacklevel=2)  # only where the former name decides the answer
            return True
        return str.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        if self._equals(other):
            _warn(str(other), stacklevel=2)
            return False
        return str.__ne__(self, other)

    __hash__ = str.__hash__

    def __repr__(self) -> str:
        return str.__repr__(str(self))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Outcome, (str(self),))


def exec_status(value: str, *, stacklevel: int = 2) -> Outcome:
    """``value`` as a sandbox status (former spellings accepted, with a warning); ``ValueError`` for anything else.

    ``stacklevel`` is that of :func:`warnings.warn` as seen from the caller of this function."""
    if isinstance(value, Outcome) and str(value) in EXEC_STATUSES:
        return value
    try:
        return Outcome(value, EXEC_STATUSES, stacklevel=stacklevel + 1)
    except ValueError:
        raise ValueError(f"ExecResult.status must be one of {EXEC_STATUSES}, got {value!r}") from None


EXEC_STATUSES: tuple[str, ...] = tuple(map(Outcome, ("ok", "exception", "timeout", "crash", "output_limit")))
"""What ``execute`` can return: every outcome but ``bad_call`` (a sandbox runs code, it does not parse calls). The
items are :class:`Outcome` objects, so a former spelling checked against it (``"crashed" in EXEC_STATUSES``) is
still found, with a warning."""
