"""The fork server: a single-threaded interpreter that pre-imports the math stack and forks the workers.

Started by :mod:`rstar_env.sandbox._pool` as a clean interpreter (never forked from the caller, whose threads
would make ``fork`` unsafe), usually inside bubblewrap or ``unshare`` where it is PID 1 of its own PID namespace:
then user code cannot signal it, and if it dies the kernel kills every process of the pool.

The zygote keeps ``spares`` workers forked and prepared ahead of demand (own directory, limits, uid). Callers
do not go through the zygote to get one: they write ``{"call": id, "session": bool}`` with a fresh channel socket
attached to the shared *dispatch* socket (``SOCK_SEQPACKET``), and whichever spare is idle receives it. So a
call's latency has no ``fork`` in it, and a busy zygote never delays a call. The worker then

* closes the dispatch socket (user code must not steal other calls),
* tells the zygote ``{"op": "assigned", "call"}`` over its private link, attaching a copy of the channel,
* writes ``{"op": "started"}`` on the channel and serves ``exec`` requests on it (see :mod:`._worker`).

The zygote replaces the spare, and when the worker dies it kills any stray it left, removes its directory,
writes ``{"op": "exit", "status"}`` (a ``waitpid`` status) on its copy of the channel and closes it.

Control socket (caller -> zygote), framed by :mod:`._protocol`: ``{"op": "kill", "call": id}`` kills that
worker's whole process tree now; end of stream kills everything and exits. The zygote writes one message on it,
``{"op": "ready", ...}``, when its imports are done.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import heapq
import importlib
import os
import secrets
import selectors
import shutil
import signal
import socket
import stat
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, NoReturn

from . import _limits, _proctree, _protocol, _worker

SPARE_RETRY_S = 1.0
"""After a spare died before being used, wait this long before forking another (it would likely die too)."""


@dataclass
class _Worker:
    workdir: str
    uid: int | None
    link: socket.socket | None = None
    """Zygote's end of the worker's private link while it is a spare; None once it is assigned."""
    call: int | None = None
    chan: int | None = None
    """Zygote's copy of the caller's channel (for the exit message); None while a spare."""


class _Uids:
    """Private uids for workers (lowest free first, so the range stays small)."""

    def __init__(self, base: int, count: int) -> None:
        self._base, self._count, self._next = base, count, 0
        self._free: list[int] = []

    def acquire(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        if self._next >= self._count:
            raise OSError("no free sandbox uid")
        self._next += 1
        return self._base + self._next - 1

    def release(self, uid: int) -> None:
        heapq.heappush(self._free, uid)

    def __contains__(self, uid: int) -> bool:
        return self._base <= uid < self._base + self._count


class Zygote:
    """One fork server. ``config`` comes from the pool: preload, warmup, limits, env, base_dir, uid_base, spares."""

    def __init__(self, control: socket.socket, config: dict[str, Any]) -> None:
        self.control = control
        self.dispatch_fd = int(config["dispatch_fd"])
        self.pid = os.getpid()
        self.env: dict[str, str] = dict(config["env"])
        self.limits = _limits.Limits(**config["limits"])
        self.base_dir: str = config["base_dir"]
        self.workers: dict[int, _Worker] = {}
        self.by_call: dict[int, int] = {}
        self.idle: set[int] = set()
        self.spare_target = max(1, int(config.get("spares", 2)))
        self.refill_after = 0.0
        self.pending_kills: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.uids: _Uids | None = None
        self.shared_dirs: list[str] = list(config.get("shared_dirs", ["/dev/shm", "/tmp", "/var/tmp"]))
        self.shared_dir_mtimes: dict[str, int] = {}
        self.selector = selectors.DefaultSelector()
        self.notes: list[str] = []
        if self.pid != 1:  # PID 1 of a namespace adopts every orphan already
            _proctree.become_subreaper()
        self.loaded, self.skipped = _preload(config.get("preload", ()))
        if config.get("warmup"):
            try:
                exec(compile(config["warmup"], "<warmup>", "exec"), {"__name__": "__warmup__"})
            except Exception as exc:
                self.notes.append(f"warmup failed: {exc!r}")
        uid_base = config.get("uid_base")
        if uid_base is not None:
            reason = _probe_privilege_drop(int(uid_base))
            if reason is None:
                self.uids = _Uids(int(uid_base), int(config.get("uid_count", 65536)))
            else:
                self.notes.append(f"cannot give workers private uids: {reason}")
        if threading.active_count() > 1:
            self.notes.append("preloaded modules started threads; fork may be unsafe")
        # Everything imported so far is shared copy-on-write with the workers: keep the collector off it.
        gc.collect()
        gc.freeze()

    # ------------------------------------------------------------------------------------------------ loop

    def run(self) -> NoReturn:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.selector.register(self.control, selectors.EVENT_READ, "control")
        self.selector.register(wake_r, selectors.EVENT_READ, "wake")
        ready = {
            "op": "ready",
            "pid": self.pid,
            "loaded": self.loaded,
            "skipped": self.skipped,
            "private_uids": self.uids is not None,
            "notes": self.notes,
        }
        _protocol.send_message(self.control, ready)
        while True:
            timeout = None
            if len(self.idle) < self.spare_target:
                # Refill only when nothing else is waiting: kills and reaping come first.
                timeout = max(0.0, self.refill_after - time.monotonic())
            events = self.selector.select(timeout)
            if not events and timeout is not None:
                self.fork_spare()
            for key, _ in events:
                if key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 512):
                            pass
                    self.reap()
                elif key.data == "control":
                    self.handle_control()
                else:
                    self.take_assignment(key.data)

    def handle_control(self) -> None:
        try:
            received = _protocol.recv_message(self.control)
        except (OSError, _protocol.ProtocolError):
            received = None
        if received is None:
            self.shutdown()
        request, fds = received
        for fd in fds:
            os.close(fd)
        if request.get("op") == "kill":
            self.kill(int(request["call"]))

    def kill(self, call: int) -> None:
        if call not in self.by_call:
            # The worker may have taken the call without our having read its note yet.
            for pid in [p for p, w in self.workers.items() if w.link is not None]:
                self.take_assignment(pid)
        pid = self.by_call.get(call)
        if pid is not None:
            _proctree.kill_tree(pid)
            return
        # Not taken yet (still queued on the dispatch socket): kill it the moment a worker takes it.
        self.pending_kills[call] = None
        while len(self.pending_kills) > 4096:
            self.pending_kills.popitem(last=False)

    # ------------------------------------------------------------------------------------------------ spares

    def fork_spare(self) -> None:
        """Fork a prepared worker that waits on the dispatch socket for a call."""
        workdir = os.path.join(self.base_dir, f"w{secrets.token_hex(8)}")
        link, child_link = socket.socketpair()
        uid = None
        try:
            uid = self.uids.acquire() if self.uids is not None else None
            pid = os.fork()
        except OSError:
            link.close()
            child_link.close()
            if uid is not None and self.uids is not None:
                self.uids.release(uid)
            self.refill_after = time.monotonic() + SPARE_RETRY_S
            return
        if pid == 0:
            self._become_worker(child_link.fileno(), workdir, uid)
        child_link.close()
        link.setblocking(False)  # our own end only: the worker's end is a separate socket
        self.workers[pid] = _Worker(workdir, uid, link=link)
        self.idle.add(pid)
        self.selector.register(link, selectors.EVENT_READ, pid)

    def take_assignment(self, pid: int) -> None:
        """Read a spare's note that it took a call, with its copy of the caller's channel."""
        worker = self.workers.get(pid)
        if worker is None or worker.link is None:
            return
        try:
            received = _protocol.recv_message(worker.link)
        except BlockingIOError:
            return
        except (OSError, _protocol.ProtocolError):
            received = None
        self.selector.unregister(worker.link)
        worker.link.close()
        worker.link = None
        self.idle.discard(pid)
        if received is None:
            return  # died before taking a call
        message, fds = received
        if message.get("op") != "assigned" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            return
        worker.call, worker.chan = int(message["call"]), fds[0]
        self.by_call[worker.call] = pid
        if worker.call in self.pending_kills:
            del self.pending_kills[worker.call]
            _proctree.kill_tree(pid)

    def _become_worker(self, link: int, workdir: str, uid: int | None) -> NoReturn:
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            # Drop every descriptor of the zygote (control socket, other workers' links and channels).
            _close_all_but({link, self.dispatch_fd})
            _worker.prepare(workdir, self.env, self.limits, uid)
            _proctree.die_with_parent(self.pid)  # after prepare: a uid change clears the death signal
            with socket.socket(fileno=self.dispatch_fd) as dispatch:
                received = _protocol.recv_datagram(dispatch)
            if received is None or len(received[1]) != 1:
                os._exit(0)  # every caller is gone: the pool is shutting down
            request, (chan,) = received
            with socket.socket(fileno=link) as sock:
                _protocol.send_message(sock, {"op": "assigned", "call": request.get("call")}, [chan])
            with socket.socket(fileno=os.dup(chan)) as sock:
                _protocol.send_message(sock, {"op": "started", "pid": os.getpid()})
            _worker.serve(chan, once=not request.get("session"))
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
            os._exit(70)

    # ------------------------------------------------------------------------------------------------ reap

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            worker = self.workers.get(pid)
            if worker is not None:
                self._finish(pid, worker, status)

    def _finish(self, pid: int, worker: _Worker, status: int) -> None:
        clean_exit = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        if worker.link is not None:
            self.take_assignment(pid)  # it may have taken a call just before dying
            if worker.call is None and not clean_exit:
                self.refill_after = time.monotonic() + SPARE_RETRY_S  # a spare that dies unasked would again
        del self.workers[pid]
        self.idle.discard(pid)
        if worker.call is not None:
            self.by_call.pop(worker.call, None)
        self.sweep_strays()
        if worker.uid is not None and not clean_exit:
            _proctree.kill_uid(worker.uid)
        _remove_tree(worker.workdir)
        if worker.uid is not None:
            self.tidy_shared_dirs(worker.uid)
        if worker.uid is not None and self.uids is not None:
            self.uids.release(worker.uid)
        if worker.chan is not None:
            _send_nowait(worker.chan, {"op": "exit", "status": status})
            os.close(worker.chan)

    def tidy_shared_dirs(self, uid: int) -> None:
        """Delete what ``uid`` left in world-writable directories (the uid is private: it is all the worker's).

        A directory whose modification time has not changed since the last look has nothing new to delete.
        """
        for directory in self.shared_dirs:
            try:
                mtime = os.stat(directory).st_mtime_ns
            except OSError:
                continue
            if self.shared_dir_mtimes.get(directory) == mtime:
                continue
            others_left = _remove_owned_by(uid, directory, self.uids)
            # Remember the state only when no other worker has files there, or we would skip them later.
            self.shared_dir_mtimes[directory] = mtime if not others_left else -1

    def sweep_strays(self) -> None:
        """Kill every child we did not fork: orphans re-parented to us when a worker died."""
        for _ in range(100):
            strays = [p for p in _proctree.children("self") if p not in self.workers and _proctree.is_alive(p)]
            if not strays:
                return
            for pid in strays:
                _proctree.kill_tree(pid)

    def shutdown(self) -> NoReturn:
        for pid in list(self.workers):
            _proctree.kill_tree(pid)
        self.sweep_strays()
        for worker in self.workers.values():
            _remove_tree(worker.workdir)
        os._exit(0)


def _send_nowait(fd: int, message: dict[str, Any]) -> None:
    # Never block the pool on one channel: user code holds the other end and could stop reading it.
    sock = socket.socket(fileno=fd)
    try:
        _protocol.send_message(sock, message, nowait=True)
    except OSError:
        pass
    finally:
        sock.detach()


def _preload(modules: list[str] | tuple[str, ...]) -> tuple[list[str], list[str]]:
    loaded, skipped = [], []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # an optional module that is missing or broken is not fatal
            skipped.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            loaded.append(name)
    return loaded, skipped


def _close_all_but(keep: set[int]) -> None:
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _probe_privilege_drop(uid: int) -> str | None:
    """Try the privilege drop in a throwaway child; None if it works, else why not."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            _limits.drop_privileges(uid)
            os.listdir(os.path.dirname(os.__file__))  # can the worker still import the standard library?
            os.write(w, b"ok")
        except BaseException as exc:
            with contextlib.suppress(Exception):
                os.write(w, repr(exc).encode()[:500])
        os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        answer = f.read().decode(errors="replace")
    os.waitpid(pid, 0)
    return None if answer == "ok" else answer or "probe died"


def _remove_owned_by(uid: int, directory: str, pool_uids: _Uids | None) -> bool:
    """Delete the entries of ``directory`` owned by ``uid``; True if entries of other pool uids remain."""
    others = False
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return False
    for entry in entries:
        with contextlib.suppress(OSError):
            owner = entry.stat(follow_symlinks=False).st_uid
            if owner == uid:
                if entry.is_dir(follow_symlinks=False):
                    _remove_tree(entry.path)
                else:
                    os.unlink(entry.path)
            elif pool_uids is not None and owner in pool_uids:
                others = True
    return others


def _remove_tree(path: str) -> None:
    def make_writable(_func: Any, failed: str, _exc: Any) -> None:
        # User code may leave read-only directories behind; unlock the parent and retry once.
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(failed), stat.S_IRWXU)
            if os.path.isdir(failed) and not os.path.islink(failed):
                os.chmod(failed, stat.S_IRWXU)
                shutil.rmtree(failed, ignore_errors=True)
            else:
                os.unlink(failed)

    if os.path.lexists(path):
        shutil.rmtree(path, onerror=make_writable)


def main(control_fd: int, config: dict[str, Any]) -> NoReturn:
    """Entry point (see :func:`._spawn.python_argv`)."""
    control = socket.socket(fileno=control_fd)
    Zygote(control, config).run()
