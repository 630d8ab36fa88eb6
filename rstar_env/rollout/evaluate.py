"""Evaluate a policy on a dataset: k samples per problem, trajectories to JSONL, a summary of the metrics.

Resumable: trajectories already in the output file (matched by problem id and sample index) are not run again,
except those that ended in a failure of the system (``env_error``, ``policy_error``) and those produced with other
settings (each record's ``metadata["settings"]``: the verifier's name and options hash, the env settings' hash; see
``MathToolEnv.settings_key``), which are run again (``rescored_stale`` counts them). The summary covers the whole
file, the latest record of each episode. A half-written last line (a killed run) is ignored with a warning.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rstar_env.rollout.collect import iter_collect, jobs_for
from rstar_env.rollout.metrics import summarize
from rstar_env.rollout.policy import Policy
from rstar_env.trajectory import Trajectory
from rstar_env.vector import MathToolVectorEnv


def read_trajectories(path: str | Path) -> list[Trajectory]:
    """Trajectories from a JSONL file; unreadable lines are skipped with a warning naming them."""
    path = Path(path)
    if not path.exists():
        return []
    trajectories = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                trajectories.append(Trajectory.from_dict(json.loads(line)))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                warnings.warn(f"{path}:{number}: skipping an unreadable trajectory ({exc})", stacklevel=2)
    return trajectories


def _done_key(trajectory: Trajectory) -> tuple[str | None, int]:
    return trajectory.id, int(trajectory.metadata.get("sample", 0))


def _end_dangling_line(path: Path) -> None:
    """Make sure appended lines start on a line of their own (a killed run may have left half a line)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size:
        with path.open("rb+") as handle:
            handle.seek(-1, 2)
            if handle.read(1) != b"\n":
                handle.write(b"\n")


async def evaluate(
    policy: Policy,
    rows: Sequence[Any],
    *,
    samples: int = 1,
    out: str | Path | None = None,
    width: int = 32,
    env: MathToolVectorEnv | None = None,
    on_done: Callable[[Trajectory], None] | None = None,
    **env_options: Any,
) -> dict[str, Any]:
    """Run ``samples`` episodes per row and return :func:`~rstar_env.rollout.metrics.summarize` of them all, plus
    ``resumed`` and, for a :class:`~rstar_env.rollout.dispatch.DispatchPolicy`, ``engines`` (its stats).

    With ``out``, each trajectory is appended to that JSONL file as it finishes, and finished ones are skipped.
    """
    owned = env is None
    if env is None:
        env = MathToolVectorEnv(max(1, min(width, len(rows) * samples)), tokenizer=policy.tokenizer, **env_options)
    try:
        # The last record of a job wins. One that ended in a system failure is not done, and runs again; so does
        # one scored with other settings (another verifier, its options, the env's rules or tools): its score is
        # stale, never reported as current.
        current = env.envs[0].settings_key
        latest = {_done_key(t): t for t in (read_trajectories(out) if out else [])}
        stale = [t for t in latest.values() if not t.failed and t.metadata.get("settings") != current]
        previous = [t for t in latest.values() if not t.failed and t.metadata.get("settings") == current]
        done = {_done_key(t) for t in previous}
        jobs = jobs_for(rows, samples, skip=lambda job: (job.row.get("id"), job.sample) in done)
        fresh: list[Trajectory] = []
        if out is not None:
            _end_dangling_line(Path(out))
        with Path(out).open("a", encoding="utf-8") if out is not None else contextlib.nullcontext() as handle:
            async for _job, trajectory in iter_collect(policy, jobs, width=width, env=env):
                fresh.append(trajectory)
                if handle is not None:
                    handle.write(json.dumps(trajectory.to_dict(), ensure_ascii=False) + "\n")
                    handle.flush()  # a killed run keeps everything that finished
                if on_done is not None:
                    on_done(trajectory)
    finally:
        if owned:
            await env.aclose()
    summary = summarize(previous + fresh)
    summary["resumed"] = len(previous)
    stats = getattr(policy, "stats", None)
    if callable(stats):  # a multi-engine dispatcher: requests, failures and busy time per engine (this run's)
        summary["engines"] = stats()
    summary["rescored_stale"] = len(stale)
    return summary
