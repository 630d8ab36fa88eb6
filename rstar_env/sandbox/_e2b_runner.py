"""Runs inside the remote Jupyter kernel: our cell semantics on top of a code-interpreter context.

The ``e2b`` backend sends this file's source once per context (``BOOTSTRAP``), then every call as one cell
``__cell_runner__(code, stdin, max_output_bytes)``. The runner gives a Jupyter kernel the same semantics as the
local sandbox (:mod:`rstar_env.sandbox._worker`): the code runs in its own namespace (the session's, kept across
calls), the ``repr`` of a last bare expression is printed, ``stdin`` is an in-memory file that ``input()`` reads,
tracebacks are the interpreter's own without the runner's frames, ``sys.exit`` is not an error unless its code
says so, and stdout + stderr together are cut at ``max_output_bytes``, which also stops the code.

The outcome returns as the cell's value, whose ``_repr_json_`` the kernel sends as the ``application/json``
result (``text/plain`` carries the same JSON after a marker, for servers that drop JSON). Printing cannot forge
it: only the cell's own value is a result with ``is_main_result``.

Stdlib only, self-contained, and free of names that mention this project: its frames and globals live in the
user's kernel.
"""

from __future__ import annotations

STATUS_MARKER = "__cell_status__"
"""The key of the status dict (and the prefix of its text form)."""


class _CellOutputLimit(BaseException):
    """Raised into the code when it prints past the budget; a BaseException, so ``except Exception`` in the
    code cannot swallow it."""


class _CellStatus:
    def __init__(self, status: str, error: str | None) -> None:
        self.value = {STATUS_MARKER: 1, "status": status, "error": error}

    def _repr_json_(self) -> dict:
        return self.value

    def __repr__(self) -> str:
        import json

        return STATUS_MARKER + json.dumps(self.value)


class _CellBudget:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.over = False


class _CellStream:
    """Writes through to the kernel's stream, counting bytes against the budget shared by stdout and stderr."""

    encoding = "utf-8"
    errors = "backslashreplace"

    def __init__(self, target, budget: _CellBudget) -> None:
        self.target = target
        self.budget = budget

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self.budget.over:
            raise _CellOutputLimit()
        data = text.encode("utf-8", "backslashreplace")
        room = self.budget.limit - self.budget.used
        if len(data) <= room:
            self.budget.used += len(data)
            self.target.write(text)
            return len(text)
        self.target.write(data[:room].decode("utf-8", "ignore"))
        self.budget.used = self.budget.limit
        self.budget.over = True
        self.flush()
        raise _CellOutputLimit()

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        import contextlib

        with contextlib.suppress(Exception):  # a closed kernel stream must not fail the cell
            self.target.flush()

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def fileno(self) -> int:
        import io

        raise io.UnsupportedOperation("fileno")


def _cell_summary(exc: BaseException) -> str:
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
    return line[:300]


def __cell_runner__(code: str, stdin: str, max_output_bytes: int, namespace: dict | None = None) -> _CellStatus:
    import ast
    import builtins
    import io
    import linecache
    import sys
    import traceback

    global __cell_namespace__
    if namespace is None:
        try:
            namespace = __cell_namespace__
        except NameError:
            namespace = __cell_namespace__ = {"__name__": "__main__", "__builtins__": builtins}

    budget = _CellBudget(max_output_bytes)
    saved = (sys.stdin, sys.stdout, sys.stderr, builtins.input)
    out = _CellStream(sys.stdout, budget)
    err = _CellStream(sys.stderr, budget)
    reader = io.StringIO(stdin)

    def cell_input(prompt: object = "") -> str:
        if prompt:
            sys.stdout.write(str(prompt))
        line = sys.stdin.readline()
        if not line:
            raise EOFError("EOF when reading a line")
        return line[:-1] if line.endswith("\n") else line

    def report(exc: BaseException, frames: bool) -> None:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<runner>":
            tb = tb.tb_next
        try:
            if frames:
                err.write("".join(traceback.format_exception(type(exc), exc, tb)))
            else:
                err.write("".join(traceback.format_exception_only(type(exc), exc)))
        except _CellOutputLimit:
            raise
        except Exception:
            err.write(f"{type(exc).__name__}: <unprintable exception>\n")

    sys.stdin, sys.stdout, sys.stderr, builtins.input = reader, out, err, cell_input
    try:
        filename = "<cell>"
        linecache.cache[filename] = (len(code), None, code.splitlines(keepends=True), filename)
        try:
            tree = ast.parse(code, filename, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
                last = ast.Expression(tree.body.pop().value)
            body = compile(tree, filename, "exec")
            tail = compile(last, filename, "eval") if last is not None else None
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
            report(exc, frames=False)
            return _CellStatus("error", _cell_summary(exc))
        try:
            exec(body, namespace)
            if tail is not None:
                value = eval(tail, namespace)
                if value is not None:
                    print(repr(value))
        except _CellOutputLimit:
            raise
        except SystemExit as exc:
            code_ = exc.code
            if code_ is None or code_ is False or code_ == 0:
                return _CellStatus("ok", None)
            if not isinstance(code_, int):
                print(code_, file=sys.stderr)
            return _CellStatus("error", _cell_summary(exc))
        except BaseException as exc:
            if budget.over:  # the code swallowed the limit and failed afterwards
                raise _CellOutputLimit() from None
            report(exc, frames=True)
            return _CellStatus("error", _cell_summary(exc))
        if budget.over:  # the code caught the limit and went on
            raise _CellOutputLimit()
        return _CellStatus("ok", None)
    except _CellOutputLimit:
        return _CellStatus("output_limit", f"output exceeded {max_output_bytes} bytes")
    finally:
        for stream in (out, err):
            stream.flush()
        sys.stdin, sys.stdout, sys.stderr, builtins.input = saved
