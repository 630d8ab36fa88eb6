"""``local``: a warm pool of sandboxed Python workers forked from a pre-importing zygote.

How a call runs::

    caller thread ──call + channel──▶ spare worker ──channel──▶ zygote (PID 1 of the pool's namespaces,
         │                                                      │      numpy/sympy imported; supervisor)
         │◀═══════ requests / results (channel) ═══════════════▶│◀─ reports (link) ─ worker
         │◀── stdout / stderr pipes ─────────────────────────────────────────────────┘

* The zygote is a clean interpreter (``python -c``), started once per sandbox under bubblewrap or ``unshare``
  (:mod:`._isolation`), so ``fork`` is safe and the pool's namespaces cost nothing per call. Spares are prepared
  ahead (own cgroup, own IPC and network namespaces, own empty ``/tmp``, ``/dev/shm`` and ``/dev/pts``, own uid,
  no capabilities, a seccomp filter); see ``docs/security.md``.
* Stateless calls get a fresh fork each; a stateful session keeps one forked worker until ``close_session``,
  stopped (SIGSTOP) and frozen (cgroup freezer) between calls so nothing of it runs while it is not called.
  Each open session reserves what it holds (read from its cgroup, at least 64 MiB; ``memory_mb`` while a call of
  it runs) and ``memory_mb`` stays free for any call: a call that does not fit waits for room, so what idle
  sessions hold can never get another episode's call within ``memory_mb`` killed (:mod:`._admission`).
* No call's code, stdin, report or output is ever read by the zygote (whose memory every later worker is a fork
  of): they travel between the caller and the worker in memfds and pipes that the zygote passes on unread.
* The zygote, not the worker, tells the caller that a call is over, and only when every process of the call is
  dead (stateless) or stopped with nothing below it (a session); see :mod:`._zygote`. User code cannot reach the
  caller's channel at all.
* The caller enforces the wall-clock timeout and the output limit; the zygote adds up the CPU time of each
  call's whole process tree. When a limit trips, the zygote kills the worker's whole tree (:mod:`._proctree`).
  If the zygote itself dies, every worker dies with it, and the next call starts a new one.
* Calls run on a private thread pool of ``max_concurrency`` threads: by default many more than cores
  (:func:`default_concurrency`), so a spinning or sleeping call never holds up the others; the kernel shares
  the cores and every call is bounded by CPU time as well as wall time. The API works from any event loop.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from . import _admission, _base, _cgroup, _client, _isolation, _limits, _pool

DEFAULT_PRELOAD: tuple[str, ...] = (
    "math",
    "cmath",
    "fractions",
    "decimal",
    "itertools",
    "functools",
    "collections",
    "random",
    "statistics",
    "re",
    "numpy",
    "sympy",
    "sympy.abc",
    "sympy.calculus",
    "sympy.combinatorics",
    "sympy.concrete",
    "sympy.discrete",
    "sympy.functions",
    "sympy.geometry",
    "sympy.integrals",
    "sympy.logic",
    "sympy.matrices",
    "sympy.ntheory",
    "sympy.parsing.sympy_parser",
    "sympy.polys",
    "sympy.series",
    "sympy.sets",
    "sympy.simplify",
    "sympy.solvers",
)
"""Imported once in the zygote; modules that are not installed are skipped (logged at debug level)."""

DEFAULT_WARMUP = """\
import sys
if "sympy" in sys.modules:
    import sympy
    _x = sympy.Symbol("x")
    sympy.simplify(sympy.sin(_x) ** 2 + sympy.cos(_x) ** 2)
    sympy.simplify((_x**2 - 1) / (_x - 1))
    sympy.solve(_x**2 - 4, _x)
    sympy.factor(_x**3 - 1)
    sympy.integrate(_x * sympy.exp(_x), _x)
"""
"""Run once in the zygote after the imports: fills sympy's caches, which every forked worker then shares."""


def default_concurrency() -> int:
    """Calls admitted at once by default: 4 per core and at least 16. Tool calls mostly wait (sleep, I/O) or are
    short; admitting few more than cores would let two infinite loops stall every other episode's tool call."""
    return max(16, 4 * (os.cpu_count() or 1))


class LocalSandbox(_base.ThreadedSandbox):
    """Warm fork-server sandbox (see the module docstring). Use as an async context manager.

    Options (all keyword):

    * ``max_concurrency``: calls running at once (default :func:`default_concurrency`: 4 per core, at least 16);
      more calls queue. Each running call is a process; the kernel shares the cores among them.
    * ``timeout_s``: default wall-clock limit per call (4.0, the paper's tool limit); ``execute`` may override.
    * ``memory_mb``: memory of each worker (a call, or a session) over its whole process tree, memfds, shared
      memory and its ``/tmp`` included, where a cgroup can be had; else an address-space limit per process (2048).
      ``pool_memory_mb``: memory of all workers together (half of what this process may use).
      ``cpu_s``: CPU seconds per call, counting every process the call starts (timeout + 1).
      ``tmp_mb``: size of each worker's private ``/tmp`` and of its ``/dev/shm`` (256 each, in memory; counted in
      ``memory_mb``, and each cut to half of it, so that a worker's files always fit its own budget).
    * Sessions and the pool's memory (request and limit, as Kubernetes has them): ``memory_mb`` is each session's
      limit, enforced by its cgroup; its request, what the pool sets aside for it, is what it holds between calls
      (its cgroup's usage, files in ``/tmp`` and ``/dev/shm`` included; at least 64 MiB), and ``memory_mb`` while
      one of its calls runs. A call starts once the other sessions' requests plus ``memory_mb`` fit in
      ``pool_memory_mb``; until then it *waits* (``ExecResult.queue_s``), and past ``queue_timeout_s`` (30 s) it
      is turned away unrun as a failure of the system (``ExecResult.system_failure``: the python tool never shows
      it to the model; the episode ends ``env_error``). So sessions that hold little fit by the hundred (161 at
      the defaults on a 24 GiB machine), and a call within ``memory_mb`` is never the one killed because of what
      idle sessions hold. Stateless calls share what sessions leave, unreserved. Closing a session, or a call
      that ends its worker, gives its request back. With ``memory_mb=None`` nothing is reserved (nothing bounds
      a session).
    * ``max_per_client``: calls of one client (``execute(..., client=key)``) running at once (None: no cap);
      clients are served in turn whatever the cap (:mod:`._fair`).
    * ``max_output_bytes``: stdout + stderr kept per call (1 MiB); more is ``output_limit``.
    * ``max_processes``, ``max_files``, ``max_file_mb``: RLIMIT_NPROC / NOFILE / FSIZE per worker.
    * ``preload``: modules the zygote imports (:data:`DEFAULT_PRELOAD`); ``warmup``: code it runs after.
    * ``network``: allow network access (False: the pool gets its own network namespace).
    * ``isolation``: ``"auto"`` (best available, one warning naming what is missing), ``"bwrap"``,
      ``"unshare"`` (fail if unavailable) or ``"none"``.
    * ``env``: extra environment variables for sandboxed code (on top of a small allowlist).
    * ``python``: interpreter for the zygote (default: this one).
    * ``spares``: workers the zygote keeps forked and prepared ahead of calls (``min(max_concurrency, 16)``),
      which takes ``fork`` off the latency of a call; a burst beyond them waits for forks (not on its timeout).
    * ``pid_namespace``: make each worker PID 1 of a PID namespace of its own (True), so that concurrent calls
      cannot tell which pids exist in others (``kill(pid, 0)``, ``pidfd_open``, ``ns_last_pid``). False shares the
      pool's namespace, as before; where a namespace cannot be made (``isolation="none"`` without root), the
      pool's warning says so.
    """

    def __init__(
        self,
        *,
        max_concurrency: int | None = None,
        timeout_s: float = 4.0,
        memory_mb: int | None = 2048,
        max_output_bytes: int = 1 << 20,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        warmup: str | None = DEFAULT_WARMUP,
        network: bool = False,
        cpu_s: float | None = None,
        max_processes: int | None = 64,
        max_files: int | None = 256,
        max_file_mb: int | None = 64,
        tmp_mb: int = 256,
        isolation: str = "auto",
        env: Mapping[str, str] | None = None,
        python: str | None = None,
        start_timeout_s: float = 120.0,
        spares: int | None = None,
        pool_memory_mb: int | None = None,
        pid_namespace: bool = True,
        queue_timeout_s: float = _base.DEFAULT_QUEUE_TIMEOUT_S,
        max_per_client: int | None = None,
    ) -> None:
        super().__init__(
            max_concurrency=max_concurrency or default_concurrency(),
            timeout_s=timeout_s,
            max_output_bytes=max_output_bytes,
            cpu_s=cpu_s,
            queue_timeout_s=queue_timeout_s,
            max_per_client=max_per_client,
        )
        for name, value in (("memory_mb", memory_mb), ("pool_memory_mb", pool_memory_mb)):
            if value is not None and value < 64:
                raise ValueError(f"{name} must be at least 64 (MiB), got {value!r}")
        if isolation not in _isolation.ISOLATION_MODES:
            raise ValueError(f"isolation must be one of {_isolation.ISOLATION_MODES}, got {isolation!r}")
        self.limits = _limits.Limits(
            memory_mb=memory_mb,
            max_processes=max_processes,
            max_files=max_files,
            max_file_mb=max_file_mb,
            tmp_mb=tmp_mb,
        )
        self.pool = _pool.ZygotePool(
            preload=preload,
            warmup=warmup,
            limits=self.limits,
            env=env,
            isolation=isolation,
            network=network,
            python=python,
            start_timeout_s=start_timeout_s,
            spares=min(self.max_concurrency, 16) if spares is None else spares,
            pool_memory_mb=_cgroup.default_pool_memory_mb() if pool_memory_mb is None else pool_memory_mb,
            pid_namespace=pid_namespace,
        )
        self._gate = _admission.MemoryGate(self.pool.pool_memory_mb, memory_mb)

    @property
    def isolation(self) -> _isolation.Isolation | None:
        """What the pool runs inside (known once started)."""
        return self.pool.isolation

    @property
    def info(self) -> dict[str, Any]:
        """What the zygote reported: pid, preloaded and skipped modules, whether workers get private uids, the
        MiB of its heap in huge pages (``huge_pages_mb``)."""
        return self.pool.info

    def _start(self) -> None:
        self.pool.start()

    def _after_fork_in_child(self) -> None:
        pool = getattr(self, "pool", None)  # None if the fork came in the middle of __init__
        if pool is not None:
            pool.after_fork_in_child()
        super()._after_fork_in_child()

    def _spawn(self, *, session: bool) -> _client.Worker:
        return self.pool.spawn(session=session)

    def _held_mb(self, worker: _client.Worker) -> int | None:
        return self.pool.held_mb(worker) if isinstance(worker, _pool.LocalWorker) else None

    def _shutdown(self) -> None:
        self.pool.close()
