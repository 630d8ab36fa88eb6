"""The math-verify worker process: ``python -m rstar_plugins.rewards._worker MEMORY_MB SOFT_TIMEOUT_S``.

Protocol (pickled frames over stdin/stdout, see :mod:`.pool`): the worker sends ``("ready", pid)`` once
math-verify is imported and warm, then answers each request ``(pred, pred_is_latex, gold)`` with
``(verdict, detail, exiting)``: ``verdict`` is ``"verified"``, ``"mismatch"``, ``"bad_gold"``, ``"timeout"`` or
``"error"``, and ``exiting`` says the worker stops after this reply (it hit its memory limit).

Why a process: math-verify's own timeouts use ``signal.alarm`` (main thread only) and some inputs (a power tower
like ``5^{5^{5^5}}``) spin inside C code where no signal handler runs. Here the worker arms its own interval timer
(``soft_timeout_s``, a little under the parent's hard limit) so ordinary slow comparisons end cleanly and the
worker survives; anything that ignores the timer is killed by the parent at the hard limit. ``RLIMIT_AS`` turns a
memory explosion (``10^{10^{10}}`` evaluated exactly) into a ``MemoryError`` instead of an OOM kill of the host.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
from functools import lru_cache
from multiprocessing.connection import Connection
from typing import Any


class _SoftTimeout(BaseException):
    """Raised by the interval timer. A BaseException, so sympy's and math-verify's ``except Exception`` blocks
    cannot swallow it."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SoftTimeout


def _verify(pred: str, pred_is_latex: bool, gold: str) -> tuple[str, str]:
    from math_verify import parse, verify

    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return "bad_gold", f"math-verify could not parse the gold answer {gold[:80]!r}"
    # A boxed answer is given to math-verify boxed, so it reads exactly that; free text goes as is and
    # math-verify finds the answer in it ("the answer is 42").
    pred_parsed = parse(f"\\boxed{{{pred}}}" if pred_is_latex else pred, parsing_timeout=None)
    if not pred_parsed:
        return "mismatch", "prediction not parseable"
    # allow_set_relation_comp: a gold interval "(0,\\infty)" answered as "x > 0" is right; by default math-verify
    # compares set to relation only when the prediction is the set (a false negative on the other order).
    ok = verify(gold_parsed, pred_parsed, timeout_seconds=None, allow_set_relation_comp=True)
    return ("verified" if ok else "mismatch"), ""


@lru_cache(maxsize=2048)
def _parse_gold(gold: str) -> list[Any]:
    # Gold answers repeat across a group's rollouts: parse each once per worker.
    from math_verify import parse

    text = gold.strip()
    if not text:
        return []
    if "\\boxed" not in text and not text.startswith("$"):
        text = f"${text}$"
    return parse(text, parsing_timeout=None)


def serve(reader: Connection, writer: Connection, memory_mb: int, soft_timeout_s: float) -> None:
    # Everything math-verify logs is either handled here (timeouts) or noise (its "timeout disabled" warning).
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    import math_verify  # noqa: F401  (import before the memory limit: imports map shared libraries)

    _verify("1/2", True, "0.5")  # warm the parser caches so the first real request is not the slow one
    _parse_gold.cache_clear()
    if memory_mb > 0:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    writer.send(("ready", os.getpid()))
    while True:
        try:
            request = reader.recv()
        except (EOFError, OSError):
            return  # the parent closed the pipe or died: nothing left to do
        if request is None:
            return
        pred, pred_is_latex, gold = request
        fatal = False
        try:
            signal.setitimer(signal.ITIMER_REAL, soft_timeout_s)
            try:
                reply = _verify(pred, pred_is_latex, gold)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _SoftTimeout:
            reply = ("timeout", f"math-verify took longer than {soft_timeout_s:.2f}s")
        except MemoryError:
            reply = ("error", f"math-verify exceeded the {memory_mb} MB memory limit")
            fatal = True  # the heap may be fragmented or half-built: start afresh
        except RecursionError:
            reply = ("error", "math-verify hit the recursion limit")
        except Exception as exc:
            reply = ("error", f"{type(exc).__name__}: {str(exc)[:200]}")
        try:
            writer.send((*reply, fatal))
        except (pickle.PicklingError, OSError):
            return
        if fatal:
            return


def main() -> None:
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    soft_timeout_s = float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    # The protocol owns the original stdout; anything printed by library code goes to stderr instead.
    protocol_out = os.dup(1)
    os.dup2(2, 1)
    reader = Connection(os.dup(0), readable=True, writable=False)
    writer = Connection(protocol_out, readable=False, writable=True)
    serve(reader, writer, memory_mb, soft_timeout_s)


if __name__ == "__main__":
    main()
