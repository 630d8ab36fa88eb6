"""Collect trajectories: drive many episodes with a policy, batched turn by turn.

``collect`` keeps ``width`` episodes in flight. Each round, every live episode asks the policy for its next
action (one batched call), then all of them step concurrently (tool calls overlap on the shared sandbox pool).
An episode that ends is replaced at once by the next pending (problem, sample) pair, so the batch stays full:
continuous batching at the granularity of turns.

Token-level truth: with a token-level policy the env is built with the policy's tokenizer. The context of each
turn is the prompt's ids, then every action's generated ids and every feedback's ids, appended, never re-tokenized;
:func:`trajectory_tokens` rebuilds exactly that sequence (and the action mask) for the trainer.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rstar_env.env import MathToolEnv
from rstar_env.rollout.policy import Generation, Policy, Request
from rstar_env.trajectory import Trajectory
from rstar_env.vector import MathToolVectorEnv


@dataclass(frozen=True)
class Job:
    """One episode to run: a problem row and which of its samples this is."""

    row: dict[str, Any]
    sample: int = 0


@dataclass
class TokenizedTrajectory:
    """What a trainer scores: the full id sequence and which ids the policy generated."""

    input_ids: list[int]
    action_mask: list[int]
    """1 where the policy generated the token, 0 for prompt and environment feedback (masked out of the loss)."""
    logprobs: list[float]
    """The sampling log-prob of each generated token; 0.0 elsewhere."""
    prompt_length: int


def trajectory_tokens(trajectory: Trajectory) -> TokenizedTrajectory:
    """The token sequence of a trajectory collected by a token-level policy, exactly as it was generated."""
    if trajectory.prompt_token_ids is None:
        raise ValueError("this trajectory has no token ids: collect it with a token-level policy and a tokenizer")
    ids = list(trajectory.prompt_token_ids)
    mask = [0] * len(ids)
    logprobs = [0.0] * len(ids)
    for n, turn in enumerate(trajectory.turns):
        if turn.action_token_ids is None:
            raise ValueError(f"turn {n} has no action token ids")
        ids += turn.action_token_ids
        mask += [1] * len(turn.action_token_ids)
        logprobs += turn.action_logprobs or [0.0] * len(turn.action_token_ids)
        if turn.feedback_token_ids:
            ids += turn.feedback_token_ids
            mask += [0] * len(turn.feedback_token_ids)
            logprobs += [0.0] * len(turn.feedback_token_ids)
    return TokenizedTrajectory(ids, mask, logprobs, len(trajectory.prompt_token_ids))


def context_ids(trajectory: Trajectory) -> list[int] | None:
    """The ids a token-level policy continues from: the sequence so far."""
    if trajectory.prompt_token_ids is None:
        return None
    return trajectory_tokens(trajectory).input_ids


def jobs_for(rows: Iterable[Any], samples: int = 1, skip: Callable[[Job], bool] | None = None) -> list[Job]:
    """``samples`` jobs per row (rows are dicts or records with ``to_dict``), minus those ``skip`` says are done."""
    jobs = []
    for row in rows:
        data = row.to_dict() if hasattr(row, "to_dict") else dict(row)
        for k in range(samples):
            job = Job(data, k)
            if skip is None or not skip(job):
                jobs.append(job)
    return jobs


async def iter_collect(
    policy: Policy,
    jobs: Sequence[Job],
    *,
    width: int = 32,
    env: MathToolVectorEnv | None = None,
    **env_options: Any,
) -> AsyncIterator[tuple[Job, Trajectory]]:
    """Yield ``(job, trajectory)`` as each episode ends (in completion order).

    Each trajectory's ``metadata`` holds ``sample`` (which of the row's samples) and the policy's finish reasons.
    ``env``: a vector env to run on (its sub-envs are the slots); otherwise one is built from ``env_options``
    with the policy's tokenizer, and closed at the end.
    """
    if not jobs:
        return
    owned = env is None
    if env is None:
        env = MathToolVectorEnv(min(width, len(jobs)), tokenizer=policy.tokenizer, **env_options)
    slots: list[MathToolEnv] = env.envs
    pending = list(reversed(jobs))
    live: dict[int, Job] = {}

    async def start(slot: int, job: Job) -> None:
        live[slot] = job
        await slots[slot].areset(options=job.row)

    try:
        await asyncio.gather(*(start(i, pending.pop()) for i in range(min(len(slots), len(pending)))))
        while live:
            order = sorted(live)
            requests = [_request(slots[i], policy) for i in order]
            generations = await policy.generate(requests)
            if len(generations) != len(requests):
                raise RuntimeError(f"policy returned {len(generations)} generations for {len(requests)} requests")
            results = await asyncio.gather(*(_step(slots[i], g) for i, g in zip(order, generations, strict=True)))
            finished = []
            for slot, trajectory in zip(order, results, strict=True):
                if trajectory is not None:
                    job = live.pop(slot)
                    trajectory.metadata["sample"] = job.sample
                    finished.append(slot)
                    yield job, trajectory
            refill = [start(slot, pending.pop()) for slot in finished[: len(pending)]]
            await asyncio.gather(*refill)
    finally:
        if owned:
            await asyncio.gather(*(e.aclose() for e in reversed(slots)))


async def collect(policy: Policy, jobs: Sequence[Job], **options: Any) -> list[Trajectory]:
    """All trajectories of ``jobs``, in job order; see :func:`iter_collect` for the options."""
    index = {id(job): i for i, job in enumerate(jobs)}
    by_job: list[Trajectory | None] = [None] * len(jobs)
    async for job, trajectory in iter_collect(policy, jobs, **options):
        by_job[index[id(job)]] = trajectory
    return [t for t in by_job if t is not None]


def _request(env: MathToolEnv, policy: Policy) -> Request:
    trajectory = env.trajectory
    assert trajectory is not None
    left = env.budget_left
    # A turn may use what the budget leaves plus one token, so an over-long answer is cut by the budget (reward 0)
    # rather than silently shortened into a valid-looking one.
    return Request(
        trajectory=trajectory,
        context_ids=context_ids(trajectory) if policy.tokenizer is not None else None,
        max_new_tokens=None if left is None or env.settings.length_unit != "tokens" else left + 1,
    )


async def _step(env: MathToolEnv, generation: Generation) -> Trajectory | None:
    live = env.trajectory
    assert live is not None
    live.metadata.setdefault("finish_reasons", []).append(generation.finish_reason)
    if generation.finish_reason == "error":
        # Generation failed after the policy's own retries: a failure of the system, never a scored answer.
        _, _, terminated, truncated, info = await env.aabort(
            "policy_error", str(generation.metadata.get("error", generation.text))
        )
    else:
        _, _, terminated, truncated, info = await env.astep(
            generation.text, token_ids=generation.token_ids, logprobs=generation.logprobs
        )
    return info["trajectory"] if terminated or truncated else None
