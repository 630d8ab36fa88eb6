"""The local trainer's commands, mounted into ``rstar-env`` through the ``rstar_env.commands`` entry points:
``train`` (SFT, GRPO-RoC, or SFT then RL), ``compare`` (GRPO vs GRPO-RoC), ``roc-check`` and ``plot``.

The command line never imports this module by name; pyproject declares ``train = "rstar_trainers.local.cli:train"``
and so on, and ``rstar-env`` loads a command when it runs or lists it. So this module imports nothing heavy at the
top (``rstar-env --help`` stays fast): torch and transformers come in when a command runs, and their absence is a
one-line error naming the extra to install.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from rstar_env._cli_util import console, fail, interrupted_status, stops_on_sigterm


# -- train -------------------------------------------------------------------------------------------------------
@click.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), required=True, help="Run config (YAML).")
@click.option("--max-steps", type=int, default=None, help="Stop after this many more steps (checkpointed).")
@click.option("--output-dir", default=None, help="Override trainer.output_dir.")
@click.option("--fresh", is_flag=True, help="Ignore checkpoints in the output directory (start over).")
@click.option(
    "--backend",
    type=click.Choice(["local"]),
    default=None,
    help="Run a config written for another backend (e.g. a stage config) on this machine.",
)
@click.option("--model", default=None, help="Override trainer.model.")
@click.option("--seed", type=int, default=None, help="Override trainer.seed (RL, and an sft: stage's default seed).")
@click.option("--device", default=None, help="Override trainer.device: cpu, cuda, cuda:N (SFT stage too).")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default=None,
    help="Override trainer.dtype: compute precision of rollouts and training (weights stay float32).",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override an RL trainer key (YAML value), e.g. --set steps=2; repeatable.",
)
@stops_on_sigterm
def train(
    config: str,
    max_steps: int | None,
    output_dir: str | None,
    fresh: bool,
    backend: str | None,
    model: str | None,
    seed: int | None,
    device: str | None,
    dtype: str | None,
    sets: tuple[str, ...],
) -> None:
    """Train on this machine (the `local` trainer): GRPO-RoC, an SFT stage (`trainer.stage: sft`), or both (an RL
    section with an `sft:` sub-section runs SFT first, then RL from its weights). Resumes from the output
    directory's checkpoints. Ctrl-C or SIGTERM saves a checkpoint."""
    try:
        for module in ("config", "sft", "trainer"):
            importlib.import_module(f"rstar_trainers.local.{module}")
    except ImportError as exc:
        fail(f"the local trainer needs torch and transformers ({exc}): pip install 'rstar-env[local]'")
    run, sft, settings = _plan(
        config, backend=backend, output_dir=output_dir, model=model, seed=seed, device=device, dtype=dtype, sets=sets
    )
    if fresh:
        import shutil

        shutil.rmtree(settings.output_dir if settings is not None else sft.output_dir, ignore_errors=True)
    from rstar_env import threads

    threads.configure(settings.threads if settings is not None else sft.threads)  # the SFT stage's process inherits it
    started = time.monotonic()
    if settings is None:
        _sft_alone(run, sft, max_steps, started)
        return
    sft_model: str | None = None
    if sft is not None:
        sft_model = str(_sft_before_rl(run, sft))
        settings = settings.model_copy(update={"model": sft_model})
    _rl_stage(run, settings, max_steps, started, sft_model)


def _plan(
    config: str,
    *,
    backend: str | None,
    output_dir: str | None,
    model: str | None,
    seed: int | None,
    device: str | None,
    dtype: str | None,
    sets: tuple[str, ...],
) -> tuple[Any, Any, Any]:
    """``(run config, SFT settings or None, RL settings or None)``: an SFT stage alone (``trainer.stage: sft``), RL
    alone, or SFT then RL (an ``sft:`` sub-section); the device and dtype are checked before any model loads."""
    from rstar_env.config import ConfigError, load_config
    from rstar_trainers.local.config import sft_config, trainer_config

    try:
        run = load_config(config)
        if run.trainer.get("stage") == "sft":
            sft = sft_config(run.trainer, output_dir=output_dir, model=model, seed=seed, device=device)
            settings = None
        else:
            settings = trainer_config(
                run,
                force_local=backend == "local",
                output_dir=output_dir,
                model=model,
                seed=seed,
                device=device,
                dtype=dtype,
                **_overrides(sets),
            )
            sft = None if settings.sft is None else _sft_before_rl_config(settings, device)
        _check_device(
            device or (settings.device if settings is not None else sft.device),
            dtype or (settings.dtype if settings is not None else "float32"),
        )
    except ConfigError as exc:
        fail(str(exc))
    return run, sft, settings


def _sft_before_rl_config(settings: Any, device: str | None) -> Any:
    """The SFT stage of an RL config's ``sft:`` sub-section: the RL model, seed and device unless it says
    otherwise, in ``OUTPUT_DIR/sft``."""
    from rstar_trainers.local.config import sft_config

    return sft_config(
        {
            "model": settings.model,
            "seed": settings.seed,
            "device": settings.device,
            "tensorboard": settings.tensorboard,
            **settings.sft,
            "output_dir": str(Path(settings.output_dir) / "sft"),
        },
        device=device,
    )


@contextlib.contextmanager
def _sft_errors() -> Iterator[None]:
    from rstar_env.config import ConfigError
    from rstar_env.data import DataError

    try:
        yield
    except (ConfigError, DataError) as exc:
        fail(str(exc))
    except KeyboardInterrupt as exc:
        console.print("[yellow]interrupted: SFT checkpoint saved[/]")
        raise SystemExit(interrupted_status(exc)) from None


def _sft_alone(run: Any, sft: Any, max_steps: int | None, started: float) -> None:
    """An SFT stage on its own: its table, its held-out report, then the summary (or where to resume)."""
    from rstar_trainers.local.progress import (
        SFT_COLUMNS,
        RunProgress,
        StepTable,
        held_out_line,
        peak_memory_gib,
        summary_lines,
    )
    from rstar_trainers.local.sft import run_sft_stage

    console.print("[bold]SFT stage[/] -> " + sft.output_dir)
    with _sft_errors(), RunProgress(console) as progress:
        model_dir, report = run_sft_stage(
            run, sft, max_steps=max_steps, on_progress=progress.update, on_step=StepTable(progress, SFT_COLUMNS).add
        )
    if report:
        console.print(held_out_line("SFT held-out", report), markup=False, highlight=False, soft_wrap=True)
    if model_dir is None:
        console.print(f"SFT stage not finished yet (rerun to continue); checkpoints in {sft.output_dir}")
        return
    eval_path = Path(sft.output_dir) / "eval.json"
    for line in summary_lines(
        model=str(model_dir),
        run_dir=sft.output_dir,
        eval_before=None,
        eval_after=report or None,
        eval_path=str(eval_path) if eval_path.exists() else None,
        seconds=time.monotonic() - started,
        peak_gib=peak_memory_gib(),
        steps=_last_step(Path(sft.output_dir)),
    ):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _sft_before_rl(run: Any, sft: Any) -> Path:
    """The SFT stage of an SFT -> RL config, run (or found finished) in a child process that shows its own
    progress, so RL never holds its memory; returns the model RL starts from, or fails if the stage is unfinished."""
    from rstar_trainers.local.progress import held_out_line
    from rstar_trainers.local.sft import run_sft_stage_isolated

    console.print("[bold]SFT stage[/] -> " + sft.output_dir)
    with _sft_errors():
        model_dir, report = run_sft_stage_isolated(run, sft)
    if report:
        console.print(held_out_line("SFT held-out", report), markup=False, highlight=False, soft_wrap=True)
    if model_dir is None:
        fail(f"the SFT stage has not finished (rerun to continue it); its checkpoints are in {sft.output_dir}")
    console.print("[bold]RL stage[/] from " + str(model_dir))
    return model_dir


def _rl_stage(run: Any, settings: Any, max_steps: int | None, started: float, sft_model: str | None) -> None:
    """GRPO-RoC with its per-step table and held-out lines, then the summary; Ctrl-C saves a checkpoint."""
    from rstar_env.config import ConfigError
    from rstar_env.data import DataError
    from rstar_env.sampler import SamplerError
    from rstar_trainers.local.progress import (
        RL_COLUMNS,
        RL_LEGEND,
        RunProgress,
        StepTable,
        held_out_line,
        peak_memory_gib,
        summary_lines,
        sync_line,
        sync_ok,
    )
    from rstar_trainers.local.trainer import LocalTrainer

    syncs: list[tuple[float, float]] = []

    def held_out(name: str, report: dict[str, float]) -> None:
        progress.print(held_out_line("held-out before RL" if name == "eval_start" else "held-out after RL", report))

    with RunProgress(console) as progress:
        try:
            trainer = LocalTrainer(run, settings, on_progress=progress.update)
        except (ConfigError, DataError, ValueError) as exc:  # ValueError: a device or dtype this machine lacks
            fail(str(exc))
        if trainer.step:
            progress.print(f"resuming {settings.output_dir} at step {trainer.step}")
        table = StepTable(progress, RL_COLUMNS, legend=RL_LEGEND)

        def on_step(metrics: dict[str, Any]) -> None:
            table.add(metrics)
            if "sync/probe_gap_after" in metrics:  # the first check, and any that fails, get a line of their own
                syncs.append((metrics["sync/probe_gap_before"], metrics["sync/probe_gap_after"]))
                if len(syncs) == 1 or not sync_ok(*syncs[-1], settings.dtype):
                    progress.print(sync_line(syncs[-1:], settings.dtype) or "")

        try:
            trainer.train(
                max_steps=max_steps,
                on_step=on_step,
                on_eval=held_out,
                on_progress=progress.update,
            )
        except SamplerError as exc:  # a plugin's contract broken: its message says which and how, no traceback
            fail(str(exc))
        except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM
            console.print(f"[yellow]interrupted: checkpoint saved at step {trainer.step}[/]")
            raise SystemExit(interrupted_status(exc)) from None
        finally:
            trainer.close()
    root = Path(settings.output_dir)
    model_path = root / "model"
    for line in summary_lines(
        model=str(model_path) if (model_path / "config.json").exists() and trainer.step >= settings.steps else None,
        run_dir=settings.output_dir,
        eval_before=_read_json(root / "eval_start.json"),
        eval_after=_read_json(root / "eval.json"),
        eval_path=str(root / "eval.json") if (root / "eval.json").exists() else None,
        seconds=time.monotonic() - started,
        peak_gib=peak_memory_gib(),
        steps=trainer.step,
        sft_model=sft_model,
    ):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    summary = sync_line(syncs, settings.dtype)
    if summary is not None and len(syncs) > 1:  # one sync: its own line above already said it all
        console.print(summary, markup=False, highlight=False, soft_wrap=True)


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def _last_step(run_dir: Path) -> int:
    from rstar_trainers.local.logging import read_metrics

    try:
        return max((int(r.get("step", 0)) for r in read_metrics(run_dir)), default=0)
    except FileNotFoundError:
        return 0


# -- compare -----------------------------------------------------------------------------------------------------
@click.command()
@click.option(
    "--config",
    "config",
    type=click.Path(dir_okay=False),
    required=True,
    help="An RL config with an `sft:` sub-section (e.g. configs/quickstart.yaml), or any RL config with --sft-model.",
)
@click.option("--seeds", default="0,1", show_default=True, help="Comma-separated seeds; each trains both arms.")
@click.option("--steps", type=int, default=None, help="RL steps per arm (default: the config's trainer.steps).")
@click.option("--output-dir", default=None, help="Where the arms, figure and table go (default: OUTPUT_DIR/compare).")
@click.option(
    "--sft-model",
    default=None,
    help="Start both arms from this model instead of the config's SFT stage (run, or found finished, "
    "in OUTPUT_DIR/sft).",
)
@click.option("--device", default=None, help="Override trainer.device: cpu, cuda, cuda:N (SFT stage too).")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default=None,
    help="Override trainer.dtype (compute precision; weights stay float32).",
)
@click.option(
    "--jobs",
    type=int,
    default=1,
    show_default=True,
    help="Arms trained at once, each in its own process (e.g. all 2 x seeds on one GPU).",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a trainer key (YAML value), e.g. --set prompts_per_step=4; repeatable.",
)
@stops_on_sigterm
def compare(
    config: str,
    seeds: str,
    steps: int | None,
    output_dir: str | None,
    sft_model: str | None,
    device: str | None,
    dtype: str | None,
    jobs: int,
    sets: tuple[str, ...],
) -> None:
    """GRPO vs GRPO-RoC from the same SFT checkpoint, with the same seeds, data and steps, as paired arms: for
    each seed both arms draw the same step-1 rollouts (per-request sampling streams) and differ only through the
    sampler. Plots, per step, the tool-error ratio in correct trajectories before selection, the reward, the
    response length and the per-seed difference; prints the per-seed differences RoC - GRPO with a 95%
    t-interval over seeds; writes both arms' metrics, compare.png, compare.md, per_step.csv and the sampler-only
    check of the step-1 rollouts (roc_check.json). Reruns resume."""
    from rstar_env.config import ConfigError, load_config
    from rstar_env.data import DataError

    try:
        from rstar_trainers.local.compare import run_compare
        from rstar_trainers.local.config import trainer_config
        from rstar_trainers.local.sft import run_sft_stage_isolated
    except ImportError as exc:
        fail(f"compare needs torch and transformers ({exc}): pip install 'rstar-env[local]'")
    try:
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
    except ValueError:
        fail(f"--seeds takes comma-separated integers, got {seeds!r}")
    if not seed_list or (steps is not None and steps < 1) or jobs < 1:
        fail("give at least one seed, --steps >= 1 and --jobs >= 1")
    try:
        run = load_config(config)
        settings = trainer_config(run, device=device, dtype=dtype, **_overrides(sets))
        _check_device(settings.device, settings.dtype)
    except ConfigError as exc:
        fail(str(exc))
    root = Path(settings.output_dir)
    model = sft_model
    if model is None:
        if settings.sft is None:
            fail(f"{config} has no trainer.sft section: pass --sft-model PATH (the checkpoint both arms start from)")
        sft = _sft_before_rl_config(settings, device)
        console.print(f"SFT stage in {sft.output_dir} (reused when finished)")
        try:
            model_dir, _ = run_sft_stage_isolated(run, sft)
        except (ConfigError, DataError) as exc:
            fail(str(exc))
        model = str(model_dir)
    out = Path(output_dir) if output_dir else root / "compare"
    from rstar_trainers.local.progress import COMPARE_COLUMNS, RunProgress, StepTable

    with RunProgress(console) as progress:
        table = StepTable(progress, COMPARE_COLUMNS)
        try:
            summary = run_compare(
                run,
                settings,
                out=out,
                model=model,
                seeds=seed_list,
                steps=steps or settings.steps,
                jobs=jobs,
                on_step=lambda arm, seed, m: table.add({**m, "arm": f"{arm}/{seed}"}),
                on_progress=progress.update,
            )
        except KeyboardInterrupt as exc:
            console.print("[yellow]interrupted: each arm's checkpoint is saved; rerun to continue[/]")
            raise SystemExit(interrupted_status(exc)) from None
    click.echo((out / "compare.md").read_text())
    roc = summary["arms"]["roc"]["tool_error_ratio_correct"]["mean_second_half"]
    grpo = summary["arms"]["grpo"]["tool_error_ratio_correct"]["mean_second_half"]
    paired = summary["paired"]["tool_error_ratio_correct"]["second_half"]
    low, high = paired["ci95"]
    interval = "no interval with one seed" if low != low else f"95% CI [{low:+.4f}, {high:+.4f}] over seeds"
    click.echo(
        f"tool-error ratio in correct trajectories, second half: GRPO-RoC {roc:.3f} vs GRPO {grpo:.3f}; "
        f"paired difference RoC - GRPO {paired['mean']:+.4f} ({interval}); figure {out / 'compare.png'}"
    )


# -- roc-check, plot ---------------------------------------------------------------------------------------------
@click.command("roc-check")
@click.argument("rollouts", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--keep", type=int, required=True, help="G: trajectories kept per group (trainer.group_size).")
@click.option("--step", type=int, default=1, show_default=True, help="Which step's rollouts to read.")
@click.option("--draws", type=int, default=500, show_default=True, help="Replays of each sampler (fresh rng each).")
@click.option(
    "--mode",
    type=click.Choice(["topk", "weighted"]),
    default="topk",
    show_default=True,
    help="RoC's positive selection.",
)
@click.option("--json-out", type=click.Path(dir_okay=False), default=None, help="Also write the report as JSON.")
def roc_check_command(
    rollouts: tuple[str, ...], keep: int, step: int, draws: int, mode: str, json_out: str | None
) -> None:
    """The sampler-only check: on recorded rollouts (run directories or trajectories.jsonl files, e.g. each arm
    of `rstar-env compare`), the tool-error ratio of the positives GRPO-RoC would keep against GRPO's uniform
    pick, over many draws. If RoC is not clearly below GRPO here, training from these weights cannot show its
    effect."""
    from rstar_trainers.local.roc_check import format_report, read_step_groups, roc_check

    if keep < 1 or draws < 1:
        fail("--keep and --draws must be at least 1")
    groups = []
    try:
        for path in rollouts:
            groups += read_step_groups(path, step=step)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    report = roc_check(groups, keep, draws=draws, roc={"mode": mode})
    click.echo(format_report(report))
    if json_out:
        Path(json_out).write_text(json.dumps(report, indent=1))


@click.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="PNG path (default RUN_DIR/curves.png).")
def plot(run_dir: str, out: str | None) -> None:
    """Draw a training run's curves to PNG."""
    from rstar_trainers.local.plot import plot_run

    try:
        path = plot_run(run_dir, out)
    except (FileNotFoundError, ValueError, ImportError) as exc:
        fail(str(exc))
    click.echo(str(path))


# -- shared ------------------------------------------------------------------------------------------------------
def _overrides(sets: tuple[str, ...]) -> dict[str, Any]:
    """``--set KEY=VALUE`` pairs as trainer overrides (values parsed as YAML: numbers, booleans, strings)."""
    import yaml

    out: dict[str, Any] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            fail(f"--set takes KEY=VALUE (a trainer key), got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


def _check_device(device: str, dtype: str) -> None:
    """Fail with a clear message, before any model loads, when torch cannot use ``device`` / ``dtype`` here."""
    try:
        from rstar_env.rollout.local import check_dtype
        from rstar_trainers.local.trainer import check_device
    except ImportError:
        return  # the trainer's own import error says what to install
    try:
        check_device(device)
        check_dtype(dtype, device)
    except ValueError as exc:
        fail(str(exc))
