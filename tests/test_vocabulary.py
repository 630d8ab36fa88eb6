"""One name for one thing: the outcome names spelled in one place, the one <answer> pattern, and the RL
hyperparameters that both trainers share."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rstar_env import format as fmt
from rstar_env.outcomes import EXEC_STATUSES, OUTCOMES, TOOL_ERROR_KINDS
from rstar_env.trajectory import Trajectory, Turn

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("rstar_env", "plugins", "trainers", "testkit", "examples/rstar_examples")


def _spelled_lists(path: Path) -> list[tuple[int, set[str]]]:
    """(line, names) for each tuple, list, set or subscript (``Literal[...]``) in ``path`` that writes out three or
    more outcome names: a second spelling of the vocabulary."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else None
        if isinstance(node, ast.Subscript):
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        names = {i.value for i in items or () if isinstance(i, ast.Constant) and i.value in OUTCOMES}
        if len(names) >= 3:
            found.append((node.lineno, names))
    return found


def test_the_outcome_names_are_spelled_only_in_rstar_env_outcomes() -> None:
    spelled = {
        str(path.relative_to(ROOT)): lines
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if (lines := _spelled_lists(path))
    }
    assert set(spelled) == {"rstar_env/outcomes.py"}, f"import the names from rstar_env.outcomes instead: {spelled}"


_LISTED = re.compile(r"`(?:%s)`(?:(?:,\s*|\s+or\s+|\s+and\s+)`(?:%s)`)+" % (("|".join(OUTCOMES),) * 2))


@pytest.mark.parametrize("document", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name)
def test_the_documents_list_the_outcome_names_whole(document: Path) -> None:
    # Prose cannot import the names: every list of three or more must be one of the vocabulary's lists, complete.
    whole = {frozenset(OUTCOMES), frozenset(EXEC_STATUSES), frozenset(TOOL_ERROR_KINDS)}
    for match in _LISTED.finditer(document.read_text(encoding="utf-8")):
        names = frozenset(re.findall(r"`(\w+)`", match.group()))
        assert len(names) < 3 or names in whole, f"{document.name}: {match.group()!r} is not a whole outcome list"


@pytest.mark.parametrize(
    "action",
    ["<answer>\\boxed{1}</answer>", "no block", "<answer>a</answer> and <answer>\nb\n</answer>", "<answer>open"],
)
def test_one_answer_pattern_for_extraction_and_the_format_count(action: str) -> None:
    traj = Trajectory(problem="p", answer="1", prompt="", turns=[Turn(action), Turn(action)])
    assert traj.num_answer_blocks == 2 * len(fmt.answer_blocks(action)) == 2 * len(fmt.ANSWER_BLOCK.findall(action))


def test_both_trainers_share_one_rl_hyperparameter_model() -> None:
    pytest.importorskip("torch")  # the local trainer's package imports torch
    from rstar_trainers.hyperparams import RLHyperparameters
    from rstar_trainers.local.config import LocalTrainerConfig
    from rstar_trainers.openrlhf.config import OpenRLHFRLConfig

    assert issubclass(LocalTrainerConfig, RLHyperparameters) and issubclass(OpenRLHFRLConfig, RLHyperparameters)
    local, cluster, shared = LocalTrainerConfig(), OpenRLHFRLConfig(), RLHyperparameters()
    scale = {"group_size", "prompts_per_step"}  # a CPU run is smaller; nothing else may differ
    for name in set(RLHyperparameters.model_fields) - scale:
        assert getattr(local, name) == getattr(cluster, name) == getattr(shared, name), name
    assert local.entropy_coef == cluster.entropy_coef == 0.0
    with pytest.raises(ValueError, match="clip_low must be below 1"):
        RLHyperparameters(clip_low=1.5)
