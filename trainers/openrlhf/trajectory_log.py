"""``trajectories.jsonl`` for OpenRLHF runs, in the local trainer's format (input of ``rstar-env filter-hard``).

The agent (:mod:`rstar_trainers.openrlhf.agent_func`) returns each episode's :class:`~rstar_env.trajectory.Trajectory`
as a dict under :data:`TRAJECTORY_KEY` in its result; OpenRLHF's engine actor hands that result back to the samples
generator untouched. The RoC generator (one process per job: OpenRLHF's trainer actor, or its samples actor in async
mode, so this is rank 0's file) appends every training rollout of a step, kept or dropped, with
``metadata.step`` (OpenRLHF's global step the rollouts were made for), ``metadata.kept`` (chosen by the sampler) and
``metadata.backend = "openrlhf"``: the same rows as the local trainer, which also writes all rollouts.

Resuming: OpenRLHF resumes from the DeepSpeed checkpoint named in ``{ckpt.path}/_actor/latest`` (``global_stepN``);
rows of steps after N were rolled out by the interrupted run and are rolled out again, so they are removed when the
log is opened, and numbering continues at N + 1.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rstar_env.trajectory import Trajectory
from rstar_trainers.openrlhf.policy_version import TOKEN_VERSIONS_KEY

TRAJECTORY_KEY = "rstar_trajectory"
"""The key of the agent's result (and the attribute of an Experience) that carries the trajectory dict."""
FILENAME = "trajectories.jsonl"


def resumed_step(ckpt_path: str | Path | None) -> int:
    """The global step OpenRLHF resumes from: the tag in ``{ckpt_path}/_actor/latest``, 0 when there is none."""
    if ckpt_path is None:
        return 0
    latest = Path(ckpt_path) / "_actor" / "latest"
    if not latest.is_file():
        return 0
    match = re.fullmatch(r"global_step(\d+)", latest.read_text(encoding="utf-8").strip())
    return int(match.group(1)) if match else 0


def trajectory_record(experience: Any) -> dict[str, Any]:
    """The trajectory dict an experience carries, or, when the agent returned none (OpenRLHF's own length budget
    ended the episode before the env did), the minimal row ``filter-hard`` needs: problem, answer, reward."""
    record = getattr(experience, TRAJECTORY_KEY, None)
    if isinstance(record, dict):
        return dict(record)
    reward = experience.rewards if experience.rewards is not None else experience.info.get("reward")
    value = float(reward.reshape(-1)[0]) if hasattr(reward, "reshape") else float(reward or 0.0)
    return Trajectory(problem=str(experience.prompts[0]), answer=str(experience.labels[0]), reward=value).to_dict()


class TrajectoryLog:
    """Appends each training step's rollouts to ``{out_dir}/trajectories.jsonl`` (see the module docstring)."""

    def __init__(self, out_dir: str | Path, *, resume_from: int = 0) -> None:
        self.path = Path(out_dir) / FILENAME
        self.step = resume_from
        if self.path.exists():
            self._truncate_after(resume_from)

    def _truncate_after(self, step: int) -> None:
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash
            if int((row.get("metadata") or {}).get("step", 0)) <= step:
                kept.append(line)
        self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def write_step(self, experiences: Sequence[Any], kept: Sequence[bool], *, trains: bool = True) -> int:
        """Append rollouts (``kept[i]``: the sampler chose ``experiences[i]``) under the global step they precede;
        returns it. ``trains=False`` (every group dropped: OpenRLHF skips the update and its step counter stays)
        labels them with the same step as the next batch."""
        step = self.step + 1
        if trains:
            self.step = step
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            for experience, chosen in zip(experiences, kept, strict=True):
                record = trajectory_record(experience)
                record["metadata"] = {
                    **(record.get("metadata") or {}),
                    "step": step,
                    "kept": bool(chosen),
                    "backend": "openrlhf",
                }
                runs = getattr(experience, TOKEN_VERSIONS_KEY, None)
                if runs is not None:  # per turn, [[policy version, tokens], ...] (policy_version.version_runs)
                    record["metadata"]["token_versions"] = runs
                handle.write(json.dumps(record, ensure_ascii=False) + "\n")
        return step
