"""``rstar-env serve sandbox``: the sandbox behind SandboxFusion's API, so verl's ``sandbox_fusion`` tool and the
``sandbox-fusion`` client (``run_code``, ``run_jupyter``) work against it unchanged.

- ``POST /run_code`` (``RunCodeRequest`` -> ``RunCodeResponse``): ``language: "python"`` only; any other language
  is refused with ``status: "SandboxError"`` and a message that says so (the sandbox runs Python). ``run_timeout``
  is capped by the python tool's limit; ``memory_limit_MB`` and ``compile_timeout`` are accepted and the server's own
  limits hold. ``files`` / ``fetch_files`` must be empty (refused otherwise). As with SandboxFusion's
  ``python file.py``, a last bare expression is not echoed.
- ``POST /run_jupyter`` (``RunJupyterRequest`` -> ``RunJupyterResponse``): the stateful form the API has. The
  cells run one after another in one sandbox session (variables persist between cells), closed at the end; a last
  bare expression is echoed into the cell's ``stdout``, and a failing cell stops the run.

Outcomes map onto SandboxFusion's: ``ok`` -> ``Success`` / ``Finished`` / return code 0; an exception -> ``Failed`` /
``Finished`` / 1 (``sys.exit(n)``: n); a timeout -> ``Failed`` / ``TimeLimitExceeded``; a crash or the output limit
-> ``Failed`` / ``Finished`` / 137, the reason in ``message``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from pydantic import BaseModel, ConfigDict, Field

from rstar_env.sandbox import ExecResult
from rstar_env.serve.fair import FairGate
from rstar_env.serve.guard import client_of
from rstar_env.serve.resources import Resources, on_background
from rstar_env.serve.sessions import CapacityError, Sessions

Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
"""A time limit: a finite number of seconds, not negative (NaN, infinity or -1 is a 400 naming the field)."""

_SYSTEM_EXIT = re.compile(r"^SystemExit: (-?\d+)$")
KILLED = 137
"""The return code reported for a process the sandbox stopped (crash, output limit), as a shell reports SIGKILL."""


class RunCodeRequest(BaseModel):
    """SandboxFusion's ``/run_code`` request; unknown fields (``memory_limit_MB``, ...) are accepted and ignored."""

    model_config = ConfigDict(extra="allow")

    code: str
    language: str = "python"
    stdin: str | None = None
    run_timeout: Seconds = 10
    compile_timeout: Seconds = 10
    files: dict[str, str | None] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class CommandRunResult(BaseModel):
    status: Literal["Finished", "Error", "TimeLimitExceeded"]
    execution_time: float | None = None
    return_code: int | None = None
    stdout: str | None = None
    stderr: str | None = None


class RunCodeResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    compile_result: CommandRunResult | None = None
    run_result: CommandRunResult | None = None
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


class RunJupyterRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    cells: list[str]
    cell_timeout: Seconds = 0
    total_timeout: Seconds = 45
    kernel: str = "python3"
    files: dict[str, str] = Field(default_factory=dict)
    fetch_files: list[str] = Field(default_factory=list)


class CellRunResult(BaseModel):
    stdout: str
    stderr: str
    display: list[dict[str, Any]] = Field(default_factory=list)
    error: list[dict[str, Any]] = Field(default_factory=list)


class RunJupyterResponse(BaseModel):
    status: Literal["Success", "Failed", "SandboxError"]
    message: str = ""
    driver: CommandRunResult | None = None
    cells: list[CellRunResult] = Field(default_factory=list)
    executor_pod_name: str | None = None
    files: dict[str, str] = Field(default_factory=dict)


def refusal(request: RunCodeRequest | RunJupyterRequest) -> str | None:
    """Why this server will not run ``request``, or ``None``."""
    language = getattr(request, "language", None)
    if language is not None and language != "python":
        return f"language {language!r} is not supported: rstar-env's sandbox runs Python only (send language 'python')"
    kernel = getattr(request, "kernel", None)
    if kernel is not None and kernel != "python3":
        return f"kernel {kernel!r} is not supported: rstar-env's sandbox runs the python3 kernel only"
    if request.files or request.fetch_files:
        return "files and fetch_files are not supported by rstar-env's sandbox: send them empty"
    return None


def run_result(result: ExecResult) -> tuple[CommandRunResult, str]:
    """SandboxFusion's view of one execution, and the message."""
    message = result.message or ""
    if result.status == "timeout":
        return CommandRunResult(
            status="TimeLimitExceeded", execution_time=result.duration_s, stdout=result.stdout, stderr=result.stderr
        ), message
    if result.status == "ok":
        code = 0
    elif result.status == "exception":
        exit_code = _SYSTEM_EXIT.match(message)
        code = int(exit_code.group(1)) if exit_code else 1
    else:  # crash, output_limit: the sandbox stopped the process
        code = KILLED
        message = message or result.status
    return CommandRunResult(
        status="Finished",
        execution_time=result.duration_s,
        return_code=code,
        stdout=result.stdout,
        stderr=result.stderr,
    ), message


def add_sandbox_routes(
    app: FastAPI, resources: Resources, *, sessions: Sessions, gate: FairGate, max_cells: int = 256
) -> None:
    """Mount ``/run_code`` and ``/run_jupyter`` on ``app``, on ``resources``' sandbox: ``/run_code`` calls wait
    their turn in ``gate`` (fair per client), a ``/run_jupyter`` run is a session of ``sessions`` (the one cap; its
    time at most ``sessions.max_session_s``; at most ``max_cells`` cells) that stops when its client goes away."""
    cap = resources.python_timeout_s

    @app.post("/run_code", response_model=RunCodeResponse, tags=["SandboxFusion"])
    async def run_code(request: RunCodeRequest, raw: Request) -> RunCodeResponse:
        refused = refusal(request)
        if refused is not None:
            return RunCodeResponse(status="SandboxError", message=refused)
        timeout = min(max(float(request.run_timeout), 0.001), cap)
        # SandboxFusion runs `python file.py`, which echoes nothing: end on a statement, not a bare expression.
        client = client_of(raw.scope)
        async with gate.slot(client):
            result = await on_background(
                resources.sandbox.execute(
                    request.code + "\npass\n",
                    stdin=request.stdin or "",
                    timeout_s=timeout,
                    **resources.for_client(client),
                )
            )
        run, message = run_result(result)
        ok = run.status == "Finished" and run.return_code == 0
        return RunCodeResponse(status="Success" if ok else "Failed", message=message, run_result=run)

    @app.post("/run_jupyter", response_model=RunJupyterResponse, tags=["SandboxFusion"])
    async def run_jupyter(request: RunJupyterRequest, raw: Request) -> RunJupyterResponse:
        refused = refusal(request)
        if refused is None and len(request.cells) > max_cells:
            refused = f"{len(request.cells)} cells: this server runs at most {max_cells} per request"
        if refused is not None:
            return RunJupyterResponse(status="SandboxError", message=refused)
        try:
            session = sessions.open("jupyter", client_of(raw.scope))
        except CapacityError as exc:
            return RunJupyterResponse(status="SandboxError", message=str(exc))
        name = f"jupyter-{session.id}"
        sandbox, whose = resources.sandbox, resources.for_client(session.owner)
        session.close = lambda: on_background(sandbox.close_session(name))
        total = float(request.total_timeout)
        if sessions.max_session_s is not None:
            total = min(total, sessions.max_session_s)
        start, cells, status = time.monotonic(), [], "Success"
        driver_status: Literal["Finished", "TimeLimitExceeded"] = "Finished"

        async def run_cells() -> None:
            nonlocal status, driver_status
            for code in request.cells:
                left = total - (time.monotonic() - start)
                if left <= 0:
                    status, driver_status = "Failed", "TimeLimitExceeded"
                    break
                timeout = min(left, cap, float(request.cell_timeout) or cap)
                result = await on_background(sandbox.execute(code, session=name, timeout_s=timeout, **whose))
                cell = CellRunResult(stdout=result.stdout, stderr=result.stderr)
                if result.status != "ok":
                    ename, _, value = (result.message or result.status).partition(": ")
                    cell.error.append({"ename": ename, "evalue": value, "traceback": result.stderr.splitlines()})
                    status = "Failed"
                    driver_status = "TimeLimitExceeded" if result.status == "timeout" else driver_status
                cells.append(cell)
                if result.status != "ok":
                    break

        try:
            with sessions.using(session):
                await _unless_gone(raw, run_cells())
        finally:
            await sessions.end(session)  # closes the sandbox session: nothing of the run outlives it
        driver = CommandRunResult(
            status=driver_status, execution_time=time.monotonic() - start, return_code=0 if status == "Success" else 1
        )
        return RunJupyterResponse(status=status, driver=driver, cells=cells)  # type: ignore[arg-type]


async def _unless_gone(request: Request, work: Any) -> None:
    """Run ``work`` unless the client hangs up first: then it is cancelled (no later cell runs) and the caller
    closes the session. The body was read already, so the next ASGI message can only be the disconnect."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return
    task.result()


__all__ = ["RunCodeRequest", "RunCodeResponse", "RunJupyterRequest", "RunJupyterResponse", "add_sandbox_routes"]
