"""The fork server and supervisor: a single-threaded interpreter that pre-imports the math stack, forks the
workers, and alone reports the end of every call.

Started by :mod:`rstar_env.sandbox._pool` as a clean interpreter (never forked from the caller, whose threads
would make ``fork`` unsafe), usually inside bubblewrap or ``unshare`` where it is PID 1 of its own PID namespace:
then user code cannot signal it, and if it dies the kernel kills every process of the pool.

The zygote keeps ``spares`` workers forked and prepared ahead of demand (each PID 1 of its own PID namespace, own
IPC namespace and ``/tmp``, limits, uid, no capabilities), and forks more while calls wait for one. Callers write
``{"call": id, "session": bool}`` with a fresh channel socket attached to the shared *dispatch* socket
(``SOCK_SEQPACKET``); whichever spare is idle receives it, hands the channel to the zygote over its private *link*
(``{"op": "assigned", "call"}``) and keeps no copy of it. From then on the channel joins the caller and the zygote only:

* caller -> zygote: ``{"op": "exec", "token", "cpu_s"}`` with a memfd holding the code and stdin and the stdout
  and stderr pipes. The zygote forwards the descriptors on the link and continues the worker if it is stopped.
* zygote -> caller: ``{"op": "started"}`` when a worker took the call; ``{"op": "result", "token"}`` with the
  worker's report attached when a call is over; ``{"op": "exit", "status", "token", "reason"}`` when the worker is
  gone (its report attached, if it made one the zygote had not passed on; ``reason``: why the zygote ended it).

Nothing a call sends or returns is ever read here: every later spare is a fork of this process's memory, and freed
buffers would carry one episode's code, stdin or error message into the next. The caller writes the code and stdin
into a memfd and the worker reads it; the worker writes its report (``{"status", "error"}``) into a memfd of its
own and the caller reads it; output goes on pipes between the two. The zygote passes the descriptors on.

The worker runs the cell, kills what it started, reports ``{"op": "done"}`` (with its report's memfd) on the link
and stops itself with SIGSTOP. The zygote takes the report as the call's end only when the worker is stopped with no
process left below it (it kills any) and, in a session, one thread; then it replies, and kills a one-call worker.
PID 1 of its own PID namespace cannot stop itself (the kernel drops the signal): on its report the zygote stops it
(a session), or replies and kills it at once (a one-call worker: whatever it might start in between dies with its
namespace). It may also ask for the default action of a signal the kernel drops for it (``{"op": "signal",
"signal"}``, see :mod:`._pidns`): the zygote stops it, or kills it and reports it killed by that signal. Code that
writes a fake report and goes on running gains nothing: the call ends at its deadline, and every process it started
dies with it. A second report, an oversized or malformed one, a stopped worker that is running again, or threads
still alive in a stopped session end the worker (``reason``). While a call runs, the zygote also adds up the CPU
time of the worker's whole process tree and ends it past the call's ``cpu_s`` (RLIMIT_CPU counts each process on its
own, and each child of a fork starts from zero).

Control socket (caller -> zygote), framed by :mod:`._protocol`: first the zygote's configuration (see
:class:`Zygote`), then ``{"op": "kill", "call": id}`` kills that worker's whole process tree now; end of stream
kills everything and exits. The zygote writes one message on it, ``{"op": "ready", ...}``, when its imports are
done.
"""

from __future__ import annotations

import collections
import contextlib
import gc
import heapq
import importlib
import os
import secrets
import select
import selectors
import shutil
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any, NoReturn

from . import _cgroup, _hugepages, _limits, _pidns, _proctree, _procview, _protocol, _seccomp, _sysinfo, _worker

SPARE_RETRY_S = 1.0
"""After a spare died before being used, wait this long before forking another (it would likely die too)."""
CPU_CHECK_S = 0.1
"""How often the CPU time of running calls' process trees is added up (only for calls running this long)."""
MAX_REQUEST_BYTES = 4096
"""Largest request a caller may send (its code and stdin travel in a memfd, not in the message)."""
MAX_REPORT_BYTES = 4096
"""Largest message a worker may write on its link (its report of a call travels in a memfd)."""
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
_NO_FREEZER = (
    ": a session stopped between calls that a timer or signal of its own resumes is ended (its state is lost); "
    "mount the cgroup v1 freezer controller, or use cgroup v2"
)
_NO_PROC_VIEW = (
    ": sandboxed code reads the host's counters in /proc (meminfo, stat, loadavg, vmstat, pressure), where "
    "concurrent episodes' allocations, threads and forks show"
)
_NO_SYSINFO = (
    ": sandboxed code sees the host's load, free memory and process count through it (os.sysconf, psutil), where "
    "concurrent episodes' allocations and forks show; seccomp user notification needs Linux 5.0"
)
_NO_CGROUP_NAMESPACE = ": /proc/self/cgroup names the pool's cgroup path on the host, with the pool creator's pid"
_NO_CGROUP = (
    ": memory_mb bounds each process's address space, not the worker's tree (memfds, shared memory and its /tmp "
    "are not counted), processes are bounded per uid, and a child made with CLONE_PARENT leaves the worker's tree"
)


@dataclass
class _Worker:
    workdir: str
    cgroup: str
    """Name of its cgroup below the pool's (when the pool has cgroups)."""
    uid: int | None
    link: socket.socket | None
    """Zygote's end of the worker's private link (``SOCK_SEQPACKET``); None once the worker closed it."""
    call: int | None = None
    chan: socket.socket | None = None
    """The caller's channel, handed over by the worker when it took a call; None while a spare."""
    session: bool = False
    token: Any = None
    running: bool = False
    """A request was forwarded and its end not reported yet."""
    reported: bool = False
    """The worker reported the current call's end."""
    report_fd: int | None = None
    """The memfd holding its report, for the caller (never read here); None once passed on."""
    stopped: bool = False
    frozen: bool = False
    """A session between calls, its cgroup frozen: nothing of it runs, whatever signal it gets."""
    reason: str | None = None
    """Why the zygote ended the worker: ``tamper``, ``threads``, ``cpu`` or ``continued``."""
    cpu_s: float = 0.0
    cpu_base: float = 0.0
    since: float = 0.0
    finished: bool = False
    """Its call ended normally (reported, stopped, nothing left below it); killed by us only to free it."""
    stops_asked: int = 0
    """Stops it asked for (see :meth:`Zygote.deliver_signal`) and that we have not seen yet."""
    signal: int | None = None
    listener: int | None = None
    """Its syscall filter's listener: the zygote answers its ``sysinfo`` calls (see :mod:`._sysinfo`)."""
    """Killed at its own request, for a signal whose default action the kernel would not give PID 1 of its
    namespace (see :mod:`._pidns`): reported as killed by this signal."""


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
        if not os.path.isdir(self.base_dir):  # under bubblewrap: in the pool's own /tmp (no host folder is bound)
            with contextlib.suppress(OSError):
                os.makedirs(self.base_dir)
                os.chmod(self.base_dir, 0o711)  # workers may enter their own folder (random name), not list others
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
        self.expose_paths: list[str] = []
        if config.get("expose_paths") and config.get("expose_in") == "zygote":
            try:
                _limits.expose_interpreter(config["expose_paths"])
            except OSError as exc:
                self.notes.append(f"cannot hide private directories around the interpreter: {exc}")
        elif config.get("expose_paths"):
            self.expose_paths = list(config["expose_paths"])  # done by each worker, in its own mount namespace
        self.loaded, self.skipped = _preload(config.get("preload", ()))
        if config.get("warmup"):
            try:
                exec(compile(config["warmup"], "<warmup>", "exec"), {"__name__": "__warmup__"})
            except Exception as exc:
                self.notes.append(f"warmup failed: {exc!r}")
        self.uid_count = int(config.get("uid_count", 65536))
        self.network = bool(config.get("network", True))
        self.tmp_binds: list[str] = list(config.get("tmp_binds", []))
        self.max_ptys: int | None = _limits.MAX_PTYS
        self.cgroups: _cgroup.WorkerCgroups | None = None
        self.doomed_cgroups: set[str] = set()
        """Cgroups of dead workers not removed yet (a process in them was still exiting)."""
        self.free_cgroups: list[str] = []
        """Empty cgroups of dead workers, kept for the next spares (creating and removing one costs more)."""
        if config.get("cgroup"):
            self.cgroups = _cgroup.WorkerCgroups(config["cgroup"], self.limits.memory_mb, self.limits.max_processes)
            probe_name = f"probe{secrets.token_hex(4)}"
            error = _probe(lambda: self.cgroups.enter(probe_name))  # type: ignore[union-attr]
            if error is None:
                try:
                    self.cgroups.freeze(probe_name)
                    self.cgroups.thaw(probe_name)
                except OSError as exc:
                    self.cgroups.freezer_fd = None
                    self.notes.append(f"no cgroup freezer ({exc}){_NO_FREEZER}")
            self.cgroups.remove(probe_name)
            if error is not None:
                self.notes.append(f"no cgroup per worker ({error}){_NO_CGROUP}")
                self.cgroups = None
        elif config.get("cgroup_missing"):
            self.notes.append(f"no cgroup per worker ({config['cgroup_missing']}){_NO_CGROUP}")
        self.syscall_filter: Any = None
        try:
            self.syscall_filter = _seccomp.build()
            if self.syscall_filter.notifies and (error := _probe(self.syscall_filter.load)) is not None:
                self.notes.append(f"sysinfo(2) answers with the host's load and free memory ({error}){_NO_SYSINFO}")
                self.syscall_filter = _seccomp.build(answer_sysinfo=False)
        except Exception as exc:
            self.notes.append(_seccomp.describe_missing(exc))
        self.sysinfo: _sysinfo.Supervisor | None = None
        """Answers the workers' ``sysinfo`` calls, once the worker's view is known (see :meth:`run`)."""
        self.pid_ns: int | None = None
        """Our own PID namespace (a descriptor) when each worker is PID 1 of one of its own (see :mod:`._pidns`)."""
        if config.get("pid_namespace", True):
            self.pid_ns = self._probe_pid_namespace()
        self.cgroup_namespace = False
        """Each worker makes a cgroup namespace of its own (see :func:`._cgroup.unshare_namespace`)."""
        self.proc_files: dict[str, bytes] | None = None
        """The worker's own copies of the host's counters, bound over them in its /proc (see :mod:`._procview`)."""
        self.pidfd: int | None = None
        """A pidfd of this process, for a new worker to tell whether we died before it asked to die with us."""
        with contextlib.suppress(OSError, AttributeError):
            self.pidfd = os.pidfd_open(self.pid)
        self.private_mounts, self.keep_read_search = self._probe_setup(config.get("uid_base"))
        if self.private_mounts:
            self.shared_dirs = []  # every worker has its own /tmp and /dev/shm: nothing is left in shared ones
        if threading.active_count() > 1:
            self.notes.append("preloaded modules started threads; fork may be unsafe")
        # Everything imported so far is shared copy-on-write with the workers: keep the collector off it.
        gc.collect()
        gc.freeze()
        # Each fork then copies a few dozen huge-page entries instead of ~13,000 small ones (see _hugepages).
        self.huge_pages_mb = 0
        if config.get("huge_page_bytes"):
            self.huge_pages_mb = _hugepages.collapse_heap(int(config["huge_page_bytes"])) >> 20

    def _probe_pid_namespace(self) -> int | None:
        """Our own PID namespace's descriptor if a worker can be PID 1 of a new one, else None (noted)."""

        def in_a_namespace_of_its_own() -> None:
            if os.getpid() != 1:
                raise OSError(f"the child is pid {os.getpid()}, not PID 1 of a namespace of its own")

        try:
            own = _pidns.own_namespace()
        except OSError as exc:
            error: str | None = repr(exc)
        else:
            error = _probe(in_a_namespace_of_its_own, own)
            if error is None:
                return own
            os.close(own)
        self.notes.append(
            f"no PID namespace per worker ({error}): concurrent calls can tell which pids are in use "
            "(kill(pid, 0), pidfd_open, /proc/sys/kernel/ns_last_pid), a channel between episodes"
        )
        return None

    def _probe(self, setup: Any) -> str | None:
        """:func:`_probe` in a child set up as a worker would be (PID 1 of a namespace of its own, if they are)."""
        return _probe(setup, self.pid_ns)

    def _probe_setup(self, uid_base: int | None) -> tuple[bool, bool]:
        """Find the strongest worker setup that works here, in throwaway children; note what is missing."""

        def namespaces(tmp_mb: int | None = None) -> None:
            _limits.private_namespaces(
                self.limits.tmpfs_mb if tmp_mb is None else tmp_mb,
                network=self.network,
                tmp_binds=self.tmp_binds,
                max_ptys=self.max_ptys,
            )

        ns_error = self._probe(namespaces)
        if ns_error is not None:
            pts_error, self.max_ptys = ns_error, None
            ns_error = self._probe(namespaces)
            if ns_error is None:
                self.notes.append(
                    f"no /dev/pts per worker ({pts_error}): concurrent calls see each other's pseudo-terminals"
                )
            else:
                self.max_ptys = _limits.MAX_PTYS
        if ns_error is not None and not self.network:
            net_error, self.network = ns_error, True
            ns_error = self._probe(namespaces)
            if ns_error is None:
                self.notes.append(
                    f"no network namespace per worker ({net_error}): concurrent calls share loopback and abstract "
                    "sockets, so episodes can talk to each other"
                )
        private_mounts = ns_error is None
        if private_mounts and self.expose_paths:
            error = self._probe(lambda: (namespaces(1), _limits.expose_interpreter(self.expose_paths)))
            if error is not None:
                self.notes.append(f"cannot hide private directories around the interpreter: {error}")
                self.expose_paths = []
        else:
            self.expose_paths = []
        if not private_mounts:
            self.notes.append(f"no private /tmp, /dev/shm and IPC namespace per worker ({ns_error})")
        self._probe_views(namespaces if private_mounts else None)
        uid = int(uid_base) if uid_base is not None else None
        if uid is None and not private_mounts:
            if self.syscall_filter is not None:
                error = self._probe(lambda: (self.syscall_filter.load(), os.listdir(os.path.dirname(os.__file__))))
                if error is not None:
                    self.notes.append(_seccomp.describe_missing(RuntimeError(error)))
                    self.syscall_filter = None
            return False, False
        errors = []
        for keep in (False, True):

            def setup(keep: bool = keep) -> None:
                if self.cgroup_namespace:
                    _cgroup.unshare_namespace()
                if private_mounts:
                    namespaces()
                    if self.proc_files:
                        _procview.install(self.proc_files)
                    if self.expose_paths:
                        _limits.expose_interpreter(self.expose_paths)
                _limits.drop_privileges(uid, keep_read_search=keep)
                if self.syscall_filter is not None:
                    self.syscall_filter.load()
                os.listdir(os.path.dirname(os.__file__))  # can the worker still import the standard library?
                for name in ("numpy", "sympy"):
                    if name in self.loaded:
                        os.listdir(os.path.dirname(importlib.import_module(name).__file__ or "."))

            error = self._probe(setup)
            if error is None:
                if uid is not None:
                    self.uids = _Uids(uid, self.uid_count)
                if keep:
                    self.notes.append(
                        f"workers keep CAP_DAC_READ_SEARCH, so sandboxed code can read every host file "
                        f"(/etc/shadow included): the interpreter lives where other users cannot read "
                        f"({os.path.dirname(os.__file__)}); install bubblewrap, or use an interpreter that "
                        f"every user can read ({errors[0]})"
                    )
                return private_mounts, keep
            errors.append(error)
        self.notes.append(f"cannot give workers private uids or drop their capabilities: {errors[-1]}")
        return private_mounts, False

    def _probe_views(self, namespaces: Any) -> None:
        """Whether workers can have a cgroup namespace and their own copies of the host's counters (given their own
        mount namespace: ``namespaces``, the call that makes it); noted where not."""
        if self.cgroups is not None:
            error = self._probe(_cgroup.unshare_namespace)
            self.cgroup_namespace = error is None
            if error is not None:
                self.notes.append(f"no cgroup namespace per worker ({error}){_NO_CGROUP_NAMESPACE}")
        if namespaces is None:
            self.notes.append(
                f"no worker's own view of the host's counters (no mount namespace per worker){_NO_PROC_VIEW}"
            )
            return
        try:
            files = _procview.render(self.limits.memory_mb)
        except OSError as exc:
            error = repr(exc)
        else:
            error = self._probe(lambda: (namespaces(1), _procview.install(files)))
        if error is None:
            self.proc_files = files
        else:
            self.notes.append(f"no worker's own view of the host's counters ({error}){_NO_PROC_VIEW}")

    # ------------------------------------------------------------------------------------------------ loop

    def run(self) -> NoReturn:
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        self.selector.register(self.control, selectors.EVENT_READ, ("control", 0))
        self.selector.register(wake_r, selectors.EVENT_READ, ("wake", 0))
        if self.syscall_filter is not None and self.syscall_filter.notifies:
            files = self.proc_files
            if files is None:
                with contextlib.suppress(OSError):
                    files = _procview.render(self.limits.memory_mb)
            memory = (self.limits.memory_mb or 0) << 20
            self.sysinfo = _sysinfo.Supervisor(_sysinfo.answer(files or {}, memory))
        ready = {
            "op": "ready",
            "pid": self.pid,
            "loaded": self.loaded,
            "skipped": self.skipped,
            "private_uids": self.uids is not None,
            "private_mounts": self.private_mounts,
            "keep_read_search": self.keep_read_search,
            "cgroups": self.cgroups is not None,
            "syscall_filter": self.syscall_filter is not None,
            "private_network": self.private_mounts and not self.network,
            "huge_pages_mb": self.huge_pages_mb,
            "pid_namespace": self.pid_ns is not None,
            "cgroup_namespace": self.cgroup_namespace,
            "proc_view": self.proc_files is not None,
            "notes": self.notes,
        }
        _protocol.send_message(self.control, ready)
        next_cpu_check = 0.0
        while True:
            now = time.monotonic()
            timeout = None
            if len(self.idle) < self.spare_target:
                timeout = max(0.0, self.refill_after - now)
            if any(w.running and not w.stopped for w in self.workers.values()):
                wait = max(0.0, next_cpu_check - now)
                timeout = wait if timeout is None else min(timeout, wait)
            for key, _ in self.selector.select(timeout):
                kind, pid = key.data
                if kind == "wake":
                    with contextlib.suppress(BlockingIOError):
                        while os.read(wake_r, 512):
                            pass
                    self.reap()
                elif kind == "control":
                    self.handle_control()
                elif kind == "link":
                    self.handle_link(pid)
                elif kind == "chan":
                    self.handle_chan(pid)
                elif kind == "sysinfo":
                    self.answer_sysinfo(pid)
            now = time.monotonic()
            if now >= next_cpu_check:
                self.check_cpu(now)
                next_cpu_check = now + CPU_CHECK_S
            # One spare per turn: kills, reports and requests are never kept waiting behind a burst of forks.
            if len(self.idle) < self.spare_target and now >= self.refill_after:
                self.fork_spare()

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
            for pid in [p for p, w in self.workers.items() if w.call is None and w.link is not None]:
                self.handle_link(pid)
        pid = self.by_call.get(call)
        if pid is not None:
            self.kill_worker(pid)
            return
        # Not taken yet (still queued on the dispatch socket): kill it the moment a worker takes it.
        self.pending_kills[call] = None
        while len(self.pending_kills) > 4096:
            self.pending_kills.popitem(last=False)

    def end(self, pid: int, reason: str) -> None:
        """End a worker for ``reason`` (told to its caller when it is reaped)."""
        worker = self.workers.get(pid)
        if worker is not None and worker.reason is None:
            worker.reason = reason
        self.kill_worker(pid)

    def kill_worker(self, pid: int) -> None:
        """Kill the worker's process tree and everything else in its cgroup (``CLONE_PARENT`` children, whose
        parent is the zygote, and anything that left the tree)."""
        worker = self.workers.get(pid)
        if worker is not None and worker.frozen:
            # A frozen process dies only once thawed; killed first, it runs nothing of its own on waking.
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            self.thaw(worker)
        _proctree.kill_tree(pid)
        if worker is not None and self.cgroups is not None:
            self.cgroups.kill(worker.cgroup)

    def thaw(self, worker: _Worker) -> None:
        if self.cgroups is not None:
            with contextlib.suppress(OSError):
                self.cgroups.thaw(worker.cgroup)
        worker.frozen = False

    # ------------------------------------------------------------------------------------------------ spares

    def fork_spare(self) -> None:
        """Fork a prepared worker that waits on the dispatch socket for a call."""
        name = f"w{secrets.token_hex(8)}"
        workdir = os.path.join("/tmp" if self.private_mounts else self.base_dir, name)
        # An empty cgroup of a dead worker, limits already set: entering it is one write per hierarchy.
        cgroup = self.free_cgroups.pop() if self.free_cgroups else None
        link, child_link = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        uid = None
        try:
            uid = self.uids.acquire() if self.uids is not None else None
            # A namespace per spare costs two system calls here, and no process: the worker is its PID 1.
            pid = os.fork() if self.pid_ns is None else _pidns.fork_as_init(self.pid_ns)
        except OSError:
            if cgroup is not None:
                self.free_cgroups.append(cgroup)
            link.close()
            child_link.close()
            if uid is not None and self.uids is not None:
                self.uids.release(uid)
            self.refill_after = time.monotonic() + SPARE_RETRY_S
            return
        if pid == 0:
            self._become_worker(child_link.fileno(), workdir, uid, name, cgroup)
        child_link.close()
        link.setblocking(False)  # our own end only: the worker's end is a separate socket
        self.workers[pid] = _Worker(workdir if not self.private_mounts else "", cgroup or name, uid, link=link)
        self.idle.add(pid)
        self.selector.register(link, selectors.EVENT_READ, ("link", pid))

    def _become_worker(self, link: int, workdir: str, uid: int | None, name: str, cgroup: str | None) -> NoReturn:
        try:
            # First: every page and process of the worker counts from here.
            if self.cgroups is not None and cgroup is not None:
                self.cgroups.attach(cgroup)
            elif self.cgroups is not None:
                self.cgroups.enter(name)
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM):
                signal.signal(sig, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            # Drop every descriptor of the zygote (control socket, other workers' links and channels).
            pidfd = self.pidfd
            _close_all_but({link, self.dispatch_fd} | ({pidfd} if pidfd is not None else set()))
            listener = _worker.prepare(
                workdir,
                self.env,
                self.limits,
                uid,
                private_mounts=self.private_mounts,
                keep_read_search=self.keep_read_search,
                expose_paths=self.expose_paths,
                network=self.network,
                tmp_binds=self.tmp_binds,
                max_ptys=self.max_ptys,
                syscall_filter=self.syscall_filter,
                cgroup_namespace=self.cgroup_namespace,
                proc_files=self.proc_files,
            )
            if listener is not None:
                # The zygote answers the filter's sysinfo calls (see ._sysinfo); no copy stays with user code.
                with socket.socket(fileno=os.dup(link)) as sock:
                    _protocol.send_datagram(sock, {"op": "listener"}, [listener])
                os.close(listener)
            # After prepare: a uid change clears the death signal. In a PID namespace of its own, our parent's pid
            # reads 0.
            _proctree.die_with_parent(0 if self.pid_ns is not None else self.pid, pidfd)
            if pidfd is not None:
                os.close(pidfd)
            if self.pid_ns is not None:
                _pidns.act_as_init(link)  # here, not once it has a call: off the call's latency
            with socket.socket(fileno=self.dispatch_fd) as dispatch:
                received = _protocol.recv_datagram(dispatch)
            if received is None or len(received[1]) != 1:
                os._exit(0)  # every caller is gone: the pool is shutting down
            request, (chan,) = received
            with socket.socket(fileno=link) as sock:
                # The channel goes to the zygote; the worker keeps no copy that user code could write on.
                note = {"op": "assigned", "call": request.get("call"), "session": bool(request.get("session"))}
                _protocol.send_datagram(sock, note, [chan])
                os.close(chan)
                once = not request.get("session")
                _worker.serve_supervised(sock.detach(), once=once, as_init=self.pid_ns is not None)
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
            os._exit(70)

    # ------------------------------------------------------------------------------------------------ calls

    def handle_link(self, pid: int) -> None:
        """Read what a worker wrote on its link: the note that it took a call, then its reports."""
        worker = self.workers.get(pid)
        if worker is None or worker.link is None:
            return
        try:
            received = _protocol.recv_datagram(worker.link, MAX_REPORT_BYTES, nowait=True)
        except BlockingIOError:
            return
        except (OSError, _protocol.ProtocolError):
            self.end(pid, "tamper")
            return
        if received is None:  # the worker closed its link (it is exiting, or exec'd something else)
            self.selector.unregister(worker.link)
            worker.link.close()
            worker.link = None
            self.idle.discard(pid)
            return
        message, fds = received
        if message.get("op") == "listener":
            self.take_listener(pid, worker, fds)
            return
        if worker.call is None:
            self.take_assignment(pid, worker, message, fds)
            return
        if message.get("op") == "signal" and not fds:
            self.deliver_signal(pid, worker, message.get("signal"))
            return
        if message.get("op") != "done" or len(fds) != 1 or not worker.running or worker.reported:
            for fd in fds:
                os.close(fd)
            self.end(pid, "tamper")  # a report nobody asked for, or a second one: the cell wrote it
            return
        worker.reported, worker.report_fd = True, fds[0]  # for the caller, unread (see the module docstring)
        if self.pid_ns is not None and worker.session and not worker.stopped:
            # PID 1 of its namespace cannot stop itself (the kernel drops the signal); from here it is not dropped.
            # A one-call worker is not stopped (see finish_call).
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        self.finish_call(pid, worker)

    def take_listener(self, pid: int, worker: _Worker, fds: list[int]) -> None:
        """The worker's filter listener, sent once, before it takes a call; anything else is tampering."""
        if len(fds) != 1 or worker.listener is not None or worker.call is not None or self.sysinfo is None:
            for fd in fds:
                os.close(fd)
            self.end(pid, "tamper")
            return
        worker.listener = fds[0]
        self.selector.register(worker.listener, selectors.EVENT_READ, ("sysinfo", pid))

    def answer_sysinfo(self, pid: int) -> None:
        worker = self.workers.get(pid)
        if worker is None or worker.listener is None or self.sysinfo is None:
            return
        if not self.sysinfo.handle(worker.listener):
            self.drop_listener(worker)

    def drop_listener(self, worker: _Worker) -> None:
        if worker.listener is not None:
            self.selector.unregister(worker.listener)
            os.close(worker.listener)
            worker.listener = None

    def deliver_signal(self, pid: int, worker: _Worker, sig: Any) -> None:
        """The default action of ``sig`` for a worker that is PID 1 of its namespace, which the kernel would not
        give it (see :mod:`._pidns`): stop it, or kill it and report it killed by ``sig``."""
        if self.pid_ns is None or not isinstance(sig, int) or not 0 < sig <= signal.SIGRTMAX:
            self.end(pid, "tamper")
            return
        if sig in _pidns.STOPS:
            worker.stops_asked += 1
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
            return
        if worker.signal is None:
            worker.signal = sig
        self.kill_worker(pid)

    def take_assignment(self, pid: int, worker: _Worker, message: dict[str, Any], fds: list[int]) -> None:
        self.idle.discard(pid)
        if message.get("op") != "assigned" or len(fds) != 1:
            for fd in fds:
                os.close(fd)
            self.kill_worker(pid)
            return
        worker.call, worker.session = int(message["call"]), bool(message.get("session"))
        worker.chan = socket.socket(fileno=fds[0])
        self.by_call[worker.call] = pid
        self.selector.register(worker.chan, selectors.EVENT_READ, ("chan", pid))
        _send_nowait(worker.chan, {"op": "started", "pid": pid})
        if worker.call in self.pending_kills:
            del self.pending_kills[worker.call]
            self.kill_worker(pid)
            return
        # The caller sends its request right behind the call, so it is usually waiting already: pass it on now,
        # before this turn ends in forking the next spare (a fork of the zygote takes milliseconds the call would
        # otherwise wait, while the worker could already be running on another core).
        if select.select([worker.chan], [], [], 0)[0]:
            self.handle_chan(pid)

    def handle_chan(self, pid: int) -> None:
        """A request from the caller (or the end of its channel: it gave the worker up)."""
        worker = self.workers.get(pid)
        if worker is None or worker.chan is None:
            return
        try:
            worker.chan.settimeout(5.0)  # the caller writes each request whole: never wait on it for long
            received = _protocol.recv_message(worker.chan, MAX_REQUEST_BYTES)
        except (OSError, _protocol.ProtocolError):
            received = None
        if received is None:
            self.selector.unregister(worker.chan)
            if not worker.finished:  # the caller gave up on a live worker (a closed session, a timeout)
                self.kill_worker(pid)
            return
        request, fds = received
        if request.get("op") != "exec" or len(fds) != 3 or worker.running or worker.link is None:
            for fd in fds:
                os.close(fd)
            self.kill_worker(pid)
            return
        try:
            # The descriptors (the memfd with the code and stdin, the output pipes) go on unread.
            cpu_s = float(request.get("cpu_s", 10.0))
            _protocol.send_datagram(worker.link, {"op": "exec", "cpu_s": cpu_s}, fds)
        except (OSError, TypeError, ValueError):
            self.kill_worker(pid)
            return
        finally:
            for fd in fds:
                os.close(fd)
        self.drop_report(worker)
        worker.token, worker.running, worker.reported = request.get("token"), True, False
        worker.cpu_s, worker.since = cpu_s, time.monotonic()
        # A session's worker carries the CPU time of its earlier calls, a reused cgroup that of earlier workers; a
        # fresh process tree only its few ms of setup.
        worker.cpu_base = self.cpu_used(pid, worker) if worker.session or self.cgroups is not None else 0.0
        if worker.frozen:
            self.thaw(worker)
        if worker.stopped:  # a session between calls: let it read the request
            worker.stopped = False
            os.kill(pid, signal.SIGCONT)

    def finish_call(self, pid: int, worker: _Worker) -> None:
        """Report a call's end once the worker has reported it *and* stopped, with nothing left running below it.

        A one-call worker is killed right after; a session worker stays stopped until its next request. A one-call
        worker that is PID 1 of its namespace is not stopped first: it cannot stop itself, and stopping it from here
        would cost the call a round trip through the scheduler (killing it first costs as much: its exit takes the
        core the caller is about to need). Everything else it started is dead before the reply, and it is killed
        right after: whatever it might start in between dies with it, since the kernel ends its whole namespace.
        """
        if not (worker.running and worker.reported):
            return
        unstopped = False
        if not worker.stopped:
            if self.pid_ns is None or worker.session:
                return  # until it stops
            unstopped = True
        # Stopped, the worker cannot fork (PID 1 of its namespace: anything it forks from now on dies with it, right
        # after the reply); kill whatever is left of its call (a cell that faked its report). Its cgroup holds every
        # process it started, below it or not (CLONE_PARENT), and none can leave it.
        if self.cgroups is not None:
            self.cgroups.kill(worker.cgroup, spare=pid)
        else:
            for _ in range(100):
                alive = [p for p in _proctree.descendants(pid) if _proctree.is_alive(p)]
                if not alive:
                    break
                for child in alive:
                    with contextlib.suppress(OSError):
                        os.kill(child, signal.SIGKILL)
            self.sweep_strays()  # CLONE_PARENT children: ours, though we did not fork them
        try:
            threads = len(os.listdir(f"/proc/{pid}/task")) if worker.session else 1
        except OSError:
            return  # it died meanwhile: reaped soon
        if threads > 1:
            self.end(pid, "threads")  # they would write into, and run during, later calls
            return
        if not unstopped and _proctree.state(pid) not in ("T", "t"):
            self.end(pid, "tamper")  # something continued it behind our back
            return
        worker.running = False
        unfrozen = False
        if worker.session and self.cgroups is not None and self.cgroups.freezer_fd is not None:
            # Stopped is not enough: a signal the session arranged (a timer sending SIGCONT) would resume it.
            try:
                self.cgroups.freeze(worker.cgroup)
                worker.frozen = True
            except OSError:
                unfrozen = True
        if worker.chan is not None:
            _send_nowait(worker.chan, {"op": "result", "token": worker.token}, self.take_report(worker))
        self.drop_report(worker)
        if unfrozen:
            self.end(pid, "continued")  # nothing would keep it from running until its next call
            return
        if not worker.session:
            # With nothing below it (stopped, or PID 1 of its namespace): a plain kill ends it, and nothing of its uid
            # is left to hunt down.
            worker.finished = True
            os.kill(pid, signal.SIGKILL)

    def check_cpu(self, now: float) -> None:
        """End calls whose whole process tree used more CPU time than the call may."""
        for pid, worker in list(self.workers.items()):
            running = worker.running and not worker.stopped and now - worker.since >= CPU_CHECK_S
            if running and self.cpu_used(pid, worker) - worker.cpu_base > worker.cpu_s:
                self.end(pid, "cpu")

    def cpu_used(self, pid: int, worker: _Worker) -> float:
        """CPU seconds of the worker's cgroup (every process ever in it), else of its process tree."""
        if self.cgroups is not None:
            used = self.cgroups.cpu_s(worker.cgroup)
            if used is not None:
                return used
        return _tree_cpu_s(pid)

    # ------------------------------------------------------------------------------------------------ reap

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG | os.WUNTRACED | os.WCONTINUED)
            except ChildProcessError:
                self.remove_cgroups()
                return
            if pid == 0:
                self.remove_cgroups()
                return
            worker = self.workers.get(pid)
            if worker is None:
                continue
            if os.WIFCONTINUED(status):
                worker.stopped = False
                if worker.session and not worker.running and not worker.frozen and worker.call is not None:
                    # A session between calls, resumed behind our back (its own timer sending SIGCONT): it would
                    # run for free until its next call. Frozen, it could not; here nothing can stop it but this.
                    self.end(pid, "continued")
                continue
            if os.WIFSTOPPED(status):
                worker.stopped = True
                if worker.stops_asked and worker.link is not None:
                    # Read by the worker once continued: its stop is over (see _pidns._deliver).
                    for _ in range(worker.stops_asked):
                        with contextlib.suppress(OSError):
                            _protocol.send_datagram(worker.link, {"op": "stopped"})
                    worker.stops_asked = 0
                if worker.running and not worker.reported:
                    self.handle_link(pid)  # the report is queued before the stop: read it now
                self.finish_call(pid, worker)
                continue
            self._finish(pid, worker, status)

    def _finish(self, pid: int, worker: _Worker, status: int) -> None:
        clean_exit = worker.finished or (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0)
        if worker.link is not None:
            if worker.call is None or (worker.running and not worker.reported):
                self.handle_link(pid)  # it may have taken a call, or reported one, just before dying
            worker = self.workers[pid]
            if worker.link is not None:
                self.selector.unregister(worker.link)
                worker.link.close()
                worker.link = None
        self.drop_listener(worker)
        died_unasked = worker.call is None and not clean_exit
        if died_unasked:
            self.refill_after = time.monotonic() + SPARE_RETRY_S  # a spare that dies unasked would again
            if self.cgroups is not None and not self.cgroups.exists():
                # Someone removed the pool's cgroup: no spare can start again. Exit, so that the pool starts a
                # fresh zygote (with a fresh cgroup) on the next call instead of failing spares forever.
                print("rstar_env sandbox zygote: the pool's cgroup was removed; exiting", file=sys.stderr)
                self.shutdown()
        del self.workers[pid]
        self.idle.discard(pid)
        if worker.call is not None:
            self.by_call.pop(worker.call, None)
        if self.cgroups is None or not worker.finished:
            # Orphans re-parented to us. A worker we ended cleanly had nothing left in its cgroup when we did.
            self.sweep_strays()
        if worker.uid is not None and not clean_exit:
            _proctree.kill_uid(worker.uid)
        if worker.frozen:
            self.thaw(worker)  # died frozen (the OOM killer): the cgroup may be used again
        if self.cgroups is not None:
            emptied = self.cgroups.kill(worker.cgroup)
            if emptied and not died_unasked and len(self.free_cgroups) < 2 * self.spare_target:
                self.free_cgroups.append(worker.cgroup)
            else:
                self.doomed_cgroups.add(worker.cgroup)  # removed after the reply: rmdir is off the call's latency
        if worker.workdir:
            _remove_tree(worker.workdir)
        if worker.uid is not None:
            self.tidy_shared_dirs(worker.uid)
        if worker.uid is not None and self.uids is not None:
            self.uids.release(worker.uid)
        if worker.chan is not None:
            # Every process of the worker is dead by now: only then does the caller learn the call is over.
            if worker.signal is not None and os.WIFSIGNALED(status):
                status = worker.signal  # what it died of, had it not been PID 1 of its namespace
            exit_message = {"op": "exit", "status": status, "token": worker.token, "reason": worker.reason}
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(worker.chan)
            _send_nowait(worker.chan, exit_message, self.take_report(worker) if worker.running else [])
            worker.chan.close()
        self.drop_report(worker)
        self.remove_cgroups()

    @staticmethod
    def take_report(worker: _Worker) -> list[int]:
        """The worker's report memfd to attach to a message (empty if it made none)."""
        return [worker.report_fd] if worker.report_fd is not None else []

    @staticmethod
    def drop_report(worker: _Worker) -> None:
        """Close our copy of the worker's report memfd (passed on already, or no longer wanted)."""
        if worker.report_fd is not None:
            with contextlib.suppress(OSError):
                os.close(worker.report_fd)
            worker.report_fd = None

    def remove_cgroups(self) -> None:
        """Remove the cgroups of dead workers (one whose last process is still exiting waits for a later turn)."""
        if self.cgroups is not None:
            for name in list(self.doomed_cgroups):
                if self.cgroups.remove(name):
                    self.doomed_cgroups.discard(name)

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
            self.kill_worker(pid)
        self.sweep_strays()
        # The pool removes the cgroups once the zygote is gone (it owns their parent).
        for worker in self.workers.values():
            _remove_tree(worker.workdir)
        os._exit(0)


def _send_nowait(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    # Never block the pool on one channel: a caller that stopped reading must not stall every other call.
    with contextlib.suppress(OSError):
        _protocol.send_message(sock, message, fds or (), nowait=True)


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds used by ``pid`` and every process below it, including children they have reaped.

    Zombies still count (their times stay readable until reaped, then move to the reaper's ``cutime``).
    """
    ticks = 0
    for member in [pid, *_proctree.descendants(pid)]:
        try:
            with open(f"/proc/{member}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue
    return ticks / _CLOCK_TICKS


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


def _probe(setup: Any, pid_ns: int | None = None) -> str | None:
    """Run ``setup()`` in a throwaway child (PID 1 of a new PID namespace, given ours: ``pid_ns``); None if it
    works, else why not."""
    r, w = os.pipe()
    try:
        pid = os.fork() if pid_ns is None else _pidns.fork_as_init(pid_ns)
    except OSError as exc:
        os.close(r)
        os.close(w)
        return repr(exc)
    if pid == 0:
        os.close(r)
        try:
            setup()
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


def main(control_fd: int) -> NoReturn:
    """Entry point (see :func:`._spawn.python_argv`): the configuration is the first message on the control socket
    (never the command line, which every worker can read)."""
    control = socket.socket(fileno=control_fd)
    received = _protocol.recv_message(control)
    if received is None:
        os._exit(0)  # the pool gave up before sending it
    config, fds = received
    for fd in fds:
        os.close(fd)
    Zygote(control, config).run()
