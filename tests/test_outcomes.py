"""One vocabulary of outcomes from the sandbox to the tool to the trajectory, and the former names still working."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle
import warnings
from typing import Any, get_args

import pytest

from rstar_env.outcomes import DEPRECATED_NAMES, EXEC_STATUSES, TOOL_ERROR_KINDS, Outcome
from rstar_env.sandbox import ExecResult, ExecStatus
from rstar_env.tool import EpisodeContext
from rstar_env.trajectory import ToolErrorKind, ToolResult


def test_one_vocabulary() -> None:
    # Every way code can fail in a sandbox is a tool error kind of the same name.
    assert set(EXEC_STATUSES) - {"ok"} <= set(TOOL_ERROR_KINDS)
    assert get_args(ExecStatus) == EXEC_STATUSES and get_args(ToolErrorKind) == TOOL_ERROR_KINDS
    assert set(TOOL_ERROR_KINDS) - set(EXEC_STATUSES) == {"bad_call"}


def test_statuses_are_the_names_and_plain_comparisons_do_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = ExecResult("", "boom\n", "exception", "ValueError: boom", 0.1)
        assert result.status == "exception" and result.status != "crash" and not result.ok
        assert result.status != "crashed"  # a former name that does not decide the answer does not warn
        assert isinstance(result.status, str) and str(result.status) == "exception"
        assert result.message == "ValueError: boom"
        assert result.to_dict()["status"] == "exception" and type(result.to_dict()["status"]) is str
        assert {result.status: 1}["exception"] == 1  # hashes as its name
        assert pickle.loads(pickle.dumps(result)) == result
        assert dataclasses.replace(result, queue_s=2.0).queue_s == 2.0


@pytest.mark.parametrize(("old", "new"), sorted(DEPRECATED_NAMES.items()))
def test_former_status_names_still_work_with_a_warning(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"status '{old}' is now '{new}'"):
        result = ExecResult("", "", old, "why")
    assert str(result.status) == new
    with pytest.warns(DeprecationWarning, match=rf"'{old}' is now '{new}'"):
        assert result.status == old  # the old comparison still holds
    with pytest.warns(DeprecationWarning):
        assert old == result.status
    with pytest.warns(DeprecationWarning):
        assert (result.status, result.message) == (old, "why")
    with pytest.warns(DeprecationWarning):
        assert (result.status != old) is False
    with pytest.warns(DeprecationWarning):
        assert old in EXEC_STATUSES  # checks against the list of statuses still find the former name
    assert Outcome(new) == new


def test_former_message_name_still_works_with_a_warning() -> None:
    with pytest.warns(DeprecationWarning, match=r"ExecResult\(error=...\) is now ExecResult\(message=...\)"):
        result = ExecResult("", "", "timeout", error="timed out after 1 s")
    assert result.message == "timed out after 1 s"
    with pytest.warns(DeprecationWarning, match=r"ExecResult.error is now ExecResult.message"):
        assert result.error == "timed out after 1 s"
    with pytest.raises(TypeError, match=r"message= only"), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        ExecResult("", "", "timeout", "a", error="b")


def test_unknown_statuses_are_refused() -> None:
    for bad in ("bad_call", "crashd", "", "OK"):
        with pytest.raises(ValueError, match=r"ExecResult\.status must be one of"):
            ExecResult("", "", bad)
    with pytest.raises(ValueError, match=r"ToolResult\.error must be None or one of"):
        ToolResult("x", error="crashed")  # a tool error kind was never spelt the sandbox's old way


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
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the product itself uses no former name
        result = asyncio.run(tool.call({"code": "print('out')"}, episode))
    assert result.error == (None if status == "ok" else status)
    assert result.metadata["status"] == status and type(result.metadata["status"]) is str
