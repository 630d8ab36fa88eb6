"""``python_code_with_standard_io``: the rStar2-Agent reference implementation's Python tool.

The tool of microsoft/rStar's ``rstar2_agent`` (``config/tool_config/python_tool_config.yaml``), as its model sees
it: arguments ``{code, input}`` (``input`` is the program's stdin), each call in a fresh interpreter, and a response
that says whether the call succeeded, then stdout, stderr and the execution time (``tools/code_judge_utils.py``),
cut to 256 characters by keeping 128 at each end around ``...(truncated)...`` (the agent loop's "middle" cut)::

    Tool call success
    stdout: 4
    <BLANKLINE>
    execution time: 0.03s

    Tool call failure
    reason: worker_timeout
    execution time: 4.01s

It runs code exactly as the ``python`` tool does (same sandboxes, shared pool, limits): only its name, schema and
rendering differ. Tool errors are still counted from the structured status (a non-zero exit, a timeout, a crash),
never from the text. What stays different from the reference (its error messages name the line instead of
printing a traceback, a call that omits ``input`` runs there but is a ``bad_call`` here) is in README "Fidelity".
"""

from __future__ import annotations

from typing import Any, ClassVar

from rstar_env.sandbox import ExecResult
from rstar_env.tool import EpisodeContext, function_schema
from rstar_env.trajectory import ToolResult

from .python import PythonTool

# The reference's code-judge server gives a failure a reason: empty for a program that failed on its own,
# "worker_timeout" when it ran out of time (and "internal_error"/"queue_timeout" for the server's own failures,
# which here are system failures instead, see rstar_env.sandbox).
_REASONS: dict[str, str] = {"timeout": "worker_timeout"}

TRUNCATION_MARKER = "...(truncated)..."


def truncate_middle_marked(text: str, limit: int) -> str:
    """``text`` if it fits in ``limit`` characters, else ``limit // 2`` characters from each end joined by
    ``...(truncated)...``: the reference agent loop's middle cut (the marker is not counted in the limit)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}{TRUNCATION_MARKER}{text[len(text) - half:]}"


class PythonStdIOTool(PythonTool):
    """Python with standard input, speaking the reference implementation's format (see the module docstring)."""

    name: ClassVar[str] = "python_code_with_standard_io"

    def __init__(
        self,
        *,
        backend: str = "local",
        timeout_s: float = 4.0,
        max_output_chars: int = 256,
        sandbox: Any = None,
        sandbox_options: dict[str, Any] | None = None,
    ) -> None:
        """
        Args:
            backend, sandbox, sandbox_options: as for the ``python`` tool.
            timeout_s: wall-clock limit of one call (the reference's code-judge server: ``MAX_EXECUTION_TIME=4``).
            max_output_chars: the response's middle cut (the reference agent loop's ``max_tool_response_length``).
        """
        if max_output_chars < 2:
            raise ValueError(f"max_output_chars must be at least 2, got {max_output_chars}")
        # The parent's 64-character floor protects its own marker; this tool's cut is the reference's, any size.
        super().__init__(stateful=False, backend=backend, timeout_s=timeout_s, max_output_chars=64,
                         sandbox=sandbox, sandbox_options=sandbox_options)
        self.max_output_chars = max_output_chars
        # The reference's schema, word for word: the model reads it in its system prompt.
        self.schema = function_schema(
            self.name,
            "Execute Python code with standard input and capture standard output. This function takes a Python "
            "code string and an input string, provides the input string through standard input (stdin) to the "
            "code, and captures and returns any output produced through standard output (stdout). If the executed "
            "code raises an exception, the error message will be captured and returned instead.",
            {
                "code": {
                    "type": "string",
                    "description": "A string containing Python code to be executed. The code can read from standard "
                    "input using the input() function.",
                },
                "input": {
                    "type": "string",
                    "description": "A string that will be provided as standard input to the code when it calls "
                    "input().",
                },
            },
            ["code", "input"],
        )

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        return await super().call({"code": arguments["code"], "stdin": arguments.get("input", "")}, episode)

    def render(self, result: ExecResult) -> str:
        """The reference's response: success or failure (with its reason), stdout and stderr when not empty, as the
        program wrote them, and the execution time to 10 ms; then the middle cut."""
        if result.status == "ok":
            lines = ["Tool call success"]
        else:
            lines = ["Tool call failure", f"reason: {_REASONS.get(result.status, '')}"]
        if result.stdout:
            lines.append(f"stdout: {result.stdout}")
        if result.stderr:
            lines.append(f"stderr: {result.stderr}")
        lines.append(f"execution time: {result.duration_s:.2f}s")
        return truncate_middle_marked("\n".join(lines), self.max_output_chars)


__all__ = ["TRUNCATION_MARKER", "PythonStdIOTool", "truncate_middle_marked"]
