"""Evaluate a policy on a dataset: k samples per problem, trajectories to JSONL, a summary of the metrics.

Resumable: trajectories already in the output file (matched by problem id, problem text, gold answer and sample
index) are not run again, except those that ended in a failure of the system (``env_error``, ``policy_error``) and
those produced with other settings (each record's ``metadata["settings"]``: the reward plugin's name and options hash,
the env settings' hash; see ``MathToolEnv.settings_key``), which are run again (``rescored_stale`` counts them).

Resuming never crosses models: with ``model`` (see :func:`model_identity`: the model's name or path and a hash of
its weights and config, or an endpoint's served model name) each record carries it in ``metadata["model"]``, and a
file holding another model's episodes is refused (:class:`EvalResumeError` names both). The summary covers this
run's selection only (its rows and samples: ``--limit`` and the dataset choose them), the latest record of each
episode; other records in the file are left as they are. A half-written last line (a killed run) is ignored with a
warning.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rstar_env.rollout.collect import iter_collect, jobs_for
from rstar_env.rollout.metrics import summarize
from rstar_env.rollout.policy import Policy
from rstar_env.trajectory import Trajectory
from rstar_env.vector import MathToolVectorEnv


class EvalResumeError(ValueError):
    """The output file holds episodes of another model: resuming from it would report that model's scores."""


_HASHES: dict[tuple[str, int, int], str] = {}


def _file_digest(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) within the process."""
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _HASHES:
        with path.open("rb") as handle:
            _HASHES[key] = hashlib.file_digest(handle, "sha256").hexdigest()
    return _HASHES[key]


def model_identity(
    model: str | os.PathLike[str] | None = None, *, served_model: str | None = None, endpoints: Sequence[str] = ()
) -> dict[str, str]:
    """What an evaluation's records are keyed on, so a resumed run never mixes two models' episodes.

    A served model (``endpoints``): ``{"model": served name, "endpoint": the URLs}``; the served name is the key
    (the engine's weights are not visible from here). A local model (``None``/``"smollm2"``, a directory or a
    ``.gguf`` file): ``{"model": name or path, "hash": sha256 over its config and weight files}``, so a
    directory retrained in place (``runs/x/model``) is a different model. The hash costs about a second per GB.
    """
    if endpoints:
        if not served_model:
            raise ValueError("an endpoint evaluation needs the served model's name")
        return {"model": served_model, "endpoint": ", ".join(endpoints)}
    from rstar_env.rollout.local import DEFAULT_MODEL, resolve_model

    folder, gguf = resolve_model(model)
    if gguf:
        files = [folder / gguf]
    else:
        weights = (".safetensors", ".bin", ".pt", ".gguf")
        files = sorted(
            p
            for p in folder.iterdir()
            if p.is_file() and (p.suffix in weights or p.name in ("config.json", "generation_config.json"))
        )
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + _file_digest(file).encode() + b"\0")
    return {"model": str(model) if model is not None else DEFAULT_MODEL, "hash": digest.hexdigest()[:16]}


def _describe(identity: dict[str, Any] | None) -> str:
    if not identity:
        return "an unrecorded model (a file written before models were recorded, or by evaluate() without model=)"
    if "hash" in identity:
        return f"{identity.get('model')!r} (weights {identity['hash']})"
    return f"{identity.get('model')!r} served at {identity.get('endpoint')}"


def _same_model(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    """Local models match on their weights' hash; served ones on the served name."""
    if not a:
        return False
    if "hash" in b or "hash" in a:
        return a.get("hash") == b.get("hash")
    return a.get("model") == b.get("model")


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


def _done_key(trajectory: Trajectory) -> tuple[str | None, str, str, int]:
    return trajectory.id, trajectory.problem, trajectory.answer, int(trajectory.metadata.get("sample", 0))


def _job_key(row: Any, sample: int) -> tuple[str | None, str, str, int]:
    """The key :func:`_done_key` gives the trajectory of this row and sample (as the env records them)."""
    pid, answer = row.get("id"), row.get("answer")
    answer = "" if answer is None or not str(answer).strip() else str(answer)
    return None if pid is None else str(pid), str(row.get("problem")), answer, sample


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
    model: dict[str, Any] | None = None,
    **env_options: Any,
) -> dict[str, Any]:
    """Run ``samples`` episodes per row and return :func:`~rstar_env.rollout.metrics.summarize` of them all, plus
    ``resumed`` and, for a :class:`~rstar_env.rollout.dispatch.DispatchPolicy`, ``engines`` (its stats).

    With ``out``, each trajectory is appended to that JSONL file as it finishes, and finished ones are skipped.
    ``model`` (:func:`model_identity`) is written into each record; a file holding another model's episodes
    raises :class:`EvalResumeError` before anything runs.
    """
    existing = read_trajectories(out) if out else []
    if model is not None:
        others = [t for t in existing if not _same_model(t.metadata.get("model"), model)]
        if others:
            raise EvalResumeError(
                f"{out} holds {len(others)} episode(s) of {_describe(others[0].metadata.get('model'))}; this run "
                f"evaluates {_describe(model)}. Resuming would mix the two models' scores: pass another --out "
                "(or delete the file to start over)."
            )
    owned = env is None
    if env is None:
        env = MathToolVectorEnv(max(1, min(width, len(rows) * samples)), tokenizer=policy.tokenizer, **env_options)
    try:
        # The last record of a job wins. One that ended in a system failure is not done, and runs again; so does
        # one scored with other settings (another reward plugin, its options, the env's rules or tools): its score is
        # stale, never reported as current.
        # Only this run's selection counts (its rows and samples): a file may also hold other problems, or more
        # samples, from an earlier run with another --limit or dataset.
        current = env.envs[0].settings_key
        wanted = {_job_key(job.row, job.sample) for job in jobs_for(rows, samples)}
        latest = {key: t for t in existing if (key := _done_key(t)) in wanted}
        stale = [t for t in latest.values() if not t.failed and t.metadata.get("settings") != current]
        previous = [t for t in latest.values() if not t.failed and t.metadata.get("settings") == current]
        done = {_done_key(t) for t in previous}
        jobs = jobs_for(rows, samples, skip=lambda job: _job_key(job.row, job.sample) in done)
        fresh: list[Trajectory] = []
        if out is not None:
            _end_dangling_line(Path(out))
        with Path(out).open("a", encoding="utf-8") if out is not None else contextlib.nullcontext() as handle:
            async for _job, trajectory in iter_collect(policy, jobs, width=width, env=env):
                if model is not None:
                    trajectory.metadata["model"] = dict(model)
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
