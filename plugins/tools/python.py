"""The ``python`` tool: run the model's code in a sandbox and show it the output.

Arguments ``{"code": str, "stdin"?: str}``. A last bare expression is echoed like Jupyter. ``stateful: false`` (the
default) runs each call in a fresh interpreter; ``stateful: true`` keeps one interpreter per episode, closed when
the episode ends. What the model sees is cut to ``max_output_chars``, keeping the head and the tail.

Tools built with the same sandbox settings share one sandbox (one warm pool per process, not one per env).
"""

from __future__ import annotations

import os
import threading
from typing import Any, ClassVar

from rstar_env.sandbox import ExecResult, Sandbox, create_sandbox
from rstar_env.tool import EpisodeContext, function_schema
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


class _SharedSandboxes:
    """Refcounted sandboxes keyed by their settings, so every env in a process shares one warm pool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, str], list[Any]] = {}

    def acquire(self, backend: str, options: dict[str, Any]) -> tuple[tuple[str, str], Sandbox]:
        key = (backend, repr(sorted(options.items())))
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                entry = self._entries[key] = [create_sandbox(backend, **options), 0]
            entry[1] += 1
            return key, entry[0]

    async def release(self, key: tuple[str, str]) -> None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            entry[1] -= 1
            if entry[1] > 0:
                return
            del self._entries[key]
        await entry[0].aclose()

    def forget_after_fork(self) -> None:
        # A forked child (a worker of gymnasium's AsyncVectorEnv, say) must not drive its parent's sandboxes: their
        # processes and loop threads belong to the parent. The child builds its own on first use.
        self._lock = threading.Lock()
        self._entries = {}


_shared = _SharedSandboxes()
os.register_at_fork(after_in_child=_shared.forget_after_fork)


class PythonTool:
    """Run Python code in a sandbox (``backend``: local, subprocess, e2b, ray)."""

    name: ClassVar[str] = "python"

    def __init__(
        self,
        *,
        stateful: bool = False,
        backend: str = "local",
        timeout_s: float = 4.0,
        max_output_chars: int = 4096,
        sandbox: Sandbox | None = None,
        sandbox_options: dict[str, Any] | None = None,
        description: str | None = None,
    ) -> None:
        """
        Args:
            stateful: keep one interpreter per episode (variables survive between calls).
            backend: the sandbox backend, see :func:`rstar_env.sandbox.create_sandbox`.
            timeout_s: wall-clock limit of one call (the rStar2-Agent recipe uses 4 s).
            max_output_chars: what the model sees of stdout + stderr, head and tail kept.
            sandbox: an existing sandbox to use (not closed by this tool); overrides ``backend``.
            sandbox_options: options for ``create_sandbox`` (memory limit, pool size, ...).
            description: the schema's description, if the default does not suit your prompt.
        """
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        if max_output_chars < 64:
            raise ValueError(f"max_output_chars must be at least 64, got {max_output_chars}")
        self.stateful = stateful
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.max_output_chars = max_output_chars
        self._sandbox = sandbox
        self._sandbox_options = dict(sandbox_options or {})
        self._key: tuple[str, str] | None = None
        self._lock = threading.Lock()
        self.schema = function_schema(
            "python",
            description
            or (
                "Execute Python 3 code and return what it prints (the value of a last bare expression is shown too). "
                + ("Variables persist between calls in this conversation. " if stateful else "Each call starts fresh. ")
                + f"Time limit {self.timeout_s:g} s per call. numpy and sympy are available."
            ),
            {
                "code": {"type": "string", "description": "The Python code to run."},
                "stdin": {"type": "string", "description": "Text given to the program on standard input."},
            },
            ["code"],
        )

    @property
    def sandbox(self) -> Sandbox:
        with self._lock:
            if self._sandbox is None:
                self._key, self._sandbox = _shared.acquire(self.backend, self._sandbox_options)
            return self._sandbox

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        session = episode.episode_id if self.stateful else None
        result = await self.sandbox.execute(
            arguments["code"], stdin=arguments.get("stdin", ""), session=session, timeout_s=self.timeout_s
        )
        return ToolResult(
            text=self.render(result),
            error=None if result.status == "ok" else str(result.status),  # one vocabulary: the status is the kind
            duration_s=result.duration_s,
            metadata={"status": str(result.status), "queue_s": result.queue_s},  # time waiting before it ran
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
            await _shared.release(key)


__all__ = ["PythonTool", "truncate_middle"]

