"""Collect trajectories: drive many episodes with a policy, each episode on its own, none waiting for another.

``collect`` keeps ``width`` episodes in flight, one asyncio task per slot. Each task runs its episode as
generate -> step -> generate with no barrier between episodes: a tool call goes to the environment the moment its
generation returns, and an episode that ends hands its slot to the next pending (problem, sample) pair at once.
Batching is the policy's business, not the collector's: the local transformers policy gathers requests that arrive
together into one forward batch (a micro-batching queue), the OpenAI policy sends each request as it comes under a
concurrency limit, and the multi-engine dispatcher routes each to an engine with free KV capacity.

Reproducible sampling: each request carries its own seed, :func:`stream_seed` of (run seed, problem id, sample
index, turn). A local model draws each row's tokens from that row's own generator, an endpoint gets it as the
request's ``seed``; which requests share a batch, and when a tool call returns, then change nothing that is drawn.

Token-level truth: with a token-level policy the env is built with the policy's tokenizer. The context of each
turn is the prompt's ids, then every action's generated ids and every feedback's ids, appended, never re-tokenized;
:func:`trajectory_tokens` rebuilds exactly that sequence (and the action mask) for the trainer.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections import deque
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


def stream_seed(run_seed: int, problem_id: object, sample: int, turn: int) -> int:
    """The seed of one request's sampling stream: a 63-bit hash of (run seed, problem id, sample index, turn).

    A hash rather than arithmetic so that neighbouring runs, problems or samples never share streams, and the same
    on every machine and Python (no ``hash()`` randomisation)."""
    key = f"{int(run_seed)}\x1f{problem_id}\x1f{int(sample)}\x1f{int(turn)}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") >> 1


def problem_key(row: dict[str, Any]) -> str:
    """What identifies a problem in :func:`stream_seed`: its ``id``, else a digest of its text."""
    if row.get("id") is not None:
        return f"id:{row['id']}"
    return "text:" + hashlib.blake2b(str(row.get("problem", "")).encode(), digest_size=8).hexdigest()


def run_seed_of(policy: Policy) -> int | None:
    """The seed a policy was built with (``sampling.seed``; a dispatcher's first engine's), or None."""
    sampling = getattr(policy, "sampling", None)
    if sampling is None and getattr(policy, "engines", None):
        first = policy.engines[0]  # type: ignore[attr-defined]
        sampling = getattr(getattr(getattr(first, "spec", first), "policy", None), "sampling", None)
    return getattr(sampling, "seed", None)


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
    seed: int | None = None,
    **env_options: Any,
) -> AsyncIterator[tuple[Job, Trajectory]]:
    """Yield ``(job, trajectory)`` as each episode ends (in completion order).

    Each trajectory's ``metadata`` holds ``sample`` (which of the row's samples) and the policy's finish reasons.
    ``env``: a vector env to run on (its sub-envs are the slots; ``width`` is then its size); otherwise one of
    ``min(width, len(jobs))`` slots is built from ``env_options`` with the policy's tokenizer, and closed at the end.
    ``seed``: the run seed of every request's :func:`stream_seed` (default: the policy's ``sampling.seed``; with
    neither, requests carry no seed and the policy samples from its own stream, which is not reproducible once
    episodes overlap). Jobs start in the order given. An exception in one episode (a bug: policies and the env
    report failures in the trajectory) stops the others and is raised here; so does abandoning the iterator.
    """
    if not jobs:
        return
    if width < 1 and env is None:
        raise ValueError(f"width must be at least 1, got {width}")
    owned = env is None
    if env is None:
        env = MathToolVectorEnv(min(width, len(jobs)), tokenizer=policy.tokenizer, **env_options)
    slots: list[MathToolEnv] = env.envs
    if seed is None:
        seed = run_seed_of(policy)
    pending = deque(jobs)
    finished: asyncio.Queue[tuple[Job, Trajectory] | BaseException] = asyncio.Queue()

    async def run_slot(slot: MathToolEnv) -> None:
        try:
            while pending:
                job = pending.popleft()
                trajectory = await _episode(slot, job, policy, seed)
                finished.put_nowait((job, trajectory))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # handed to the consumer, who re-raises it
            finished.put_nowait(exc)

    tasks = [asyncio.create_task(run_slot(slot)) for slot in slots[: len(jobs)]]
    try:
        for _ in range(len(jobs)):
            item = await finished.get()
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if owned:
            await asyncio.gather(*(e.aclose() for e in reversed(slots)))


async def _episode(slot: MathToolEnv, job: Job, policy: Policy, seed: int | None = None) -> Trajectory:
    """One episode on ``slot``, start to end: reset, then generate and step until it ends."""
    await slot.areset(options=job.row)
    key = uuid.uuid4().hex
    problem = problem_key(job.row)
    turn = 0
    while True:
        request = _request(slot, policy, key)
        if seed is not None:
            request.seed = stream_seed(seed, problem, job.sample, turn)
        turn += 1
        generations = await policy.generate([request])
        if len(generations) != 1:
            raise RuntimeError(f"policy returned {len(generations)} generations for 1 request")
        trajectory = await _step(slot, generations[0])
        if trajectory is not None:
            trajectory.metadata["sample"] = job.sample
            return trajectory


async def collect(policy: Policy, jobs: Sequence[Job], **options: Any) -> list[Trajectory]:
    """All trajectories of ``jobs``, in job order; see :func:`iter_collect` for the options."""
    index = {id(job): i for i, job in enumerate(jobs)}
    by_job: list[Trajectory | None] = [None] * len(jobs)
    async for job, trajectory in iter_collect(policy, jobs, **options):
        by_job[index[id(job)]] = trajectory
    return [t for t in by_job if t is not None]


def _request(env: MathToolEnv, policy: Policy, episode: str | None = None) -> Request:
    trajectory = env.trajectory
    assert trajectory is not None
    left = env.budget_left
    # A turn may use what the budget leaves plus one token, so an over-long answer is cut by the budget (reward 0)
    # rather than silently shortened into a valid-looking one.
    return Request(
        trajectory=trajectory,
        context_ids=context_ids(trajectory) if policy.tokenizer is not None else None,
        max_new_tokens=None if left is None or env.settings.length_unit != "tokens" else left + 1,
        episode=episode,
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
