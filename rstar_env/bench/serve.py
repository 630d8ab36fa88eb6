"""``rstar-env bench serve``: what serving the env costs, side by side with the env in-process, in one run.

The same episodes two ways, at each concurrency (1, 16 and 64 sessions by default), the two ways interleaved per
concurrency so machine load hits them alike:

* **server**: ``rstar-env serve env`` started as a subprocess, each session an OpenEnv ``GenericEnvClient`` over
  ``/ws`` (the client a trainer would use);
* **in-process**: ``MathToolEnv`` instances in this process sharing one python tool and one reward plugin, stepped
  with ``astep`` on rstar-env's loop.

An episode is a reset, two steps with a python tool call each (the sandbox runs them) and a step with the final
answer, as a short rStar2-Agent episode. Reported per way: steps per second (steps over the wall time of the whole
concurrency level), the p50 / p99 latency of one step (reset excluded) and the p50 of each kind of step (a tool
call waits for the sandbox; an answer only for the verifier, milliseconds): the overall p50 of a mix of two kinds
says little on its own. The ratio is server p50 over in-process p50. Sessions that fail (a connection refused or
timed out, a step that errs) are counted and named in the table, never a traceback; the server's memory per idle
session is measured at each level (its unique memory with that many sessions reset and waiting, over the count).

``--scenario flood``: one client keeps a backlog of slow ``/run_code`` calls (``time.sleep(1)``, ``--flood`` of
them in flight) while an honest client sends short calls one after another; reported: the honest client's p50 and
p99 alone and beside the flood, and the flood's throughput.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import click

_CALL = '<tool_call>\n{{"name": "python", "arguments": {{"code": "print({a} * {b})"}}}}\n</tool_call>'
READY = "rstar-env serve: listening on http://"
"""What ``rstar-env serve`` prints, followed by ``host:port``, once it accepts connections."""


STEPS = ("call", "call", "answer")
"""The kinds of the steps of one episode, in order."""


def _episode(i: int) -> tuple[dict[str, str], list[str]]:
    a, b = 3 + i % 11, 17 + i % 13
    row = {"problem": f"What is {a} * {b}?", "answer": str(a * b)}
    return row, [_CALL.format(a=a, b=b), _CALL.format(a=a, b=b + 1), f"<answer>\\boxed{{{a * b}}}</answer>"]


def _summary(latencies: list[tuple[str, float]], wall_s: float, rewards: list[float]) -> dict[str, Any]:
    ordered = sorted(seconds for _, seconds in latencies)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    kinds = {kind: 1e3 * statistics.median([s for k, s in latencies if k == kind]) for kind in sorted(set(STEPS))}
    return {
        "steps": len(ordered),
        "steps_per_s": len(ordered) / wall_s,
        "p50_ms": 1e3 * statistics.median(ordered),
        "p99_ms": 1e3 * p99,
        "p50_ms_by_kind": kinds,
        "mean_reward": statistics.fmean(rewards) if rewards else 0.0,
    }


class ServerProcess:
    """A ``rstar-env serve ARGS --port 0`` subprocess, started and waited for: ``url`` and ``port`` come from the
    line it prints once listening, ``lines`` is everything it printed. Raises ``RuntimeError`` with its last output
    when it exits or stays silent for ``start_timeout_s``."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, start_timeout_s: float = 300) -> None:
        command = [sys.executable, "-m", "rstar_env.cli", "serve", *args, "--port", "0"]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self.lines: list[str] = []
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)
                if line.startswith(READY):
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(start_timeout_s) or self.proc.poll() is not None:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"the server did not start:\n{self.output()[-3000:]}")
        line = next(line for line in self.lines if line.startswith(READY))
        self.url = "http://" + line.strip()[len(READY) :]
        self.port = int(self.url.rsplit(":", 1)[1])

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self, timeout_s: float = 60) -> int:
        """SIGTERM, then its exit status (SIGKILL after ``timeout_s``: a negative status)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


OPENING = 256
"""Connections a benchmark client opens at once (the rest wait their turn), as a trainer ramps up its sessions."""


def _failure(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}".rstrip(": ")


async def _open(url: str, opening: asyncio.Semaphore) -> Any:
    from rstar_env.serve import import_openenv

    import_openenv()  # without its Gradio web UI
    from openenv.core.generic_client import GenericEnvClient

    env = GenericEnvClient(base_url=url, connect_timeout_s=300, message_timeout_s=600)
    async with opening:
        await env.connect()
    return env


async def _through_server(url: str, sessions: int, episodes: int) -> dict[str, Any]:
    latencies: list[tuple[str, float]] = []
    rewards: list[float] = []
    opening = asyncio.Semaphore(OPENING)

    async def session(k: int) -> None:
        env = await _open(url, opening)
        try:
            for e in range(episodes):
                row, actions = _episode(k * episodes + e)
                await env.reset(**row)
                for kind, action in zip(STEPS, actions, strict=True):
                    start = time.perf_counter()
                    result = await env.step({"text": action})
                    latencies.append((kind, time.perf_counter() - start))
                rewards.append(float(result.reward or 0.0))
        finally:
            await env.disconnect()

    start = time.perf_counter()
    outcomes = await asyncio.gather(*(session(k) for k in range(sessions)), return_exceptions=True)
    failed = Counter(_failure(o) for o in outcomes if isinstance(o, BaseException))
    summary = _summary(latencies, time.perf_counter() - start, rewards) if latencies else {"steps": 0}
    return {**summary, "failed_sessions": sum(failed.values()), "failures": dict(failed.most_common(3))}


async def _idle_memory(url: str, pid: int, sessions: int) -> float:
    """The server's unique memory per session with ``sessions`` sessions reset and idle, in KiB."""
    import psutil

    server = psutil.Process(pid)
    before = server.memory_full_info().uss
    opening = asyncio.Semaphore(OPENING)
    envs = await asyncio.gather(*(_open(url, opening) for _ in range(sessions)), return_exceptions=True)
    live = [env for env in envs if not isinstance(env, BaseException)]
    try:
        await asyncio.gather(*(env.reset(problem="What is 2 + 2?", answer="4") for env in live))
        after = server.memory_full_info().uss
    finally:
        await asyncio.gather(*(env.disconnect() for env in live), return_exceptions=True)
    return (after - before) / 1024 / max(len(live), 1)


async def _in_process(plugins: tuple[Any, Any], sessions: int, episodes: int) -> dict[str, Any]:
    from rstar_env.env import MathToolEnv

    tool, reward = plugins
    latencies: list[tuple[str, float]] = []
    rewards: list[float] = []

    async def session(k: int) -> None:
        env = MathToolEnv(tools=[tool], reward=reward)
        try:
            for e in range(episodes):
                row, actions = _episode(k * episodes + e)
                await env.areset(options=row)
                for kind, action in zip(STEPS, actions, strict=True):
                    start = time.perf_counter()
                    _, step_reward, *_ = await env.astep(action)
                    latencies.append((kind, time.perf_counter() - start))
                rewards.append(float(step_reward))
        finally:
            await env.aclose()

    start = time.perf_counter()
    await asyncio.gather(*(session(k) for k in range(sessions)))
    return _summary(latencies, time.perf_counter() - start, rewards)


def run(concurrency: tuple[int, ...] = (1, 16, 64), episodes: int = 4) -> dict[str, Any]:
    """Measure both ways at each concurrency; returns ``{"levels": [{sessions, server, in_process, ratio}], ...}``."""
    from rstar_env import aio
    from rstar_env.plugins import load_reward, load_tool
    from rstar_env.serve.net import raise_open_files

    raise_open_files()  # one descriptor per session's connection
    tool, reward = load_tool("python"), load_reward("math")
    try:
        server = ServerProcess("env", "--max-sessions", str(max(concurrency)))
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        # Warm up both: the server's pool and imports, this process's pool and reward workers.
        asyncio.run(_through_server(server.url, 2, 2))
        aio.run_sync(_in_process((tool, reward), 2, 2))
        levels = []
        for sessions in concurrency:
            through = asyncio.run(_through_server(server.url, sessions, episodes))
            local = aio.run_sync(_in_process((tool, reward), sessions, episodes))
            idle_kib = asyncio.run(_idle_memory(server.url, server.proc.pid, sessions))
            levels.append(
                {
                    "sessions": sessions,
                    "server": through,
                    "in_process": local,
                    "idle_session_kib": idle_kib,
                    "p50_ratio_server_over_in_process": through.get("p50_ms", float("nan")) / local["p50_ms"],
                    "steps_per_s_ratio_in_process_over_server": local["steps_per_s"]
                    / max(through.get("steps_per_s", 0.0), 1e-9),
                }
            )
    finally:
        server.stop()
        aio.run_sync(tool.aclose())
        aio.run_sync(reward.aclose())
    return {"episodes_per_session": episodes, "steps_per_episode": len(STEPS), "cpus": os.cpu_count(), "levels": levels}


async def _flood(url: str, flood: int, honest_calls: int) -> dict[str, Any]:
    import httpx

    limits = httpx.Limits(max_connections=flood + 8, max_keepalive_connections=flood + 8)
    done = {"flood": 0, "failed": 0}
    stop = asyncio.Event()

    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def flooder() -> None:
            while not stop.is_set():
                try:
                    reply = await client.post(
                        f"{url}/run_code",
                        json={"code": "import time; time.sleep(1)", "language": "python"},
                        headers={"X-Rstar-Client": "flood"},
                    )
                    done["flood" if reply.status_code == 200 else "failed"] += 1
                except httpx.HTTPError:
                    done["failed"] += 1

        async def honest() -> list[float]:
            times = []
            for _ in range(honest_calls):
                start = time.perf_counter()
                reply = await client.post(
                    f"{url}/run_code",
                    json={"code": "print(6 * 7)", "language": "python"},
                    headers={"X-Rstar-Client": "honest"},
                )
                reply.raise_for_status()
                times.append(time.perf_counter() - start)
            return times

        alone = await honest()
        tasks = [asyncio.create_task(flooder()) for _ in range(flood)]
        await asyncio.sleep(3)  # the backlog builds up
        beside = await honest()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stats(times: list[float]) -> dict[str, Any]:
        ordered = sorted(times)
        p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
        return {"calls": len(ordered), "p50_ms": 1e3 * statistics.median(ordered), "p99_ms": 1e3 * p99}

    return {
        "alone": stats(alone),
        "beside_flood": stats(beside),
        "flood_done": done["flood"],
        "flood_failed": done["failed"],
    }


def run_flood(flood: int = 80, honest_calls: int = 40) -> dict[str, Any]:
    """The flood scenario (see the module docstring)."""
    from rstar_env.serve.net import raise_open_files

    raise_open_files()
    try:
        server = ServerProcess("sandbox")
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    try:
        result = asyncio.run(_flood(server.url, flood, honest_calls))
    finally:
        server.stop()
    return {"flood": flood, "cpus": os.cpu_count(), **result}


def _print_flood(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"one client keeps {result['flood']} slow /run_code calls (sleep 1 s) in flight; {result['cpus']} CPUs")
    click.echo(f"{'honest client':<14} {'calls':>6} {'p50 ms':>8} {'p99 ms':>8}")
    for name in ("alone", "beside_flood"):
        row = result[name]
        click.echo(f"{name:<14} {row['calls']:>6} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f}")
    click.echo(f"flood calls finished meanwhile: {result['flood_done']} ({result['flood_failed']} failed)")


@click.command(name="serve")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(min=1),
    multiple=True,
    default=(1, 16, 64),
    show_default=True,
    help="Concurrent sessions (repeat for several levels).",
)
@click.option(
    "--episodes", type=click.IntRange(min=1), default=4, show_default=True, help="Episodes per session at each level."
)
@click.option(
    "--scenario",
    type=click.Choice(["sessions", "flood"]),
    default="sessions",
    show_default=True,
    help="sessions: server vs in-process at each -c; flood: an honest client beside another's /run_code backlog.",
)
@click.option(
    "--flood", type=click.IntRange(min=1), default=80, show_default=True, help="flood: slow calls kept in flight."
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def command(concurrency: tuple[int, ...], episodes: int, scenario: str, flood: int, as_json: bool) -> None:
    """Steps/s and p50/p99 step latency through `rstar-env serve env` vs the env in-process, side by side
    (``--scenario flood``: an honest client's latency beside another client's backlog)."""
    try:
        import openenv  # noqa: F401
    except ImportError:
        raise click.ClickException("bench serve needs the serve extra: pip install 'rstar-env[serve]'") from None
    if scenario == "flood":
        _print_flood(run_flood(flood), as_json)
        return
    result = run(tuple(concurrency), episodes)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"{episodes} episodes per session, {len(STEPS)} steps each ({', '.join(STEPS)}); {result['cpus']} CPUs")
    click.echo(
        f"{'sessions':>8}  {'way':<10} {'steps/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'p50 call':>9} "
        f"{'p50 answer':>10} {'reward':>6}"
    )
    for level in result["levels"]:
        for name in ("server", "in_process"):
            row = level[name]
            if not row.get("steps"):
                click.echo(f"{level['sessions']:>8}  {name:<10} no step completed")
                continue
            kinds = row["p50_ms_by_kind"]
            click.echo(
                f"{level['sessions']:>8}  {name:<10} {row['steps_per_s']:>8.1f} {row['p50_ms']:>8.2f} "
                f"{row['p99_ms']:>8.2f} {kinds['call']:>9.2f} {kinds['answer']:>10.2f} "
                f"{row['mean_reward']:>6.2f}"
            )
        click.echo(
            f"{'':>8}  p50 server / in-process: {level['p50_ratio_server_over_in_process']:.2f}x; steps/s "
            f"in-process / server: {level['steps_per_s_ratio_in_process_over_server']:.2f}x; "
            f"{level['idle_session_kib']:.0f} KiB per idle session"
        )
        failed = level["server"]["failed_sessions"]
        if failed:
            named = "; ".join(f"{count}x {what}" for what, count in level["server"]["failures"].items())
            click.echo(f"{'':>8}  FAILED sessions: {failed} of {level['sessions']} ({named})")
