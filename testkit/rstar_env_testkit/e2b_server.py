"""A local stand-in for E2B's code-interpreter server, for tests and offline development.

It speaks what ``e2b-code-interpreter`` sends (read from the SDK and from the server in E2B's
``code-interpreter`` template, ``template/server``):

* ``POST /execute`` ``{"code", "context_id", "language", "env_vars"}`` answers a chunked stream of JSON lines:
  ``{"type": "number_of_executions", "execution_count"}``, ``{"type": "stdout" | "stderr", "text",
  "timestamp"}``, ``{"type": "result", "text", "json", ..., "is_main_result": true}``, ``{"type": "error",
  "name", "value", "traceback"}``, ``{"type": "keepalive"}`` every few seconds, and ``{"type":
  "end_of_execution"}``; an unknown context is a 404. When the client goes away mid-stream, the kernel is
  interrupted, as the real server does.
* ``POST /contexts`` ``{"language", "cwd"}`` -> ``{"id", "language", "cwd"}``; ``GET /contexts``;
  ``DELETE /contexts/{id}`` (kills the kernel); ``POST /contexts/{id}/restart``.
* ``GET /health`` (envd's liveness route, which the SDK's ``is_running`` calls): 204, or 502 once the
  sandbox was killed, which is what the E2B proxy answers for a sandbox that is gone.

Each context is a small Python kernel process (:mod:`rstar_env_testkit._e2b_kernel`) in its own session, killed
with its process group. It emulates the protocol, it is not a security boundary: run only trusted code on it, or
run it inside a container.

Several sandboxes (VMs) share one server through a path prefix: ``/vm/<id>/execute`` is sandbox ``<id>``'s
``/execute`` (no prefix: sandbox ``default``). The ``e2b`` backend's ``sandbox_url`` option takes
``http://host:port/vm/{vm}`` and fills in a fresh id per sandbox it creates, so a test sees many sandboxes.

Faults for tests: :meth:`CodeInterpreterServer.inject` makes the next requests answer 429, 502 or 500, drop the
connection, or hang; :meth:`CodeInterpreterServer.kill_vm` kills a sandbox (in-flight requests are cut, later ones
answer 502).

Run it for the SDK's debug mode (``E2B_DEBUG=true`` sends sandbox traffic to ``localhost:49999`` and envd's to
``localhost:49983``)::

    python -m rstar_env_testkit.e2b_server --port 49999 --envd-port 49983
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KERNEL_FILE = Path(__file__).with_name("_e2b_kernel.py")
KEEPALIVE_S = 5.0
"""Like the real server: a keepalive line every 5 s of silence, so a vanished client is noticed."""
FAULTS = ("429", "500", "502", "disconnect", "hang")
_MAX_LINE = 256 << 20


class _Kernel:
    """One context: a kernel process, its request pipe, and the queues of the requests it is serving."""

    def __init__(self, context_id: str, cwd: str, python: str, env: dict[str, str]) -> None:
        self.id = context_id
        self.cwd = cwd
        self.python = python
        self.env = env
        self.lock = asyncio.Lock()  # one execution at a time per context, as a Jupyter kernel
        self.queues: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self.request_w: int | None = None
        self.reader_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        req_r, req_w = os.pipe()
        evt_r, evt_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [self.python, "-I", "-c", _LAUNCH, str(req_r), str(evt_w), str(KERNEL_FILE)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(req_r, evt_w),
                cwd=self.cwd if os.path.isdir(self.cwd) else None,
                env=self.env,
                start_new_session=True,
            )
        finally:
            os.close(req_r)
            os.close(evt_w)
        self.request_w = req_w
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_MAX_LINE)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(evt_r, "rb", 0))
        self.reader_task = asyncio.create_task(self._read_events(reader))

    async def _read_events(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                queue = self.queues.get(event.get("id"))
                if queue is not None:
                    queue.put_nowait(event)
        finally:
            for queue in self.queues.values():  # the kernel died: every waiting execution learns it
                queue.put_nowait({"type": "died"})

    async def send(self, request_id: str, code: str, env: dict[str, str] | None) -> bool:
        self.queues[request_id] = asyncio.Queue()
        data = (json.dumps({"id": request_id, "code": code, "env": env or {}}) + "\n").encode()
        assert self.request_w is not None
        try:
            await asyncio.to_thread(_write_all, self.request_w, data)  # a 1 MB cell must not block the loop
        except OSError:
            return False
        return True

    def interrupt(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGINT)

    async def kill(self) -> None:
        proc, self.proc = self.proc, None
        if self.request_w is not None:
            with contextlib.suppress(OSError):
                os.close(self.request_w)
            self.request_w = None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.wait)
        if self.reader_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.reader_task, 2.0)
            self.reader_task = None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


_LAUNCH = """\
import fcntl, os, runpy, sys
req, evt, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (req, evt)]
for fd in (req, evt):
    os.close(fd)
os.dup2(high[0], 3)
os.dup2(high[1], 4)
for fd in high:
    os.close(fd)
sys.argv = [path]
runpy.run_path(path, run_name="__main__")
"""
"""The kernel's launcher: moves the two inherited pipe ends to fds 3 and 4, wherever Popen put them."""


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


@dataclass
class _VM:
    id: str
    dead: bool = False
    contexts: dict[str, _Kernel] = field(default_factory=dict)
    default_context: str | None = None
    streams: set[asyncio.StreamWriter] = field(default_factory=set)


@dataclass
class _Fault:
    kind: str
    path: str
    vm: str | None
    times: int
    match: str | None = None


@dataclass
class _Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class CodeInterpreterServer:
    """The server on a background thread (see the module docstring). Use as a context manager or
    :meth:`start` / :meth:`stop`.

    ``port=0`` picks a free port; ``envd_port`` also serves the same routes on a second port (the SDK's debug
    mode sends envd traffic to 49983). ``python`` runs the kernels (default: this interpreter).
    """

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, *, envd_port: int | None = None, python: str | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.envd_port = envd_port
        self.python = python or sys.executable
        self.requests: collections.Counter[tuple[str, str, int]] = collections.Counter()
        """(method, route without the VM prefix, status) -> count."""
        self._faults: list[_Fault] = []
        self._vms: dict[str, _VM] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._kernel_env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}

    # ------------------------------------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def sandbox_url(self) -> str:
        """The template for the ``e2b`` backend's ``sandbox_url`` option: one fresh sandbox per ``{vm}``."""
        return self.url + "/vm/{vm}"

    def start(self) -> CodeInterpreterServer:
        if self._thread is not None:
            return self
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            try:
                loop.run_until_complete(self._listen())
            except BaseException as exc:  # reported to start()
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._teardown())
            pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="e2b-test-server", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread = None
            raise failure[0]
        return self

    async def _listen(self) -> None:
        server = await asyncio.start_server(self._handle, self.host, self.port, limit=_MAX_LINE)
        self.port = server.sockets[0].getsockname()[1]
        self._servers.append(server)
        if self.envd_port is not None:
            self._servers.append(await asyncio.start_server(self._handle, self.host, self.envd_port))

    async def _teardown(self) -> None:
        for server in self._servers:
            server.close()
        for vm in list(self._vms.values()):
            for kernel in list(vm.contexts.values()):
                await kernel.kill()
            for writer in list(vm.streams):
                writer.transport.abort()

    def stop(self) -> None:
        """Kill every kernel and stop serving."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=15)
        self._thread = None

    def __enter__(self) -> CodeInterpreterServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------------------- test controls

    def inject(
        self, kind: str, *, path: str = "/execute", times: int = 1, vm: str | None = None, match: str | None = None
    ) -> None:
        """Make the next ``times`` requests to ``path`` (on sandbox ``vm``, or any; whose body contains ``match``,
        or any) fail as ``kind``:
        ``"429"``/``"500"``/``"502"`` answer that status before doing anything; ``"disconnect"`` sends the
        response head and drops the connection; ``"hang"`` sends the head and then nothing, until the client
        leaves."""
        if kind not in FAULTS:
            raise ValueError(f"fault must be one of {FAULTS}, got {kind!r}")
        with self._lock:
            self._faults.append(_Fault(kind, path, vm, times, match))

    def clear_faults(self) -> None:
        """Forget every injected fault that has not fired yet."""
        with self._lock:
            self._faults.clear()

    def pending_faults(self) -> int:
        with self._lock:
            return sum(f.times for f in self._faults)

    def vms(self) -> list[str]:
        """Sandboxes that have been used and are not dead."""
        with self._lock:
            return [vm.id for vm in self._vms.values() if not vm.dead]

    def contexts(self, vm: str | None = None) -> int:
        """Live contexts (kernels) on ``vm``, or on every sandbox."""
        with self._lock:
            vms = [self._vms[vm]] if vm is not None and vm in self._vms else list(self._vms.values())
            return sum(1 for v in vms for k in v.contexts.values() if k.alive())

    def kill_vm(self, vm: str) -> None:
        """Kill sandbox ``vm``: its kernels die, its open streams are cut, and it answers 502 from now on."""
        if self._loop is None:
            raise RuntimeError("the server is not running")
        asyncio.run_coroutine_threadsafe(self._kill_vm(vm), self._loop).result(timeout=15)

    async def _kill_vm(self, vm_id: str) -> None:
        vm = self._vm(vm_id)
        vm.dead = True
        for writer in list(vm.streams):
            writer.transport.abort()
        for kernel in list(vm.contexts.values()):
            await kernel.kill()
        vm.contexts.clear()

    # ------------------------------------------------------------------------------------------- HTTP

    def _vm(self, vm_id: str) -> _VM:
        with self._lock:
            if vm_id not in self._vms:
                self._vms[vm_id] = _VM(vm_id)
            return self._vms[vm_id]

    def _take_fault(self, route: str, vm_id: str, body: bytes) -> str | None:
        with self._lock:
            for fault in self._faults:
                matches = fault.match is None or fault.match.encode() in body
                if fault.path == route and fault.vm in (None, vm_id) and matches:
                    fault.times -= 1
                    if fault.times <= 0:
                        self._faults.remove(fault)
                    return fault.kind
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    break
                if not await self._dispatch(request, reader, writer):
                    break
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass
        except asyncio.CancelledError:  # the server is stopping (asyncio's own callback chokes on a cancelled task)
            pass
        finally:
            writer.close()

    async def _dispatch(self, request: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Answer one request; False when the connection must close."""
        parts = request.path.split("?", 1)[0].rstrip("/").split("/")
        vm_id = "default"
        if len(parts) > 2 and parts[1] == "vm":
            vm_id, parts = parts[2], ["", *parts[3:]]
        route = "/".join(parts) or "/"
        vm = self._vm(vm_id)
        generic = "/contexts/{id}" if route.startswith("/contexts/") else route
        if route.endswith("/restart"):
            generic = "/contexts/{id}/restart"

        def count(status: int) -> None:
            with self._lock:
                self.requests[(request.method, generic, status)] += 1

        fault = self._take_fault(route, vm_id, request.body)
        if fault in ("429", "500", "502"):
            status = int(fault)
            count(status)
            body = {429: "Too many requests, slow down", 500: "Internal error", 502: "The sandbox was not found"}
            await _respond(writer, status, body[status], "text/plain")
            return True
        if fault in ("disconnect", "hang"):
            count(200)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
            await writer.drain()
            if fault == "hang":
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(reader.read(1), 120)
            writer.transport.abort()
            return False
        if vm.dead:
            count(502)
            await _respond(writer, 502, "The sandbox was not found", "text/plain")
            return True

        if request.method == "GET" and route == "/health":
            count(204)
            await _respond(writer, 204, None)
            return True
        if request.method == "POST" and route == "/execute":
            return await self._execute(vm, request, reader, writer, count)
        if request.method == "POST" and route == "/contexts":
            payload = _json_body(request)
            kernel = await self._new_kernel(vm, payload.get("cwd") or "/home/user")
            count(200)
            await _respond(writer, 200, {"id": kernel.id, "language": "python", "cwd": kernel.cwd})
            return True
        if request.method == "GET" and route == "/contexts":
            count(200)
            listing = [{"id": k.id, "language": "python", "cwd": k.cwd} for k in vm.contexts.values()]
            await _respond(writer, 200, listing)
            return True
        if route.startswith("/contexts/"):
            context_id = parts[2]
            kernel = vm.contexts.get(context_id)
            if kernel is None:
                count(404)
                await _respond(writer, 404, f"Context {context_id} not found", "text/plain")
                return True
            if request.method == "DELETE" and len(parts) == 3:
                del vm.contexts[context_id]
                await kernel.kill()
                count(200)
                await _respond(writer, 200, None)
                return True
            if request.method == "POST" and parts[3:] == ["restart"]:
                await kernel.kill()
                await kernel.start()
                count(200)
                await _respond(writer, 200, None)
                return True
        count(404)
        await _respond(writer, 404, "Not Found", "text/plain")
        return True

    async def _new_kernel(self, vm: _VM, cwd: str, context_id: str | None = None) -> _Kernel:
        kernel = _Kernel(context_id or str(uuid.uuid4()), cwd, self.python, self._kernel_env)
        await kernel.start()
        vm.contexts[kernel.id] = kernel
        return kernel

    async def _execute(
        self, vm: _VM, request: _Request, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, count: Any
    ) -> bool:
        payload = _json_body(request)
        context_id, language = payload.get("context_id"), payload.get("language")
        if context_id and language:
            count(400)
            await _respond(writer, 400, "Only one of context_id or language can be provided", "text/plain")
            return True
        if language and language.lower().strip() != "python":
            count(400)
            await _respond(writer, 400, f"This test server runs python only, not {language!r}", "text/plain")
            return True
        if not context_id:
            if vm.default_context not in vm.contexts:
                vm.default_context = (await self._new_kernel(vm, "/home/user")).id
            context_id = vm.default_context
        kernel = vm.contexts.get(context_id)
        if kernel is None:
            count(404)
            await _respond(writer, 404, f"Context {context_id} not found", "text/plain")
            return True
        count(200)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        vm.streams.add(writer)
        gone = asyncio.ensure_future(reader.read(1))  # HTTP/1.1 clients send nothing more: EOF means gone
        request_id = uuid.uuid4().hex
        try:
            async with kernel.lock:
                if not kernel.alive() or not await kernel.send(
                    request_id, payload.get("code", ""), payload.get("env_vars")
                ):
                    await _chunk(
                        writer,
                        {
                            "type": "error",
                            "name": "ContextRestarting",
                            "value": "Context was restarted",
                            "traceback": "",
                        },
                    )
                else:
                    queue = kernel.queues[request_id]
                    try:
                        if not await self._stream(kernel, queue, writer, gone):
                            kernel.interrupt()  # the client left: stop its code, as the real server does
                            return False
                    finally:
                        kernel.queues.pop(request_id, None)
                await _chunk(writer, {"type": "end_of_execution"})
                writer.write(b"0\r\n\r\n")
                await writer.drain()
            return True
        except (ConnectionError, RuntimeError):
            kernel.interrupt()
            return False
        finally:
            vm.streams.discard(writer)
            gone.cancel()
            # The reader allows one waiter: the cancelled read must be gone before the next request is read.
            await asyncio.gather(gone, return_exceptions=True)

    async def _stream(
        self, kernel: _Kernel, queue: asyncio.Queue[dict[str, Any]], writer: asyncio.StreamWriter, gone: Any
    ) -> bool:
        """Forward the kernel's events as the server's JSON lines; False if the client went away."""
        while True:
            getter = asyncio.ensure_future(queue.get())
            done, _ = await asyncio.wait({getter, gone}, timeout=KEEPALIVE_S, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                if gone in done:
                    return False
                await _chunk(writer, {"type": "keepalive"})
                continue
            event = getter.result()
            kind = event.get("type")
            if kind == "done":
                return True
            if kind == "died":
                # A kernel that dies is restarted by Jupyter; the server reports it like this.
                await _chunk(
                    writer,
                    {"type": "error", "name": "ContextRestarting", "value": "Context was restarted", "traceback": ""},
                )
                await kernel.kill()
                await kernel.start()
                return True
            if kind == "start":
                await _chunk(writer, {"type": "number_of_executions", "execution_count": event["count"]})
            elif kind in ("stdout", "stderr"):
                await _chunk(writer, {"type": kind, "text": event["text"], "timestamp": _now()})
            elif kind == "result":
                await _chunk(writer, _result(event["data"]))
            elif kind == "error":
                await _chunk(
                    writer,
                    {
                        "type": "error",
                        "name": event["ename"],
                        "value": event["evalue"],
                        "traceback": "".join(event["traceback"]),
                    },
                )


def _result(data: dict[str, Any]) -> dict[str, Any]:
    """The server's ``Result`` model, as ``model_dump(exclude_none=True)`` sends it."""
    data = dict(data)
    text = data.pop("text/plain", None)
    if text and len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]  # the real server strips the quotes of a string's repr
    out: dict[str, Any] = {"type": "result", "is_main_result": True}
    if text is not None:
        out["text"] = text
    if "application/json" in data:
        out["json"] = data.pop("application/json")
    out["extra"] = data
    return out


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


def _json_body(request: _Request) -> dict[str, Any]:
    if not request.body:
        return {}
    value = json.loads(request.body)
    return value if isinstance(value, dict) else {}


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        raw = await reader.readline()
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = bytearray()
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                break
            body += await reader.readexactly(size)
            await reader.readline()
        return _Request(method, path, headers, bytes(body))
    length = int(headers.get("content-length", "0") or 0)
    body = await reader.readexactly(length) if length else b""
    return _Request(method, path, headers, body)


_REASONS = {
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
}


async def _respond(
    writer: asyncio.StreamWriter, status: int, body: Any, content_type: str = "application/json"
) -> None:
    if status == 204:
        data = b""
    elif content_type == "application/json":
        data = json.dumps(body).encode()
    else:
        data = str(body).encode()
    head = f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
    if status != 204:
        head += f"Content-Type: {content_type}\r\nContent-Length: {len(data)}\r\n"
    writer.write(head.encode() + b"\r\n" + data)
    await writer.drain()


async def _chunk(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode()
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Local E2B code-interpreter stand-in (see the module docstring).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=49999, help="the code interpreter's port (SDK debug: 49999)")
    parser.add_argument("--envd-port", type=int, default=49983, help="envd's port for /health (SDK debug: 49983)")
    args = parser.parse_args(argv)
    server = CodeInterpreterServer(args.host, args.port, envd_port=args.envd_port).start()
    print(f"code-interpreter test server on {server.url} (envd on port {args.envd_port}); Ctrl-C stops it")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
