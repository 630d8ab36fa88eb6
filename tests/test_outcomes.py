"""One vocabulary of outcomes from the sandbox to the tool to the trajectory: plain strings, spelled in one place."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
from typing import Any, get_args

import pytest

from rstar_env import outcomes
from rstar_env.outcomes import EXEC_STATUSES, OUTCOMES, TOOL_ERROR_KINDS, OutcomeName
from rstar_env.sandbox import ExecResult, ExecStatus
from rstar_env.tool import EpisodeContext
from rstar_env.trajectory import ToolErrorKind, ToolResult


def test_one_vocabulary() -> None:
    assert OUTCOMES == get_args(OutcomeName) == ("ok", "exception", "timeout", "crash", "output_limit", "bad_call")
    # A sandbox runs code, it does not parse calls; a tool error is every outcome but success.
    assert tuple(o for o in OUTCOMES if o != "bad_call") == EXEC_STATUSES
    assert tuple(o for o in OUTCOMES if o != "ok") == TOOL_ERROR_KINDS
    # The sandbox's and the trajectory's types are the ones defined in rstar_env.outcomes, not copies.
    assert ExecStatus is outcomes.ExecStatus and ToolErrorKind is outcomes.ToolErrorKind
    assert get_args(ExecStatus) == EXEC_STATUSES and get_args(ToolErrorKind) == TOOL_ERROR_KINDS


def test_statuses_are_plain_strings() -> None:
    result = ExecResult("", "boom\n", "exception", "ValueError: boom", 0.1)
    assert type(result.status) is str and result.status == "exception" and not result.ok
    assert result.message == "ValueError: boom"
    assert {result.status: 1}["exception"] == 1  # equality and hashing agree: it is the name itself
    assert type(result.to_dict()["status"]) is str
    assert pickle.loads(pickle.dumps(result)) == result
    assert dataclasses.replace(result, queue_s=2.0).queue_s == 2.0
    assert ExecResult("1\n", "", "ok").ok


@pytest.mark.parametrize("bad", ["bad_call", "error", "crashed", "crashd", "", "OK"])
def test_unknown_statuses_are_refused_naming_the_allowed_ones(bad: str) -> None:
    # "error" and "crashed" were the sandbox's pre-release spellings: refused like any other unknown name.
    with pytest.raises(ValueError, match=r"ExecResult\.status must be one of \('ok', 'exception', .*got"):
        ExecResult("", "", bad)


def test_unknown_tool_error_kinds_are_refused() -> None:
    for bad in ("ok", "crashed", "error"):
        with pytest.raises(ValueError, match=r"ToolResult\.error must be None or one of \('exception', "):
            ToolResult("x", error=bad)  # type: ignore[arg-type]
    assert ToolResult("x", error="bad_call").error == "bad_call"


def test_the_message_has_one_name() -> None:
    with pytest.raises(TypeError, match="error"):
        ExecResult("", "", "timeout", error="timed out")  # type: ignore[call-arg]
    assert not hasattr(ExecResult("", "", "timeout", "timed out"), "error")


class _Scripted:
    """A sandbox that returns the given result: what the python tool makes of each status."""

    def __init__(self, result: ExecResult) -> None:
        self.result = result

    async def execute(self, code: str, **_: Any) -> ExecResult:
        return self.result

    async def close_session(self, session: str) -> None:
        return None


@pytest.mark.parametrize("status", EXEC_STATUSES)
def test_the_python_tool_reports_the_sandbox_status_as_its_error_kind(status: str) -> None:
    from rstar_plugins.tools.python import PythonTool

    tool = PythonTool(sandbox=_Scripted(ExecResult("out\n", "", status, None if status == "ok" else "why")))
    episode = EpisodeContext(episode_id="e", problem="p", answer="1")
    result = asyncio.run(tool.call({"code": "print('out')"}, episode))
    assert result.error == (None if status == "ok" else status)
    assert result.metadata["status"] == status and type(result.metadata["status"]) is str
