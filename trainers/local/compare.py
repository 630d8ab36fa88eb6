"""``rstar-env compare``: GRPO against GRPO-RoC from the same SFT checkpoint, same seeds, data and steps.

For each seed, both arms train from the same weights with the same config except the sampler: ``grpo`` keeps a
uniform seeded G of the 2G rollouts, ``roc`` keeps them by Resample-on-Correct. The arms are **paired** (common
random numbers): the same seed gives both the same problem order and the same sampling stream for every request
(seeded from seed, step, problem, sample and turn), so at step 1 they draw the same 2G rollouts and differ only
through the sampler; later they differ only through their weights. The report checks the step-1 pairing
(``paired_step1``) and gives, per seed, the difference RoC - GRPO with a t-interval over seeds.

Per step, what is plotted comes from each step's rollouts **before** selection (``metrics.jsonl``):
``tool_error_ratio_correct`` (tool calls with an error / all tool calls, within trajectories with reward > 0: the
paper's Figure 4), ``reward`` and ``response_tokens``. Output under ``OUT``: ``grpo-seedS/`` and ``roc-seedS/`` (each
a full training run: metrics.jsonl, TensorBoard, checkpoints, eval.json), ``compare.json`` (every arm's metrics),
``compare.png`` and ``compare.md`` (the tables), ``per_step.csv`` (every seed, step and arm), ``roc_check.json`` (the
sampler-only check on the step-1 rollouts). A rerun resumes every arm from its checkpoints.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import NormalDist, fmean, pstdev, stdev
from typing import Any

from rstar_env.config import RunConfig
from rstar_trainers.local.config import LocalTrainerConfig
from rstar_trainers.local.logging import read_metrics

ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"name": "grpo", "options": {}},
    "roc": {"name": "roc", "options": {"mode": "topk"}},
}
PANELS: list[tuple[str, str]] = [
    ("tool_error_ratio_correct", "tool-error ratio in correct trajectories (before selection)"),
    ("reward", "reward (strict)"),
    ("response_tokens", "response length (tokens)"),
]


def arm_dir(out: Path, arm: str, seed: int) -> Path:
    return out / f"{arm}-seed{seed}"


def run_compare(
    run: RunConfig,
    settings: LocalTrainerConfig,
    *,
    out: str | Path,
    model: str,
    seeds: Sequence[int],
    steps: int,
    on_step: Callable[[str, int, dict[str, Any]], None] | None = None,
    model_and_tokenizer: tuple[Any, Any] | None = None,
    jobs: int = 1,
    on_progress: Callable[[str, int, int, str], None] | None = None,
) -> dict[str, Any]:
    """Train every (arm, seed) for ``steps`` steps from ``model``; then write the figure, table and metrics.
    Returns the summary written to ``compare.json``. ``model_and_tokenizer``: loaded weights to start every arm
    from (each arm trains a copy) instead of loading ``model``. ``jobs``: arms trained at once, each in its own
    process (on a GPU, one arm's token-by-token sampling leaves it mostly idle; plugins must then be installed
    entry points, not registered at run time). The result does not depend on ``jobs``. ``on_progress``: each
    arm's progress within its steps (loading, rollouts, updates), as the trainer's ``on_progress`` with the phase's
    key and description prefixed by ``ARM/SEED``, from child processes too."""
    import copy

    from rstar_trainers.local.trainer import LocalTrainer

    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    arms = [(arm, seed, *arm_config(run, settings, root, arm, seed, steps, model)) for seed in seeds for arm in ARMS]
    if jobs > 1 and model_and_tokenizer is None:
        _run_parallel(arms, jobs, on_step, on_progress)
        return write_report(root, seeds, keep=settings.group_size)
    for arm, seed, arm_run, arm_settings in arms:
        loaded = None
        if model_and_tokenizer is not None:
            loaded = (copy.deepcopy(model_and_tokenizer[0]), model_and_tokenizer[1])
        report = None if on_progress is None else _arm_progress(on_progress, arm, seed)
        trainer = LocalTrainer(arm_run, arm_settings, model_and_tokenizer=loaded, on_progress=report)
        try:
            trainer.train(on_step=None if on_step is None else lambda m, a=arm, s=seed: on_step(a, s, m))
        finally:
            trainer.close()
            del trainer
            gc.collect()
    return write_report(root, seeds, keep=settings.group_size)


def arm_config(
    run: RunConfig, settings: LocalTrainerConfig, root: Path, arm: str, seed: int, steps: int, model: str
) -> tuple[RunConfig, LocalTrainerConfig]:
    """One arm's run config and trainer settings: the shared ones, with the arm's sampler and the seed."""
    arm_run = run.model_copy(deep=True)
    arm_run.sampler = type(run.sampler).model_validate(ARMS[arm])
    arm_settings = settings.model_copy(
        update={
            "seed": seed,
            "steps": steps,
            "model": model,
            "output_dir": str(arm_dir(root, arm, seed)),
            "sft": None,
            "save_model": False,
            "eval_at_start": False,
            # step 1's rollouts only: the pairing check and the sampler-only check read them
            "save_trajectories": True,
            "save_trajectories_steps": 1,
        }
    )
    return arm_run, arm_settings


def _arm_progress(
    on_progress: Callable[[str, int, int, str], None], arm: str, seed: int
) -> Callable[[str, int, int, str], None]:
    def report(key: str, done: int, total: int, description: str = "") -> None:
        on_progress(f"{arm}/{seed} {key}", done, total, f"{arm}/{seed} {description or key}")

    return report


_messages: Any = None
"""In an arm's process: the queue to the parent (set by :func:`_child_init`)."""
_stopping: Any = None
"""In an arm's process: set by the parent once the comparison stops (an arm queued already must not start)."""
_interrupted = False
"""In an arm's process: Ctrl-C came while it trained."""


def _child_init(messages: Any, stopping: Any) -> None:
    """An arm process. Ctrl-C reaches every process of the terminal's group: an idle one ignores it (the
    parent cancels the arms not started), a training one stops at its first (see :func:`_on_interrupt`)."""
    global _messages, _stopping
    _messages, _stopping = messages, stopping
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.unraisablehook = _quiet_interrupts


def _on_interrupt(_signum: int, _frame: Any) -> None:
    global _interrupted
    if _interrupted:
        return  # a second Ctrl-C (or the parent passing the first on) must not cut the checkpoint being written
    _interrupted = True
    raise KeyboardInterrupt


def _raise_if_interrupted() -> None:
    # A KeyboardInterrupt raised while a finalizer (__del__) runs is dropped by Python: raise it again here, at a
    # point where it reaches the trainer (which saves a checkpoint on its way out).
    if _interrupted:
        raise KeyboardInterrupt


def _quiet_interrupts(unraisable: Any) -> None:
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        sys.__unraisablehook__(unraisable)


def _train_arm(arm: str, seed: int, run_data: dict[str, Any], settings_data: dict[str, Any], threads: int) -> None:
    """A child process's work: one arm, start to end (resuming from its checkpoints), its steps and progress sent
    back as ``("step", arm, seed, metrics)`` and ``("progress", key, done, total, description)``."""
    import os

    from rstar_trainers.local.trainer import LocalTrainer

    global _interrupted
    queue = _messages

    def send(*message: Any) -> None:
        _raise_if_interrupted()
        queue.put(message)

    _interrupted = False
    queue.put(("started", os.getpid()))
    signal.signal(signal.SIGINT, _on_interrupt)
    signal.signal(signal.SIGTERM, _on_interrupt)  # a SIGTERM of the arm itself stops it as Ctrl-C does
    try:
        if _stopping.is_set():
            return
        # This arm's share of the cores, fixed: the other arms are not neighbours to make room for.
        settings_data = {**settings_data, "threads": threads}
        report = _arm_progress(lambda *args: send("progress", *args), arm, seed)
        trainer = LocalTrainer(
            RunConfig.model_validate(run_data), LocalTrainerConfig.model_validate(settings_data), on_progress=report
        )
        try:
            trainer.train(on_step=lambda m: send("step", arm, seed, m))
        finally:
            trainer.close()
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if _interrupted:
            # The comparison stops: said here, before this process is free to take a queued arm, since the
            # parent's own Ctrl-C (which sets it too) may be handled later than this arm's.
            _stopping.set()
        queue.put(("ended", os.getpid()))


def _run_parallel(
    arms: Sequence[tuple[str, int, RunConfig, LocalTrainerConfig]],
    jobs: int,
    on_step: Callable[[str, int, dict[str, Any]], None] | None,
    on_progress: Callable[[str, int, int, str], None] | None = None,
) -> None:
    import multiprocessing as mp
    import os
    import queue as queue_module
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # Not forked from this process (CUDA cannot be forked, and its threads make fork unsafe): from a fork server, a
    # clean interpreter that imports the trainer and transformers' Auto classes (4 CPU-seconds) once for every arm.
    context = mp.get_context("forkserver")
    context.set_forkserver_preload(
        [
            "rstar_trainers.local.trainer",
            "transformers.models.auto.modeling_auto",
            "transformers.models.auto.tokenization_auto",
        ]
    )
    threads = max(1, (os.cpu_count() or 1) // jobs)
    messages, stopping = context.Queue(), context.Event()
    training: set[int] = set()  # pids of the arm processes in the middle of an arm

    def drain() -> None:
        while True:
            try:
                kind, *message = messages.get_nowait()
            except queue_module.Empty:
                return
            if kind == "started":
                training.add(message[0])
            elif kind == "ended":
                training.discard(message[0])
            elif kind == "step" and on_step is not None:
                on_step(*message)
            elif kind == "progress" and on_progress is not None:
                on_progress(*message)

    pool = ProcessPoolExecutor(
        max_workers=jobs, mp_context=context, initializer=_child_init, initargs=(messages, stopping)
    )
    pending: set[Any] = set()
    try:
        pending = {
            pool.submit(_train_arm, arm, seed, r.model_dump(), s.model_dump(), threads) for arm, seed, r, s in arms
        }
        while pending:
            done, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
            drain()
            for future in done:
                future.result()  # an arm's failure stops the comparison with its own traceback
    except BaseException:
        # Interrupted (or an arm failed): arms not started never start; running ones checkpoint and stop. A
        # Ctrl-C in a terminal reached them already; a signal to this process alone is passed on (once: see
        # _on_interrupt). Their messages are read meanwhile: a child whose queue is full cannot exit.
        stopping.set()
        signalled: set[int] = set()
        while True:
            with contextlib.suppress(KeyboardInterrupt):  # more Ctrl-C while the arms save: they are ignored
                drain()
                for pid in training - signalled:
                    signalled.add(pid)
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGINT)
                if not pending:
                    break
                _, pending = wait(pending, timeout=0.5)
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        drain()


def _series(rows: list[dict[str, Any]], key: str) -> list[float]:
    out = []
    for r in rows:
        value = r.get(key)
        out.append(float("nan") if value is None else float(value))
    return out


def _mean(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return fmean(kept) if kept else float("nan")


def t_interval(values: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """``(mean, low, high)``: the Student-t confidence interval of the mean of ``values`` (NaN bounds below two)."""
    kept = [v for v in values if not math.isnan(v)]
    if not kept:
        return math.nan, math.nan, math.nan
    mean = fmean(kept)
    if len(kept) < 2:
        return mean, math.nan, math.nan
    half = t_quantile(0.5 + level / 2, len(kept) - 1) * stdev(kept) / math.sqrt(len(kept))
    return mean, mean - half, mean + half


def _t_cdf(t: float, df: int) -> float:
    """Student's t CDF for a whole number of degrees of freedom, by the closed-form series of Abramowitz and
    Stegun 26.7.3-4 (exact, no special functions needed)."""
    theta = math.atan(t / math.sqrt(df))
    cos2, term = math.cos(theta) ** 2, 1.0
    if df % 2:  # odd: (2/pi) * (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), last power df-3
        total = 0.0
        if df > 1:
            total = 1.0
            for k in range(1, (df - 1) // 2):
                term *= cos2 * (2 * k) / (2 * k + 1)
                total += term
            total *= math.sin(theta) * math.cos(theta)
        inside = 2 / math.pi * (theta + total)
    else:  # even: sin * (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...), last power df-2
        total = 1.0
        for k in range(1, df // 2):
            term *= cos2 * (2 * k - 1) / (2 * k)
            total += term
        inside = math.sin(theta) * total
    return 0.5 + inside / 2  # inside = P(|T| < t), signed with t


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t with ``df`` (a whole number >= 1) degrees of freedom, by bisection of
    :func:`_t_cdf` to float precision."""
    if df < 1 or not 0.0 < p < 1.0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df >= 1, got p={p}, df={df}")
    low, high = -1.0, 1.0
    while _t_cdf(low, df) > p:
        low *= 2
    while _t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if mid in (low, high):
            break
        low, high = (mid, high) if _t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


PAIRED = ("tool_error_ratio_correct", "reward", "accuracy", "response_tokens", "tool_calls_per_trajectory")
"""Quantities whose per-seed difference RoC - GRPO is reported (second-half means and all-steps means)."""


def paired_differences(runs: dict[str, dict[int, list[dict[str, Any]]]], seeds: Sequence[int]) -> dict[str, Any]:
    """Per quantity and window (``second_half``, ``all_steps``): each seed's RoC - GRPO, their mean and 95%
    t-interval over seeds."""
    out: dict[str, Any] = {}
    for key in PAIRED:
        entry: dict[str, Any] = {}
        for window in ("second_half", "all_steps"):
            per_seed = {}
            for seed in seeds:
                means = []
                for arm in ("roc", "grpo"):
                    rows = runs[arm][seed]
                    rows = rows[len(rows) // 2 :] if window == "second_half" else rows
                    means.append(_mean(_series(rows, key)))
                per_seed[str(seed)] = means[0] - means[1]
            mean, low, high = t_interval(list(per_seed.values()))
            entry[window] = {"per_seed": per_seed, "mean": mean, "ci95": [low, high]}
        out[key] = entry
    return out


HELD_OUT = ("pass@1", "tool_error_ratio", "tool_calls_per_trajectory", "answer_format_share")
"""Figures of each arm's held-out report (``eval.json``, written after its last step when the config has an
``eval_dataset``) whose per-seed difference RoC - GRPO is reported."""


def held_out_differences(root: Path, seeds: Sequence[int]) -> dict[str, Any] | None:
    """Per held-out figure: each arm's value per seed, each seed's RoC - GRPO, their mean and 95% t-interval over
    the seeds where both arms have a report, and ``seeds_to_settle``: about how many seeds would put the interval
    clear of zero if the mean difference and its spread stayed what they are (None when they already do, or when
    the difference is zero). None when no arm has a held-out report."""
    reports: dict[str, dict[str, dict[str, Any]]] = {arm: {} for arm in ARMS}
    for arm in ARMS:
        for seed in seeds:
            path = arm_dir(root, arm, seed) / "eval.json"
            if path.exists():
                reports[arm][str(seed)] = json.loads(path.read_text())
    if not any(reports.values()):
        return None
    out: dict[str, Any] = {}
    both = [str(s) for s in seeds if str(s) in reports["roc"] and str(s) in reports["grpo"]]
    for key in HELD_OUT:
        per_arm = {arm: {s: float(r[key]) for s, r in by_seed.items() if key in r} for arm, by_seed in reports.items()}
        per_seed = {
            s: per_arm["roc"][s] - per_arm["grpo"][s] for s in both if s in per_arm["roc"] and s in per_arm["grpo"]
        }
        mean, low, high = t_interval(list(per_seed.values()))
        out[key] = {
            "per_arm": per_arm,
            "per_seed": per_seed,
            "mean": mean,
            "ci95": [low, high],
            "seeds_to_settle": seeds_to_settle(list(per_seed.values())),
        }
    return out


def seeds_to_settle(differences: Sequence[float], level: float = 0.95) -> int | None:
    """The smallest number of seeds n whose t-interval (``level``) would exclude zero if the differences kept their
    mean and sample spread: ``t(n-1) * s / sqrt(n) < |mean|``. None when the interval already excludes zero, when
    the mean is zero, or with fewer than two differences."""
    kept = [d for d in differences if not math.isnan(d)]
    if len(kept) < 2:
        return None
    mean, spread = fmean(kept), stdev(kept)
    if mean == 0.0:
        return None
    if spread == 0.0:
        return 2

    def clear(n: int) -> bool:
        return t_quantile(0.5 + level / 2, n - 1) * spread / math.sqrt(n) < abs(mean)

    if clear(len(kept)):
        return None
    # t's quantile is at least the normal one, so no n at or below (z * s / mean)^2 can clear: start the walk there
    # (one bisection per step: from len(kept) a tiny mean would cost up to 100,000 of them).
    z = NormalDist().inv_cdf(0.5 + level / 2)
    n = max(len(kept), min(100_000, math.floor((z * spread / abs(mean)) ** 2)))
    while not clear(n) and n < 100_000:
        n += 1
    return n


def step1_paired(root: Path, seeds: Sequence[int]) -> dict[str, dict[str, int] | None]:
    """Per seed: how many step-1 rollouts both arms drew identically (every action's token ids), of how many.
    All of them, on one machine in float32; a GPU may flip a rare draw (see docs/roc_experiment.md), and the
    episode then differs from that token on. None when an arm did not save them."""
    result: dict[str, dict[str, int] | None] = {}
    for seed in seeds:
        by_arm = []
        for arm in ARMS:
            path = arm_dir(root, arm, seed) / "trajectories.jsonl"
            if not path.exists():
                by_arm.append(None)
                continue
            rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            by_arm.append(
                {
                    (r.get("id"), r["metadata"].get("sample")): [t.get("action_token_ids") for t in r["turns"]]
                    for r in rows
                    if r["metadata"].get("step") == 1
                }
            )
        if by_arm[0] is None or by_arm[1] is None:
            result[str(seed)] = None
            continue
        a, b = by_arm
        result[str(seed)] = {"identical": sum(1 for k in a if k in b and a[k] == b[k]), "of": max(len(a), len(b))}
    return result


def write_per_step_csv(runs: dict[str, dict[int, list[dict[str, Any]]]], path: Path) -> Path:
    """One line per (seed, step, arm): the rollouts' figures before selection, and the log-prob gap if measured."""
    columns = [
        "tool_error_ratio_correct",
        "tool_error_ratio",
        "reward",
        "accuracy",
        "tool_calls_per_trajectory",
        "response_tokens",
        "groups_kept",
        "sampler/kept_pos/error_penalty",
        "logprob_gap/mean_abs",
        "logprob_gap/outside_clip",
        "time/step_s",
    ]
    lines = [",".join(["seed", "step", "arm", *columns])]
    for arm, by_seed in runs.items():
        for seed, rows in by_seed.items():
            for r in rows:
                cells = [str(seed), str(r["step"]), arm]
                cells += ["" if r.get(c) is None else f"{float(r[c]):.6g}" for c in columns]
                lines.append(",".join(cells))
    path.write_text("\n".join(lines) + "\n")
    return path


def write_report(root: Path, seeds: Sequence[int], keep: int | None = None) -> dict[str, Any]:
    """``compare.json``, ``compare.md``, ``compare.png``, ``per_step.csv`` and (given ``keep`` = G, when the arms
    saved their step-1 rollouts) ``roc_check.json`` from the arms' output."""
    runs: dict[str, dict[int, list[dict[str, Any]]]] = {arm: {} for arm in ARMS}
    for arm in ARMS:
        for seed in seeds:
            rows = [r for r in read_metrics(arm_dir(root, arm, seed)) if "reward" in r]
            runs[arm][seed] = rows
    summary: dict[str, Any] = {"seeds": list(seeds), "arms": {}}
    for arm, by_seed in runs.items():
        entry: dict[str, Any] = {"metrics": {str(s): rows for s, rows in by_seed.items()}}
        for key, _ in PANELS:
            per_seed = [_mean(_series(rows, key)) for rows in by_seed.values()]
            last = [_mean(_series(rows[len(rows) // 2 :], key)) for rows in by_seed.values()]
            entry[key] = {
                "mean_all_steps": _mean(per_seed),
                "mean_second_half": _mean(last),
                "spread_second_half": pstdev([v for v in last if not math.isnan(v)]) if len(last) > 1 else 0.0,
                "per_seed_second_half": last,
            }
        for name in ("tool_calls_per_trajectory", "accuracy"):
            entry[name] = {
                "mean_second_half": _mean([_mean(_series(rows[len(rows) // 2 :], name)) for rows in by_seed.values()])
            }
        summary["arms"][arm] = entry
    summary["paired"] = paired_differences(runs, seeds)
    summary["paired_step1"] = step1_paired(root, seeds)
    summary["held_out"] = held_out_differences(root, seeds)
    if keep is not None:
        summary["roc_check"] = _roc_check_all_seeds(root, seeds, keep)
        if summary["roc_check"] is not None:
            (root / "roc_check.json").write_text(json.dumps(summary["roc_check"], indent=1))
    (root / "compare.json").write_text(json.dumps(summary, indent=1))
    write_per_step_csv(runs, root / "per_step.csv")
    (root / "compare.md").write_text(markdown_table(summary))
    plot_compare(runs, root / "compare.png")
    return summary


def _roc_check_all_seeds(root: Path, seeds: Sequence[int], keep: int) -> dict[str, Any] | None:
    """The sampler-only check on every seed's step-1 rollouts (the GRPO arm's; paired, they are the RoC arm's)."""
    from rstar_trainers.local.roc_check import read_step_groups, roc_check

    groups = []
    for seed in seeds:
        path = arm_dir(root, "grpo", seed) / "trajectories.jsonl"
        if path.exists():
            groups += read_step_groups(path, step=1)
    if not groups:
        return None
    return roc_check(groups, keep, roc=ARMS["roc"]["options"])


def markdown_table(summary: dict[str, Any]) -> str:
    """One row per arm: each plotted quantity over all steps and over the second half (mean ± spread of seeds)."""
    head = ["arm", *(f"{k} (all / 2nd half)" for k, _ in PANELS), "tool calls / traj (2nd half)", "accuracy (2nd half)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for arm, entry in summary["arms"].items():
        cells = [arm]
        for key, _ in PANELS:
            e = entry[key]
            cells.append(f"{e['mean_all_steps']:.3f} / {e['mean_second_half']:.3f} ± {e['spread_second_half']:.3f}")
        cells.append(f"{entry['tool_calls_per_trajectory']['mean_second_half']:.2f}")
        cells.append(f"{entry['accuracy']['mean_second_half']:.3f}")
        lines.append("| " + " | ".join(cells) + " |")
    seeds = ", ".join(map(str, summary["seeds"]))
    lines.append("")
    lines.append(f"Seeds {seeds}; ± is the spread (population std) of the per-seed second-half means.")
    paired = summary.get("paired")
    if paired:
        seed_keys = [str(s) for s in summary["seeds"]]
        lines += [
            "",
            "Paired difference RoC - GRPO (same seeds, same step-1 rollouts), per seed and mean with its 95% "
            "t-interval over seeds:",
            "",
            "| quantity | window | " + " | ".join(f"seed {s}" for s in seed_keys) + " | mean | 95% CI |",
            "|" + "---|" * (4 + len(seed_keys)),
        ]
        for key, entry in paired.items():
            for window in ("second_half", "all_steps"):
                e = entry[window]
                low, high = e["ci95"]
                cells = [
                    key,
                    window.replace("_", " "),
                    *(f"{e['per_seed'][s]:+.4f}" for s in seed_keys),
                    f"{e['mean']:+.4f}",
                    "n/a (one seed)" if math.isnan(low) else f"[{low:+.4f}, {high:+.4f}]",
                ]
                lines.append("| " + " | ".join(cells) + " |")
    held_out = summary.get("held_out")
    if held_out:
        seed_keys = [str(s) for s in summary["seeds"]]
        lines += [
            "",
            "Held-out (each arm's model after its last step, `eval_dataset`), per seed RoC - GRPO and mean with its "
            "95% t-interval over seeds:",
            "",
            "| quantity | GRPO | GRPO-RoC | " + " | ".join(f"seed {s}" for s in seed_keys) + " | mean | 95% CI |",
            "|" + "---|" * (5 + len(seed_keys)),
        ]
        for key, e in held_out.items():
            low, high = e["ci95"]
            # over the paired seeds only, so that the two columns and the difference speak of the same seeds
            arms = [_mean([e["per_arm"][arm][s] for s in e["per_seed"]]) for arm in ("grpo", "roc")]
            interval = "n/a" if math.isnan(low) else f"[{low:+.4f}, {high:+.4f}]"
            if e["seeds_to_settle"]:
                interval += f" (~{e['seeds_to_settle']} seeds to exclude 0)"
            cells = [
                key,
                *(f"{v:.4f}" for v in arms),
                *(f"{e['per_seed'][s]:+.4f}" if s in e["per_seed"] else "-" for s in seed_keys),
                f"{e['mean']:+.4f}",
                interval,
            ]
            lines.append("| " + " | ".join(cells) + " |")
    pairing = summary.get("paired_step1")
    if pairing:
        lines += [
            "",
            "Step-1 rollouts identical in both arms: "
            + ", ".join(
                f"seed {s}: {v['identical']} of {v['of']}" if v else f"seed {s}: not saved" for s, v in pairing.items()
            ),
        ]
    check = summary.get("roc_check")
    if check:
        lines += [
            "",
            "Sampler-only check on the step-1 rollouts (all seeds): selected positives' tool-error ratio "
            f"GRPO-RoC {check['roc_selected_error_ratio']:.4f} vs GRPO {check['grpo_selected_error_ratio']:.4f} "
            f"(difference {check['difference']:+.4f}; before selection "
            f"{check['error_ratio_positives_before_selection']:.4f}; {check['mixed_groups']} mixed groups, "
            f"{check['positives_with_tool_error']} of {check['positives']} positives with a tool error).",
        ]
    return "\n".join(lines) + "\n"


def plot_compare(runs: dict[str, dict[int, list[dict[str, Any]]]], path: Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError("plotting needs matplotlib: pip install 'rstar-env[local]'") from exc
    colors = {"grpo": "tab:blue", "roc": "tab:red"}
    fig, axes = plt.subplots(1, len(PANELS) + 1, figsize=(6 * (len(PANELS) + 1), 4.2))
    for ax, (key, title) in zip(axes, PANELS, strict=False):
        for arm, by_seed in runs.items():
            width = max((len(rows) for rows in by_seed.values()), default=0)
            for rows in by_seed.values():  # each seed thin, their mean thick
                ax.plot([r["step"] for r in rows], _series(rows, key), color=colors[arm], alpha=0.25, lw=1)
            mean = [_mean([_series(rows, key)[i] for rows in by_seed.values() if i < len(rows)]) for i in range(width)]
            ax.plot(
                range(1, width + 1),
                mean,
                color=colors[arm],
                lw=2.2,
                marker="o",
                ms=3,
                label=f"{'GRPO-RoC' if arm == 'roc' else 'GRPO'} (mean of {len(by_seed)} seeds)",
            )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    # The paired view: each seed's RoC - GRPO per step (same seeds, same streams), and their mean.
    ax, key = axes[-1], PANELS[0][0]
    diffs = []
    for seed in runs["roc"]:
        roc, grpo = runs["roc"][seed], runs["grpo"].get(seed, [])
        n = min(len(roc), len(grpo))
        d = [a - b for a, b in zip(_series(roc[:n], key), _series(grpo[:n], key), strict=True)]
        diffs.append(d)
        ax.plot(range(1, n + 1), d, color="tab:purple", alpha=0.3, lw=1)
    width = max((len(d) for d in diffs), default=0)
    ax.plot(
        range(1, width + 1),
        [_mean([d[i] for d in diffs if i < len(d)]) for i in range(width)],
        color="tab:purple",
        lw=2.2,
        marker="o",
        ms=3,
        label=f"RoC - GRPO (mean of {len(diffs)} seeds)",
    )
    ax.axhline(0.0, color="black", lw=0.8)
    ax.set_title("paired difference: tool-error ratio in correct trajectories", fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
