"""The ``math`` reward: is the response's final answer equal to the gold answer?

Two stages, cheapest first:

1. **Exact fast path** (:mod:`.normalize`), in-process, microseconds: when both answers read as plain numbers
   (integers, decimals, fractions, after stripping ``$``, spacing, thousands separators, ``\\text{}`` units,
   degrees, percent, ``\\dfrac``, a trailing period, ``x =``), the pair is decided by exact rational arithmetic.
   This is the AIME / DAPO case and never touches sympy.
2. **math-verify** for everything else (expressions, sets, intervals, tuples, matrices, equations, text),
   ``parse`` of the gold first, then ``verify(gold, pred)``, in a :class:`~.pool.VerifierPool` of worker
   processes with a hard wall-clock kill and a memory limit. So ``score`` is safe from any thread or event loop,
   never blocks the loop, and a pathological answer (``5^{5^{5^5}}``, ``10^{10^{10}}``, megabytes of LaTeX) costs
   at most ``timeout_s`` and scores 0 with ``reason="timeout"``.

``reason`` codes (stable, short): ``exact`` (fast path, equal), ``verified`` (math-verify, equal), ``mismatch``
(either stage, not equal), ``no_answer`` (nothing extracted), ``timeout``, ``bad_gold`` (the gold answer is empty
or unreadable: a data problem, reward 0), ``error`` (the verifier failed; reward 0).
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

from rstar_env.format import answer_blocks, extract_answer, last_boxed
from rstar_env.trajectory import RewardResult

from .normalize import compare_numbers, parse_number
from .pool import VerifierPool

REASONS: tuple[str, ...] = ("exact", "verified", "mismatch", "no_answer", "timeout", "bad_gold", "error")

# Verdicts that depend on the inputs only (not on load), and so may be cached.
_CACHEABLE = frozenset({"verified", "mismatch", "bad_gold"})

_live: weakref.WeakSet[MathReward] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for reward in list(_live):
        reward.close()


class MathReward:
    """Reward 1.0 when the extracted final answer equals the gold answer, else 0.0.

    Options: ``answer_block``, ``boxed``, ``fallback``, ``last_number`` (where the answer is read from, see
    :func:`rstar_env.format.extract_answer`; ``last_number`` is only for models too small to follow any format);
    ``timeout_s`` (hard wall-clock limit per math-verify comparison);
    ``memory_mb`` (address-space limit per worker, 0 for none); ``workers`` (worker processes, started on first
    use); ``cache_size`` (verdicts remembered per ``(answer, gold)``: a group's rollouts often agree, 0 disables).

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
        last_number: bool = False,
        timeout_s: float = 3.0,
        memory_mb: int = 1024,
        workers: int = 2,
        cache_size: int = 10_000,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"math reward: timeout_s must be > 0 seconds, got {timeout_s}")
        if workers < 1:
            raise ValueError(f"math reward: workers must be >= 1, got {workers}")
        if memory_mb < 0:
            raise ValueError(f"math reward: memory_mb must be >= 0 (0 disables the limit), got {memory_mb}")
        self.answer_block = answer_block
        self.boxed = boxed
        self.fallback = fallback
        self.last_number = last_number
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)
        self.workers = int(workers)
        self.cache_size = int(cache_size)
        self._cache: OrderedDict[tuple[str, bool, str], tuple[str, str]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: VerifierPool | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._executor_pid = os.getpid()
        _live.add(self)

    # -- public API ------------------------------------------------------------------------------------------------
    async def score(self, response: str, answer: str) -> RewardResult:
        """Score one final response against the gold ``answer``. Never raises for bad model output."""
        extracted, quick = self._prepare(response, answer)
        if quick is not None:
            return quick
        assert extracted is not None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._get_executor(), self._slow, extracted, response, answer)

    async def score_batch(self, pairs: Sequence[tuple[str, str]]) -> list[RewardResult]:
        """Score ``(response, answer)`` pairs: the fast path in-process, the rest fanned out to the workers.
        Results are in input order."""
        results: list[RewardResult | None] = []
        pending: list[tuple[int, str, str, str]] = []
        for i, (response, answer) in enumerate(pairs):
            extracted, quick = self._prepare(response, answer)
            results.append(quick)
            if quick is None:
                assert extracted is not None
                pending.append((i, extracted, response, answer))
        if pending:
            loop = asyncio.get_running_loop()
            executor = self._get_executor()
            slow = await asyncio.gather(
                *(loop.run_in_executor(executor, self._slow, ex, resp, ans) for _, ex, resp, ans in pending)
            )
            for (i, *_), result in zip(pending, slow, strict=True):
                results[i] = result
        return [r for r in results if r is not None]

    def score_sync(self, response: str, answer: str) -> RewardResult:
        """Blocking ``score``, callable from any thread (including one that runs an event loop's callbacks)."""
        extracted, quick = self._prepare(response, answer)
        if quick is not None:
            return quick
        assert extracted is not None
        return self._slow(extracted, response, answer)

    def extract(self, response: str) -> str | None:
        """The final answer this reward reads from ``response`` (``None`` if there is none)."""
        return extract_answer(
            response,
            answer_block=self.answer_block,
            boxed=self.boxed,
            fallback=self.fallback,
            last_number=self.last_number,
        )

    def start(self, wait: bool = False) -> None:
        """Start the worker processes now (otherwise they start on the first comparison that needs them);
        with ``wait``, block until they are ready, so the first comparisons pay no start-up."""
        self._get_pool().start(wait=wait)

    async def aclose(self) -> None:
        """``close()`` without blocking the event loop (what the env calls when it closes)."""
        await asyncio.to_thread(self.close)

    def close(self) -> None:
        """Stop the workers and the helper threads. Safe to call twice; using the reward again restarts them."""
        with self._lock:
            pool, self._pool = self._pool, None
            executor, self._executor = self._executor, None
        if pool is not None:
            pool.close()
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> MathReward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> MathReward:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------------------------------
    def _prepare(self, response: str, answer: str) -> tuple[str | None, RewardResult | None]:
        """Extraction and the fast path. Returns ``(extracted, result)``; ``result`` is None when math-verify must
        decide."""
        extracted = self.extract(str(response))
        if extracted is None or not extracted.strip():
            return None, RewardResult(0.0, None, "no_answer")
        pred_num = parse_number(extracted)
        if pred_num is not None:
            gold_num = parse_number(_gold_text(str(answer)))
            if gold_num is not None:
                decided = compare_numbers(pred_num, gold_num)
                if decided is True:
                    return extracted, RewardResult(1.0, extracted, "exact")
                if decided is False:
                    return extracted, RewardResult(0.0, extracted, "mismatch")
        return extracted, None

    def _slow(self, extracted: str, response: str, answer: str) -> RewardResult:
        is_latex = self._came_from_box(response)
        answer = str(answer)  # datasets sometimes store numeric answers as numbers
        key = (extracted, is_latex, answer)
        verdict = self._cache_get(key)
        if verdict is None:
            # A pool that cannot start (math-verify missing, a broken interpreter) raises RuntimeError with the
            # worker's stderr: that is a broken install, not bad model output, and must not silently score 0.
            verdict = self._get_pool().run(extracted, is_latex, answer)
            if verdict[0] in _CACHEABLE:
                self._cache_put(key, verdict)
        code = verdict[0]
        return RewardResult(1.0 if code == "verified" else 0.0, extracted, code)

    def _came_from_box(self, response: str) -> bool:
        # Mirrors extract_answer: a boxed answer is handed to math-verify boxed; free text in an answer block is
        # handed over as text, so math-verify's own extraction ("the answer is 42") can find it.
        if not self.boxed:
            return False
        if self.answer_block:
            blocks = answer_blocks(response)
            if blocks:
                return last_boxed(blocks[-1]) is not None
            if not self.fallback:
                return False
        return last_boxed(response) is not None

    def _get_pool(self) -> VerifierPool:
        with self._lock:
            if self._pool is not None and self._pool.owner_pid != os.getpid():
                # Forked (a data-loader worker, say): the workers and threads belong to the parent; start afresh.
                self._pool.close()
                self._pool, self._executor = None, None
            if self._pool is None:
                self._pool = VerifierPool(self.workers, self.timeout_s, self.memory_mb)
            return self._pool

    def _get_executor(self) -> ThreadPoolExecutor:
        # One thread per worker process: each thread blocks on one comparison, so more would only queue.
        with self._lock:
            if self._executor is None or self._executor_pid != os.getpid():
                self._executor_pid = os.getpid()
                self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="math-reward")
            return self._executor

    def _cache_get(self, key: tuple[str, bool, str]) -> tuple[str, str] | None:
        if self.cache_size <= 0:
            return None
        with self._lock:
            value = self._cache.get(key)
            if value is not None:
                self._cache.move_to_end(key)
            return value

    def _cache_put(self, key: tuple[str, bool, str], value: tuple[str, str]) -> None:
        if self.cache_size <= 0:
            return
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)


def _gold_text(answer: str) -> str:
    # Gold answers sometimes arrive as a whole solution or "\boxed{...}"; the number is in the box.
    inner = last_boxed(answer) if "\\box" in answer or "\\fbox" in answer else None
    return inner if inner is not None else answer
