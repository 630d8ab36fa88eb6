"""``rstar-env bench sandbox``: the ``local`` fork-server pool against what users would write instead, side by side.

The baseline (``python -c``) is a plain ``subprocess.run([sys.executable, "-c", code])`` per call, with no
isolation at all: what a user picks without a sandbox library. The project's own ``subprocess`` backend (a fresh
interpreter per call, with the worker's limits) may be added as a second reference.

Workloads (each measured on every backend, at concurrency 1 and at 4x the cores, in one run):

* **print**: ``print(1 + 1)``, the floor cost of one tool call;
* **sympy**: import sympy and simplify an expression (a typical math-tool call);
* **session**: a stateful episode of two calls (define, then use) and ``close_session``: one op = 2 calls.

Each (backend, workload, concurrency) cell runs ``--calls`` ops or until ``--budget-s`` seconds pass, whichever
comes first (the baseline is slow), after a warm-up. Latency is per op as the caller sees it (queueing included);
ops/s is ops over wall time. Ratios compare every backend with the ``python -c`` baseline measured in the same run
(the baseline has no sessions: its session cells are left out). Every backend stays open for the whole run and
each cell is measured on every backend in turn, so that a change in the machine's load weighs on all alike. A
backend may carry options, ``NAME:KEY=VALUE,...`` (``local:pid_namespace=false``): two settings of one backend
then run side by side.

Head-of-line scenarios (each backend at its *default* settings, median of ``--repeats`` runs):

* **sleep**: 16 concurrent calls of ``time.sleep(0.5)``: seconds until all are done;
* **mixed**: 2 calls of ``while True: pass`` (timeout 5 s), then 14 ``print`` calls: seconds until every print
  is done (the spinners are waited for, outside the figure, before the next run);
* **sessions**: 16 stateful sessions, each one call of ``time.sleep(0.5)``: seconds until all are done;
* **vector**: one ``step`` of a 16-episode vector env whose every action calls the ``python`` tool with
  ``time.sleep(0.5)``: seconds for the step.

Channel (only when asked for: ``--workload pagecache``): the bits per second one episode can still pass to a
later one through the page cache of the files they share, by timing reads, and by the fault-around that
``/proc/self/pagemap`` shows (``--rounds`` rounds of 64 bits each; see :mod:`rstar_env.bench._sandbox_channels`).

``--soak N`` then runs N mixed calls on a fresh ``local`` pool and reports what leaked: processes below this
one beyond the pool's own, file descriptors of this process, and the pool's memory (PSS of the zygote and its
idle workers) before and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import click

from rstar_env.sandbox import BACKENDS, ExecResult, Sandbox, create_sandbox

from ._sandbox_channels import page_cache_channel

CHANNELS = ("pagecache",)
"""Channels between episodes that ``--workload`` can measure (bits per second), only when named."""

BASELINE = "python -c"
"""The row every ratio is taken against: ``subprocess.run([sys.executable, "-c", code])``."""


class PlainPython:
    """The baseline: ``subprocess.run([sys.executable, "-c", code])`` per call, in a thread (no isolation, no
    limits, no sessions). Quacks like a sandbox for the stateless workloads."""

    def __init__(self, *, timeout_s: float = 30.0, **_options: Any) -> None:
        self.timeout_s = timeout_s

    async def __aenter__(self) -> PlainPython:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def _run(self, code: str, stdin: str, timeout_s: float) -> ExecResult:
        start = time.perf_counter()
        try:
            done = subprocess.run(
                [sys.executable, "-c", code], input=stdin, capture_output=True, text=True, timeout=timeout_s
            )
        except subprocess.TimeoutExpired:
            return ExecResult("", "", "timeout", "timed out", time.perf_counter() - start)
        status = "ok" if done.returncode == 0 else "error"
        return ExecResult(done.stdout, done.stderr, status, None, time.perf_counter() - start)

    async def execute(
        self, code: str, *, stdin: str = "", session: str | None = None, timeout_s: float | None = None
    ) -> ExecResult:
        if session is not None:
            raise ValueError("the python -c baseline has no sessions")
        return await asyncio.to_thread(self._run, code, stdin, timeout_s or self.timeout_s)

    async def close_session(self, session: str) -> None:
        return None


def parse_backend(spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME`` or ``NAME:KEY=VALUE,...`` -> the backend's name and its extra options (values read as JSON where
    they parse: ``false``, ``2``; else kept as text)."""
    name, _, rest = spec.partition(":")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"backend option {item!r} in {spec!r} is not KEY=VALUE")
        try:
            options[key] = json.loads(value)
        except ValueError:
            options[key] = value
    return name, options


def _open(backend: str, **options: Any) -> Any:
    """A sandbox (or the baseline) for a backend spec (see :func:`parse_backend`); ``options`` under the spec's."""
    if backend == BASELINE:
        return PlainPython(**options)
    name, extra = parse_backend(backend)
    return create_sandbox(name, **{**options, **extra})


SYMPY_CODE = """\
import sympy as sp
x = sp.symbols("x")
print(sp.simplify((x**3 - 1) / (x - 1)))
"""
"""A typical tool call: the import dominates a fresh interpreter; the simplification itself takes ~5-10 ms."""


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    run: Callable[[Sandbox, str], Awaitable[bool]]
    """One op on a sandbox; ``tag`` is unique per op. Returns whether the output was right."""


async def _print(box: Sandbox, tag: str) -> bool:
    result = await box.execute("print(1 + 1)")
    return result.ok and result.stdout == "2\n"


async def _sympy(box: Sandbox, tag: str) -> bool:
    result = await box.execute(SYMPY_CODE)
    return result.ok and result.stdout == "x**2 + x + 1\n"


async def _session(box: Sandbox, tag: str) -> bool:
    first = await box.execute("a = 6 * 7", session=tag)
    second = await box.execute("print(a)", session=tag)
    await box.close_session(tag)
    return first.ok and second.stdout == "42\n"


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("print", "print(1 + 1)", _print),
        Workload("sympy", "import sympy; simplify an expression", _sympy),
        Workload("session", "stateful: 2 calls + close", _session),
    )
}

SLEEP_CODE = "import time\ntime.sleep(0.5)"


async def _warm(box: Sandbox) -> None:
    """One call, then (for the local pool) wait until every spare is forked: a pool in steady use."""
    await box.execute("1")
    pool = getattr(box, "pool", None)
    if pool is not None:
        await asyncio.to_thread(_settle, box, pool.resting_size(), 10.0)


async def _sleep_scenario(backend: str) -> tuple[float, bool]:
    async with _open(backend, timeout_s=5.0) as box:
        await _warm(box)
        start = time.perf_counter()
        results = await asyncio.gather(*(box.execute(SLEEP_CODE) for _ in range(16)))
        return time.perf_counter() - start, all(r.ok for r in results)


async def _mixed_scenario(backend: str) -> tuple[float, bool]:
    async with _open(backend, timeout_s=5.0) as box:
        await _warm(box)
        start = time.perf_counter()
        spinners = [asyncio.ensure_future(box.execute("while True:\n    pass")) for _ in range(2)]
        await asyncio.sleep(0.05)  # the spinners take their workers first

        async def printed(i: int) -> tuple[bool, float]:
            result = await box.execute(f"print({i})")
            return result.stdout == f"{i}\n", time.perf_counter() - start

        done = await asyncio.gather(*(printed(i) for i in range(14)))
        spun = await asyncio.gather(*spinners)
        return max(t for _, t in done), all(ok for ok, _ in done) and all(r.status == "timeout" for r in spun)


async def _sessions_scenario(backend: str) -> tuple[float, bool]:
    # Each open local session reserves memory_mb of the pool (docs/security.md): 16 small ones, on any machine.
    budgets = {"memory_mb": 256, "pool_memory_mb": 17 * 256} if parse_backend(backend)[0] == "local" else {}
    async with _open(backend, timeout_s=5.0, **budgets) as box:
        await _warm(box)
        start = time.perf_counter()
        results = await asyncio.gather(*(box.execute(SLEEP_CODE, session=f"s{i}") for i in range(16)))
        elapsed = time.perf_counter() - start
        await asyncio.gather(*(box.close_session(f"s{i}") for i in range(16)))
        return elapsed, all(r.ok for r in results)


async def _vector_scenario(backend: str) -> tuple[float, bool]:
    import gymnasium

    import rstar_env  # noqa: F401  (registers the env ids)
    from rstar_env.testing import python_call

    name, extra = parse_backend(backend)
    tools = [{"name": "python", "options": {"backend": name, "timeout_s": 5.0, "sandbox_options": extra}}]
    rows = [{"problem": f"p{i}", "answer": str(i)} for i in range(16)]
    envs = gymnasium.make_vec(
        "rstar_env/MathTool-v0", num_envs=16, vectorization_mode="vector_entry_point", tools=tools, max_turns=4
    )
    vec = envs.unwrapped
    try:
        await vec.areset(options={"rows": rows})
        await vec.astep([python_call("1")] * 16)  # starts the sandbox
        start = time.perf_counter()
        obs, *_ = await vec.astep([python_call(SLEEP_CODE)] * 16)
        elapsed = time.perf_counter() - start
        return elapsed, all("rror" not in o and "timed out" not in o for o in obs)
    finally:
        await asyncio.to_thread(envs.close)


SCENARIOS: dict[str, tuple[str, Callable[[str], Awaitable[tuple[float, bool]]]]] = {
    "sleep": ("16 x time.sleep(0.5), all done (s)", _sleep_scenario),
    "mixed": ("2 x while True + 14 x print, every print done (s)", _mixed_scenario),
    "sessions": ("16 sessions x time.sleep(0.5), all done (s)", _sessions_scenario),
    "vector": ("vector-env step, 16 python sleeps (s)", _vector_scenario),
}


async def run_scenarios(
    backends: list[str], names: list[str], repeats: int, progress: Callable[[str], None] = lambda _: None
) -> list[dict[str, Any]]:
    """Each scenario on each backend at its default settings: the median of ``repeats`` runs, in seconds."""
    rows = []
    for name in names:
        description, scenario = SCENARIOS[name]
        for backend in backends:
            progress(f"{backend} {name}")
            times, ok = [], True
            for _ in range(repeats):
                elapsed, right = await scenario(backend)
                times.append(elapsed)
                ok = ok and right
            rows.append(
                {
                    "backend": backend,
                    "scenario": name,
                    "description": description,
                    "median_s": statistics.median(times),
                    "runs_s": times,
                    "ok": ok,
                }
            )
    return rows


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(box: Sandbox, workload: Workload, concurrency: int, calls: int, budget_s: float) -> dict[str, Any]:
    """Run ``calls`` ops of ``workload`` from ``concurrency`` concurrent clients (or until ``budget_s``)."""
    latencies: list[float] = []
    failures = 0
    tickets = itertools.count()
    deadline = time.perf_counter() + budget_s

    async def client(index: int) -> None:
        nonlocal failures
        while time.perf_counter() < deadline:
            ticket = next(tickets)
            if ticket >= calls:
                return
            start = time.perf_counter()
            ok = await workload.run(box, f"bench-{index}-{ticket}")
            latencies.append(time.perf_counter() - start)
            failures += not ok

    start = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    wall = time.perf_counter() - start
    return {
        "ops": len(latencies),
        "failures": failures,
        "p50_ms": _percentile(latencies, 0.50) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else float("nan"),
        "ops_per_s": len(latencies) / wall if wall > 0 else float("nan"),
    }


async def run_bench(
    backends: list[str],
    workloads: list[str],
    concurrencies: list[int],
    calls: int,
    budget_s: float,
    progress: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Every (backend, workload, concurrency) cell, plus ratios against the ``python -c`` baseline."""
    rows: list[dict[str, Any]] = []
    options: dict[str, Any] = {"max_concurrency": max(concurrencies), "timeout_s": 30.0}
    async with contextlib.AsyncExitStack() as stack:
        boxes: dict[str, Any] = {}
        for backend in backends:
            start = time.perf_counter()
            boxes[backend] = await stack.enter_async_context(_open(backend, **options))
            startup_s = time.perf_counter() - start
            rows.append({"backend": backend, "workload": "startup", "concurrency": 0, "startup_s": startup_s})
        for name in workloads:
            workload = WORKLOADS[name]
            # No sessions in a plain interpreter per call.
            measured = {b: box for b, box in boxes.items() if not (b == BASELINE and name == "session")}
            for box in measured.values():
                for _ in range(3):  # warm-up: caches, spares, lazy imports of the backend itself
                    await workload.run(box, f"warmup-{name}")
            for concurrency in concurrencies:
                for backend, box in measured.items():
                    progress(f"{backend} {name} x{concurrency}")
                    cell = await measure(box, workload, concurrency, calls, budget_s)
                    rows.append({"backend": backend, "workload": name, "concurrency": concurrency, **cell})
    return {"cpu_count": os.cpu_count(), "rows": rows, "ratios": _ratios(rows)}


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = {(r["workload"], r["concurrency"]): r for r in rows if r["backend"] == BASELINE and "ops" in r}
    ratios = []
    for row in rows:
        ref = base.get((row["workload"], row["concurrency"]))
        if row["backend"] == BASELINE or ref is None or "ops" not in row:
            continue
        ratios.append(
            {
                "backend": row["backend"],
                "workload": row["workload"],
                "concurrency": row["concurrency"],
                "p50_ms": row["p50_ms"],
                "baseline_p50_ms": ref["p50_ms"],
                "p50_speedup": ref["p50_ms"] / row["p50_ms"],
                "throughput_ratio": row["ops_per_s"] / ref["ops_per_s"],
            }
        )
    return ratios


# ------------------------------------------------------------------------------------------------------- soak

SOAK_MIX: list[tuple[str, str]] = [
    ("print(1 + 1)", ""),
    ("1 / 0", ""),
    ("import sys\nprint(sys.stdin.read().upper())", "soak\n"),
    ("import subprocess\nsubprocess.Popen(['sleep', '30'])", ""),  # a child left behind: must be reaped
    ("x = [i * i for i in range(1000)]\nsum(x)", ""),
]


def _pss_kib(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, ValueError, IndexError):
            continue
    return total


def _descendants() -> list[int]:
    from rstar_env.sandbox import _proctree

    return _proctree.descendants(os.getpid())


def _settle(box: Any, expected: int, timeout_s: float = 10.0) -> None:
    """Wait until the pool is back to its resting shape (every spare forked and idle) for a moment."""
    deadline = time.monotonic() + timeout_s
    steady_since = None
    while time.monotonic() < deadline:
        if len(box.pool.processes()) == expected:
            steady_since = steady_since or time.monotonic()
            if time.monotonic() - steady_since > 0.3:
                return
        else:
            steady_since = None
        time.sleep(0.02)


async def soak(n: int, concurrency: int, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    """``n`` mixed calls on a fresh ``local`` pool; leaks of processes, descriptors and memory."""
    from rstar_env.sandbox.local import LocalSandbox

    box = LocalSandbox(max_concurrency=concurrency, timeout_s=10.0)
    await asyncio.to_thread(box.start)
    expected = box.pool.resting_size()
    for code, stdin in SOAK_MIX * 4:
        await box.execute(code, stdin=stdin)
    await asyncio.to_thread(_settle, box, expected)
    before = {
        "processes": len(_descendants()),
        "fds": len(os.listdir("/proc/self/fd")),
        "pool_pss_kib": _pss_kib(box.pool.processes()),
    }
    tickets = itertools.count()
    statuses: dict[str, int] = {}

    async def client() -> None:
        while (ticket := next(tickets)) < n:
            code, stdin = SOAK_MIX[ticket % len(SOAK_MIX)]
            result = await box.execute(code, stdin=stdin)
            statuses[result.status] = statuses.get(result.status, 0) + 1
            if ticket % 1000 == 0:
                progress(f"soak {ticket}/{n}")

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    await asyncio.to_thread(_settle, box, expected)
    after = {
        "processes": len(_descendants()),
        "fds": len(os.listdir("/proc/self/fd")),
        "pool_pss_kib": _pss_kib(box.pool.processes()),
    }
    restarts = box.pool.restarts
    await box.aclose()
    return {
        "calls": n,
        "concurrency": concurrency,
        "calls_per_s": n / wall,
        "statuses": statuses,
        "before": before,
        "after": after,
        "leaked_processes": after["processes"] - before["processes"],
        "leaked_fds": after["fds"] - before["fds"],
        "pool_memory_growth": (after["pool_pss_kib"] - before["pool_pss_kib"]) / max(1, before["pool_pss_kib"]),
        "pool_restarts": restarts,
        "processes_after_close": len(_descendants()),
    }


# ------------------------------------------------------------------------------------------------------- output


def _print_tables(results: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if results.get("rows"):
        table = Table(title=f"sandbox latency and throughput ({results['cpu_count']} cores)")
        for column in ("backend", "workload", "conc.", "ops", "p50 ms", "p99 ms", "ops/s", "fails"):
            # Folded, not cut: a backend with options (local:pid_namespace=false) must stay readable.
            table.add_column(column, justify="left" if column in ("backend", "workload") else "right", overflow="fold")
        for row in results["rows"]:
            if "ops" not in row:
                continue
            table.add_row(
                row["backend"],
                row["workload"],
                str(row["concurrency"]),
                str(row["ops"]),
                f"{row['p50_ms']:.1f}",
                f"{row['p99_ms']:.1f}",
                f"{row['ops_per_s']:.1f}",
                str(row["failures"]),
            )
        console.print(table)
        startups = ", ".join(
            f"{r['backend']} {r['startup_s']:.2f} s" for r in results["rows"] if r["workload"] == "startup"
        )
        console.print(f"start-up: {startups}")
    if results.get("ratios"):
        table = Table(title=f"against subprocess.run([sys.executable, '-c', code]) ({BASELINE}), same run")
        for column in ("backend", "workload", "conc.", "p50 ms", f"{BASELINE} p50 ms", "p50 speed-up", "ops/s x"):
            # Folded, not cut: a backend with options (local:pid_namespace=false) must stay readable.
            table.add_column(column, justify="left" if column in ("backend", "workload") else "right", overflow="fold")
        for ratio in results["ratios"]:
            table.add_row(
                ratio["backend"],
                ratio["workload"],
                str(ratio["concurrency"]),
                f"{ratio['p50_ms']:.1f}",
                f"{ratio['baseline_p50_ms']:.1f}",
                f"{ratio['p50_speedup']:.1f}x",
                f"{ratio['throughput_ratio']:.1f}x",
            )
        console.print(table)
    if results.get("scenarios"):
        table = Table(title="head-of-line scenarios (default settings; median of runs)")
        for column in ("backend", "scenario", "seconds", "runs", "ok"):
            table.add_column(column, justify="left" if column in ("backend", "scenario") else "right")
        for row in results["scenarios"]:
            runs = " ".join(f"{t:.2f}" for t in row["runs_s"])
            table.add_row(row["backend"], row["description"], f"{row['median_s']:.2f}", runs, str(row["ok"]))
        console.print(table)
    if results.get("channels"):
        table = Table(title="channels between episodes (local, default settings)")
        for column in ("channel", "bits", "wrong", "seconds", "bits/s", "RWF_NOWAIT", "cold / cached read"):
            table.add_column(column, justify="left" if column == "channel" else "right")
        for row in results["channels"]:
            table.add_row(
                row["channel"],
                str(row["bits"]),
                str(row["wrong"]),
                f"{row['seconds']:.2f}",
                f"{row['bits_per_s']:.1f}",
                ", ".join(row["rwf_nowait"]),
                f"{row['cold_read_us']:.0f} / {row['cached_read_us']:.1f} us",
            )
        console.print(table)
    soaked = results.get("soak")
    if soaked:
        table = Table(title=f"soak: {soaked['calls']} calls on local at concurrency {soaked['concurrency']}")
        table.add_column("measure")
        table.add_column("value", justify="right")
        table.add_row("calls/s", f"{soaked['calls_per_s']:.1f}")
        table.add_row("statuses", ", ".join(f"{k} {v}" for k, v in sorted(soaked["statuses"].items())))
        table.add_row("leaked processes", str(soaked["leaked_processes"]))
        table.add_row("leaked fds", str(soaked["leaked_fds"]))
        table.add_row(
            "pool memory (PSS)",
            f"{soaked['before']['pool_pss_kib'] / 1024:.1f} -> {soaked['after']['pool_pss_kib'] / 1024:.1f} MiB "
            f"({soaked['pool_memory_growth']:+.1%})",
        )
        table.add_row("pool restarts", str(soaked["pool_restarts"]))
        table.add_row("processes after close", str(soaked["processes_after_close"]))
        console.print(table)


@click.command("sandbox")
@click.option("--calls", default=200, show_default=True, help="Ops per (backend, workload, concurrency) cell.")
@click.option("--budget-s", default=15.0, show_default=True, help="Time cap per cell (the baseline is slow).")
@click.option(
    "--backend",
    "backends",
    multiple=True,
    default=("local", "subprocess"),
    show_default=True,
    help="Backends to compare (repeatable), each NAME or NAME:KEY=VALUE,... (local:pid_namespace=false); ratios "
    "are against the python -c baseline.",
)
@click.option(
    "--baseline/--no-baseline",
    default=True,
    show_default=True,
    help="Also measure subprocess.run([sys.executable, '-c', code]) per call, the reference of every ratio.",
)
@click.option(
    "--workload",
    "workloads",
    multiple=True,
    type=click.Choice([*WORKLOADS, *SCENARIOS, *CHANNELS]),
    default=(*WORKLOADS, *SCENARIOS),
    show_default=True,
    help="Workloads (repeatable): latency/throughput cells, head-of-line scenarios (sleep, mixed, ...), or the "
    "page-cache channel between episodes (pagecache, only when named).",
)
@click.option("--rounds", default=8, show_default=True, help="Rounds of 64 bits for the pagecache channel.")
@click.option(
    "--repeats", default=3, show_default=True, help="Runs per head-of-line scenario (median reported); 0 skips them."
)
@click.option(
    "--concurrency",
    "concurrencies",
    multiple=True,
    type=int,
    help="Concurrent callers (repeatable) [default: 1 and 4 x cores].",
)
@click.option("--soak", "soak_calls", default=0, show_default=True, help="Also run N mixed calls and count leaks.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
def command(
    calls: int,
    budget_s: float,
    backends: tuple[str, ...],
    workloads: tuple[str, ...],
    concurrencies: tuple[int, ...],
    soak_calls: int,
    as_json: bool,
    repeats: int,
    baseline: bool,
    rounds: int,
) -> None:
    """Latency and throughput of the local sandbox pool against a fresh interpreter per call."""
    try:
        names = {parse_backend(spec)[0] for spec in backends}
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    unknown = sorted(names - set(BACKENDS))
    if unknown:
        raise click.BadParameter(f"unknown backend(s) {unknown}; choose from {sorted(BACKENDS)}")
    levels = list(concurrencies) or [1, 4 * (os.cpu_count() or 1)]
    progress = (lambda _: None) if as_json else (lambda text: click.echo(f"  ... {text}", err=True))

    async def everything() -> dict[str, Any]:
        results: dict[str, Any] = {}
        cells = [w for w in workloads if w in WORKLOADS]
        scenarios = [w for w in workloads if w in SCENARIOS]
        measured = [BASELINE, *backends] if baseline else list(backends)
        if calls > 0 and measured and cells:
            results = await run_bench(measured, cells, levels, calls, budget_s, progress)
        if scenarios and backends and repeats > 0:
            results["scenarios"] = await run_scenarios(list(backends), scenarios, repeats, progress)
        if "pagecache" in workloads:
            progress("local pagecache channel")
            results["channels"] = [await page_cache_channel(rounds, receiver=r) for r in ("timing", "pagemap")]
        if soak_calls > 0:
            results["soak"] = await soak(soak_calls, 4 * (os.cpu_count() or 1), progress)
        return results

    results = asyncio.run(everything())
    if as_json:
        click.echo(json.dumps(results, indent=2))
    else:
        _print_tables(results)
