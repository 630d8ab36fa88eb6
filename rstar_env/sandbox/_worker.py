"""The child side of every local sandbox: set up a worker process, then run cells sent over a private socket.

Both backends run this same code: the ``local`` zygote calls :func:`prepare` and :func:`serve_supervised` in a
fresh fork, the ``subprocess`` backend :func:`prepare` and :func:`serve` in a fresh interpreter
(:func:`subprocess_main`). A cell runs like a notebook cell:
the module body is executed and, when the last statement is a bare expression whose value is not None, its
``repr`` is printed (a trailing ``;`` suppresses that, as in Jupyter). An exception prints its traceback, without
this module's frames, to stderr; the result carries a one-line summary such as ``"ZeroDivisionError: division by
zero"``.

The outcome travels over a socket, never through stdout, so printing cannot forge it. Under the ``local`` pool
that socket leads to the zygote, not the caller, and the zygote reports a call's end only once the worker has
exited or stopped itself with nothing else of its left alive (see :mod:`._zygote`): code that writes a fake outcome
on it gains nothing. Stdout and stderr are per-call pipes read by the caller (which enforces the output limit);
stdin is an in-memory file, so a large stdin never blocks.

Stdlib only, and free of ``rstar_env`` imports: it is loaded by path in processes that must not import the
package (see :mod:`rstar_env.sandbox._spawn`).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import errno
import io
import json
import linecache
import os
import signal
import socket
import sys
import traceback
import types
from typing import Any, NoReturn

from . import _cgroup, _limits, _proctree, _procview, _protocol

MAX_ERROR_CHARS = 300
"""A result's ``error`` is a one-line summary, cut to this length."""

_THIS_FILE = __file__


# ---------------------------------------------------------------------------------------------------- cells


def run_cell(code: str, namespace: dict[str, Any], filename: str = "<cell>") -> tuple[str, str | None]:
    """Execute ``code`` in ``namespace``; returns ``(status, error)`` with status ``"ok"`` or ``"error"``.

    Prints the ``repr`` of a last bare expression that is not None. Tracebacks go to ``sys.stderr``.
    """
    linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
    try:
        tree = ast.parse(code, filename, "exec")
        last: ast.Expression | None = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
            last = ast.Expression(tree.body.pop().value)
        body = compile(tree, filename, "exec")
        tail = compile(last, filename, "eval") if last is not None else None
    except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
        # Compile-time failures have no user frames: print just the exception, as the interpreter does.
        sys.stderr.write("".join(traceback.format_exception_only(type(exc), exc)))
        return "error", _summary(exc)
    try:
        exec(body, namespace)
        if tail is not None:
            value = eval(tail, namespace)
            if value is not None:
                print(repr(value))
    except SystemExit as exc:
        return _system_exit(exc)
    except BaseException as exc:
        _print_traceback(exc)
        return "error", _summary(exc)
    return "ok", None


def _system_exit(exc: SystemExit) -> tuple[str, str | None]:
    code = exc.code
    if code is None or code is False or code == 0:
        return "ok", None
    if not isinstance(code, int):
        print(code, file=sys.stderr)  # what the interpreter does with sys.exit("message")
    return "error", _summary(exc)


def _print_traceback(exc: BaseException) -> None:
    """Print ``exc`` like the interpreter would, dropping the frames of this runner."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == _THIS_FILE:
        tb = tb.tb_next
    try:
        sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))
    except Exception:  # a broken __str__ or a closed stderr must not take the worker down
        with contextlib.suppress(Exception):
            sys.stderr.write(f"{type(exc).__name__}: <unprintable exception>\n")


def _summary(exc: BaseException) -> str:
    name = type(exc).__qualname__
    module = type(exc).__module__
    if module not in ("builtins", "__main__"):
        name = f"{module}.{name}"
    try:
        message = str(exc)
    except Exception:
        message = "<unprintable exception>"
    first = message.strip().splitlines()[0] if message.strip() else ""
    line = f"{name}: {first}" if first else name
    return line[:MAX_ERROR_CHARS]


# ---------------------------------------------------------------------------------------------------- stdio


def _text_stream(fd: int, mode: str) -> io.TextIOWrapper:
    raw = io.FileIO(fd, mode, closefd=False)
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="replace")
    # Line buffering: what was printed before a timeout kill still reaches the caller.
    return io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8", errors="backslashreplace", line_buffering=True)


def _install_stdio(stdin: str, out_fd: int, err_fd: int) -> None:
    """Point fds 0-2 and ``sys.std*`` at this call's stdin and output pipes."""
    data = stdin.encode("utf-8", "surrogateescape")
    memfd = os.memfd_create("stdin", os.MFD_CLOEXEC)
    try:
        if data:
            os.write(memfd, data)
            os.lseek(memfd, 0, os.SEEK_SET)
        os.dup2(memfd, 0)
    finally:
        os.close(memfd)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    sys.stdin = sys.__stdin__ = _text_stream(0, "r")
    sys.stdout = sys.__stdout__ = _text_stream(1, "w")
    sys.stderr = sys.__stderr__ = _text_stream(2, "w")


def _release_stdio() -> None:
    """Flush what the call printed and detach fds 0-2 from its pipes, so the caller sees end-of-file."""
    for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}.values():
        with contextlib.suppress(Exception):
            stream.flush()
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.close(devnull)


# ---------------------------------------------------------------------------------------------------- worker


def prepare(
    workdir: str,
    env: dict[str, str],
    limits: _limits.Limits,
    uid: int | None,
    *,
    private_mounts: bool = False,
    keep_read_search: bool = False,
    expose_paths: list[str] | None = None,
    network: bool = True,
    tmp_binds: list[str] | None = None,
    max_ptys: int | None = _limits.MAX_PTYS,
    syscall_filter: Any = None,
    cgroup_namespace: bool = False,
    proc_files: dict[str, bytes] | None = None,
) -> int | None:
    """Turn this fresh process into a sandbox worker. Call before any user code, in the child. Returns the syscall
    filter's listener (see :meth:`._seccomp.CompiledFilter.load`), for the caller to pass on and close, or None.

    Makes it a subreaper (so daemons it starts stay in its tree), gives it its own session, its own IPC namespace
    and empty ``/tmp``, ``/dev/shm``, ``/dev/pts`` and ``/proc`` view (``private_mounts``), a private working
    directory, a clean environment and its limits, and finally drops every capability (and changes to its private
    uid, when the pool runs as root). ``expose_paths``: see :func:`._limits.expose_interpreter`
    (``isolation="none"`` only). ``network=False`` adds a network namespace of its own; ``tmp_binds`` are bound
    back over its ``/tmp``; ``max_ptys`` bounds its own ``/dev/pts`` (None: the pool's, shared; see
    :func:`._limits.private_namespaces`). ``syscall_filter`` (:func:`._seccomp.build`) is loaded last, once the
    worker needs no refused call any more. ``cgroup_namespace``: a cgroup namespace of its own, rooted at the cgroup
    it is in (:func:`._cgroup.unshare_namespace`). ``proc_files`` (:func:`._procview.render`): bound over the
    host's counters in its ``/proc`` (needs ``private_mounts``).
    """
    _proctree.become_subreaper()
    with contextlib.suppress(OSError):
        os.setsid()
    if cgroup_namespace:
        _cgroup.unshare_namespace()
    if private_mounts:
        _limits.private_namespaces(limits.tmpfs_mb, network=network, tmp_binds=tmp_binds or (), max_ptys=max_ptys)
        if proc_files:
            _procview.install(proc_files)
        if expose_paths:
            _limits.expose_interpreter(expose_paths)
    os.mkdir(workdir, 0o700)
    if uid is not None:
        os.chown(workdir, uid, uid)
    os.chdir(workdir)
    os.environ.clear()
    os.environ.update(env)
    os.environ["HOME"] = os.environ["TMPDIR"] = workdir
    if "tempfile" in sys.modules:  # it caches its directory on first use, possibly in the zygote
        sys.modules["tempfile"].tempdir = workdir
    limits.apply()
    if uid is not None or private_mounts:
        _limits.drop_privileges(uid, keep_read_search=keep_read_search)
    if syscall_filter is not None:
        return syscall_filter.load()
    return None


def _fresh_main() -> dict[str, Any]:
    """A new ``__main__`` module for user code: pickling and ``if __name__ == "__main__"`` behave as usual."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = ["-c"]
    return main.__dict__


def _reseed() -> None:
    # Forks share the zygote's RNG state; a fresh interpreter would not. `random` reseeds itself at fork.
    # Seeding from an explicit array: numpy's own entropy path costs ~15 ms on first use in a process.
    numpy = sys.modules.get("numpy")
    if numpy is not None and "numpy.random" in sys.modules:
        with contextlib.suppress(Exception):
            numpy.random.seed(numpy.frombuffer(os.urandom(16), dtype=numpy.uint32))


def _read_body(fd: int) -> dict[str, Any]:
    """The code and stdin of a request, from the memfd the caller wrote (see :func:`._client.request_body`)."""
    chunks = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    body = json.loads(b"".join(chunks))
    return body if isinstance(body, dict) else {}


def _run_request(
    request: dict[str, Any], fds: list[int], namespace: dict[str, Any], cells: int, *, final: bool
) -> tuple[str, str | None]:
    """Run one ``exec`` request (``fds``: the memfd with its code and stdin, the two output pipes); everything the
    cell started is dead when this returns."""
    body_fd, out_fd, err_fd = fds
    try:
        body = _read_body(body_fd)
    finally:
        os.close(body_fd)
    _limits.set_cpu_budget(float(request.get("cpu_s", 10.0)), final=final)
    _install_stdio(str(body.get("stdin", "")), out_fd, err_fd)
    filename = "<cell>" if cells == 1 else f"<cell-{cells}>"
    try:
        status, error = run_cell(str(body.get("code", "")), namespace, filename)
    finally:
        _release_stdio()
    _proctree.end_descendants()
    return status, error


def _report(status: str, error: str | None) -> int:
    """A memfd holding ``{"status", "error"}``: the zygote passes it to the caller unread (see :mod:`._zygote`)."""
    try:
        fd = os.memfd_create("report", os.MFD_CLOEXEC)
    except OSError as exc:
        if exc.errno != errno.EMFILE:
            raise
        os.close(0)  # /dev/null since the call ended: room for the report when the cell left every descriptor open
        fd = os.memfd_create("report", os.MFD_CLOEXEC)
    view = memoryview(json.dumps({"status": status, "error": error}).encode())
    while view:
        view = view[os.write(fd, view) :]
    return fd


def serve(chan_fd: int, *, once: bool) -> NoReturn:
    """``subprocess`` backend: answer ``exec`` requests on ``chan_fd`` until end of stream (or after one); exit.

    Request: ``{"op": "exec", "token", "cpu_s"}`` with a memfd holding ``{"code", "stdin"}`` and the stdout and
    stderr pipes attached. Reply: ``{"op": "result", "token", "status", "error"}``, sent only after the call's own
    processes are gone.
    """
    chan = socket.socket(fileno=chan_fd)
    namespace = _fresh_main()
    _reseed()
    cells = 0
    while True:
        try:
            received = _protocol.recv_message(chan)
        except (OSError, _protocol.ProtocolError):
            received = None
        if received is None:
            _proctree.end_descendants()
            os._exit(0)
        request, fds = received
        cells += 1
        if request.get("op") != "exec" or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        status, error = _run_request(request, fds, namespace, cells, final=once)
        reply = {"op": "result", "token": request.get("token"), "status": status, "error": error}
        try:
            _protocol.send_message(chan, reply)
        except OSError:
            os._exit(0)
        if once:
            os._exit(0)


def serve_supervised(link_fd: int, *, once: bool, as_init: bool = False) -> NoReturn:
    """``local`` pool: run the ``exec`` requests the zygote forwards on ``link_fd`` (a ``SOCK_SEQPACKET`` socket).

    Request: ``{"op": "exec", "cpu_s"}`` with the caller's memfd holding ``{"code", "stdin"}`` and the two output
    pipes, passed on by the zygote unread. After each call the worker writes ``{"op": "done"}`` with a memfd
    holding its report (``{"status", "error"}``, for the caller: the zygote never reads it) and stops itself with
    SIGSTOP: the zygote passes the report on only once the worker is stopped (or dead), so a fake report written by
    the cell ends nothing early. A one-call worker is then killed by the zygote (stopping rather than exiting keeps
    the teardown of its namespaces off the call's latency); a session worker waits, stopped, for the next request.

    ``as_init``: the worker is PID 1 of its own PID namespace, where a signal it sends itself is dropped: the zygote
    stops it when it reads the report (a session), or replies and kills it (one call); :func:`._pidns.act_as_init`,
    called before, gives the code the usual signal behaviour.
    """
    link = socket.socket(fileno=link_fd)
    namespace = _fresh_main()
    _reseed()
    cells = 0
    while True:
        try:
            received = _protocol.recv_datagram(link)
        except (OSError, _protocol.ProtocolError):
            received = None
        if received is None:
            _proctree.end_descendants()
            os._exit(0)
        request, fds = received
        if request.get("op") != "exec" or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            continue
        cells += 1
        status, error = _run_request(request, fds, namespace, cells, final=once)
        try:
            report = _report(status, error)
            try:
                _protocol.send_datagram(link, {"op": "done"}, [report])
            finally:
                os.close(report)
        except OSError:
            os._exit(0)
        if not as_init:
            os.kill(os.getpid(), signal.SIGSTOP)
        elif once:
            # Killed by the zygote once it has replied: nothing more arrives on the link.
            with contextlib.suppress(OSError):
                link.recv(1)
        if once:
            os._exit(0)


def subprocess_main(chan_fd: int, config: dict[str, Any]) -> NoReturn:
    """Entry point of a ``subprocess``-backend interpreter: prepare, then serve one call or one session."""
    try:
        # No namespaces here; the uid-less read capability keeps interpreters under a private home importable.
        limits = _limits.Limits(**config["limits"])
        prepare(config["workdir"], config["env"], limits, config.get("uid"), keep_read_search=True)
        _proctree.die_with_parent(int(config["parent"]))  # after prepare: a uid change clears the death signal
    except Exception as exc:  # report instead of dying silently; the caller turns it into a crashed result
        sys.stderr.write(f"sandbox worker setup failed: {exc!r}\n")
        os._exit(70)
    with socket.socket(fileno=os.dup(chan_fd)) as chan:  # the call's timeout counts from here, not from exec
        _protocol.send_message(chan, {"op": "started", "pid": os.getpid()})
    serve(chan_fd, once=not config.get("session", False))
