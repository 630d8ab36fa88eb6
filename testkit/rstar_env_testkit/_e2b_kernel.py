"""A minimal Jupyter-like Python kernel: one per context of the code-interpreter test server.

Started by :mod:`rstar_env_testkit.e2b_server` as ``python -I <this file>`` (by path, so it imports nothing of
the package) with two inherited pipes: requests arrive on fd 3 as JSON lines ``{"id", "code", "env"}``; events
leave on fd 4 as JSON lines tagged with the request's ``id``:

* ``{"type": "start", "count": n}`` when the cell starts (the server's ``number_of_executions``);
* ``{"type": "stdout" | "stderr", "text": ...}`` as the cell writes (unbuffered, so output streams);
* ``{"type": "result", "data": {mime: value}}`` for a last bare expression that is not None (IPython's
  displayhook: ``text/plain`` is the repr, ``application/json`` comes from ``_repr_json_``);
* ``{"type": "error", "ename", "evalue", "traceback": [lines]}`` for an exception;
* ``{"type": "done"}`` at the end.

Like IPython, the cell runs in one namespace per kernel, the interpreter's fds 0-2 are not the cell's streams,
and SIGINT raises ``KeyboardInterrupt`` in the running cell (the server's interrupt).

Stdlib only.
"""

from __future__ import annotations

import ast
import builtins
import json
import os
import sys
import traceback
from typing import Any

REQUEST_FD = 3
EVENT_FD = 4


def emit(message: dict[str, Any]) -> None:
    data = (json.dumps(message) + "\n").encode("utf-8", "backslashreplace")
    view = memoryview(data)
    while view:
        written = os.write(EVENT_FD, view)
        view = view[written:]


class EventStream:
    """``sys.stdout`` / ``sys.stderr`` of a cell: every write is an event at once."""

    encoding = "utf-8"
    errors = "backslashreplace"

    def __init__(self, name: str) -> None:
        self.name = name
        self.request_id: str | None = None

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if text:
            emit({"id": self.request_id, "type": self.name, "text": text})
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def run_cell(request_id: str, code: str, namespace: dict[str, Any], count: int) -> None:
    filename = f"<ipython-input-{count}>"
    try:
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr) and not code.rstrip().endswith(";"):
            last = ast.Expression(tree.body.pop().value)
        body = compile(tree, filename, "exec")
        tail = compile(last, filename, "eval") if last is not None else None
        exec(body, namespace)
        if tail is not None:
            value = eval(tail, namespace)
            if value is not None:
                namespace["_"] = value
                data: dict[str, Any] = {"text/plain": repr(value)}
                to_json = getattr(value, "_repr_json_", None)
                if callable(to_json):
                    data["application/json"] = to_json()
                emit({"id": request_id, "type": "result", "data": data})
    except BaseException as exc:  # what IPython reports as an error message, KeyboardInterrupt included
        emit(
            {
                "id": request_id,
                "type": "error",
                "ename": type(exc).__name__,
                "evalue": str(exc),
                "traceback": traceback.format_exception(type(exc), exc, exc.__traceback__),
            }
        )


def main() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    stdout, stderr = EventStream("stdout"), EventStream("stderr")
    requests = os.fdopen(REQUEST_FD, "r", encoding="utf-8")
    count = 0
    while True:
        try:
            line = requests.readline()
        except KeyboardInterrupt:  # an interrupt that arrived between cells
            continue
        if not line:
            return
        request_id = None
        try:
            request = json.loads(line)
            count += 1
            request_id = request["id"]
            env = request.get("env") or {}
            saved_env = {key: os.environ.get(key) for key in env}
            os.environ.update({str(k): str(v) for k, v in env.items()})
            stdout.request_id = stderr.request_id = request_id
            sys.stdout, sys.stderr = stdout, stderr
            emit({"id": request_id, "type": "start", "count": count})
            try:
                run_cell(request_id, request["code"], namespace, count)
            finally:
                sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
                for key, value in saved_env.items():
                    if value is None:
                        os.environ.pop(key, None)
                    else:
                        os.environ[key] = value
            emit({"id": request_id, "type": "done"})
        except KeyboardInterrupt:  # an interrupt between the cell's end and its "done"
            emit({"id": request_id, "type": "done"})


if __name__ == "__main__":
    main()
