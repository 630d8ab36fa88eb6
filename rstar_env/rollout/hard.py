"""Stage-3 data: the problems not yet solved every time, from evaluation or training trajectories."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from rstar_env.data import Problem, save_jsonl
from rstar_env.rollout.evaluate import read_trajectories
from rstar_env.trajectory import Trajectory


def hard_problems(
    trajectories: Iterable[Trajectory], *, max_pass_rate: float = 1.0, min_samples: int = 1
) -> list[Problem]:
    """Problems whose pass rate over their trajectories is below ``max_pass_rate`` (default: not solved every
    time). Problems seen fewer than ``min_samples`` times are left out: one lucky sample says little."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.id or t.problem].append(t)
    hard = []
    for key, group in groups.items():
        if len(group) < min_samples:
            continue
        rate = sum(t.reward > 0.5 for t in group) / len(group)
        if rate < max_pass_rate:
            first = group[0]
            hard.append(Problem(first.problem, first.answer, key, {"pass_rate": rate, "samples": len(group)}))
    return hard


def filter_hard(
    sources: Sequence[str | Path], out: str | Path, *, max_pass_rate: float = 1.0, min_samples: int = 1
) -> tuple[int, int]:
    """Read trajectory JSONL files, write the hard problems to ``out``; returns ``(problems seen, hard)``."""
    trajectories: list[Trajectory] = []
    for source in sources:
        if not Path(source).exists():
            raise FileNotFoundError(f"trajectory file not found: {source}")
        trajectories += read_trajectories(source)
    seen = len({t.id or t.problem for t in trajectories})
    hard = hard_problems(trajectories, max_pass_rate=max_pass_rate, min_samples=min_samples)
    save_jsonl(hard, out)
    return seen, len(hard)
