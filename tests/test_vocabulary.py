"""One name for one thing: the public event-loop module, the one <answer> pattern, and the RL hyperparameters that
both trainers share."""

from __future__ import annotations

import warnings

import pytest

from rstar_env import format as fmt
from rstar_env.config import load_config
from rstar_env.trajectory import Trajectory, Turn


def test_aio_is_public_and_the_private_name_is_the_same_module() -> None:
    import rstar_env._aio as private
    from rstar_env import aio

    assert private is aio
    assert aio.run_sync(_double(21)) == 42


async def _double(x: int) -> int:
    return 2 * x


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
    from rstar_trainers.local.config import trainer_config as local_config
    from rstar_trainers.openrlhf.config import OpenRLHFRLConfig
    from rstar_trainers.openrlhf.config import trainer_config as openrlhf_config

    assert issubclass(LocalTrainerConfig, RLHyperparameters) and issubclass(OpenRLHFRLConfig, RLHyperparameters)
    local, cluster, shared = LocalTrainerConfig(), OpenRLHFRLConfig(), RLHyperparameters()
    scale = {"group_size", "prompts_per_step"}  # a CPU run is smaller; nothing else may differ
    for name in set(RLHyperparameters.model_fields) - scale:
        assert getattr(local, name) == getattr(cluster, name) == getattr(shared, name), name
    assert local.entropy_coef == cluster.entropy_coef == 0.0
    # A config written for the OpenRLHF section's former default (entropy_coef: null) still loads, as "off".
    run = load_config({"trainer": {"backend": "openrlhf", "entropy_coef": None, "group_size": 4}})
    assert openrlhf_config(run).entropy_coef == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # running another backend's config locally warns about its own keys
        assert local_config(run, force_local=True).entropy_coef == 0.0
    with pytest.raises(ValueError, match="clip_low must be below 1"):
        RLHyperparameters(clip_low=1.5)
