"""Held-out evaluation of a model being trained: does it call the tool, answer in format, answer right?"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import fmean
from typing import Any

from rstar_env.config import RunConfig
from rstar_env.rollout.collect import Job, iter_collect, jobs_for
from rstar_env.rollout.local import TransformersPolicy
from rstar_env.rollout.metrics import has_answer_format
from rstar_env.rollout.policy import SamplingParams
from rstar_env.trajectory import Trajectory
from rstar_env.vector import MathToolVectorEnv


def well_formed_calls(trajectory: Trajectory) -> int:
    """Tool calls that parsed and named a tool (whatever their code then did): the format was right."""
    return sum(call.error != "bad_call" for call in trajectory.tool_calls)


def tool_use_summary(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """``tool_call_share`` (trajectories with at least one well-formed call), ``answer_format_share`` (final action
    with one ``<answer>`` holding ``\\boxed{}``), ``pass@1`` (strict reward > 0), calls and errors. System failures
    (env_error, policy_error) are left out."""
    scored = [t for t in trajectories if not t.failed]
    if not scored:
        return {"episodes": 0.0}
    calls = sum(t.num_tool_calls for t in scored)
    return {
        "episodes": float(len(scored)),
        "pass@1": fmean(float(t.reward > 0) for t in scored),
        "tool_call_share": fmean(float(well_formed_calls(t) > 0) for t in scored),
        "answer_format_share": fmean(float(has_answer_format(t)) for t in scored),
        "tool_calls_per_trajectory": calls / len(scored),
        "tool_error_ratio": sum(t.num_tool_errors for t in scored) / calls if calls else 0.0,
        "response_tokens": fmean(float(t.response_tokens or 0) for t in scored),
    }


def evaluate_model(
    model: Any,
    tokenizer: Any,
    run: RunConfig,
    rows: Sequence[Any],
    *,
    max_new_tokens: int,
    max_response_tokens: int,
    temperature: float = 1.0,
    seed: int = 0,
    samples: int = 1,
    width: int = 32,
    batch_size: int = 32,
    device: str = "cpu",
    dtype: str = "float32",
    on_done: Callable[[int, int], None] | None = None,
    engine: Any = None,
) -> tuple[dict[str, Any], list[Trajectory]]:
    """Roll ``model`` out on ``rows`` in ``run``'s env (its tools, reward, turns) and summarise tool use (with
    ``rewards``: every episode's reward, in the order of ``rows``, so that two reports on the same rows pair up);
    the model is put in eval mode and left there. ``on_done(done, total)`` as each episode ends (progress).
    ``engine``: a policy holding ``model``'s weights already (the trainer's vLLM engine) to generate with instead
    of our own loop; it samples with this call's settings, and its own are restored afterwards."""
    model.eval()
    sampling = SamplingParams(temperature, 1.0, max_new_tokens, seed)
    if engine is None:
        policy = TransformersPolicy(
            model, tokenizer=tokenizer, batch_size=batch_size, device=device, dtype=dtype, sampling=sampling
        )
    else:
        policy, kept = engine, engine.sampling
        policy.sampling = sampling
    jobs = jobs_for(rows, samples)
    env = MathToolVectorEnv(
        min(width, len(jobs)), config=run, tokenizer=tokenizer, max_length=max_response_tokens, length_unit="tokens"
    )
    try:
        trajectories = asyncio.run(collect_reporting(policy, jobs, env, on_done, seed=seed))
    finally:
        env.close()
        if engine is not None:
            engine.sampling = kept
    rewards = [float(t.reward or 0.0) for t in trajectories]
    report: dict[str, Any] = {**tool_use_summary(trajectories), "rewards": rewards}
    return report, trajectories


async def collect_reporting(
    policy: Any,
    jobs: Sequence[Job],
    env: MathToolVectorEnv,
    on_done: Callable[[int, int], None] | None = None,
    **options: Any,
) -> list[Trajectory]:
    """:func:`~rstar_env.rollout.collect.collect` (trajectories in job order), calling ``on_done(done, total)`` as
    each episode ends; ``options`` go to :func:`~rstar_env.rollout.collect.iter_collect` (``seed``...)."""
    index = {id(job): i for i, job in enumerate(jobs)}
    out: list[Trajectory | None] = [None] * len(jobs)
    if on_done is not None:
        on_done(0, len(jobs))
    done = 0
    async for job, trajectory in iter_collect(policy, jobs, env=env, **options):
        out[index[id(job)]] = trajectory
        done += 1
        if on_done is not None:
            on_done(done, len(jobs))
    return [t for t in out if t is not None]


def record_held_out(
    out: Path,
    name: str,
    step: int,
    logger: Any,
    evaluate: Callable[[], dict[str, float]],
    on_eval: Callable[[str, dict[str, float]], None] | None = None,
) -> dict[str, float] | None:
    """Run ``evaluate`` once per run directory: the report goes to ``out/{name}.json`` and, as ``{name}/...``, to
    the metrics at ``step``. Returns ``None`` when ``{name}.json`` already exists (a rerun does not redo it)."""
    path = out / f"{name}.json"
    if path.exists():
        return None
    report = evaluate()
    figures = {f"{name}/{k}": v for k, v in report.items() if isinstance(v, int | float)}  # not the rewards list
    logger.log({"step": step, **figures}, step)
    logger.flush()
    path.write_text(json.dumps(report, indent=2))
    if on_eval is not None:
        on_eval(name, report)
    return report
