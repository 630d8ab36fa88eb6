"""The ``python`` tool: run the model's code in a sandbox and show it the output.

Arguments ``{"code": str, "stdin"?: str}``. A last bare expression is echoed like Jupyter. ``stateful: false`` (the
default) runs each call in a fresh interpreter; ``stateful: true`` keeps one interpreter per episode, closed when
the episode ends. What the model sees is cut to ``max_output_chars``, keeping the head and the tail.

Tools built with the same sandbox settings share one sandbox (one warm pool per process, not one per env).
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from rstar_env.plugins import plugin_options, shared_sandboxes
from rstar_env.sandbox import BACKENDS, ExecResult, Sandbox, SandboxError, create_sandbox
from rstar_env.tool import EpisodeContext, ToolUnavailable, tool_schema
from rstar_env.trajectory import ToolResult


def truncate_middle(text: str, limit: int) -> str:
    """Cut ``text`` to about ``limit`` characters, keeping its head and tail around a marker that says how much
    was cut (the tail holds tracebacks and final results, so it matters as much as the head)."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n... [{cut} characters cut] ...\n{text[-tail:]}"


class SandboxToolOptions(BaseModel):
    """Options every sandboxed Python tool has (``python`` and ``python_code_with_standard_io``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    backend: str = "local"
    """The sandbox backend: ``local``, ``subprocess``, ``e2b``, ``ray`` (:data:`rstar_env.sandbox.BACKENDS`)."""
    timeout_s: float = Field(4.0, gt=0)
    """Wall-clock limit of one call, in seconds (the rStar2-Agent recipe uses 4 s)."""
    sandbox: SkipJsonSchema[Any] = None
    """An existing sandbox to use (not closed by this tool), overriding ``backend``; from Python only."""
    sandbox_options: dict[str, Any] | None = None
    """Options for ``create_sandbox`` (memory limit, pool size, ...)."""

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, backend: str) -> str:
        if backend not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {', '.join(sorted(BACKENDS))}")
        return backend

    @field_validator("sandbox")
    @classmethod
    def _sandbox_object(cls, sandbox: Any) -> Any:
        if sandbox is not None and not callable(getattr(sandbox, "execute", None)):
            raise ValueError(
                f"sandbox must be a sandbox object (rstar_env.sandbox.create_sandbox(...)), got "
                f"{type(sandbox).__name__}; in a config, choose it with backend and sandbox_options"
            )
        return sandbox


class PythonOptions(SandboxToolOptions):
    """The ``python`` tool's options (``tools: [{name: python, options: {...}}]``), checked when a config loads."""

    stateful: bool = False
    """Keep one interpreter per episode (variables survive between calls)."""
    max_output_chars: int = Field(4096, ge=64)
    """What the model sees of stdout + stderr, head and tail kept (at least 64, room for the cut marker)."""
    description: str | None = None
    """The schema's description, if the default does not suit your prompt."""


class PythonArguments(BaseModel):
    """The ``python`` tool's arguments, as the model sends them."""

    code: str = Field(description="The Python code to run.")
    stdin: str = Field("", description="Text given to the program on standard input.")


class PythonTool:
    """Run Python code in a sandbox (``backend``: local, subprocess, e2b, ray). Options: :class:`PythonOptions`,
    given as the model or as keywords (``PythonTool(stateful=True, timeout_s=2)``); a bad value raises
    :class:`~rstar_env.plugins.OptionsError` (a ``ValueError``) naming the option."""

    name: ClassVar[str] = "python"
    options_model: ClassVar[type[BaseModel]] = PythonOptions

    def __init__(self, options: PythonOptions | None = None, **settings: Any) -> None:
        opts = plugin_options(PythonOptions, options, settings)
        self.options: SandboxToolOptions = opts
        self.stateful = stateful = opts.stateful
        self.backend = opts.backend
        self.timeout_s = opts.timeout_s
        self.max_output_chars = opts.max_output_chars
        self._sandbox: Sandbox | None = opts.sandbox
        self._sandbox_options = dict(opts.sandbox_options or {})
        self._key: tuple[str, str] | None = None
        self._lock = threading.Lock()
        self.schema = tool_schema(
            self.name,
            opts.description
            or (
                "Execute Python 3 code and return what it prints (the value of a last bare expression is shown too). "
                + ("Variables persist between calls in this conversation. " if stateful else "Each call starts fresh. ")
                + f"Time limit {self.timeout_s:g} s per call. numpy and sympy are available."
            ),
            PythonArguments,
        )

    @property
    def sandbox(self) -> Sandbox:
        with self._lock:
            if self._sandbox is None:
                backend, options = self.backend, self._sandbox_options
                # Tools with the same settings share one sandbox, held by the process runtime (one warm pool).
                self._key = (backend, repr(sorted(options.items())))
                self._sandbox = shared_sandboxes().acquire(self._key, lambda: create_sandbox(backend, **options))
            return self._sandbox

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        session = episode.episode_id if self.stateful else None
        # Only the local and subprocess backends take a client key (fair queueing); None needs no keyword.
        fair = {"client": episode.client} if episode.client is not None else {}
        try:
            result = await self.sandbox.execute(
                arguments["code"], stdin=arguments.get("stdin", ""), session=session, timeout_s=self.timeout_s, **fair
            )
        except SandboxError as exc:  # the backend cannot work (closed, cannot start): not the model's doing
            raise ToolUnavailable(f"the {self.backend} sandbox failed: {exc}") from exc
        if result.system_failure:
            # No room in time, a pool that died: the system's failure, never shown to the model nor counted as its
            # tool error; the env ends the episode env_error, unscored.
            raise ToolUnavailable(f"the {self.backend} sandbox could not run the call: {result.message}")
        return ToolResult(
            text=self.render(result),
            error=None if result.status == "ok" else result.status,  # one vocabulary: the status is the kind
            duration_s=result.duration_s,
            metadata={"status": result.status, "queue_s": result.queue_s},  # time waiting before it ran
        )

    def render(self, result: ExecResult) -> str:
        """The text the model reads for one execution."""
        parts = [result.stdout.rstrip("\n")] if result.stdout.strip() else []
        if result.stderr.strip():
            parts.append(result.stderr.rstrip("\n"))
        if result.status == "timeout":
            parts.append(f"TimeoutError: execution exceeded the {self.timeout_s:g} s time limit and was stopped.")
        elif result.status == "crash":
            parts.append(f"The Python process crashed: {result.message or 'unknown cause'}.")
        elif result.status == "output_limit":
            parts.append("[output limit reached: the program was stopped]")
        text = "\n".join(parts) if parts else "(no output; print() the values you want to see)"
        return truncate_middle(text, self.max_output_chars)

    async def close(self, episode: EpisodeContext) -> None:
        if self.stateful and self._sandbox is not None:
            await self._sandbox.close_session(episode.episode_id)

    async def aclose(self) -> None:
        """Release this tool's share of its sandbox."""
        key, self._key = self._key, None
        if key is not None:
            self._sandbox = None
            await shared_sandboxes().release(key)


__all__ = ["PythonArguments", "PythonOptions", "PythonTool", "SandboxToolOptions", "truncate_middle"]
