"""A PID namespace per worker, with the worker itself as its PID 1.

Why: workers sharing the pool's PID namespace can see each other's processes come and go without seeing them:
``kill(pid, 0)`` fails with ``EPERM`` rather than ``ESRCH`` for a sibling's pid, ``pidfd_open`` opens it,
``/proc/sys/kernel/ns_last_pid`` moves, and the pids of one's own children count everyone's forks. Concurrent
episodes could talk that way. In a namespace of its own a worker sees only its own processes, numbered from 1.

Cost: none measurable on a call (docs/security.md has the figures). The zygote calls ``unshare(CLONE_NEWPID)`` right
before forking a spare and returns to its own namespace right after (``setns``), so the spare, prepared ahead of
calls, is PID 1 of a fresh namespace: no extra process, no extra fork. When the worker dies, the kernel kills
whatever is left in its namespace.

What being PID 1 changes, and what keeps ordinary code working:

* The kernel drops a signal sent to a namespace's init from inside the namespace when the signal's action is the
  default one (and ``SIGKILL``/``SIGSTOP`` unless they come from an ancestor namespace). So a worker could not stop
  itself at the end of a call: the zygote stops it when it reports (a session), or replies and kills it (one call; see
  :mod:`._zygote`). And ``os.kill(os.getpid(), SIGKILL)``, ``signal.alarm`` without a handler, or a child's
  ``SIGTERM`` to its parent would do nothing. :func:`act_as_init` makes the default actions happen anyway: catchable
  signals whose default ends or stops a process get a handler (``signal.getsignal`` still answers ``SIG_DFL``, and
  forked children get the real default back), and ``os.kill``, ``os.killpg``, ``signal.raise_signal`` and
  ``signal.pthread_kill`` aimed at the worker itself with ``SIGKILL``, ``SIGSTOP`` or a signal left at its default are
  noticed. Either way the worker asks the zygote on its link (``{"op": "signal", "signal": n}``), and the zygote stops
  it or kills it and reports the call as killed by that signal. Left as for any container's init: ``SIGKILL`` or
  ``SIGSTOP`` sent to the worker by one of its own child processes or by a raw system call (through ``ctypes``) does
  nothing; the call still ends at its deadline.
* Orphans are re-parented to it: it is a subreaper already, and reaps every descendant after each call.

Stdlib only: the zygote and the worker load this module without ``rstar_env``.
"""

from __future__ import annotations

import _signal
import contextlib
import ctypes
import os
import posix
import signal
import socket
import time
from typing import Any, NoReturn

from . import _protocol

CLONE_NEWPID = 0x20000000
_libc = ctypes.CDLL(None, use_errno=True)

STOPS = frozenset({signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU})
"""Signals whose default action stops the process."""
_ASYNC_ENDS = frozenset(
    {
        signal.SIGHUP,
        signal.SIGINT,
        signal.SIGQUIT,
        signal.SIGPIPE,
        signal.SIGABRT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGALRM,
        signal.SIGTERM,
        signal.SIGVTALRM,
        signal.SIGPROF,
        signal.SIGXCPU,
        signal.SIGXFSZ,
        signal.SIGIO,
        signal.SIGPWR,
        *([signal.SIGSTKFLT] if hasattr(signal, "SIGSTKFLT") else []),
        *range(signal.SIGRTMIN, signal.SIGRTMAX + 1),
    }
)
"""Catchable signals whose default action ends the process and that nothing raises synchronously."""
_FAULTS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS})
ENDS = _ASYNC_ENDS | _FAULTS | {signal.SIGKILL}
"""Signals whose default action ends the process. A fault's signal (``SIGSEGV`` from a bad pointer) is forced by
the kernel and ends PID 1 too; sent with ``kill``, it is dropped like the others."""
_HANDLED = (_ASYNC_ENDS | STOPS) - {signal.SIGSTOP}
"""Given a handler in PID 1 while at their default (a handler for a fault's signal would run the fault again)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def own_namespace() -> int:
    """A descriptor of this process's PID namespace, for :func:`fork_as_init` to come back to."""
    return os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)


def fork_as_init(own: int) -> int:
    """``os.fork()`` with the child as PID 1 of a new PID namespace: 0 in the child, its pid in the parent.

    ``own`` is :func:`own_namespace`: the parent's later children are born in its own namespace again. Needs
    CAP_SYS_ADMIN (root, or a user namespace of its own). Raises OSError, having forked nothing, when the namespace
    cannot be made; SystemExit if the parent cannot get back to its own namespace (every later child would be born
    in this one: the parent must not go on).
    """
    _check(_libc.unshare(CLONE_NEWPID), "unshare(CLONE_NEWPID)")
    pid = -1
    try:
        pid = os.fork()
    finally:
        if pid != 0 and _libc.setns(own, CLONE_NEWPID) != 0:
            raise SystemExit(f"setns(CLONE_NEWPID) back to our own PID namespace: {os.strerror(ctypes.get_errno())}")
    return pid


# ---------------------------------------------------------------------------------------------------- PID 1

_link: int | None = None
"""The worker's link to the zygote (a descriptor: the worker's own socket object on it may come and go)."""
_os_kill = os.kill
_os_killpg = os.killpg
_raise_signal = signal.raise_signal
_pthread_kill = signal.pthread_kill
# The C functions for our own use: the signal module's wrappers cost 10 times more (enum conversions), and a spare
# sets dozens of handlers.
_set_handler = _signal.signal
_get_handler = _signal.getsignal
_user_signal = signal.signal
_user_getsignal = signal.getsignal


def act_as_init(link: int) -> None:
    """In the worker, PID 1 of its namespace, before any user code: make the default actions of signals happen
    (see the module docstring); ``link`` is the descriptor of the worker's socket to the zygote. Called while the
    worker is a spare, so that none of it is on a call's latency."""
    global _link
    _link = link
    for sig in _HANDLED:
        if _get_handler(sig) == signal.SIG_DFL:
            _set_handler(sig, _default_action)
    os.register_at_fork(before=_block_for_fork, after_in_parent=_unblock, after_in_child=_defaults_back)
    for module in (os, posix):
        module.kill, module.killpg = _kill, _killpg  # type: ignore[assignment]
    signal.raise_signal, signal.pthread_kill = _raise, _thread_kill  # type: ignore[assignment]
    signal.signal, signal.getsignal = _install, _installed  # type: ignore[assignment]


def _is_init() -> bool:
    # A forked child keeps these wrappers and (until its at-fork hook) the handlers: there they do nothing extra.
    return os.getpid() == 1


def _dropped(sig: int) -> bool:
    """Whether the kernel drops ``sig`` sent to PID 1 from inside its namespace (no handler of its own)."""
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        return True
    return (sig in ENDS or sig in STOPS) and _get_handler(sig) == signal.SIG_DFL


def _default_action(sig: int, _frame: Any) -> None:
    if not _is_init():
        _set_handler(sig, _signal.SIG_DFL)
        _os_kill(os.getpid(), sig)
        return
    _deliver(sig)


_mask_before_fork: set[int] | None = None


def _block_for_fork() -> None:
    """Before PID 1 forks: block the signals it handles, so that one sent to the child before the child has the
    real defaults back waits for them (caught by our handler there, it would be lost)."""
    global _mask_before_fork
    if _is_init():
        _mask_before_fork = signal.pthread_sigmask(signal.SIG_BLOCK, _HANDLED)


def _unblock() -> None:
    global _mask_before_fork
    if _mask_before_fork is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, _mask_before_fork)
        _mask_before_fork = None


def _defaults_back() -> None:
    """In a child of PID 1: the real defaults, then the signals that arrived meanwhile."""
    for sig in _HANDLED:
        if _get_handler(sig) is _default_action:
            _set_handler(sig, _signal.SIG_DFL)
    _unblock()


def _deliver(sig: int) -> None:
    """Have the zygote stop this process (return once it has been stopped and continued), or kill it and report it
    killed by ``sig``."""
    try:
        assert _link is not None
        link = socket.socket(fileno=_link)
        try:
            _protocol.send_datagram(link, {"op": "signal", "signal": int(sig)})
            if sig in STOPS:
                # The zygote says "stopped" once it saw us stop; we read it only when something continues us.
                while (got := _protocol.recv_datagram(link)) is not None and got[0].get("op") != "stopped":
                    for fd in got[1]:
                        os.close(fd)
                return
        finally:
            link.detach()  # the descriptor stays the worker's
    except (OSError, AssertionError, _protocol.ProtocolError):
        if sig in STOPS:
            return  # nobody to stop us (the code closed the link): go on, as a stopped process would when continued
        os._exit(128 + sig)
    _wait_for_death(sig)


def _wait_for_death(sig: int) -> NoReturn:
    # Nothing of this process runs meanwhile: no signal handler, and no more code on this thread.
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        time.sleep(0.1)
    os._exit(128 + sig)  # the zygote should have killed us long ago


def _includes_me(pid: int) -> bool:
    """Whether ``kill(pid, ...)`` from PID 1 reaches PID 1 itself: itself, its group (``-1`` is every process but
    PID 1, even where PID 1's group is 1)."""
    return pid in (0, 1) or (pid != -1 and pid == -os.getpgrp())


def _kill(pid: int, sig: int, /) -> None:
    _os_kill(pid, sig)
    if _is_init() and _includes_me(pid) and _dropped(sig):
        _deliver(sig)


def _killpg(pgid: int, sig: int, /) -> None:
    _os_killpg(pgid, sig)  # the C library's killpg(pgid) is kill(-pgid)
    if _is_init() and _includes_me(-pgid) and _dropped(sig):
        _deliver(sig)


def _raise(sig: int, /) -> None:
    _raise_signal(sig)
    if _is_init() and _dropped(sig):
        _deliver(sig)


def _thread_kill(thread_id: int, sig: int, /) -> None:
    _pthread_kill(thread_id, sig)
    if _is_init() and sig != 0 and _dropped(sig):
        _deliver(sig)


def _install(sig: int, handler: Any, /) -> Any:
    """``signal.signal``: in PID 1, the default action of a handled signal stays ours (it would be dropped)."""
    if _is_init() and sig in _HANDLED and handler == signal.SIG_DFL:
        handler = _default_action
    previous = _user_signal(sig, handler)
    return signal.SIG_DFL if previous is _default_action else previous


def _installed(sig: int, /) -> Any:
    """``signal.getsignal``: ``SIG_DFL`` where our stand-in for the default action is installed."""
    handler = _user_getsignal(sig)
    return signal.SIG_DFL if handler is _default_action else handler
