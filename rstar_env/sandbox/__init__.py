"""Code execution backends behind one protocol.

``create_sandbox(backend, **options)`` returns a :class:`Sandbox`: an async context manager whose
``execute(code, *, stdin="", session=None, timeout_s=None)`` returns an :class:`ExecResult` and never raises for
anything the executed code does (the ``local`` and ``subprocess`` backends also take ``client=``, a key whose
calls are served in turn with other clients'; see docs/sandboxes.md). ``session`` names a stateful interpreter
(one per episode, typically): calls with the same session share globals until ``close_session(session)``.
``session=None`` runs the code fresh.

Backends are registered by name in :data:`BACKENDS` (module path and class, imported lazily, so ``import
rstar_env`` never pulls in e2b or ray). Every backend is usable from any event loop and from several loops in
turn: none binds an asyncio primitive to a loop at construction.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rstar_env.outcomes import EXEC_STATUSES, ExecStatus  # what each status means: rstar_env.outcomes


@dataclass(frozen=True)
class ExecResult:
    """The outcome of one ``execute`` call: ``ExecResult(stdout, stderr, status, message, duration_s)``.

    ``status`` is one of :data:`~rstar_env.outcomes.EXEC_STATUSES` (a plain ``str``; anything else raises
    ``ValueError``); ``message`` says what went wrong (the exception's summary, why the interpreter died), ``None``
    when the code ran to the end.
    """

    stdout: str
    stderr: str
    status: ExecStatus
    message: str | None = None
    duration_s: float = field(default=0.0, compare=False)
    """Run time: from when a worker took the call (the timeout counts from there) to its end."""
    queue_s: float = field(default=0.0, compare=False)
    """Time the call waited before it started running (its client's turn, room in the pool's memory, its session's
    turn, a worker)."""
    system_failure: bool = False
    """True when the sandbox, not the code, failed the call: no room in the pool before its queue deadline, a pool
    that died under it, no worker in time. ``status`` is then ``crash`` and ``message`` says what failed. Such a
    result is never the code's doing: a tool raises :class:`~rstar_env.tool.ToolUnavailable` for it, and the
    episode ends ``env_error``, unscored (see :mod:`rstar_env.outcomes`)."""

    def __post_init__(self) -> None:
        if self.status not in EXEC_STATUSES:
            raise ValueError(f"ExecResult.status must be one of {EXEC_STATUSES}, got {self.status!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict[str, Any]:
        return {
            "stdout": self.stdout,
            "stderr": self.stderr,
            "status": self.status,
            "message": self.message,
            "duration_s": self.duration_s,
            "queue_s": self.queue_s,
            "system_failure": self.system_failure,
        }


@runtime_checkable
class Sandbox(Protocol):
    """The protocol every backend implements."""

    async def execute(
        self, code: str, *, stdin: str = "", session: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        """Run ``code`` (with ``stdin`` on standard input) and return its result. Never raises for user code.

        The ``local`` and ``subprocess`` backends also take ``client: str | None = None``: whose call it is, for
        fair queueing between clients (``None``: the one default client)."""
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
    "subprocess": "rstar_env.sandbox.plain:SubprocessSandbox",
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
        raise ValueError(f"unknown sandbox backend {backend!r}; choose one of {sorted(BACKENDS)}") from None
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
    "Sandbox",
    "SandboxError",
    "create_sandbox",
]
