"""A tiny OpenAI-compatible chat-completions server that replays recorded responses, for tests.

It serves ``POST /v1/chat/completions`` (and ``GET /v1/models``) on 127.0.0.1 from a list of *entries*, records
every request it got, counts how many were in flight at once, and can inject faults (429 with ``Retry-After``,
5xx, a dropped connection, a slow answer). Only the standard library: it runs wherever the tests run.

    from rstar_env_testkit.replay_server import ReplayServer, fault, reply

    with ReplayServer([fault(429, retry_after=0.01), reply("The answer is \\\\boxed{4}.")]) as server:
        policy = OpenAIPolicy(server.base_url, model="test")
        ...
        server.requests[-1]["messages"]      # what the client sent

An entry is a JSON object (one per line in a ``.jsonl`` file) with any of:

``content``, ``tool_calls``, ``finish_reason``, ``usage``, ``reasoning_content``
    shorthand for a one-choice completion. ``tool_calls`` is a list of ``{"name", "arguments"}``; ``arguments`` is an
    object (JSON-encoded for you) or a string sent verbatim (to replay invalid JSON). ``finish_reason`` defaults to
    ``tool_calls`` when there are tool calls, else ``stop``.
``body``
    the whole response body, verbatim (a recorded completion); overrides the shorthand.
``status``, ``headers``, ``retry_after``
    an HTTP status other than 200 (the body is then an OpenAI error object), extra headers, a ``Retry-After`` value.
``delay_s``
    wait this long before answering (longer than the client's timeout: a timeout).
``disconnect``
    close the connection without answering.
``match``
    serve this entry only to a request whose last message's content contains this string.

Each request takes the first unused entry that matches it (entries without ``match`` match any request), so a plain
list is served in order, and ``match`` keeps concurrent episodes apart. When no entry is left, the ``responder``
(a function of the request body returning an entry, if given) answers, else the ``default`` entry (if given);
otherwise the request gets a 500 error that says so.

Run it by hand with ``python -m rstar_env_testkit.replay_server responses.jsonl --port 8000``.
"""

from __future__ import annotations

import argparse
import copy
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Entry = dict[str, Any]


def reply(
    content: str | None = "",
    tool_calls: Iterable[Mapping[str, Any]] | None = None,
    *,
    finish_reason: str | None = None,
    match: str | None = None,
    delay_s: float = 0.0,
    usage: Mapping[str, int] | None = None,
) -> Entry:
    """A successful completion entry. ``tool_calls``: ``[{"name": ..., "arguments": {...} or "raw json"}]``."""
    entry: Entry = {"content": content}
    if tool_calls is not None:
        entry["tool_calls"] = [dict(call) for call in tool_calls]
    if finish_reason is not None:
        entry["finish_reason"] = finish_reason
    if match is not None:
        entry["match"] = match
    if delay_s:
        entry["delay_s"] = delay_s
    if usage is not None:
        entry["usage"] = dict(usage)
    return entry


def fault(
    status: int = 500, *, retry_after: float | None = None, message: str | None = None, match: str | None = None
) -> Entry:
    """An HTTP error entry (429 with ``retry_after`` seconds, 500, 503, 400, ...)."""
    entry: Entry = {"status": status, "message": message or f"injected fault {status}"}
    if retry_after is not None:
        entry["retry_after"] = retry_after
    if match is not None:
        entry["match"] = match
    return entry


def disconnect(*, match: str | None = None) -> Entry:
    """An entry that drops the connection without answering."""
    entry: Entry = {"disconnect": True}
    if match is not None:
        entry["match"] = match
    return entry


def slow(seconds: float, then: Entry | None = None) -> Entry:
    """``then`` (default: an empty completion), answered after ``seconds``."""
    return {**(then if then is not None else reply("")), "delay_s": seconds}


def load_entries(path: str | Path) -> list[Entry]:
    """Entries from a JSONL file (blank lines and lines starting with ``//`` are skipped)."""
    entries = []
    for lineno, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("//"):
            continue
        try:
            entry = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
        if not isinstance(entry, dict):
            raise ValueError(f"{path}:{lineno}: an entry must be a JSON object")
        entries.append(entry)
    return entries


def validate_messages(messages: Any) -> str | None:
    """What the OpenAI API would reject in a ``messages`` list (the tool-call pairing rules), or ``None``.

    Every assistant ``tool_calls`` entry must be answered by a ``tool`` message with its id, right after it; a
    ``tool`` message must answer a call of the assistant message before it.
    """
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty list"
    pending: list[str] = []  # ids of the last assistant message not yet answered
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("system", "user", "assistant", "tool"):
            return f"messages[{i}] has no valid role"
        role = message["role"]
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                return f"messages[{i}]: tool message answers {call_id!r}, which no preceding tool call has"
            pending.remove(call_id)
            if not isinstance(message.get("content"), str):
                return f"messages[{i}]: a tool message needs string content"
            continue
        if pending:
            return f"messages[{i}]: tool call(s) {pending} were not answered by tool messages"
        if role == "assistant":
            calls = message.get("tool_calls") or []
            for j, call in enumerate(calls):
                function = call.get("function") if isinstance(call, dict) else None
                if (
                    not isinstance(function, dict)
                    or not isinstance(function.get("name"), str)
                    or not isinstance(function.get("arguments"), str)
                    or call.get("type") != "function"
                    or not isinstance(call.get("id"), str)
                ):
                    return (
                        f"messages[{i}].tool_calls[{j}] must be {{id, type: function, function: "
                        f"{{name, arguments: str}}}}"
                    )
            ids = [call["id"] for call in calls]
            if len(set(ids)) != len(ids):
                return f"messages[{i}]: tool call ids are not unique: {ids}"
            pending = ids
            if not calls and not isinstance(message.get("content"), str):
                return f"messages[{i}]: an assistant message without tool calls needs string content"
        elif not isinstance(message.get("content"), str):
            return f"messages[{i}]: a {role} message needs string content"
    if pending:
        return f"tool call(s) {pending} were not answered by tool messages"
    return None


class ReplayServer:
    """Serve recorded chat completions on ``127.0.0.1`` (a free port unless ``port`` is given), in a thread.

    Args:
        entries: the entries, or a path to a JSONL file of them.
        default: the entry that answers when no listed entry matches (e.g. ``reply("...", delay_s=0.05)``).
        responder: a function from the request body to the entry that answers it, asked when no listed entry
            matches (before ``default``); it runs in the server's handler threads, so it must be thread-safe.
        strict: reject (400) requests whose messages break the OpenAI tool-call pairing rules, as the real API does.
    """

    def __init__(
        self,
        entries: Iterable[Entry] | str | Path = (),
        *,
        default: Entry | None = None,
        responder: Callable[[dict[str, Any]], Entry] | None = None,
        strict: bool = True,
        host: str = "127.0.0.1",
        port: int = 0,
        model: str = "replay",
    ) -> None:
        listed = load_entries(entries) if isinstance(entries, str | Path) else [dict(e) for e in entries]
        self._entries: list[Entry | None] = list(listed)  # None once served
        self.default = default
        self.responder = responder
        self.metrics: str | None = None
        """Prometheus text served at ``GET /metrics`` (e.g. vLLM's KV-cache figures); ``None``: 404."""
        self.strict = strict
        self.model = model
        self.requests: list[dict[str, Any]] = []
        """Bodies of every chat-completion request received, in arrival order (faulted ones included)."""
        self.headers: list[dict[str, str]] = []
        self.served: list[Entry | None] = []
        """The entry each request got (``None``: nothing matched), parallel to ``requests``."""
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._counter = 0
        self._httpd = _Server((host, port), _make_handler(self))
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------------------------
    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        """The OpenAI ``base_url``: ``http://127.0.0.1:PORT/v1``."""
        return f"http://{self._httpd.server_address[0]}:{self.port}/v1"

    def start(self) -> ReplayServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="replay-server", daemon=True
            )
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()  # wakes slow handlers
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- state ---------------------------------------------------------------------------------------------------
    def add(self, *entries: Entry) -> None:
        """Queue more entries (thread-safe; e.g. between the turns of a test)."""
        with self._lock:
            self._entries.extend(dict(e) for e in entries)

    @property
    def remaining(self) -> int:
        """Listed entries not served yet."""
        with self._lock:
            return sum(e is not None for e in self._entries)

    def _take(self, body: dict[str, Any]) -> Entry | None:
        messages = body.get("messages") or []
        last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
        last = last if isinstance(last, str) else json.dumps(last)
        with self._lock:
            for i, entry in enumerate(self._entries):
                if entry is not None and (entry.get("match") is None or entry["match"] in last):
                    self._entries[i] = None
                    return entry
        if self.responder is not None:
            return self.responder(body)
        return self.default

    def _completion(self, entry: Entry, body: dict[str, Any]) -> dict[str, Any]:
        if "body" in entry:
            return copy.deepcopy(entry["body"])
        with self._lock:
            self._counter += 1
            n = self._counter
        message: dict[str, Any] = {"role": "assistant", "content": entry.get("content")}
        if entry.get("reasoning_content") is not None:
            message["reasoning_content"] = entry["reasoning_content"]
        calls = []
        for j, call in enumerate(entry.get("tool_calls") or []):
            arguments = call.get("arguments", {})
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments, ensure_ascii=False)
            calls.append(
                {
                    "id": call.get("id", f"chatcmpl-tool-{n}-{j}"),
                    "type": "function",
                    "function": {"name": call["name"], "arguments": arguments},
                }
            )
        message["tool_calls"] = calls
        finish = entry.get("finish_reason") or ("tool_calls" if calls else "stop")
        content = entry.get("content") or ""
        usage = entry.get("usage") or {
            "prompt_tokens": 10 * len(body.get("messages") or []),
            "completion_tokens": max(1, len(content.split())),
        }
        usage = {**usage, "total_tokens": usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)}
        return {
            "id": f"chatcmpl-replay-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", self.model),
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
            "usage": usage,
        }


class _Server(ThreadingHTTPServer):
    # http.server listens with a backlog of 5: facing more concurrent connections than that, the kernel drops SYNs
    # and each drop stalls its client ~1 s, so timings would measure the server instead of the client.
    request_queue_size = 1024


def _error_body(message: str, status: int) -> dict[str, Any]:
    kind = "rate_limit_error" if status == 429 else "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "code": status}, "object": "error"}


def _make_handler(server: ReplayServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as real servers
        timeout = 30  # an idle kept-alive connection's thread ends after this

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def _send(self, status: int, payload: dict[str, Any], headers: Mapping[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
            elif self.path.rstrip("/").endswith("/metrics") and server.metrics is not None:
                data = server.metrics.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            elif self.path.rstrip("/").endswith("/health"):
                self._send(200, {})
            else:
                self._send(404, _error_body(f"no route {self.path}", 404))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._send(404, _error_body(f"no route {self.path}", 404))
                return
            try:
                body = json.loads(raw)
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")
            except ValueError as exc:
                self._send(400, _error_body(f"invalid JSON body: {exc}", 400))
                return
            entry = server._take(body)
            with server._lock:
                server.requests.append(body)
                server.headers.append(dict(self.headers.items()))
                server.served.append(entry)
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                self._answer(entry, body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout): nothing to do
                self.close_connection = True
            finally:
                with server._lock:
                    server.in_flight -= 1

        def _answer(self, entry: Entry | None, body: dict[str, Any]) -> None:
            if entry is None:
                self._send(500, _error_body("replay server: no recorded response left for this request", 500))
                return
            if entry.get("delay_s"):
                server._stop.wait(float(entry["delay_s"]))
            if entry.get("disconnect"):
                self.close_connection = True
                return
            if server.strict:
                problem = validate_messages(body.get("messages"))
                if problem is not None:
                    self._send(400, _error_body(problem, 400))
                    return
            status = int(entry.get("status", 200))
            headers = {str(k): str(v) for k, v in (entry.get("headers") or {}).items()}
            if entry.get("retry_after") is not None:
                headers["Retry-After"] = str(entry["retry_after"])
            if status != 200:
                self._send(status, _error_body(str(entry.get("message", f"error {status}")), status), headers)
                return
            self._send(200, server._completion(entry, body), headers)

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Replay recorded chat completions (OpenAI-compatible).")
    parser.add_argument("entries", help="JSONL file of entries (see the module docstring)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--no-strict", action="store_true", help="do not validate message structure")
    args = parser.parse_args(argv)
    with ReplayServer(args.entries, host=args.host, port=args.port, strict=not args.no_strict) as server:
        print(f"replaying {server.remaining} entries at {server.base_url} (Ctrl-C to stop)", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
