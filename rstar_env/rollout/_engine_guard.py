"""A guardian process that ends an in-process engine's child processes when this process dies, however it dies.

vLLM runs its engine core (``VLLM::EngineCore``) and its workers (``VLLM::Worker``) as separate processes. They are
shut down by ``AsyncLLM.shutdown`` or by vLLM's exit-time finalizers, neither of which runs when this process is
killed (SIGKILL, or a SIGTERM that nothing handles); they ignore a SIGTERM of their own and keep gigabytes of memory
alive, with nothing left to talk to. vLLM offers no hook to give them a parent-death signal, so a guardian does the
work instead: a small stdlib-only process that this process registers the engine's processes with, and that waits
for the end of its stdin. It gets that EOF when this process closes the pipe (``close``) or dies in any way (the
kernel closes its descriptors), then SIGKILLs every registered process that is still the same process (same start
time: a pid may be reused) together with its descendants, and exits. It ignores SIGINT, SIGTERM and SIGHUP: a
Ctrl-C or a group-wide SIGTERM must leave it alive to do its work.

Linux only (``/proc``); elsewhere :class:`EngineGuard` does nothing. Run as a script by path (``python -I``), it
imports no third-party package and not ``rstar_env``: the tree walk comes from the file behind
:mod:`rstar_env.proctree` (``rstar_env/sandbox/_proctree.py``), loaded by path; in this process, from
:mod:`rstar_env.proctree`.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

_PROCTREE_DIR = Path(__file__).resolve().parent.parent / "sandbox"


def start_time(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (field 22 of ``/proc/PID/stat``), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19])  # field 22 overall; the fields after the name start at field 3


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _is_engine_process(pid: int) -> bool | None:
    """A process vLLM started: its title (``VLLM::...``, set once it runs) or, before that, a multiprocessing spawn
    child (vLLM starts its engine core with ``spawn``). The resource tracker and anything else are left alone.

    None while it cannot be told yet: a child that has not finished ``execve`` shows an empty command line, or
    still ours (forked, not yet exec'd)."""
    cmdline = _cmdline(pid)
    if not cmdline or cmdline == _cmdline(os.getpid()):
        return None if start_time(pid) is not None else False
    return cmdline.startswith(b"VLLM::") or b"spawn_main" in cmdline


class EngineGuard:
    """The parent's handle on one guardian process (see the module doc).

    ``register(pids)`` hands processes to it; :meth:`watch_children` registers every engine process (and its
    descendants) this process starts while the block runs; :meth:`close` (idempotent) closes the pipe, so the
    guardian kills what is left of them and exits, and waits for it.
    """

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._registered: set[tuple[int, int]] = set()
        self._lock = threading.Lock()
        if not sys.platform.startswith("linux"):
            return
        self._proc = subprocess.Popen(
            [sys.executable, "-I", str(Path(__file__).resolve())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            close_fds=True,
        )

    @property
    def pid(self) -> int | None:
        """The guardian's pid (None off Linux)."""
        return None if self._proc is None else self._proc.pid

    def register(self, pids: list[int]) -> None:
        """Have the guardian kill ``pids`` (and their descendants at that time) when this process ends."""
        if self._proc is None or self._proc.stdin is None:
            return
        lines = []
        with self._lock:
            for pid in pids:
                started = start_time(pid)
                if started is None or (pid, started) in self._registered:
                    continue
                self._registered.add((pid, started))
                lines.append(f"{pid} {started}\n")
            if lines:
                with contextlib.suppress(OSError, ValueError):  # the guardian died: nothing more can be done here
                    self._proc.stdin.write("".join(lines).encode())
                    self._proc.stdin.flush()

    @contextlib.contextmanager
    def watch_children(self, every_s: float = 0.2) -> Iterator[None]:
        """Register the engine processes this process starts while the block runs, polling every ``every_s`` (an
        engine takes seconds to start; a kill in the meantime must find its processes registered already)."""
        if self._proc is None:
            yield
            return
        from rstar_env import proctree

        decided = set(proctree.children("self"))  # there before the block: not ours to guard

        def scan() -> bool:
            """Register new engine processes; False while some new child cannot be told yet."""
            engines, settled = [], True
            for pid in proctree.children("self"):
                if pid in decided:
                    continue
                verdict = _is_engine_process(pid)
                if verdict is None:
                    settled = False
                    continue
                decided.add(pid)
                if verdict:
                    engines.append(pid)
            self.register([p for root in engines for p in (root, *proctree.descendants(root))])
            return settled

        stop = threading.Event()

        def poll() -> None:
            while not stop.wait(every_s):
                scan()

        poller = threading.Thread(target=poll, name="engine-guard-watch", daemon=True)
        poller.start()
        try:
            yield
        finally:
            stop.set()
            poller.join()
            # A child started just before the block ended may still be inside execve: wait for it to show what
            # it is, briefly (an exec takes milliseconds; one stuck for seconds is not an engine starting).
            deadline = time.monotonic() + 5.0
            while not scan() and time.monotonic() < deadline:
                time.sleep(0.01)

    def close(self, timeout_s: float = 10.0) -> None:
        """Close the pipe: the guardian kills what is left of the registered processes and exits."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _guard() -> None:
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sys.path.insert(0, str(_PROCTREE_DIR))
    import _proctree

    registered: list[tuple[int, int]] = []
    for line in sys.stdin.buffer:  # ends at EOF: the parent closed the pipe or died
        with contextlib.suppress(ValueError):
            pid, started = (int(x) for x in line.split())
            registered.append((pid, started))
    for pid, started in registered:
        if start_time(pid) == started and _proctree.is_alive(pid):
            _proctree.kill_tree(pid)


if __name__ == "__main__":
    _guard()
