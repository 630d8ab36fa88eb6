"""``rstar-env bench train``: a training job's wall time with each rollout engine, side by side in one run.

Each engine runs the config's whole job (``rstar-env train``) in a child process, one after another, never at once
(on a CPU they would share the cores), each in ``OUTPUT_DIR/ENGINE`` with ``policy.engine`` set to that engine. An
SFT stage (a ``trainer.sft`` section) does not depend on the engine: the first engine trains it and the others
start from a copy of its result, so its time is reported once and every engine's end-to-end time is
``SFT + its own RL stage``. For each engine the table gives the RL stage's wall time (held-out evaluations
included), the end-to-end time, the held-out pass@1 before and after RL, and the peak memory of the whole process
tree (the trainer, its engine processes, sandbox and verifier workers) from ``/proc``: the RSS sum every half
second, the PSS (shared pages counted once) every few seconds (:class:`PeakMemory`).

``--neighbours N`` runs each job beside N CPU-bound processes (``while True: pass``), started before the job and
stopped after it: a shared machine, where the job must not collapse when another program wants the cores.
``--seed`` overrides the config's ``trainer.seed`` (a second seed of the same job).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import yaml

from rstar_env.bench import require_vllm

ENGINES = ("transformers", "vllm")


def tree_rss_bytes(root: int) -> int:
    """Resident memory of ``root`` and all its descendants (0 once it is gone): each process's RSS, summed, so
    pages they share (libraries, a forked worker's untouched memory) count once per process."""
    page = os.sysconf("SC_PAGE_SIZE")

    def rss(pid: int) -> int:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * page

    return _tree_sum(root, rss)


def tree_pss_bytes(root: int) -> int:
    """The memory ``root`` and its descendants take from the machine: their proportional set sizes summed (a page
    shared by n processes counts 1/n in each), which is what the tree adds to the machine's used memory."""

    def pss(pid: int) -> int:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) * 1024

    return _tree_sum(root, pss)


def _tree_sum(root: int, measure: Callable[[int], int]) -> int:
    """``measure`` summed over ``root`` and its descendants; a process that is gone or unreadable counts 0."""
    from rstar_env.proctree import descendants

    total = 0
    for pid in (root, *descendants(root)):
        try:
            total += measure(pid)
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return total


class PeakMemory:
    """The peak RSS sum and peak PSS of a process tree, sampled by a watcher beside the job.

    Reading PSS walks every page table (``/proc/PID/smaps_rollup``): about 90 ms for a trainer beside a vLLM
    engine's two processes on an idle 2-core machine, 200 ms under load. Read every half second, as the RSS sum is
    (2 ms), it took 20-40% of a core from the job it measured, and the job's torch threads, which wait for one
    another at every operation, lost more than that: a recorded training update took 80 s watched so, 61 s
    unwatched. So PSS is read every ``pss_every_s`` seconds, and at once when the RSS sum has grown by
    ``pss_growth`` since the last PSS reading, where a new peak may be forming."""

    def __init__(self, root: int, *, pss_every_s: float = 5.0, pss_growth: float = 0.02) -> None:
        self.root = root
        self.pss_every_s = pss_every_s
        self.pss_growth = pss_growth
        self.rss = 0
        self.pss = 0
        self._pss_at = -float("inf")
        self._rss_at_pss = 0

    def sample(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        rss = tree_rss_bytes(self.root)
        self.rss = max(self.rss, rss)
        if now - self._pss_at >= self.pss_every_s or rss > self._rss_at_pss * (1 + self.pss_growth):
            self.pss = max(self.pss, tree_pss_bytes(self.root))
            self._pss_at, self._rss_at_pss = now, rss


def _held_out(path: Path) -> float | None:
    try:
        return float(json.loads(path.read_text())["pass@1"])
    except (OSError, KeyError, ValueError, TypeError):
        return None


BUSY_LOOP = "while True: pass"


@contextmanager
def neighbours(count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` CPU-bound processes running for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(count)]
    try:
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def run_engine(
    config: dict[str, Any], engine: str, out: Path, sft_from: Path | None, log: Path, *, busy: int = 0
) -> dict[str, Any]:
    """One training job with ``policy.engine: engine`` in ``out`` (beside ``busy`` CPU-bound processes); timings,
    pass@1 and peak tree memory."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    config = {**config, "policy": {**(config.get("policy") or {}), "engine": engine}}
    has_sft = bool((config.get("trainer") or {}).get("sft"))
    if has_sft and sft_from is not None:
        shutil.copytree(sft_from, out / "sft", symlinks=True)
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    command = [sys.executable, "-m", "rstar_env.cli", "train", "--config", str(path), "--output-dir", str(out)]
    start = time.perf_counter()
    sft_done_at = 0.0 if (not has_sft or sft_from is not None) else None
    with log.open("wb") as sink, neighbours(busy):
        proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        memory = PeakMemory(proc.pid)
        try:
            while proc.poll() is None:
                memory.sample()
                if sft_done_at is None and (out / "sft" / "done.json").exists():
                    sft_done_at = time.perf_counter() - start
                time.sleep(0.5)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    total = time.perf_counter() - start
    if proc.returncode != 0:
        raise click.ClickException(f"{engine}: `rstar-env train` exited with {proc.returncode}; its output: {log}")
    sft_s = sft_done_at if sft_done_at is not None else 0.0
    return {
        "engine": engine,
        "sft_s": sft_s,
        "rl_s": total - sft_s,
        "pass@1_before": _held_out(out / "eval_start.json"),
        "pass@1_after": _held_out(out / "eval.json"),
        "peak_tree_gib": memory.rss / 2**30,
        "peak_tree_pss_gib": memory.pss / 2**30,
    }


def run(
    config_path: str, engines: tuple[str, ...], output_dir: Path, *, seed: int | None = None, busy: int = 0
) -> dict[str, Any]:
    """Every engine's job, one after another; the SFT stage's time is the first engine's."""
    config = yaml.safe_load(Path(config_path).read_text()) or {}
    if seed is not None:
        config["trainer"] = {**(config.get("trainer") or {}), "seed": seed}
    rows: list[dict[str, Any]] = []
    sft_from: Path | None = None
    for engine in engines:
        out = output_dir / engine
        click.echo(f"{engine}: training in {out} (log: {output_dir / (engine + '.log')})", err=True)
        row = run_engine(config, engine, out, sft_from, output_dir / f"{engine}.log", busy=busy)
        if sft_from is None and (out / "sft" / "done.json").exists():
            sft_from = out / "sft"
        rows.append(row)
        click.echo(f"{engine}: RL stage {row['rl_s']:.0f} s, peak {row['peak_tree_gib']:.2f} GiB", err=True)
    sft_s = rows[0]["sft_s"] if rows else 0.0
    for row in rows:
        row["sft_s"] = sft_s
        row["end_to_end_s"] = sft_s + row["rl_s"]
    return {"config": config_path, "seed": seed, "neighbours": busy, "sft_s": sft_s, "rows": rows}


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def _pass(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


@click.command("train")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False), required=True)
@click.option(
    "--engine",
    "engines",
    type=click.Choice(ENGINES),
    multiple=True,
    help="Rollout engines, in this order [default: transformers vllm].",
)
@click.option(
    "--output-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs/bench-train"),
    show_default=True,
)
@click.option("--seed", type=int, default=None, help="Override the config's trainer.seed.")
@click.option(
    "--neighbours",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="CPU-bound processes running beside each job (a shared machine).",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def command(
    config_path: str, engines: tuple[str, ...], output_dir: Path, seed: int | None, neighbours: int, as_json: bool
) -> None:
    """A training job's wall time with each rollout engine (SFT stage shared), side by side."""
    engines = engines or ENGINES
    require_vllm(engines)
    output_dir.mkdir(parents=True, exist_ok=True)
    result = run(config_path, tuple(engines), output_dir, seed=seed, busy=neighbours)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    beside = f", beside {neighbours} CPU-bound process(es)" if neighbours else ""
    click.echo(f"{config_path}: SFT stage {_minutes(result['sft_s'])} (trained once, shared by every engine{beside})")
    click.echo(
        "| engine | RL stage | end to end | held-out pass@1 before -> after | peak memory (tree: PSS / RSS sum) |"
    )
    click.echo("|---|---|---|---|---|")
    for row in result["rows"]:
        click.echo(
            f"| {row['engine']} | {_minutes(row['rl_s'])} | {_minutes(row['end_to_end_s'])} | "
            f"{_pass(row['pass@1_before'])} -> {_pass(row['pass@1_after'])} | "
            f"{row['peak_tree_pss_gib']:.2f} / {row['peak_tree_gib']:.2f} GiB |"
        )
    by_engine = {row["engine"]: row for row in result["rows"]}
    if {"vllm", "transformers"} <= set(by_engine):
        ratio = by_engine["transformers"]["end_to_end_s"] / by_engine["vllm"]["end_to_end_s"]
        click.echo(f"vllm end to end: {ratio:.2f}x as fast as transformers")
