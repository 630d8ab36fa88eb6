"""The caller's side of one call: send the cell, collect output under limits, enforce the deadline.

Shared by the ``local`` and ``subprocess`` backends; they differ only in how a worker is started and killed
(:class:`Worker`). Blocking code: it runs on the sandbox's private threads, never on an event loop.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import select
import signal
import socket
import stat
import time
from dataclasses import dataclass
from typing import Any

from . import ExecResult, _protocol

DEATH_GRACE_S = 2.0
"""After a kill, how long to wait for the worker's death to be confirmed before reporting anyway."""
DRAIN_GRACE_S = 0.5
"""After the worker is done, how long to wait for its output pipes to reach end-of-file."""
START_WAIT_S = 60.0
"""How long a call may wait for a worker to take it (a burst of calls waits for forks); its timeout starts after."""
MAX_REPLY_BYTES = 1 << 16
"""Largest message the caller reads from a worker's channel. Replies are a status and a one-line error (output
travels on the pipes, under ``max_output_bytes``); anything longer fails the call before it is buffered."""
CONTINUED = (
    "the session was resumed between calls (by a timer or a signal it set up) and this machine cannot freeze it, "
    "so it was ended and its state (variables, imports) is lost"
)
THREADS_LEFT = (
    "threads started by this code were still running when it ended, so the session was ended and its state "
    "(variables, imports) is lost; join every thread you start before the code ends"
)
POOL_DIED = "the sandbox died (its pool was killed or restarted)"
"""A worker that ended with no exit status of its own: a failure of the system (``ExecResult.system_failure``)."""
_READ_CHUNK = 1 << 16


class Worker(abc.ABC):
    """A running worker as the caller sees it: a private channel, a way to kill it, a way to learn its fate."""

    chan: socket.socket
    started: bool = True
    """False until the worker is known to exist; a call that fails before that may be retried elsewhere."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Kill the worker and everything below it (the death is confirmed on ``chan``: end of stream)."""

    @abc.abstractmethod
    def returncode(self, exit_message: dict[str, Any] | None) -> int | None:
        """After death: the exit code (negative: killed by that signal), or None when unknown."""

    def note(self, message: dict[str, Any]) -> None:
        """A message from the worker's supervisor that is neither a result nor an exit (e.g. ``started``)."""
        if message.get("op") == "started":
            self.started = True

    def is_dead(self) -> bool:
        """Between calls: True if the channel already says the worker is gone (an exit message or closed)."""
        try:
            readable, _, _ = select.select([self.chan], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    def death_note(self) -> str:
        """After :meth:`is_dead`: why a session's worker is gone, in words for the model (reads the exit message)."""
        lost = "the session's interpreter died between calls; its state is lost"
        with contextlib.suppress(OSError, _protocol.ProtocolError):
            self.chan.settimeout(0.1)
            received = _protocol.recv_message(self.chan, MAX_REPLY_BYTES)
            if received is not None:
                for fd in received[1]:
                    os.close(fd)
                if received[0].get("reason") == "continued":
                    return CONTINUED
        return lost

    @abc.abstractmethod
    def close(self) -> None:
        """Release the caller's end (and reap, where the caller is the parent)."""


@dataclass(frozen=True)
class CallOutcome:
    result: ExecResult
    worker_alive: bool
    """False when the call ended the worker (killed on a limit, crashed): a session must start over."""
    started_at: float
    """``time.monotonic()`` when a worker took the call: its timeout and ``duration_s`` count from here."""


class _Output:
    """Both output pipes, kept up to a shared byte budget; past it the rest is read and discarded."""

    def __init__(self, fds: tuple[int, int], limit: int) -> None:
        self.limit = limit
        self.kept = {fd: bytearray() for fd in fds}
        self.open = set(fds)
        self.total = 0

    @property
    def over(self) -> bool:
        return self.total > self.limit

    def read(self, fd: int) -> None:
        try:
            data = os.read(fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.open.discard(fd)
            return
        room = self.limit - sum(len(b) for b in self.kept.values())
        if room > 0:
            self.kept[fd] += data[:room]
        self.total += len(data)

    def drain(self, deadline: float) -> None:
        """Read until every pipe reaches end-of-file, the budget is blown, or ``deadline``."""
        poller = select.poll()
        for fd in self.open:
            poller.register(fd, select.POLLIN)
        while self.open and not self.over:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for fd, _ in poller.poll(remaining * 1000):
                self.read(fd)
                if fd not in self.open:
                    poller.unregister(fd)

    def text(self, fd: int) -> str:
        return self.kept[fd].decode("utf-8", "replace")


def run_call(
    worker: Worker, *, code: str, stdin: str, timeout_s: float, cpu_s: float, max_output_bytes: int
) -> CallOutcome:
    """Run one cell on ``worker`` and return its outcome; never raises for anything the cell does.

    The timeout counts from when a worker takes the call (``started``), not from the request: a call that waits
    for a fork in a burst does not lose its time.
    """
    start = time.monotonic()
    token = os.urandom(8).hex()
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    try:
        os.set_blocking(out_r, False)
        os.set_blocking(err_r, False)
        output = _Output((out_r, err_r), max_output_bytes)
        request = {"op": "exec", "token": token, "cpu_s": cpu_s}
        body = request_body(code, stdin)
        try:
            worker.chan.settimeout(max(0.05, timeout_s))
            _protocol.send_message(worker.chan, request, (body, out_w, err_w))
            sent = True
        except OSError:
            sent = False  # the worker is gone; its fate is on the channel
        finally:
            os.close(body)
            os.close(out_w)
            os.close(err_w)
        clock = _Clock(start if worker.started else None, timeout_s)
        reply, exit_message, dead, stop = _wait(worker, output, token, clock, sent)
        if stop is not None:
            worker.kill()
            exit_message, dead = await_death(worker, time.monotonic() + DEATH_GRACE_S)
        output.drain(time.monotonic() + DRAIN_GRACE_S)
        run_start = clock.started if clock.started is not None else time.monotonic()
        result = _result(worker, output, out_r, err_r, reply, exit_message, dead, stop, timeout_s, run_start)
        return CallOutcome(result, worker_alive=not dead and stop is None, started_at=run_start)
    finally:
        os.close(out_r)
        os.close(err_r)


def request_body(code: str, stdin: str) -> int:
    """A memfd holding a call's code and stdin, read from the start by the worker.

    The request's message carries only this descriptor: under the ``local`` pool it passes through the zygote,
    every later worker is a fork of the zygote's memory, so the code and stdin must never be read there.
    """
    fd = os.memfd_create("rstar-request", os.MFD_CLOEXEC)
    try:
        view = memoryview(json.dumps({"code": code, "stdin": stdin}).encode())
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_report(fds: list[int]) -> dict[str, Any] | None:
    """A worker's report of a call (``{"status", "error"}``) from the file it attached (the ``local`` pool's
    workers report in a memfd, which the zygote passes on unread); None if there is none or it is not one.
    Closes ``fds``."""
    try:
        if len(fds) != 1 or not stat.S_ISREG(os.fstat(fds[0]).st_mode):
            return None  # a pipe or a device could block or never end: only a regular file is read
        data = os.pread(fds[0], MAX_REPLY_BYTES + 1, 0)
        report = json.loads(data) if len(data) <= MAX_REPLY_BYTES else None
    except (OSError, ValueError):
        return None
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
    if not isinstance(report, dict) or report.get("status") not in ("ok", "error"):
        return None
    return {"status": report["status"], "error": report.get("error")}


class _Clock:
    """A call's deadline: ``START_WAIT_S`` for a worker to take it, then ``timeout_s`` from that moment."""

    def __init__(self, started: float | None, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.started = started
        self.start_by = time.monotonic() + START_WAIT_S

    def begin(self) -> None:
        if self.started is None:
            self.started = time.monotonic()

    @property
    def deadline(self) -> float:
        return self.start_by if self.started is None else self.started + self.timeout_s


def _wait(
    worker: Worker, output: _Output, token: str, clock: _Clock, sent: bool
) -> tuple[dict[str, Any] | None, dict[str, Any] | None, bool, str | None]:
    """Until a result, the worker's death, or a reason to stop it: ``(reply, exit_message, dead, stop)``."""
    chan_fd = worker.chan.fileno()
    poller = select.poll()
    poller.register(chan_fd, select.POLLIN)
    for fd in output.open:
        poller.register(fd, select.POLLIN)
    while True:
        remaining = clock.deadline - time.monotonic()
        if remaining <= 0:
            return None, None, False, "timeout" if clock.started is not None else "no_worker"
        for fd, _events in poller.poll(remaining * 1000):
            if fd != chan_fd:
                output.read(fd)
                if fd not in output.open:
                    poller.unregister(fd)
                if output.over:
                    return None, None, False, "output_limit"
                continue
            try:
                worker.chan.settimeout(max(0.05, clock.deadline - time.monotonic()))
                received = _protocol.recv_message(worker.chan, MAX_REPLY_BYTES)
            except (TimeoutError, _protocol.ProtocolError):
                return None, None, False, "protocol"
            except OSError:
                received = None
            if received is None:
                return None, None, True, None
            message, fds = received
            op = message.get("op")
            if op in ("result", "exit") and fds:
                # The local pool: the worker's report rides in a file it attached, unread by the zygote.
                report, fds = read_report(fds), []
                if op == "exit":
                    message["result"] = report
                elif report is None:
                    return None, None, False, "protocol"
                else:
                    message.update(report)
            for extra in fds:
                os.close(extra)
            if op == "result" and sent and message.get("token") == token:
                return message, None, False, None
            if op == "exit":
                return None, message, True, None
            if op == "result":
                return None, None, False, "protocol"  # a result we did not ask for: forged by the cell
            worker.note(message)
            if worker.started:
                clock.begin()


def await_death(worker: Worker, deadline: float) -> tuple[dict[str, Any] | None, bool]:
    """After a kill: wait for the exit message or end of stream on the channel."""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None, False
        try:
            worker.chan.settimeout(remaining)
            received = _protocol.recv_message(worker.chan, MAX_REPLY_BYTES)
        except (TimeoutError, _protocol.ProtocolError, OSError):
            # Garbage the cell left on the channel: skip it by waiting for the end of stream instead.
            with contextlib.suppress(OSError):
                worker.chan.settimeout(max(0.0, deadline - time.monotonic()))
                while worker.chan.recv(_READ_CHUNK):
                    pass
                return None, True
            return None, False
        if received is None:
            return None, True
        message, fds = received
        for extra in fds:
            os.close(extra)
        if message.get("op") == "exit":
            return message, True


def _result(
    worker: Worker,
    output: _Output,
    out_r: int,
    err_r: int,
    reply: dict[str, Any] | None,
    exit_message: dict[str, Any] | None,
    dead: bool,
    stop: str | None,
    timeout_s: float,
    start: float,
) -> ExecResult:
    stdout, stderr = output.text(out_r), output.text(err_r)
    duration = time.monotonic() - start
    status: str
    error: str | None
    reason = (exit_message or {}).get("reason") if reply is None else None
    if reply is None and exit_message is not None and reason is None and worker.returncode(exit_message) == 0:
        reply = exit_message.get("result")  # a one-call worker that reported, then exited with all it started
    if stop == "timeout":
        status, error = "timeout", f"timed out after {timeout_s:g} s"
    elif stop == "no_worker":
        status, error = "crash", f"no sandbox worker took the call within {START_WAIT_S:g} s"
    elif stop == "output_limit" or (reply is not None and output.over):
        status, error = "output_limit", f"output exceeded {output.limit} bytes"
    elif stop == "protocol" or reason == "tamper":
        status, error = "crash", "the code tampered with the sandbox channel"
    elif reason == "cpu":
        status, error = "crash", "CPU time limit exceeded (counting every process the code started)"
    elif reason == "threads":
        status, error = "exception", THREADS_LEFT
        stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + THREADS_LEFT + "\n"
    elif isinstance(reply, dict) and reply.get("status") in ("ok", "error"):
        status = reply["status"]
        error = reply.get("error") if status == "error" else None
        error = str(error) if error is not None else ("error" if status == "error" else None)
    else:
        status, error = _death(worker, exit_message if dead else None)
    status = "exception" if status == "error" else status  # the worker's wire name -> the outcome name
    # No worker in time, or a worker gone with no exit status (its pool died under it): the system failed the call.
    system = stop == "no_worker" or (status == "crash" and error == POOL_DIED)
    return ExecResult(
        stdout=stdout,
        stderr=stderr,
        status=status,  # type: ignore[arg-type]
        message=error,
        duration_s=duration,
        system_failure=system,
    )


def _death(worker: Worker, exit_message: dict[str, Any] | None) -> tuple[str, str | None]:
    """Status and summary of a worker that died without a result."""
    if exit_message is not None and exit_message.get("error"):
        return "crash", str(exit_message["error"])
    code = worker.returncode(exit_message)
    if code is None:
        return "crash", POOL_DIED
    if code == 0:
        return "ok", None
    if code < 0:
        try:
            name = signal.Signals(-code).name
            what = signal.strsignal(-code) or name
        except ValueError:
            name, what = f"signal {-code}", f"signal {-code}"
        if -code == signal.SIGXCPU:
            return "crash", "CPU time limit exceeded"
        return "crash", f"the interpreter was killed by {name} ({what})"
    return "crash", f"the interpreter exited with status {code}"
