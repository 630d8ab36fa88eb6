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
   :class:`~.pool.VerifierPool` of warm worker processes (a batch goes to each worker in one message) with a hard
   wall-clock kill and a memory limit. So ``score`` is safe from any thread or event loop, never blocks the loop,
   and a pathological answer (``5^{5^{5^5}}``, ``10^{10^{10}}``, megabytes of LaTeX) costs at most ``timeout_s``
   and scores 0 with ``reason="timeout"``.

``reason`` codes (stable, short): ``exact`` (fast path, equal), ``verified`` (math-verify, equal), ``mismatch``
(either stage, not equal), ``no_answer`` (nothing extracted), ``answer too long``, ``timeout``, ``bad_gold`` (the
gold answer is empty or unreadable: a data problem, reward 0), ``error`` (the verifier failed; reward 0).
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

from rstar_env.data.numbers import compare_number_sets, compare_numbers, parse_number, same_answer
from rstar_env.format import last_boxed
from rstar_env.trajectory import RewardResult

from .extract import Answer, Boxes, locate
from .pool import VerifierPool

REASONS: tuple[str, ...] = (
    "exact", "verified", "mismatch", "no_answer", "answer too long", "timeout", "bad_gold", "error",
)

# Verdicts that depend on the inputs only (not on load), and so may be cached.
_CACHEABLE = frozenset({"verified", "mismatch", "bad_gold"})

_live: weakref.WeakSet[MathReward] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for reward in list(_live):
        reward.close()


class MathReward:
    """Reward 1.0 when the extracted final answer equals the gold answer, else 0.0.

    Options: ``answer_block``, ``boxed``, ``fallback``, ``boxes`` (where the answer is read from, see
    :mod:`.extract`; ``boxes="last"`` is the rStar reference's last-``\\boxed{}`` rule), ``last_number`` (only for
    models too small to follow any format); ``max_answer_chars`` (an answer block longer than this, with no box,
    scores 0 as ``answer too long``); ``timeout_s`` (hard wall-clock limit per math-verify comparison);
    ``memory_mb`` (address-space limit per worker, 0 for none); ``workers`` (worker processes, started on first
    use; default: the CPUs this process may use, at most 8); ``cache_size`` (verdicts remembered per
    ``(answer, gold)``: a group's rollouts often agree, 0 disables).

    ``score`` / ``score_batch`` are coroutines; ``score_sync`` is the blocking form for threads and scripts.
    ``timeout_s`` bounds each comparison once a worker has it; the first comparison after construction also waits
    for the workers to start (about half a second), which ``start(wait=True)`` pays up front, and when every worker
    is busy a comparison waits its turn.
    Call ``close()`` (or use ``with``) to stop the workers; they are also stopped at interpreter exit. A closed
    reward restarts its workers if used again.
    """

    name: ClassVar[str] = "math"

    def __init__(
        self,
        *,
        answer_block: bool = True,
        boxed: bool = True,
        fallback: bool = True,
        boxes: Boxes = "final",
        last_number: bool = False,
        max_answer_chars: int = 8192,
        timeout_s: float = 3.0,
        memory_mb: int = 1024,
        workers: int | None = None,
        cache_size: int = 10_000,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"math reward: timeout_s must be > 0 seconds, got {timeout_s}")
        if workers is None:
            workers = default_workers()
        if workers < 1:
            raise ValueError(f"math reward: workers must be >= 1, got {workers}")
        if memory_mb < 0:
            raise ValueError(f"math reward: memory_mb must be >= 0 (0 disables the limit), got {memory_mb}")
        if boxes not in ("final", "last"):
            raise ValueError(f"math reward: boxes must be 'final' (the final run of boxes is one answer) or 'last' "
                             f"(the last box only, as the rStar reference), got {boxes!r}")
        if max_answer_chars < 1:
            raise ValueError(f"math reward: max_answer_chars must be >= 1, got {max_answer_chars}")
        self.answer_block = answer_block
        self.boxed = boxed
        self.fallback = fallback
        self.boxes: Boxes = boxes
        self.last_number = last_number
        self.max_answer_chars = int(max_answer_chars)
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.workers = int(workers)
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[tuple[str, str], tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: VerifierPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._extractor: ThreadPoolExecutor | None = None
        self._executor_pid = os.getpid()
        _live.add(self)

    # -- public API ------------------------------------------------------------------------------------------------
    async def score(self, response: str, answer: str) -> RewardResult:
        """Score one final response against the gold ``answer``. Never raises for bad model output."""
        return (await self.score_batch([(response, answer)]))[0]

    async def score_batch(self, pairs: Sequence[tuple[str, str]]) -> list[RewardResult]:
        """Score ``(response, answer)`` pairs: extraction and the fast path in a helper thread (off the event loop),
        the rest in batches, one per worker. Results are in input order."""
        loop = asyncio.get_running_loop()
        pairs = list(pairs)
        prepared = await loop.run_in_executor(self._get_extractor(), self._prepare_all, pairs)
        pending = [(i, item) for i, item in enumerate(prepared) if not isinstance(item, RewardResult)]
        results: list[RewardResult | None] = [item if isinstance(item, RewardResult) else None for item in prepared]
        if pending:
            executor = self._get_executor()
            # Interleaved slices, so each worker gets a like share of easy and hard comparisons.
            slices = [pending[k :: self.workers] for k in range(min(self.workers, len(pending)))]
            answers = await asyncio.gather(*(
                loop.run_in_executor(executor, self._slow_many, [item for _, item in part]) for part in slices
            ))
            for part, verdicts in zip(slices, answers, strict=True):
                for (i, _), result in zip(part, verdicts, strict=True):
                    results[i] = result
        return [r for r in results if r is not None]

    def score_sync(self, response: str, answer: str) -> RewardResult:
        """Blocking ``score``, callable from any thread (including one that runs an event loop's callbacks)."""
        item = self._prepare(response, answer)
        if isinstance(item, RewardResult):
            return item
        return self._slow_many([item])[0]

    def extract(self, response: str) -> str | None:
        """The final answer this reward reads from ``response`` (``None`` if there is none); several boxes read as
        one answer come back comma-separated."""
        found = self.locate(str(response))
        return found.shown if found is not None else None

    def locate(self, response: str) -> Answer | None:
        """The located answer (:class:`.extract.Answer`) with this reward's options."""
        return locate(response, answer_block=self.answer_block, boxed=self.boxed, fallback=self.fallback,
                      last_number=self.last_number, boxes=self.boxes)

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
            executor, self._executor = self._executor, None
            extractor, self._extractor = self._extractor, None
        if pool is not None:
            pool.close()
        for ex in (executor, extractor):
            if ex is not None:
                ex.shutdown(wait=False, cancel_futures=True)

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
        if found.single is not None:
            if same_answer(found.single, _gold_text(answer)):
                return RewardResult(1.0, found.shown, "exact")
            pred_num = parse_number(found.single)
            if pred_num is not None:
                gold_num = parse_number(_gold_text(answer))
                if gold_num is not None:
                    decided = compare_numbers(pred_num, gold_num)
                    if decided is True:
                        return RewardResult(1.0, found.shown, "exact")
                    if decided is False:
                        return RewardResult(0.0, found.shown, "mismatch")
            decided = compare_number_sets(found.single, _gold_text(answer))
            if decided is not None:
                return RewardResult(float(decided), found.shown, "exact" if decided else "mismatch")
        text = found.text
        if len(text) > self.max_answer_chars:
            # A long block is read through its boxes; a long one with none has no answer we can judge in time.
            if found.boxes is None or len(found.boxes) > self.max_answer_chars:
                return RewardResult(0.0, None, "answer too long")
            text = found.boxes
        return text, answer, found.shown

    def _slow_many(self, items: list[tuple[str, str, str]]) -> list[RewardResult]:
        verdicts: list[tuple[str, str] | None] = [self._cache_get((text, gold)) for text, gold, _ in items]
        missing = [i for i, verdict in enumerate(verdicts) if verdict is None]
        if missing:
            # A pool that cannot start (math-verify missing, a broken interpreter) raises RuntimeError with the
            # worker's stderr: that is a broken install, not bad model output, and must not silently score 0.
            fresh = self._get_pool().run_many([(items[i][0], items[i][1]) for i in missing])
            for i, verdict in zip(missing, fresh, strict=True):
                verdicts[i] = verdict
                if verdict[0] in _CACHEABLE:
                    self._cache_put((items[i][0], items[i][1]), verdict)
        out = []
        for (_, _, shown), verdict in zip(items, verdicts, strict=True):
            assert verdict is not None
            out.append(RewardResult(1.0 if verdict[0] == "verified" else 0.0, shown, verdict[0]))
        return out

    def _get_pool(self) -> VerifierPool:
        with self._lock:
            if self._pool is not None and self._pool.owner_pid != os.getpid():
                # Forked (a data-loader worker, say): the workers and threads belong to the parent; start afresh.
                self._pool.close()
                self._pool, self._executor, self._extractor = None, None, None
            if self._pool is None:
                self._pool = VerifierPool(self.workers, self.timeout_s, self.memory_mb)
            return self._pool

    def _get_executor(self) -> ThreadPoolExecutor:
        # One thread per worker process: each thread blocks on one batch, so more would only queue.
        with self._lock:
            if self._executor_pid != os.getpid():  # forked: the parent's threads are not ours
                self._executor_pid = os.getpid()
                self._executor, self._extractor = None, None
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="math-reward")
            return self._executor

    def _get_extractor(self) -> ThreadPoolExecutor:
        # Extraction and the fast path are linear and short, but a megabyte response still takes milliseconds:
        # they run here, never on the event loop's thread, and never queue behind a slow math-verify batch.
        with self._lock:
            if self._executor_pid != os.getpid():  # forked: the parent's threads are not ours
                self._executor_pid = os.getpid()
                self._executor, self._extractor = None, None
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


def default_workers() -> int:
    """The CPUs this process may use (its affinity mask), at most 8: math-verify is CPU-bound, one per core."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(8, cpus))


def _gold_text(answer: str) -> str:
    # Gold answers sometimes arrive as a whole solution or "\boxed{...}"; the number is in the box.
    inner = last_boxed(answer) if "\\box" in answer or "\\fbox" in answer else None
    return inner if inner is not None else answer
