"""The math-verify worker processes: ``python -m rstar_plugins.rewards._worker MEMORY_MB`` is a pool's template.

The template imports math-verify and warms its parsers once, then forks a worker each time the pool asks: the pool
sends it one byte with the worker's two pipe ends attached (``SCM_RIGHTS`` over the Unix socket that is the
template's standard input), and the forked worker serves those pipes. So a worker starts (or restarts after a kill)
in milliseconds, already warm, instead of paying the imports and the warm-up (about two CPU-seconds) each time. The
template exits when the pool closes its socket or goes away.

Protocol between a worker and the pool (pickled frames over the two pipes, see :mod:`.pool`): the worker sends
``("ready", pid)`` first. Each request is a batch, a list of ``(pred, gold, soft_timeout_s, yield_s)``:
two answer texts (the gold may start with :data:`EXACT_SYMBOLIC`, the ``exact_symbolic`` mode), the time the
comparison may take (0: no timer of its own) and how long it must have run before it
yields to a ``SIGUSR1`` from the parent (0: never); the worker answers every item with its own frame
``(index, verdict, detail, exiting)``, in order, as soon as it is decided, so the parent can hold each comparison to
its own deadline. ``verdict`` is ``"verified"``, ``"mismatch"``, ``"bad_gold"``, ``"timeout"``, ``"error"`` or
``"preempted"`` (stopped by the parent's signal, to be tried again later); ``exiting`` says the worker stops after
this reply (it hit its memory limit) and the rest of the batch must go elsewhere. A signal that arrives between
items, or before the current one has run ``yield_s``, is ignored: it was meant for an item that has ended.

Why a process: math-verify's own timeouts use ``signal.alarm`` (main thread only) and some inputs (a power tower
like ``5^{5^{5^5}}``) spin inside C code where no signal handler runs. Here the worker arms its own interval timer
per comparison (its ``soft_timeout_s``, a little under the parent's hard limit) so ordinary slow comparisons end
cleanly and the worker survives; anything that ignores the timer is killed by the parent at the hard limit.
``RLIMIT_AS`` turns a memory explosion (``10^{10^{10}}`` evaluated exactly) into a ``MemoryError`` instead of an
OOM kill of the host.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import select
import signal
import socket
import sys
import time
from functools import lru_cache
from multiprocessing.connection import Connection
from typing import Any

from rstar_env.data.numbers import plain_commas, strip_presentation


class _SoftTimeout(BaseException):
    """Raised by the interval timer. A BaseException, so sympy's and math-verify's ``except Exception`` blocks
    cannot swallow it."""


class _Preempted(BaseException):
    """Raised by the parent's ``SIGUSR1``: other answers wait, and this one has had its probe."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise _SoftTimeout


class _Current:
    """The comparison running now, for the preemption handler: when it started and when it may be stopped."""

    started: float | None = None
    yield_s: float = 0.0


def _on_preempt(signum: int, frame: Any) -> None:
    started = _Current.started
    if started is not None and _Current.yield_s > 0 and time.monotonic() - started >= _Current.yield_s:
        raise _Preempted


# Text that carries its own math markup (or a box): math-verify finds the answer in it as it would in a model's
# output. Anything else with an English word is prose ("The answer is 12 apples."), read the same way.
_MARKUP = re.compile(r"\$|\\\(|\\\[|\\boxed|\\fbox")
_COMMAND = re.compile(r"\\[A-Za-z]+(?:\s*\{[^{}]*\})?")
_WORD = re.compile(r"[A-Za-z]{3,}")


def is_bare_math(text: str) -> bool:
    """Whether ``text`` is a bare math answer (``\\frac{1}{2}``, ``(1, 2)``, ``x > 0``) rather than prose or
    text with its own delimiters. A bare answer is read as inline LaTeX, ``$text$``; the rest as math-verify reads
    a model's text. The same rule for the gold and the prediction, so identical strings always read alike."""
    if _MARKUP.search(text):
        return False
    return _WORD.search(_COMMAND.sub(" ", text)) is None


_INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)([^$]{1,2000}?)(?<!\\)\$|\\\((.{1,2000}?)\\\)", re.DOTALL)


def join_math_lines(text: str) -> str:
    """Inline math (``$...$``, ``\\(...\\)``) written over several lines, on one line: math-verify reads inline
    math only within a line (so a stray ``$`` cannot pair with one lines away), and ``$(1,\n2)$`` is the pair
    ``(1, 2)``. Only bare math is joined (no words, no blank line), so prose between two dollar signs stays apart."""
    if "\n" not in text:
        return text

    def joined(match: re.Match[str]) -> str:
        inner = match.group(1) if match.group(1) is not None else match.group(2)
        if "\n" not in inner or "\n\n" in inner or not is_bare_math(inner):
            return match.group(0)
        return match.group(0).replace("\n", " ")

    return _INLINE_MATH.sub(joined, text)


@lru_cache(maxsize=4096)
def read_answer(text: str) -> tuple[Any, ...]:
    """``text`` parsed by math-verify (cached: a group's rollouts share a gold, and often an answer)."""
    from math_verify import parse

    stripped = join_math_lines(strip_presentation(text.strip()))
    if not stripped:
        return ()
    plain = plain_commas(stripped)
    if plain is not None:
        stripped = plain  # "1,22" is 1.22 and "1,000" is 1000, as the fast path reads them: not pairs
    if is_bare_math(stripped):
        parsed = parse(f"${stripped}$", parsing_timeout=None)
        if parsed:
            return tuple(parsed)
    return tuple(parse(stripped, parsing_timeout=None))


EXACT_SYMBOLIC = "\x00exact_symbolic\x00"
"""The prefix of a gold text compared under the ``math`` reward's ``exact_symbolic`` option. The mode travels with
the gold (a NUL never starts a dataset's answer), so the pool, which treats both texts as opaque, carries it to the
worker, and the verdict cache keys the two modes apart."""


def with_mode(gold: str, exact_symbolic: bool) -> str:
    """``gold`` as sent to a worker: marked with :data:`EXACT_SYMBOLIC` when a symbolic gold needs an exact answer."""
    return EXACT_SYMBOLIC + gold if exact_symbolic else gold


def compare(pred: str, gold: str) -> tuple[str, str]:
    from math_verify import verify

    exact = gold.startswith(EXACT_SYMBOLIC)
    if exact:
        gold = gold[len(EXACT_SYMBOLIC) :]
    gold_parsed = read_answer(gold)
    if not gold_parsed:
        return "bad_gold", f"math-verify could not parse the gold answer {gold[:80]!r}"
    pred_parsed = read_answer(pred)
    if not pred_parsed:
        return "mismatch", "prediction not parseable"
    if exact and is_symbolic(gold_parsed):
        pred_parsed = exact_decimals(pred_parsed)
    # allow_set_relation_comp: a gold interval "(0,\\infty)" answered as "x > 0" is right; by default math-verify
    # compares set to relation only when the prediction is the set (a false negative on the other order).
    options: dict[str, Any] = {"allow_set_relation_comp": True}
    places = stated_places(pred)
    if places is not None and _exact_fractions(gold_parsed):
        options["float_rounding"] = places  # "(0.6, 2.6667]" for (3/5, 8/3]: at the precision the answer states
    ok = verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None, **options)
    return ("verified" if ok else "mismatch"), ""


def is_symbolic(parsed: tuple[Any, ...]) -> bool:
    """The gold, as parsed, is written with an irrational or transcendental part: a constant (``\\pi``, ``e``), a
    root or other non-integer power, or a function (a logarithm, a trigonometric value), and no decimal of its own.
    Under ``exact_symbolic`` such a gold needs an exact answer. A plain rational gold (``\\frac{1}{4}``, ``0.25``) is
    not symbolic; one written with a radical whose value is rational (``\\sqrt{4}``, ``\\log_2 8``) is, and a decimal
    that is exactly its value (``2.0``, ``3.0``) is still right (see :func:`exact_decimals`)."""
    from sympy import Basic, Float, Function, NumberSymbol, Pow

    if not parsed or not isinstance(parsed[0], Basic):
        return False
    gold = parsed[0]
    if gold.has(Float):
        return False  # a gold that is itself a decimal asks for no more precision than it states
    if gold.has(NumberSymbol, Function):
        return True
    return any(not power.exp.is_integer for power in gold.atoms(Pow))


def exact_decimals(parsed: tuple[Any, ...]) -> tuple[Any, ...]:
    """The prediction with every decimal read as the exact number it writes (``0.866025`` is 173205/200000), so
    math-verify's rounding of decimals never applies: ``0.866025`` is then not ``\\frac{\\sqrt{3}}{2}``, while
    ``0.5\\sqrt{3}`` still is. The texts math-verify also compares (the second element on) stay as they are."""
    from sympy import Basic, Float, Rational

    def exact(expr: Any) -> Any:
        if not isinstance(expr, Basic):
            return expr
        floats = expr.atoms(Float)
        return expr.xreplace({f: Rational(str(f)) for f in floats}) if floats else expr

    return (exact(parsed[0]), *parsed[1:])


_DECIMAL = re.compile(r"(?<![\w.])(\d*)\.(\d+)(?![\d.])")


def stated_places(text: str) -> int | None:
    """The decimal places of the most precise decimal of four significant digits or more in ``text`` (the
    precision the answer states), or ``None`` when it has none or states six places or more (math-verify's own
    rounding)."""
    places = [len(frac) for whole, frac in _DECIMAL.findall(text) if len((whole + frac).lstrip("0")) >= 4]
    if not places or max(places) >= 6:
        return None
    return max(places)


def _exact_fractions(parsed: tuple[Any, ...]) -> bool:
    """The gold is exact rationals only (numbers, tuples, sets, intervals of them), one with no finite decimal
    expansion: the only case where a decimal answer can be a rounding and nothing else (not ``\\pi``, ``\\sqrt2``,
    a float, a symbol)."""
    from sympy import Basic, Float, Function, NumberSymbol, Pow, Rational, Symbol

    if not parsed or not isinstance(parsed[0], Basic):
        return False
    gold = parsed[0]
    if gold.has(Float, Symbol, NumberSymbol, Function, Pow):
        return False
    fractions = gold.atoms(Rational)
    return any(_repeats(q.q) for q in fractions)


def _repeats(denominator: int) -> bool:
    for prime in (2, 5):
        while denominator % prime == 0:
            denominator //= prime
    return denominator != 1


_WARM_UP: tuple[tuple[str, str], ...] = (
    ("\\frac{1}{2}", "0.5"),
    ("The answer is $\\{1, 2\\}$.", "(0, \\infty)"),
    ("x^2+2x+1", "(x+1)^2"),
    ("\\frac{\\sqrt{3}}{2}", "\\dfrac{1}{2}\\sqrt3"),
    ("[1, 2) \\cup (3, \\infty)", "x > 0"),
    ("(1, -2)", "(1,-2)"),
    ("\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}"),
    ("y = 2x + 3", "y=3+2x"),
    ("2\\pi", "\\frac{4\\pi}{2}"),
    ("\\text{(A)}", "A"),
    ("50\\%", "0.5"),
    ("90^\\circ", "\\frac{\\pi}{2}"),
    ("\\boxed{1}, \\boxed{2}", "\\{1,2\\}"),
    ("3\\sqrt{2}", "\\sqrt{18}"),
    ("e^{i\\pi}", "-1"),
    ("\\log_2 8", "3"),
    ("x \\geq 2", "[2,\\infty)"),
    ("2+3i", "3i+2"),
    ("10!", "3628800"),
    ("The final answer is $12$.", "12"),
    ("\\binom{5}{2}", "10"),
    ("a^2 - b^2", "(a-b)(a+b)"),
    ("(2, 3)", "(3,2)"),
    ("[1, 2]", "[1,2)"),
    ("\\left[ -1, 1 \\right]", "(-\\infty, 0]"),
    ("(-3,3)", "[0, 1]"),
    ("\\left(2, 3\\right)", "(\\sqrt{2}, 1)"),
    ("[1, 2, 3]", "\\{1, 2, 3\\}"),
    ("(x-1)(x+2)", "x^2+x-2"),
    ("\\sin^2 x", "1 - \\cos^2 x"),
    ("\\frac{a}{b}", "a/b"),
    ("x = 3", "3"),
    ("5 \\text{ cm}", "5"),
)
"""Pairs compared once at start-up to warm the parsers."""


def load() -> None:
    """Import math-verify (in the template, once for every worker it forks)."""
    # Everything math-verify logs is either handled here (timeouts) or noise (its "timeout disabled" warning).
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)
    import math_verify  # noqa: F401  (import before the memory limit: imports map shared libraries)


def warm() -> None:
    """Import math-verify and bring its parsers to speed (in the template, once for every worker it forks)."""
    load()
    # The LaTeX parser (ANTLR) learns its prediction tables as it goes: a cold worker parses about twice as slowly
    # as a warm one. Warm it on the shapes answers take, once, before any worker is forked.
    for pred, gold in _WARM_UP:
        compare(pred, gold)
    read_answer.cache_clear()


def serve(reader: Connection, writer: Connection, memory_mb: int) -> None:
    """A worker: answer the batches that come on ``reader`` until the pool closes the pipe."""
    if memory_mb > 0:
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGUSR1, _on_preempt)
    writer.send(("ready", os.getpid()))
    while True:
        try:
            request = reader.recv()
        except (EOFError, OSError):
            return  # the parent closed the pipe or died: nothing left to do
        if request is None:
            return
        for index, (pred, gold, soft_timeout_s, yield_s) in enumerate(request):
            fatal = False
            try:
                _Current.yield_s = yield_s
                _Current.started = time.monotonic()
                signal.setitimer(signal.ITIMER_REAL, max(0.0, soft_timeout_s))
                try:
                    reply = compare(pred, gold)
                finally:
                    _Current.started = None  # first: a late SIGUSR1 must not stop what comes next
                    signal.setitimer(signal.ITIMER_REAL, 0)
            except _SoftTimeout:
                reply = ("timeout", f"math-verify took longer than {soft_timeout_s:.2f}s")
            except _Preempted:
                reply = ("preempted", "")
            except MemoryError:
                reply = ("error", f"math-verify exceeded the {memory_mb} MB memory limit")
                fatal = True  # the heap may be fragmented or half-built: start afresh
            except RecursionError:
                reply = ("error", "math-verify hit the recursion limit")
            except Exception as exc:
                reply = ("error", f"{type(exc).__name__}: {str(exc)[:200]}")
            try:
                writer.send((index, *reply, fatal))
            except (pickle.PicklingError, OSError):
                return
            if fatal:
                return


def _reap(*_: object) -> None:
    """Collect the template's workers that have exited (as SIGCHLD comes, so none stays a zombie)."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def template(control: socket.socket, memory_mb: int, warm_up: bool = True) -> None:
    """Fork a worker for each request on ``control``; return when the pool closes it or goes away. Without
    ``warm_up``, math-verify is imported but its parsers are left cold (each worker warms its own as it goes)."""
    warm() if warm_up else load()
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        if not select.select([control], [], [], 1.0)[0]:
            if os.getppid() != parent:
                return  # the pool's process died while a forked child of it holds the socket open
            continue
        try:
            message, fds, _, _ = socket.recv_fds(control, 1, 2)
        except OSError:
            return
        if not message:
            return  # the pool closed its end
        if len(fds) != 2:
            for fd in fds:
                os.close(fd)
            continue
        pid = os.fork()
        if pid == 0:  # the worker
            status = 1
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                control.close()
                serve(Connection(fds[0], writable=False), Connection(fds[1], readable=False), memory_mb)
                status = 0
            finally:
                os._exit(status)  # never back into the template's loop, whatever serve() raised
        for fd in fds:
            os.close(fd)


def main() -> None:
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    warm_up = sys.argv[2] != "cold" if len(sys.argv) > 2 else True
    # Standard input is the pool's socket; anything printed by library code goes to stderr.
    control = socket.socket(fileno=os.dup(0))
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the workers forked from here must not hold the pool's socket
    os.close(devnull)
    os.dup2(2, 1)
    template(control, memory_mb, warm_up)


if __name__ == "__main__":
    main()
