"""Code execution backends behind one protocol.

``create_sandbox(backend, **options)`` returns a :class:`Sandbox`: an async context manager whose
``execute(code, *, stdin="", session=None, timeout_s=None)`` returns an :class:`ExecResult` and never raises for
anything the executed code does. ``session`` names a stateful interpreter (one per episode, typically): calls with
the same session share globals until ``close_session(session)``. ``session=None`` runs the code fresh.

Backends are registered by name in :data:`BACKENDS` (module path and class, imported lazily, so ``import
rstar_env`` never pulls in e2b or ray). Every backend is usable from any event loop and from several loops in
turn: none binds an asyncio primitive to a loop at construction.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from rstar_env.outcomes import EXEC_STATUSES, Outcome, exec_status

ExecStatus = Literal["ok", "exception", "timeout", "crash", "output_limit"]
"""``ok``: ran to the end. ``exception``: raised an exception (``message`` holds its summary). ``timeout``: killed
at the wall-clock limit. ``crash``: the interpreter died (signal, memory bomb, killed parent, dead sandbox).
``output_limit``: produced more output than the backend keeps, and was stopped. The names are those of
``ToolResult.error`` (:mod:`rstar_env.outcomes`); the former ``"error"`` and ``"crashed"`` still work, with a
:class:`DeprecationWarning`."""

_UNSET: Any = object()


@dataclass(frozen=True, init=False)
class ExecResult:
    """The outcome of one ``execute`` call: ``ExecResult(stdout, stderr, status, message, duration_s)``.

    ``status`` is an :class:`~rstar_env.outcomes.Outcome` (a ``str``); ``message`` says what went wrong (the
    exception's summary, why the interpreter died), ``None`` when the code ran to the end. ``error=`` and ``.error``
    are the former names of ``message``, kept with a :class:`DeprecationWarning`.
    """

    stdout: str
    stderr: str
    status: ExecStatus
    message: str | None = None
    duration_s: float = field(default=0.0, compare=False)
    """Run time: from when a worker took the call (the timeout counts from there) to its end."""
    queue_s: float = field(default=0.0, compare=False)
    """Time the call waited before it started running (for a free slot, its session's turn, a worker)."""

    def __init__(
        self,
        stdout: str,
        stderr: str,
        status: str,
        message: str | None = None,
        duration_s: float = 0.0,
        queue_s: float = 0.0,
        *,
        error: str | None = _UNSET,
    ) -> None:
        if error is not _UNSET:
            warnings.warn("ExecResult(error=...) is now ExecResult(message=...)", DeprecationWarning, stacklevel=2)
            if message is not None:
                raise TypeError("ExecResult got both message= and its former name error=: pass message= only")
            message = error
        for name, value in (("stdout", stdout), ("stderr", stderr), ("message", message),
                            ("duration_s", duration_s), ("queue_s", queue_s)):  # fmt: skip
            object.__setattr__(self, name, value)
        object.__setattr__(self, "status", exec_status(status, stacklevel=2))

    @property
    def error(self) -> str | None:
        """Deprecated: the former name of :attr:`message` (``ToolResult.error`` is a kind, this is a message)."""
        warnings.warn("ExecResult.error is now ExecResult.message", DeprecationWarning, stacklevel=2)
        return self.message

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "status": str(self.status),
            "message": self.message,
            "duration_s": self.duration_s,
            "queue_s": self.queue_s,
        }


@runtime_checkable
class Sandbox(Protocol):
    """The protocol every backend implements."""

    async def execute(
        self, code: str, *, stdin: str = "", session: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        """Run ``code`` (with ``stdin`` on standard input) and return its result. Never raises for user code."""
        ...

    async def close_session(self, session: str) -> None:
        """Forget a stateful session and end its interpreter. Closing an unknown session is a no-op."""
        ...

    async def aclose(self) -> None:
        """End every session and release the backend's resources. Idempotent."""
        ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


class SandboxError(RuntimeError):
    """The backend itself cannot work (misconfigured, missing dependency); never raised for user code."""


BACKENDS: dict[str, str] = {
    "local": "rstar_env.sandbox.local:LocalSandbox",
    "subprocess": "rstar_env.sandbox.subprocess:SubprocessSandbox",
    "e2b": "rstar_env.sandbox.e2b:E2BSandbox",
    "ray": "rstar_env.sandbox.ray:RaySandbox",
}
"""Backend name -> ``module:Class``. ``subprocess`` starts a fresh interpreter per call (the peers' way; the
benchmark baseline); ``local`` is the warm fork-server pool."""


def create_sandbox(backend: str = "local", **options: Any) -> Sandbox:
    """Create a sandbox backend by name; ``options`` go to its constructor.

    >>> async with create_sandbox("local", timeout_s=4) as sandbox:   # doctest: +SKIP
    ...     result = await sandbox.execute("print(1 + 1)")
    """
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise ValueError(
            f"unknown sandbox backend {backend!r}; choose one of {sorted(BACKENDS)}"
        ) from None
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        extra = {"e2b": "e2b", "ray": "ray"}.get(backend)
        hint = f"; install it with `pip install 'rstar-env[{extra}]'`" if extra else ""
        raise SandboxError(f"sandbox backend {backend!r} cannot be loaded: {exc}{hint}") from exc
    return getattr(module, class_name)(**options)


__all__ = [
    "BACKENDS",
    "EXEC_STATUSES",
    "ExecResult",
    "ExecStatus",
    "Outcome",
    "Sandbox",
    "SandboxError",
    "create_sandbox",
]
