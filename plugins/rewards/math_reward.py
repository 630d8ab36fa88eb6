"""The ``math`` reward: is the response's final answer equal to the gold answer?

The answer is located first (:mod:`.extract`: the last ``<answer>`` block, read as math-verify reads a model's
text, several boxes as one answer; one linear pass, in a helper thread, never on the event loop). An answer block
longer than ``max_answer_chars`` with no box in it scores 0 with ``reason="answer too long"``. Then two stages,
cheapest first:

1. **Exact fast path** (:mod:`rstar_env.data.numbers`), in-process: when both answers read as plain numbers
   (integers, decimals, fractions, after stripping ``$``, spacing, thousands separators, ``\\text{}`` units,
   degrees, percent, ``\\dfrac``, a trailing period, ``x =``), the pair is decided by exact rational arithmetic.
   This is the AIME / DAPO case and never touches sympy.
2. **math-verify** for everything else (expressions, sets, intervals, tuples, matrices, equations, text): gold and
   answer text are parsed by the same rule (:func:`._worker.read_answer`), then ``verify(gold, pred)``, in a
   :class:`~.pool.VerifierPool` of warm worker processes with a hard wall-clock kill and a memory limit, fed by a
   queue that serves untried comparisons first. So ``score`` is safe from any thread or event loop, never blocks
   the loop, and a pathological answer (``5^{5^{5^5}}``, ``10^{10^{10}}``, megabytes of LaTeX) scores 0 with
   ``reason="timeout"`` after a bounded amount of its own work, without holding back the answers queued after it.
   With ``exact_symbolic``, a decimal in the answer counts as the exact number it writes when the gold is symbolic
   (a root, ``\\pi``, a logarithm...), so a printed approximation of an irrational gold is not accepted.

``reason`` codes (stable, short): ``exact`` (fast path, equal), ``verified`` (math-verify, equal), ``mismatch``
(either stage, not equal), ``no_answer`` (nothing extracted), ``answer too long``, ``timeout``, ``bad_gold`` (the
gold answer is empty or unreadable: a data problem, reward 0), ``error`` (math-verify failed; reward 0).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rstar_env.plugins import (
    compare_number_sets,
    compare_numbers,
    current_client,
    parse_number,
    plugin_options,
    same_answer,
    strip_presentation,
    text_answer,
)
from rstar_env.trajectory import RewardResult

from ._worker import with_mode
from .extract import Answer, Boxes, locate
from .pool import VerifierPool

REASONS: tuple[str, ...] = (
    "exact",
    "verified",
    "mismatch",
    "no_answer",
    "answer too long",
    "timeout",
    "bad_gold",
    "error",
)

# Verdicts that depend on the inputs only (not on load), and so may be cached.
_CACHEABLE = frozenset({"verified", "mismatch", "bad_gold"})

_live: weakref.WeakSet[MathReward] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for reward in list(_live):
        reward.close()


class MathOptions(BaseModel):
    """The ``math`` reward's options (``reward: {name: math, options: {...}}``), checked when a config loads."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    answer_block: bool = True
    """Read the answer from the last ``<answer>`` block (see :mod:`.extract`)."""
    boxed: bool = True
    """Read the ``\\boxed{}`` inside it."""
    fallback: bool = True
    """With no answer block, read the last ``\\boxed{}`` of the whole response."""
    boxes: Boxes = "final"
    """``final``: the final run of boxes is one answer; ``last``: the last box only (the rStar reference's rule)."""
    last_number: bool = False
    """With neither, answer with the last number: only for models too small to follow any format."""
    max_answer_chars: int = Field(8192, ge=1)
    """An answer block longer than this, with no box, scores 0 as ``answer too long``."""
    timeout_s: float = Field(3.0, gt=0)
    """Hard wall-clock limit of one math-verify comparison, in seconds."""
    memory_mb: int = Field(1024, ge=0)
    """Address-space limit of each worker process in MiB; 0 for none."""
    workers: int | None = Field(None, ge=1)
    """Worker processes, started on first use; ``None``: the CPUs this process may use, at most 8."""
    warm_up: bool = True
    """Warm math-verify's parsers once, before the workers are forked: about 1.3 CPU-seconds at start, and each
    worker's first answers then cost half as much. Off for a process that scores a few answers."""
    cache_size: int = Field(10_000, ge=0)
    """Verdicts remembered per ``(answer, gold)`` (a group's rollouts often agree); 0 disables the cache."""
    exact_symbolic: bool = False
    """A symbolic gold (a root, ``\\pi``, ``e``, a logarithm, a trigonometric value) needs an exact answer: a decimal
    in the answer counts as the exact number it writes, so ``0.866025`` is not ``\\frac{\\sqrt{3}}{2}``. Off: the
    decimal rounded to six places is accepted, as math-verify does (a tool-using model can print it)."""


class MathReward:
    """Reward 1.0 when the extracted final answer equals the gold answer, else 0.0.

    Options: :class:`MathOptions` (where the answer is read from, time and memory limits, workers, cache), given as
    the model or as keywords: ``MathReward(timeout_s=1.0, workers=2)``. A bad value raises
    :class:`~rstar_env.plugins.OptionsError` (a ``ValueError``) naming the option.

    ``score`` / ``score_batch`` are coroutines; ``score_sync`` is the blocking form for threads and scripts.
    ``timeout_s`` bounds an answer's own work, not its wait for a worker. The workers are shared fairly between
    calls: a comparison that has run ``timeout_s / 4`` (at most 0.5 s) while another call's answers wait yields
    to them and gets one full attempt of ``timeout_s`` later, or a ``timeout`` verdict within ``4 * timeout_s``
    of its request when slow answers leave no room for it (see :mod:`.pool`); within one ``score_batch`` the
    order is first come. Keep the env's ``reward_timeout_s`` above ``4 * timeout_s``. The first comparison after
    construction also waits for the workers to start, which ``start(wait=True)`` pays up front.
    Call ``close()`` (or use ``with``) to stop the workers; they are also stopped at interpreter exit. A closed
    reward restarts its workers if used again.
    """

    name: ClassVar[str] = "math"
    options_model: ClassVar[type[BaseModel]] = MathOptions

    def __init__(self, options: MathOptions | None = None, **settings: Any) -> None:
        self.options = opts = plugin_options(MathOptions, options, settings)
        self.answer_block = opts.answer_block
        self.boxed = opts.boxed
        self.fallback = opts.fallback
        self.boxes: Boxes = opts.boxes
        self.last_number = opts.last_number
        self.max_answer_chars = opts.max_answer_chars
        self.timeout_s = opts.timeout_s
        self.memory_mb = opts.memory_mb
        self.workers = opts.workers if opts.workers is not None else default_workers()
        self.cache_size = opts.cache_size
        self.exact_symbolic = opts.exact_symbolic
        self._cache: OrderedDict[tuple[str, str], tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: VerifierPool | None = None
        self._extractor: ThreadPoolExecutor | None = None
        self._executor_pid = os.getpid()
        _live.add(self)

    # -- public API ------------------------------------------------------------------------------------------------
    async def score(self, response: str, answer: str) -> RewardResult:
        """Score one final response against the gold ``answer``. Never raises for bad model output."""
        return (await self.score_batch([(response, answer)]))[0]

    async def score_batch(self, pairs: Sequence[tuple[str, str]]) -> list[RewardResult]:
        """Score ``(response, answer)`` pairs: extraction and the fast path in a helper thread (off the event loop),
        the rest queued for the workers, no thread held while they wait. Results are in input order."""
        loop = asyncio.get_running_loop()
        client = current_client.get()  # read here: the extractor thread does not inherit the caller's context
        staged = await loop.run_in_executor(self._get_extractor(), self._stage_all, list(pairs), client)
        waiting = [(i, item) for i, item in enumerate(staged) if isinstance(item, _Pending)]
        if waiting:
            # Cancelling this coroutine (the env's reward_timeout_s) cancels the comparisons not yet started.
            verdicts = await asyncio.gather(*(asyncio.wrap_future(item.future) for _, item in waiting))
            for (i, item), verdict in zip(waiting, verdicts, strict=True):
                staged[i] = self._settled(item, verdict)
        return [item for item in staged if isinstance(item, RewardResult)]

    def score_sync(self, response: str, answer: str) -> RewardResult:
        """Blocking ``score``, callable from any thread (including one that runs an event loop's callbacks)."""
        [item] = self._stage_all([(response, answer)])
        if isinstance(item, _Pending):
            return self._settled(item, item.future.result())
        return item

    def extract(self, response: str) -> str | None:
        """The final answer this reward reads from ``response`` (``None`` if there is none); several boxes read as
        one answer come back comma-separated."""
        found = self.locate(str(response))
        return found.shown if found is not None else None

    def locate(self, response: str) -> Answer | None:
        """The located answer (:class:`.extract.Answer`) with this reward's options."""
        return locate(
            response,
            answer_block=self.answer_block,
            boxed=self.boxed,
            fallback=self.fallback,
            last_number=self.last_number,
            boxes=self.boxes,
        )

    def start(self, wait: bool = False) -> None:
        """Start the worker processes now (otherwise they start on the first comparison that needs them);
        with ``wait``, block until they are ready, so the first comparisons pay no start-up."""
        self._get_pool().start(wait=wait)

    def warm_up(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Compare ``(response, answer)`` pairs on every worker and discard the verdicts (blocking). math-verify's
        LaTeX parser gets faster as it sees more answers; each worker is its own parser, so this brings all of them
        to a long run's steady state (a benchmark's warm-up, or a trainer's start on a few dataset rows)."""
        items = [item for item in self._prepare_all(list(pairs)) if not isinstance(item, RewardResult)]
        if items:
            self._get_pool().run_on_every_worker([(text, gold) for text, gold, _ in items])

    async def aclose(self) -> None:
        """``close()`` without blocking the event loop (what the env calls when it closes)."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop the workers and the helper threads. Safe to call twice; using the reward again restarts them."""
        with self._lock:
            pool, self._pool = self._pool, None
            extractor, self._extractor = self._extractor, None
        if pool is not None:
            pool.close()
        if extractor is not None:
            extractor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> MathReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MathReward:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------------------------
    def _prepare_all(self, pairs: list[tuple[str, str]]) -> list[RewardResult | tuple[str, str, str]]:
        return [self._prepare(response, answer) for response, answer in pairs]

    def _prepare(self, response: str, answer: str) -> RewardResult | tuple[str, str, str]:
        """Extraction and the fast path: a decided result, or ``(answer text, gold, shown)`` for math-verify."""
        found = self.locate(str(response))
        if found is None:
            return RewardResult(0.0, None, "no_answer")
        answer = str(answer)  # datasets sometimes store numeric answers as numbers
        gold_plain, gold = _gold_forms(answer)
        gold_words = text_answer(gold_plain)
        if gold_words is not None:
            # A word answer ("Yes", "\text{odd}"): its case says nothing, and math-verify cannot read it bare.
            pred_words = text_answer(found.single if found.single is not None else found.text)
            if pred_words is not None:
                same = pred_words == gold_words
                return RewardResult(float(same), found.shown, "exact" if same else "mismatch")
            if "\\" not in gold and "$" not in gold:
                gold = f"\\text{{{gold_plain.strip()}}}"  # so math-verify reads it, rather than call it bad
        if found.single is not None:
            single = strip_presentation(found.single)
            if same_answer(single, gold_plain):
                return RewardResult(1.0, found.shown, "exact")
            pred_num = parse_number(single)
            if pred_num is not None:
                gold_num = parse_number(gold_plain)
                if gold_num is not None:
                    decided = compare_numbers(pred_num, gold_num)
                    if decided is True:
                        return RewardResult(1.0, found.shown, "exact")
                    if decided is False:
                        return RewardResult(0.0, found.shown, "mismatch")
            decided = compare_number_sets(single, strip_presentation(gold_plain))
            if decided is not None:
                return RewardResult(float(decided), found.shown, "exact" if decided else "mismatch")
        text = found.text
        if len(text) > self.max_answer_chars:
            # A long block is read through its boxes; a long one with none has no answer we can judge in time.
            if found.boxes is None or len(found.boxes) > self.max_answer_chars:
                return RewardResult(0.0, None, "answer too long")
            text = found.boxes
        return text, with_mode(gold, self.exact_symbolic), found.shown

    def _stage_all(self, pairs: list[tuple[str, str]], client: str | None = None) -> list[RewardResult | _Pending]:
        """Extraction, the fast path and the verdict cache; what is left is submitted to the pool (never waits),
        queued under ``client`` (whose answers these are: clients are served in turn)."""
        staged: list[RewardResult | _Pending] = []
        sends: list[_Pending] = []
        for item in self._prepare_all(pairs):
            if isinstance(item, RewardResult):
                staged.append(item)
                continue
            text, gold, shown = item
            cached = self._cache_get((text, gold))
            if cached is not None:
                staged.append(_result(cached, shown))
            else:
                pending = _Pending(text, gold, shown)
                sends.append(pending)
                staged.append(pending)
        if sends:
            # A pool that cannot start (math-verify missing, a broken interpreter) settles the futures with
            # RuntimeError and the worker's stderr: a broken install, not bad model output, never a silent 0.
            futures = self._get_pool().submit([(item.text, item.gold) for item in sends], client=client)
            for item, future in zip(sends, futures, strict=True):
                item.future = future
        return staged

    def _settled(self, item: _Pending, verdict: tuple[str, str]) -> RewardResult:
        if verdict[0] in _CACHEABLE:
            self._cache_put((item.text, item.gold), verdict)
        return _result(verdict, item.shown)

    def _get_pool(self) -> VerifierPool:
        with self._lock:
            if self._pool is not None and self._pool.owner_pid != os.getpid():
                # Forked (a data-loader worker, say): the workers and threads belong to the parent; start afresh.
                self._pool.close()
                self._pool, self._extractor = None, None
            if self._pool is None:
                self._pool = VerifierPool(self.workers, self.timeout_s, self.memory_mb, warm_up=self.options.warm_up)
            return self._pool

    def _get_extractor(self) -> ThreadPoolExecutor:
        # Extraction and the fast path are linear and short, but a megabyte response still takes milliseconds:
        # they run here, never on the event loop's thread, and never queue behind a slow math-verify batch.
        with self._lock:
            if self._executor_pid != os.getpid():  # forked: the parent's threads are not ours
                self._executor_pid = os.getpid()
                self._extractor = None
            if self._extractor is None:
                self._extractor = ThreadPoolExecutor(2, thread_name_prefix="math-reward-extract")
            return self._extractor

    def _cache_get(self, key: tuple[str, str]) -> tuple[str, str] | None:
        if self.cache_size <= 0:
            return None
        with self._lock:
            value = self._cache.get(key)
            if value is not None:
                self._cache.move_to_end(key)
            return value

    def _cache_put(self, key: tuple[str, str], value: tuple[str, str]) -> None:
        if self.cache_size <= 0:
            return
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)


class _Pending:
    """A comparison sent to the worker pool; its verdict comes in ``future``."""

    __slots__ = ("future", "gold", "shown", "text")

    def __init__(self, text: str, gold: str, shown: str) -> None:
        self.text, self.gold, self.shown = text, gold, shown
        self.future: Future[tuple[str, str]] = Future()


def _result(verdict: tuple[str, str], shown: str) -> RewardResult:
    return RewardResult(1.0 if verdict[0] == "verified" else 0.0, shown, verdict[0])


def default_workers() -> int:
    """The CPUs this process may use (its affinity mask), at most 8: math-verify is CPU-bound, one per core."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def _gold_forms(answer: str) -> tuple[str, str]:
    """``(plain, text)``: the gold as the fast path reads it, and as math-verify reads it.

    Gold answers sometimes arrive as a whole solution or ``\\boxed{...}``: the answer is their final run of
    boxes, found as in a response (:mod:`.extract`), so ``\\boxed{1}, \\boxed{2}`` is the list ``1, 2`` (never
    its last box alone) and math-verify reads gold and answer boxes alike."""
    if "\\box" in answer or "\\fbox" in answer:
        found = locate(answer, answer_block=False, boxed=True, fallback=True, boxes="final")
        if found is not None:
            return found.shown, answer if found.single is not None else found.text
    return answer, answer
