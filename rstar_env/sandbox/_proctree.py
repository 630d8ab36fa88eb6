"""Process trees on Linux: subreapers, descendant discovery through /proc, and whole-tree kills.

``killpg`` alone is not enough to end what sandboxed code starts: ``setsid`` leaves the group, and a double fork
orphans the daemon. So every worker makes itself a *child subreaper*: orphans below it are re-parented to it, not
to init, and stay findable as its descendants until it dies. A tree kill stops the root first (so it cannot fork
or reap while we walk), then kills every live descendant until none is left, then kills the root. Escapees of a
root that died on its own are re-parented to the zygote (a subreaper itself, or PID 1 of the pool's namespace),
which kills every child it did not fork. When each worker runs under its own uid, ``kill_uid`` is the final sweep.

Stdlib only (``ctypes`` for ``prctl``): the zygote and the worker load this module without ``rstar_env``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import time

PR_SET_PDEATHSIG = 1
PR_SET_KEEPCAPS = 8
PR_SET_CHILD_SUBREAPER = 36
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_RAISE = 2

_libc = ctypes.CDLL(None, use_errno=True)


def prctl(option: int, arg2: int = 0, arg3: int = 0, arg4: int = 0, arg5: int = 0) -> None:
    """Call ``prctl(2)``; raises OSError on failure."""
    args = [ctypes.c_ulong(a) for a in (arg2, arg3, arg4, arg5)]
    if _libc.prctl(option, *args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def become_subreaper() -> None:
    """Make orphaned descendants of this process re-parent to it instead of to init."""
    prctl(PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(expected_parent: int, parent_pidfd: int | None = None) -> None:
    """SIGKILL this process when its parent dies (and now, if the parent is already gone).

    Gone means: ``parent_pidfd`` (a pidfd of the parent) says it exited, or, without one, ``getppid()`` is no
    longer ``expected_parent`` (0 for a process whose parent is outside its PID namespace, which tells nothing).
    """
    prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent_pidfd is not None:
        gone = bool(select.select([parent_pidfd], [], [], 0)[0])
    else:
        gone = os.getppid() != expected_parent
    if gone:
        os._exit(1)


def children(pid: int | str) -> list[int]:
    """Direct children of ``pid`` (or ``"self"``), all threads, from ``/proc/<pid>/task/*/children``."""
    found: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                found.extend(int(p) for p in f.read().split())
        except OSError:
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before children (a snapshot: the tree may change meanwhile)."""
    found: list[int] = []
    frontier = [pid]
    seen = {pid}
    while frontier:
        nxt: list[int] = []
        for parent in frontier:
            for child in children(parent):
                if child not in seen:
                    seen.add(child)
                    found.append(child)
                    nxt.append(child)
        frontier = nxt
    return found


def state(pid: int) -> str:
    """The state letter of ``pid`` (``R``, ``S``, ``T``, ``Z``...), or ``""`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3].decode()


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    # The state letter follows the command name, which is in parentheses and may itself contain ") ".
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] not in (b"Z", b"X", b"")


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_tree(root: int, *, rounds: int = 200) -> None:
    """SIGKILL ``root`` and everything below it.

    The root is stopped first so it cannot fork or reap while the tree is walked; as a subreaper it then keeps
    adopting the orphans of the descendants we kill, so repeated walks converge even against a fork bomb (which
    ``RLIMIT_NPROC`` bounds). Zombies are skipped: they are already dead and their parent reaps them.
    """
    _kill(root, signal.SIGSTOP)
    for _ in range(rounds):
        alive = [p for p in descendants(root) if is_alive(p)]
        if not alive:
            break
        for pid in alive:
            _kill(pid, signal.SIGKILL)
    _kill(root, signal.SIGKILL)


def end_descendants(deadline_s: float = 2.0) -> None:
    """From inside a subreaper: kill every descendant of this process and reap them all.

    Called by the worker after each call, so nothing a call started survives it, daemons included.
    """
    me = os.getpid()
    deadline = time.monotonic() + deadline_s
    while True:
        alive = [p for p in descendants(me) if is_alive(p)]
        for pid in alive:
            _kill(pid, signal.SIGKILL)
        reaped = False
        try:
            while True:
                pid, _ = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                reaped = True
        except ChildProcessError:
            return  # no children left at all, live or zombie
        if time.monotonic() > deadline:
            return
        if not alive and not reaped:
            time.sleep(0.0005)


def uid_of(pid: int) -> int | None:
    """The real uid of ``pid``, or None if it is gone."""
    # Not the owner of /proc/<pid>: that turns to root when a process changes uid (it stops being dumpable).
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def kill_uid(uid: int, *, rounds: int = 50) -> int:
    """SIGKILL every process whose /proc entry belongs to ``uid``; returns how many were signalled.

    Only meaningful when ``uid`` is private to one worker (the pool gives each worker its own when it runs as
    root): then this catches anything that escaped the tree, whatever its parentage.
    """
    total = 0
    for _ in range(rounds):
        victims = []
        for name in os.listdir("/proc"):
            if name.isdigit() and uid_of(int(name)) == uid and is_alive(int(name)):
                victims.append(int(name))
        if not victims:
            break
        for pid in victims:
            _kill(pid, signal.SIGKILL)
        total += len(victims)
        time.sleep(0.001)
    return total
