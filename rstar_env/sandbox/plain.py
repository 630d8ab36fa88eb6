"""``subprocess``: a fresh ``python`` interpreter per call (and one per stateful session).

The way most agentic-RL stacks run their Python tool, kept as the benchmark baseline and as a simple fallback
where the ``local`` pool cannot start. It shares everything but process creation with ``local``: the same
child-side runner (:mod:`._worker`: notebook-style echo, tracebacks, results over a private socket), the same
limits and privilege drop (:mod:`._limits`), the same caller-side call loop (:mod:`._client`: timeout, output
limit) and the same tree kill (:mod:`._proctree`).

What it lacks next to ``local``: no namespaces (code can reach the network and sees the host filesystem with
the worker's permissions), and if an interpreter dies on its own, daemons it started are re-parented to init
instead of to a zygote (they are still killed when the pool runs as root, through the worker's private uid).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import Any

from . import SandboxError, _base, _client, _isolation, _limits, _pool, _proctree, _spawn


class _UidRange:
    """Thread-safe private uids for workers (lowest free first)."""

    def __init__(self, base: int, count: int) -> None:
        self._base, self._count = base, count
        self._used: set[int] = set()
        self._lock = threading.Lock()

    def acquire(self) -> int:
        with self._lock:
            for offset in range(self._count):
                uid = self._base + offset
                if uid not in self._used:
                    self._used.add(uid)
                    return uid
        raise SandboxError("no free sandbox uid")

    def release(self, uid: int) -> None:
        with self._lock:
            self._used.discard(uid)


class SubprocessWorker(_client.Worker):
    """One interpreter started with ``subprocess.Popen``; the caller is its parent and reaps it."""

    def __init__(
        self, proc: subprocess.Popen[bytes], chan: socket.socket, workdir: str, uid: int | None, uids: _UidRange | None
    ) -> None:
        self.proc, self.chan, self.workdir, self.uid, self._uids = proc, chan, workdir, uid, uids
        self.started = False  # until the interpreter is up and says so: its start-up is not the call's time

    def kill(self) -> None:
        _proctree.kill_tree(self.proc.pid)
        if self.uid is not None:
            _proctree.kill_uid(self.uid)

    def returncode(self, exit_message: dict[str, Any] | None) -> int | None:
        try:
            return self.proc.wait(timeout=_client.DEATH_GRACE_S)
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        self.chan.close()  # a session worker exits at end of stream; a one-call worker is exiting already
        # Whatever its reply said, nothing of the worker's tree outlives it (a cell can forge a reply here).
        _proctree.kill_tree(self.proc.pid)
        try:
            code = self.proc.wait(timeout=_client.DEATH_GRACE_S)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        if self.uid is not None:
            if code != 0:
                _proctree.kill_uid(self.uid)  # it died abnormally: catch whatever escaped its tree
            if self._uids is not None:
                self._uids.release(self.uid)
        shutil.rmtree(self.workdir, ignore_errors=True)


class SubprocessSandbox(_base.ThreadedSandbox):
    """Fresh-interpreter sandbox. Takes the options of :class:`~rstar_env.sandbox.local.LocalSandbox`, so a
    config can switch backends; the pool's own (``preload``, ``warmup``, ``spares``, ``isolation``, ``tmp_mb``,
    ``start_timeout_s``) have no effect here, and ``network=False`` cannot be enforced (a warning says so)."""

    def __init__(
        self,
        *,
        max_concurrency: int | None = None,
        timeout_s: float = 4.0,
        memory_mb: int | None = 2048,
        max_output_bytes: int = 1 << 20,
        cpu_s: float | None = None,
        max_processes: int | None = 64,
        max_files: int | None = 256,
        max_file_mb: int | None = 64,
        env: Mapping[str, str] | None = None,
        python: str | None = None,
        network: bool | None = None,
        preload: Any = None,
        warmup: Any = None,
        spares: Any = None,
        isolation: Any = None,
        tmp_mb: Any = None,
        start_timeout_s: Any = None,
    ) -> None:
        super().__init__(
            max_concurrency=max_concurrency, timeout_s=timeout_s, max_output_bytes=max_output_bytes, cpu_s=cpu_s
        )
        if network is False:
            _isolation.warn_once("rstar_env subprocess sandbox: network=False is not enforced (no namespaces)")
        self.limits = _limits.Limits(
            memory_mb=memory_mb, max_processes=max_processes, max_files=max_files, max_file_mb=max_file_mb
        )
        self.env = _spawn.clean_env(env)
        self.python = python
        self._base_dir: str | None = None
        self._uids: _UidRange | None = None
        self._ids = itertools.count(1)
        self._start_lock = threading.Lock()

    def _start(self) -> None:
        with self._start_lock:
            if self._base_dir is not None:
                return
            base_dir = tempfile.mkdtemp(prefix="rstar-subprocess-")
            os.chmod(base_dir, 0o711)
            if _limits.can_drop_privileges():
                base = _pool.random_uid_base()
                if _probe_uid(self.python, base):
                    self._uids = _UidRange(base, _pool.UID_RANGE)
            self._base_dir = base_dir

    def _after_fork_in_child(self) -> None:
        # The folder and uids are the parent's (closing the copy must not remove them): the child makes its own.
        self._start_lock = threading.Lock()
        self._base_dir, self._uids = None, None
        super()._after_fork_in_child()

    def _spawn(self, *, session: bool) -> _client.Worker:
        self._start()
        assert self._base_dir is not None
        uid = self._uids.acquire() if self._uids is not None else None
        workdir = os.path.join(self._base_dir, f"w{next(self._ids)}-{os.urandom(6).hex()}")
        ours, theirs = socket.socketpair()
        config = {
            "parent": os.getpid(),
            "workdir": workdir,
            "env": self.env,
            "limits": self.limits.to_dict(),
            "uid": uid,
            "session": session,
        }
        argv = _spawn.python_argv("_worker", "subprocess_main", theirs.fileno(), config, self.python)
        try:
            proc = subprocess.Popen(
                argv,
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self.env,
                cwd=self._base_dir,
                start_new_session=True,
            )
        except OSError as exc:
            ours.close()
            if uid is not None and self._uids is not None:
                self._uids.release(uid)
            raise SandboxError(f"cannot start python: {exc}") from exc
        finally:
            theirs.close()
        return SubprocessWorker(proc, ours, workdir, uid, self._uids)

    def _shutdown(self) -> None:
        with self._start_lock:
            base_dir, self._base_dir = self._base_dir, None
        if base_dir is not None:
            shutil.rmtree(base_dir, ignore_errors=True)


def _probe_uid(python: str | None, uid: int) -> bool:
    """Can a fresh interpreter drop to ``uid`` and still import the standard library?"""
    code = (
        "import sys, types; pkg = types.ModuleType('_rstar_sandbox'); "
        f"pkg.__path__ = [{_spawn.PACKAGE_DIR!r}]; sys.modules['_rstar_sandbox'] = pkg\n"
        f"from _rstar_sandbox import _limits; _limits.drop_privileges({uid}, keep_read_search=True); "
        "import json, decimal"
    )
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run([python or sys.executable, "-c", code], capture_output=True, timeout=30)
        return done.returncode == 0
    return False
