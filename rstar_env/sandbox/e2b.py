"""``e2b``: run the tool's code in E2B cloud sandboxes (``e2b-code-interpreter``), behind the sandbox protocol.

Install with ``pip install 'rstar-env[e2b]'`` and set ``E2B_API_KEY``; then ``create_sandbox("e2b")`` (or
``sandbox: {backend: e2b}`` in a config) is all a trainer needs.

How calls map onto E2B::

    execute(session=None) ─▶ a fresh code context (kernel) on the least-loaded sandbox VM, removed after the call
    execute(session="ep-7") ─▶ that episode's own context, created on first use, on the VM chosen then (pinned)
    close_session("ep-7")   ─▶ the context is removed (its kernel dies)

* **Pool.** Up to ``max_sandboxes`` VMs (set it to your account's concurrency limit: 20 on Hobby, 100 on Pro),
  each running at most ``per_sandbox`` calls at once; ``max_concurrency`` calls run in all, more wait. VMs
  open lazily as load grows. Each VM keeps ``spare_contexts`` contexts created and primed ahead of stateless
  calls, so a call does not wait for a kernel to start.
* **Semantics.** Every context first receives a small runner (:mod:`._e2b_runner`), and each call runs through
  it, so a Jupyter kernel behaves like the local sandbox: the last bare expression is printed, ``stdin`` feeds
  ``input()``, tracebacks are clean, ``sys.exit`` is handled, the output budget stops the code.
* **Limits.** The wall-clock timeout is enforced here: the request is dropped at the deadline (the server then
  interrupts the kernel) and the context is discarded, so no state survives a timed-out call (a session starts
  fresh on its next call, as with the local backend). Output past ``max_output_bytes`` gives ``output_limit``.
* **Failures.** HTTP 429, 5xx and connection errors that happen before the code can have run are retried with
  full-jitter exponential backoff, within ``max_attempts`` and ``retry_budget_s``; after that the call returns
  ``crash`` naming the last error (never hangs, never raises for it). A connection lost mid-call is retried
  for a stateless call (its context is thrown away) and is ``crash`` for a session, whose state is then lost.
  A VM that dies (killed, out of memory, past its lifetime) is dropped and replaced: the call that saw it die is
  ``crash``; a session that lived there reports ``crash`` ("its state is lost") once, then starts fresh.
  Bad credentials raise :class:`~rstar_env.sandbox.SandboxError`.
* **Lifetime.** VMs are created with ``sandbox_lifetime_s`` and extended every ``refresh_s``; VMs older than
  ``max_sandbox_age_s`` take no new work and are killed once idle. ``aclose`` kills every VM.

Offline: ``debug=True`` (or ``E2B_DEBUG=true``) with ``sandbox_url`` talks to a self-hosted code-interpreter
server through the SDK's debug mode. The test suite runs this backend against the protocol server of the separate
``rstar-env-testkit`` package, which it starts itself (that server runs code on the host: it is no sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import ExecResult, SandboxError, _remote_loop
from ._e2b_runner import STATUS_MARKER

logger = logging.getLogger("rstar_env.sandbox")

BOOTSTRAP = "exec(compile({source!r}, '<runner>', 'exec'))".format(
    source=Path(__file__).with_name("_e2b_runner.py").read_text(encoding="utf-8")
)
"""The first cell of every context: defines ``__cell_runner__`` in the kernel."""

KERNEL_FAILURES = ("ContextRestarting", "UnexpectedEndOfExecution", "WebSocketError", "ExecutionAborted")
"""Error names the code-interpreter server reports when the kernel itself died or the execution was lost."""


class _Failure(Exception):
    """A failed request, classified. ``kind``: ``rate`` / ``transient`` (nothing ran; retry), ``lost`` (the
    connection dropped mid-call), ``killed`` (the VM died during the call), ``dead`` (the VM is gone),
    ``context`` (the context is gone), ``auth`` (credentials), ``other``."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def classify(exc: BaseException) -> _Failure:
    """Map an exception of the SDK or its transport to a :class:`_Failure`."""
    if isinstance(exc, _Failure):
        return exc
    import httpx
    from e2b import exceptions as e2b_errors

    message = f"{type(exc).__name__}: {exc}".strip()
    text = str(exc)
    # Newer SDKs name more cases; fall back to nothing (a class no exception is an instance of) on older ones.
    absent = type("_Absent", (Exception,), {})
    not_running = getattr(e2b_errors, "SandboxNotRunningException", absent)
    unreachable = getattr(e2b_errors, "SandboxUnreachableException", absent)
    sandbox_gone = "was not found" in text  # the proxy's 502 body for a sandbox that no longer exists
    if isinstance(exc, e2b_errors.AuthenticationException) or text.startswith(("401", "403")):
        return _Failure("auth", message)
    if isinstance(exc, e2b_errors.RateLimitException) or text.startswith("429"):
        return _Failure("rate", message)
    if isinstance(exc, e2b_errors.SandboxNotFoundException | not_running):
        return _Failure("dead", message)
    if isinstance(exc, e2b_errors.NotFoundException):
        return _Failure("dead" if sandbox_gone else "context", message)
    if isinstance(exc, e2b_errors.TimeoutException):
        if "killed while the request was in progress" in text:
            return _Failure("killed", message)
        if "sandbox timeout" in text or sandbox_gone:  # a 502 from the proxy
            return _Failure("dead", message)
        if isinstance(exc, unreachable):
            return _Failure("lost", message)
        return _Failure("transient", message)  # "Request timed out": the request did not get through
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout | httpx.PoolTimeout):
        return _Failure("transient", message)  # never sent
    if isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError | httpx.WriteError | httpx.ReadTimeout):
        return _Failure("lost", message)
    if text.startswith(("500", "502", "503", "504")):
        return _Failure("transient", message)
    return _Failure("other", message)


class _OverLimit(Exception):
    """Raised from an output callback: the call printed past the budget (the SDK's stream is then dropped)."""


@dataclass(eq=False)
class _VM:
    sbx: Any
    label: str
    created: float
    load: int = 0
    spares: list[Any] = field(default_factory=list)
    filling: bool = False
    dead: bool = False
    retired: bool = False


@dataclass(eq=False)
class _Session:
    lock: asyncio.Lock
    vm: _VM | None = None
    context: Any = None


def _crashed(message: str, start: float, stdout: str = "", stderr: str = "", *, system: bool = True) -> ExecResult:
    """A ``crash``: by default a failure of the service (no VM, a lost connection or context, a VM that died
    between calls), which the python tool never shows to the model (``ExecResult.system_failure``); ``system=False``
    where the model's own code may have caused it."""
    return ExecResult(stdout, stderr, "crash", message, time.monotonic() - start, system_failure=system)


class E2BSandbox(_remote_loop.LoopSandbox):
    """E2B code-interpreter sandboxes behind the sandbox protocol (see the module docstring).

    Options (all keyword):

    * ``api_key`` (default ``E2B_API_KEY``), ``domain`` (``E2B_DOMAIN``), ``template`` (the SDK's default
      code-interpreter template), ``envs`` (environment of the VMs), ``network`` (internet access, default off),
      ``metadata``.
    * ``timeout_s`` (4.0), ``max_output_bytes`` (1 MiB): per call, as for the local backend.
    * ``max_sandboxes`` (8), ``per_sandbox`` (4), ``max_concurrency`` (``max_sandboxes * per_sandbox``),
      ``min_sandboxes`` (1, opened at start), ``spare_contexts`` (``per_sandbox``).
    * ``sandbox_lifetime_s`` (3600), ``refresh_s`` (a third of it), ``max_sandbox_age_s`` (None: no recycling).
    * ``max_attempts`` (6), ``retry_budget_s`` (30), ``backoff_s`` (0.2), ``max_backoff_s`` (5): retries.
    * ``request_timeout_s`` (30): bound on every request that is not an execution (contexts, VMs).
    * ``debug`` (``E2B_DEBUG``), ``sandbox_url``: talk to a local or self-hosted code-interpreter server;
      ``{vm}`` in ``sandbox_url`` becomes a fresh id per VM.
    * ``seed``: seeds the retry jitter (tests).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        domain: str | None = None,
        template: str | None = None,
        timeout_s: float = 4.0,
        max_output_bytes: int = 1 << 20,
        max_sandboxes: int = 8,
        per_sandbox: int = 4,
        max_concurrency: int | None = None,
        min_sandboxes: int = 1,
        spare_contexts: int | None = None,
        sandbox_lifetime_s: float = 3600.0,
        refresh_s: float | None = None,
        max_sandbox_age_s: float | None = None,
        envs: dict[str, str] | None = None,
        network: bool = False,
        metadata: dict[str, str] | None = None,
        max_attempts: int = 6,
        retry_budget_s: float = 30.0,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        request_timeout_s: float = 30.0,
        debug: bool | None = None,
        sandbox_url: str | None = None,
        seed: int | None = None,
    ) -> None:
        super().__init__(timeout_s=timeout_s, max_output_bytes=max_output_bytes)
        try:
            import e2b_code_interpreter
        except ImportError as exc:
            raise SandboxError(
                f"the e2b sandbox backend needs the E2B SDK ({exc}); install it with `pip install 'rstar-env[e2b]'`"
            ) from exc
        self._sdk = e2b_code_interpreter.AsyncSandbox
        if min(max_sandboxes, per_sandbox, max_attempts) < 1 or min_sandboxes < 0:
            raise ValueError("max_sandboxes, per_sandbox and max_attempts must be >= 1, min_sandboxes >= 0")
        self.debug = debug if debug is not None else os.getenv("E2B_DEBUG", "false").lower() == "true"
        self.api_key = api_key or os.getenv("E2B_API_KEY")
        if not self.debug and not self.api_key:
            raise SandboxError(
                "the e2b sandbox backend needs an E2B API key: set E2B_API_KEY (create one at "
                "https://e2b.dev/dashboard) or pass api_key=...; to use a self-hosted code-interpreter server, set "
                "E2B_DEBUG=true (or debug=True) and sandbox_url"
            )
        self.domain = domain
        self.template = template
        self.max_sandboxes = int(max_sandboxes)
        self.per_sandbox = int(per_sandbox)
        self.max_concurrency = int(max_concurrency or self.max_sandboxes * self.per_sandbox)
        self.min_sandboxes = min(int(min_sandboxes), self.max_sandboxes)
        self.spare_contexts = self.per_sandbox if spare_contexts is None else int(spare_contexts)
        self.sandbox_lifetime_s = float(sandbox_lifetime_s)
        self.refresh_s = float(refresh_s) if refresh_s is not None else self.sandbox_lifetime_s / 3
        self.max_sandbox_age_s = max_sandbox_age_s
        self.envs = dict(envs or {})
        self.network = network
        self.metadata = {"created_by": "rstar-env", **(metadata or {})}
        self.max_attempts = int(max_attempts)
        self.retry_budget_s = float(retry_budget_s)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.request_timeout_s = float(request_timeout_s)
        self.sandbox_url = sandbox_url
        self._rng = random.Random(seed)
        self.stats: dict[str, int] = {
            "sandboxes_created": 0,
            "sandboxes_replaced": 0,
            "contexts_created": 0,
            "retries": 0,
        }
        """Counters for monitoring and tests."""
        self._vms: list[_VM] = []
        self._sessions: dict[str, _Session] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._slots: asyncio.Semaphore | None = None
        self._vm_lock: asyncio.Lock | None = None
        self._refresher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------------- info

    @property
    def sandboxes(self) -> list[str]:
        """Labels of the live VMs (their E2B sandbox ids, or the test server's VM ids)."""
        return [vm.label for vm in self._vms if not vm.dead]

    # ------------------------------------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        self._slots = asyncio.Semaphore(self.max_concurrency)
        self._vm_lock = asyncio.Lock()
        opened = await asyncio.gather(*(self._open_vm() for _ in range(self.min_sandboxes)), return_exceptions=True)
        for outcome in opened:
            if isinstance(outcome, BaseException):
                raise SandboxError(f"could not start an E2B sandbox: {outcome}") from outcome
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def _shutdown(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        for vm in self._vms:
            vm.retired = True  # fillers stop topping up
        # Let clean-ups in flight (context removals, fillers) finish briefly, then cut the rest.
        if self._background:
            await asyncio.wait(list(self._background), timeout=5.0)
        for task in list(self._background):
            task.cancel()
        vms, self._vms = self._vms, []
        held = [(s.vm, s.context) for s in self._sessions.values() if s.vm is not None and s.context is not None]
        held += [(vm, context) for vm in vms for context in vm.spares]
        self._sessions.clear()
        # Contexts first: killing the VM ends them on E2B, but a debug or self-hosted server outlives this pool.
        await asyncio.gather(*(self._drop(vm, context) for vm, context in held), return_exceptions=True)
        await asyncio.gather(*(self._kill(vm) for vm in vms), return_exceptions=True)

    def _spawn(self, coro: Any) -> None:
        """Fire and forget, but keep a reference (the loop only keeps weak ones) and log failures."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _api_options(self, label: str) -> dict[str, Any]:
        options: dict[str, Any] = {"request_timeout": self.request_timeout_s, "debug": self.debug}
        if self.api_key:
            options["api_key"] = self.api_key
        if self.domain:
            options["domain"] = self.domain
        if self.sandbox_url:
            options["sandbox_url"] = self.sandbox_url.replace("{vm}", label)
        return options

    # ------------------------------------------------------------------------------------------- VMs

    async def _open_vm(self) -> _VM:
        label = uuid.uuid4().hex[:12]
        sbx = await self._retrying(
            "create an E2B sandbox",
            lambda: asyncio.wait_for(
                self._sdk.create(
                    template=self.template,
                    timeout=int(self.sandbox_lifetime_s),
                    metadata=self.metadata,
                    envs=self.envs or None,
                    allow_internet_access=self.network,
                    **self._api_options(label),
                ),
                self.request_timeout_s,
            ),
        )
        vm = _VM(sbx, label if self.debug else sbx.sandbox_id, time.monotonic())
        self.stats["sandboxes_created"] += 1
        self._vms.append(vm)
        self._spawn(self._fill(vm))
        return vm

    async def _pick_vm(self) -> _VM:
        """The least-loaded VM with room, opening one if all are full and the pool may grow."""
        assert self._vm_lock is not None
        for _ in range(2):
            live = [vm for vm in self._vms if not vm.dead and not vm.retired]
            roomy = [vm for vm in live if vm.load < self.per_sandbox]
            if roomy:
                return min(roomy, key=lambda vm: vm.load)
            if len(live) >= self.max_sandboxes:
                return min(live, key=lambda vm: vm.load)
            async with self._vm_lock:  # one opening at a time; others re-check after it
                live = [vm for vm in self._vms if not vm.dead and not vm.retired]
                if len(live) < self.max_sandboxes and not any(vm.load < self.per_sandbox for vm in live):
                    return await self._open_vm()
        live = [vm for vm in self._vms if not vm.dead and not vm.retired]
        if not live:
            return await self._open_vm()
        return min(live, key=lambda vm: vm.load)

    def _mark_dead(self, vm: _VM, why: str) -> None:
        if vm.dead:
            return
        logger.warning("E2B sandbox %s is gone (%s); replacing it", vm.label, why)
        vm.dead = True
        vm.spares.clear()
        with contextlib.suppress(ValueError):
            self._vms.remove(vm)
        self.stats["sandboxes_replaced"] += 1
        self._spawn(self._kill(vm))

    async def _kill(self, vm: _VM) -> None:
        vm.dead = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(vm.sbx.kill(), self.request_timeout_s)

    async def _check_alive(self, vm: _VM) -> None:
        """After a dropped connection: mark the VM dead if its health check says so."""
        try:
            running = await asyncio.wait_for(vm.sbx.is_running(), self.request_timeout_s)
        except Exception:
            return  # unknown: keep it; the next call finds out
        if not running:
            self._mark_dead(vm, "health check failed")

    async def _refresh_loop(self) -> None:
        """Extend every VM's lifetime; retire old VMs and kill them once idle."""
        while True:
            await asyncio.sleep(self.refresh_s)
            await self.refresh()

    async def refresh(self) -> None:
        """One refresh pass (runs every ``refresh_s``; public so tests can drive it)."""
        now = time.monotonic()
        for vm in list(self._vms):
            if vm.dead:
                continue
            if not vm.retired and self.max_sandbox_age_s is not None and now - vm.created > self.max_sandbox_age_s:
                vm.retired = True
                spares, vm.spares = vm.spares, []
                for context in spares:  # no new work goes there
                    self._spawn(self._drop(vm, context))
            if vm.retired:
                pinned = any(s.vm is vm for s in self._sessions.values())
                if vm.load == 0 and not pinned:
                    with contextlib.suppress(ValueError):
                        self._vms.remove(vm)
                    self._spawn(self._kill(vm))
                    continue
            try:
                await asyncio.wait_for(vm.sbx.set_timeout(int(self.sandbox_lifetime_s)), self.request_timeout_s)
            except Exception as exc:
                failure = classify(exc)
                if failure.kind in ("dead", "killed"):
                    self._mark_dead(vm, str(failure))
                else:
                    logger.warning("could not extend E2B sandbox %s: %s", vm.label, failure)

    # ------------------------------------------------------------------------------------------- contexts

    async def _new_context(self, vm: _VM) -> Any:
        """Create a context on ``vm`` and prime it with the runner. Raises :class:`_Failure`."""

        async def create() -> Any:
            context = await vm.sbx.create_code_context(request_timeout=self.request_timeout_s)
            try:
                execution = await vm.sbx.run_code(BOOTSTRAP, context=context, timeout=self.request_timeout_s)
            except BaseException:
                self._spawn(self._drop(vm, context))
                raise
            if execution.error is not None:
                self._spawn(self._drop(vm, context))
                raise _Failure(
                    "other", f"the runner failed in the kernel: {execution.error.name}: {execution.error.value}"
                )
            return context

        try:
            context = await asyncio.wait_for(create(), self.request_timeout_s)
        except TimeoutError:
            raise _Failure("transient", f"creating a context took over {self.request_timeout_s:g} s") from None
        except Exception as exc:
            raise classify(exc) from exc
        self.stats["contexts_created"] += 1
        return context

    async def _take_context(self, vm: _VM) -> Any:
        if vm.spares:
            context = vm.spares.pop()
            self._spawn(self._fill(vm))
            return context
        self._spawn(self._fill(vm))
        return await self._new_context(vm)

    async def _fill(self, vm: _VM) -> None:
        """Keep ``spare_contexts`` primed contexts on ``vm`` (one filler per VM)."""
        if vm.filling:
            return
        vm.filling = True
        try:
            while not vm.dead and not vm.retired and len(vm.spares) < self.spare_contexts:
                try:
                    context = await self._retrying("prime a context", lambda: self._new_context(vm))
                except _Failure as failure:
                    if failure.kind in ("dead", "killed"):
                        self._mark_dead(vm, str(failure))
                    return
                if vm.dead:
                    return
                vm.spares.append(context)
        finally:
            vm.filling = False

    async def _drop(self, vm: _VM, context: Any) -> None:
        """Remove a context (its kernel dies); best effort, bounded."""
        if vm.dead:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(vm.sbx.remove_code_context(context), self.request_timeout_s)

    # ------------------------------------------------------------------------------------------- calls

    async def _execute(self, code: str, stdin: str, session: str | None, timeout_s: float) -> ExecResult:
        if session is None:
            return await self._stateless(code, stdin, timeout_s)
        state = self._sessions.get(session)
        if state is None:
            state = self._sessions[session] = _Session(asyncio.Lock())
        async with state.lock:  # FIFO: a session's calls run one at a time, in the order they were made
            return await self._in_session(state, code, stdin, timeout_s)

    async def _close_session(self, session: str) -> None:
        state = self._sessions.pop(session, None)
        if state is None:
            return
        async with state.lock:  # after the calls made before this one
            vm, context = state.vm, state.context
            state.vm, state.context = None, None
            if vm is not None and context is not None:
                await self._drop(vm, context)

    async def _stateless(self, code: str, stdin: str, timeout_s: float) -> ExecResult:
        assert self._slots is not None
        start = time.monotonic()
        attempt = 0
        async with self._slots:
            while True:
                vm = await self._acquire_vm(start, attempt)
                if isinstance(vm, ExecResult):
                    return vm
                vm.load += 1
                context = None
                try:
                    context = await self._take_context(vm)
                    result, _ = await self._run(vm, context, code, stdin, timeout_s)
                    return result  # the context is dropped below whether or not it is spoiled
                except _Failure as failure:
                    if failure.kind == "auth":
                        raise SandboxError(f"E2B refused the credentials: {failure}") from None
                    if failure.kind in ("dead", "killed"):
                        self._mark_dead(vm, str(failure))
                    elif failure.kind == "lost":
                        self._spawn(self._check_alive(vm))
                    if failure.kind == "killed":  # the code may have killed it: do not run it again
                        return _crashed(f"the E2B sandbox died during the call ({failure})", start, system=False)
                    if failure.kind == "other":
                        return _crashed(f"E2B call failed: {failure}", start)
                    attempt += 1
                    delay = self._backoff(start, attempt)
                    if delay is None:
                        return _crashed(
                            f"E2B call failed after {attempt} attempts in {time.monotonic() - start:.1f} s: {failure}",
                            start,
                        )
                    self.stats["retries"] += 1
                    await asyncio.sleep(delay)
                finally:
                    vm.load -= 1
                    if context is not None:
                        self._spawn(self._drop(vm, context))  # stateless: every context is used once

    async def _acquire_vm(self, start: float, attempt: int) -> _VM | ExecResult:
        """A VM for the next attempt, or a ``crash`` result when none can be opened within the budget."""
        while True:
            try:
                return await self._pick_vm()
            except _Failure as failure:
                if failure.kind == "auth":
                    raise SandboxError(f"E2B refused the credentials: {failure}") from None
                attempt += 1
                delay = self._backoff(start, attempt)
                if delay is None:
                    return _crashed(f"no E2B sandbox could be opened: {failure}", start)
                await asyncio.sleep(delay)

    async def _in_session(self, state: _Session, code: str, stdin: str, timeout_s: float) -> ExecResult:
        assert self._slots is not None
        start = time.monotonic()
        if state.vm is not None and state.vm.dead:
            state.vm, state.context = None, None
            return _crashed("the E2B sandbox that held this session died between calls; its state is lost", start)
        attempt = 0
        async with self._slots:
            while True:
                if state.context is None:
                    picked = await self._acquire_vm(start, attempt)
                    if isinstance(picked, ExecResult):
                        return picked
                    state.vm = picked
                vm = state.vm
                assert vm is not None
                vm.load += 1
                try:
                    if state.context is None:
                        state.context = await self._take_context(vm)
                    result, spoiled = await self._run(vm, state.context, code, stdin, timeout_s)
                    if spoiled:  # a timeout, the output limit, a dead kernel: no state survives it
                        self._spawn(self._drop(vm, state.context))
                        state.context = None
                    return result
                except _Failure as failure:
                    if failure.kind == "auth":
                        raise SandboxError(f"E2B refused the credentials: {failure}") from None
                    had_context = state.context is not None
                    if failure.kind in ("dead", "killed"):
                        self._mark_dead(vm, str(failure))
                    if failure.kind in ("rate", "transient"):
                        # Nothing ran: wait and try again (on the same context, if the session has one).
                        attempt += 1
                        delay = self._backoff(start, attempt)
                        if delay is not None:
                            self.stats["retries"] += 1
                            await asyncio.sleep(delay)
                            continue
                        return _crashed(
                            f"E2B call failed after {attempt} attempts in {time.monotonic() - start:.1f} s: {failure}",
                            start,
                        )
                    if had_context and not vm.dead:
                        self._spawn(self._drop(vm, state.context))
                    if failure.kind == "lost":
                        self._spawn(self._check_alive(vm))
                    state.vm, state.context = None, None
                    if not had_context and failure.kind in ("dead", "context"):
                        attempt += 1  # the session had no state yet: opening it elsewhere is safe
                        delay = self._backoff(start, attempt)
                        if delay is not None:
                            await asyncio.sleep(delay)
                            continue
                    return _crashed(f"the session's E2B context was lost ({failure}); its state is lost", start)
                finally:
                    vm.load -= 1

    async def _retrying(self, what: str, op: Any) -> Any:
        """``await op()`` with retries on rate limits and transient errors; raises :class:`_Failure` (or
        :class:`SandboxError` for bad credentials) when it cannot."""
        start = time.monotonic()
        attempt = 0
        while True:
            try:
                return await op()
            except TimeoutError:
                failure = _Failure("transient", f"{what}: no answer in {self.request_timeout_s:g} s")
            except Exception as exc:
                failure = classify(exc)
            if failure.kind == "auth":
                raise SandboxError(f"E2B refused the credentials ({failure}); check E2B_API_KEY") from None
            attempt += 1
            delay = self._backoff(start, attempt) if failure.kind in ("rate", "transient") else None
            if delay is None:
                raise _Failure(failure.kind, f"could not {what}: {failure}")
            self.stats["retries"] += 1
            await asyncio.sleep(delay)

    def _backoff(self, start: float, attempt: int) -> float | None:
        """Full-jitter exponential backoff; None once the attempts or the time budget are spent."""
        if attempt >= self.max_attempts:
            return None
        delay = self._rng.uniform(0, min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
        if time.monotonic() - start + delay > self.retry_budget_s:
            return None
        return delay

    async def _run(self, vm: _VM, context: Any, code: str, stdin: str, timeout_s: float) -> tuple[ExecResult, bool]:
        """One execution on ``context``: ``(result, spoiled)``; spoiled means the context must not be reused.

        Raises :class:`_Failure` when the request itself failed.
        """
        out: list[str] = []
        err: list[str] = []
        used = 0
        limit = self.max_output_bytes

        def collect(into: list[str]) -> Any:
            def handler(message: Any) -> None:
                nonlocal used
                text = message.line if hasattr(message, "line") else str(message)
                into.append(text)
                used += len(text.encode("utf-8", "backslashreplace"))
                if used > limit:
                    raise _OverLimit

            return handler

        cell = f"__cell_runner__({code!r}, {stdin!r}, {limit})"
        start = time.monotonic()
        try:
            execution = await asyncio.wait_for(
                vm.sbx.run_code(
                    cell,
                    context=context,
                    on_stdout=collect(out),
                    on_stderr=collect(err),
                    timeout=timeout_s + 10.0,  # a backstop only: the deadline is ours, below
                    request_timeout=self.request_timeout_s,
                ),
                timeout_s,
            )
        except TimeoutError:
            stdout, stderr = _cut("".join(out), "".join(err), limit)
            return ExecResult(
                stdout, stderr, "timeout", f"timed out after {timeout_s:g} s", time.monotonic() - start
            ), True
        except _OverLimit:
            stdout, stderr = _cut("".join(out), "".join(err), limit)
            result = ExecResult(
                stdout, stderr, "output_limit", f"output exceeded {limit} bytes", time.monotonic() - start
            )
            return result, True
        except Exception as exc:
            raise classify(exc) from exc
        duration = time.monotonic() - start
        stdout, stderr = _cut("".join(out), "".join(err), limit)
        outcome = _status(execution)
        if outcome is not None:
            status, error = outcome
            status = "exception" if status == "error" else status  # the runner's name -> the outcome name
            return ExecResult(stdout, stderr, status, error, duration), status == "output_limit"  # type: ignore[arg-type]
        if execution.error is not None:
            name, value = execution.error.name, execution.error.value
            if name in KERNEL_FAILURES:
                return ExecResult(
                    stdout, stderr, "crash", f"the interpreter died ({name}: {value}); its state is lost", duration
                ), True
            if name == "NameError" and "__cell_runner__" in str(value):
                return ExecResult(stdout, stderr, "crash", "the kernel lost its state (restarted)", duration), True
            traceback = execution.error.traceback
            return ExecResult(stdout, stderr + traceback, "exception", f"{name}: {value}", duration), False
        return ExecResult(stdout, stderr, "crash", "the kernel returned no outcome", duration), True


def _status(execution: Any) -> tuple[str, str | None] | None:
    """The runner's ``(status, error)`` from the cell's main result, if it sent one."""
    for result in execution.results:
        if not getattr(result, "is_main_result", False):
            continue
        value = result.json if isinstance(getattr(result, "json", None), dict) else None
        if value is None and isinstance(result.text, str) and result.text.startswith(STATUS_MARKER):
            with contextlib.suppress(ValueError):
                value = json.loads(result.text[len(STATUS_MARKER) :])
        if (
            isinstance(value, dict)
            and STATUS_MARKER in value
            and value.get("status") in ("ok", "error", "output_limit")
        ):
            return value["status"], value.get("error")
    return None


def _cut(stdout: str, stderr: str, limit: int) -> tuple[str, str]:
    """Keep at most ``limit`` bytes of output in all, stdout first (the runner already cuts; this is the net)."""
    data = stdout.encode("utf-8", "backslashreplace")
    if len(data) >= limit:
        return data[:limit].decode("utf-8", "ignore"), ""
    room = limit - len(data)
    err = stderr.encode("utf-8", "backslashreplace")
    return stdout, err[:room].decode("utf-8", "ignore") if len(err) > room else stderr
