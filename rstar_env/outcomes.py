"""One vocabulary for how a piece of code ended, from the sandbox to the tool to the trajectory.

=================  ==============================================================  ==========================
name               meaning                                                         used by
=================  ==============================================================  ==========================
``ok``             ran to the end                                                  ``ExecResult.status``
``exception``      raised an exception                                             status, ``ToolResult.error``
``timeout``        stopped at the wall-clock limit                                 status, ``ToolResult.error``
``crash``          the interpreter died (a signal, its memory budget)              status, ``ToolResult.error``
``output_limit``   printed more than is kept, and was stopped                      status, ``ToolResult.error``
``bad_call``       the tool call itself was wrong (bad JSON, unknown tool, args)   ``ToolResult.error``
=================  ==============================================================  ==========================

**Failures of the system are none of these.** A call the sandbox failed, not the code (no room in the pool before
its queue deadline, a pool that died under it, no worker in time), is an ``ExecResult`` with ``system_failure=True``
(its status ``crash``, its message saying what failed). A tool raises :class:`rstar_env.tool.ToolUnavailable` for
it, never returns it as a ``ToolResult``: the episode ends ``env_error`` (one of
:data:`rstar_env.trajectory.SYSTEM_FAILURES`), unscored, and the model never reads it nor is charged a tool error.

Each name is spelled once, in the ``Literal`` types below; every list of them (the sandbox's statuses, the tool
error kinds, a trainer's metric keys) is derived from these with :func:`typing.get_args` or imports them. The values
are plain ``str``: where one is made (``ExecResult``, ``ToolResult``), a name outside its list raises
``ValueError`` naming the allowed ones.
"""

from __future__ import annotations

from typing import Literal, get_args

# The names, each written once: a failure of the code itself, then what only the sandbox or only the tool reports.
_CodeFailure = Literal["exception", "timeout", "crash", "output_limit"]
ExecStatus = Literal["ok", _CodeFailure]
"""How one ``execute`` call ended (``ExecResult.status``): a sandbox runs code, it does not parse calls, so never
``bad_call``."""
ToolErrorKind = Literal[_CodeFailure, "bad_call"]
"""Why a tool call failed (``ToolResult.error``): every outcome but ``ok``."""
OutcomeName = Literal[ExecStatus, "bad_call"]
"""Every outcome name (the table above)."""

OUTCOMES: tuple[OutcomeName, ...] = get_args(OutcomeName)
EXEC_STATUSES: tuple[ExecStatus, ...] = get_args(ExecStatus)
TOOL_ERROR_KINDS: tuple[ToolErrorKind, ...] = get_args(ToolErrorKind)

__all__ = ["EXEC_STATUSES", "OUTCOMES", "TOOL_ERROR_KINDS", "ExecStatus", "OutcomeName", "ToolErrorKind"]
