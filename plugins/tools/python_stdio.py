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

from pydantic import BaseModel, Field

from rstar_env.plugins import plugin_options
from rstar_env.sandbox import ExecResult
from rstar_env.tool import EpisodeContext, tool_schema
from rstar_env.trajectory import ToolResult

from .python import PythonOptions, PythonTool, SandboxToolOptions

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
    return f"{text[:half]}{TRUNCATION_MARKER}{text[len(text) - half :]}"


class PythonStdIOOptions(SandboxToolOptions):
    """The options of ``python_code_with_standard_io``: ``backend``, ``sandbox``, ``sandbox_options`` as for the
    ``python`` tool; ``timeout_s`` is the reference's code-judge ``MAX_EXECUTION_TIME=4``."""

    max_output_chars: int = Field(256, ge=2)
    """The response's middle cut (the reference agent loop's ``max_tool_response_length``)."""


class PythonStdIOArguments(BaseModel):
    """The reference's arguments, word for word: the model reads them in its system prompt."""

    code: str = Field(
        description="A string containing Python code to be executed. The code can read from standard input using "
        "the input() function."
    )
    input: str = Field(
        description="A string that will be provided as standard input to the code when it calls input()."
    )


class PythonStdIOTool(PythonTool):
    """Python with standard input, speaking the reference implementation's format (see the module docstring).
    Options: :class:`PythonStdIOOptions`, as the model or as keywords."""

    name: ClassVar[str] = "python_code_with_standard_io"
    options_model: ClassVar[type[BaseModel]] = PythonStdIOOptions
    # The reference's schema, word for word: the model reads it in its system prompt.
    schema: dict[str, Any] = tool_schema(
        name,
        "Execute Python code with standard input and capture standard output. This function takes a Python "
        "code string and an input string, provides the input string through standard input (stdin) to the "
        "code, and captures and returns any output produced through standard output (stdout). If the executed "
        "code raises an exception, the error message will be captured and returned instead.",
        PythonStdIOArguments,
    )

    def __init__(self, options: PythonStdIOOptions | None = None, **settings: Any) -> None:
        opts = plugin_options(PythonStdIOOptions, options, settings)
        # The parent's 64-character floor protects its own marker; this tool's cut is the reference's, any size.
        super().__init__(PythonOptions(**{**dict(opts), "max_output_chars": 64}))
        self.options = opts
        self.max_output_chars = opts.max_output_chars
        self.schema = type(self).schema  # the class's, not the one the parent built for ``python``

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


__all__ = [
    "TRUNCATION_MARKER",
    "PythonStdIOArguments",
    "PythonStdIOOptions",
    "PythonStdIOTool",
    "truncate_middle_marked",
]
