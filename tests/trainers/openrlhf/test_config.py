"""The OpenRLHF trainer's section extends the shared :class:`~rstar_env.config.TrainerSettings` (as the local
trainer's does): a shared key means the same on both backends, and a mistyped key is named with its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from rstar_env.config import ConfigError, TrainerSettings, load_config
from rstar_trainers.hyperparams import RLHyperparameters
from rstar_trainers.local.config import LocalTrainerConfig
from rstar_trainers.openrlhf.config import OpenRLHFRLConfig, OpenRLHFSFTConfig, trainer_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def openrlhf(**trainer):
    return trainer_config(load_config({"trainer": {"backend": "openrlhf", **trainer}}))


def test_both_trainers_extend_the_shared_settings():
    for model in (OpenRLHFRLConfig, LocalTrainerConfig):
        assert issubclass(model, TrainerSettings) and issubclass(model, RLHyperparameters)
        assert set(TrainerSettings.model_fields) <= set(model.model_fields)


def test_the_sft_stage_extends_the_shared_settings_too():
    assert issubclass(OpenRLHFSFTConfig, TrainerSettings)
    cfg = openrlhf(stage="sft", dataset="chat.jsonl", temperature=0.7)
    assert isinstance(cfg, OpenRLHFSFTConfig) and cfg.temperature == 0.7 and cfg.model == "Qwen/Qwen3-14B-Base"
    with pytest.raises(ConfigError, match=r"trainer\.top_p"):
        openrlhf(stage="sft", dataset="chat.jsonl", top_p=2)


def test_every_openrlhf_config_under_configs_still_loads():
    loaded = [p.name for p in sorted(CONFIGS.glob("*.yaml")) if load_config(p).trainer.get("backend") == "openrlhf"]
    assert {"sft.yaml", "stage1_8k.yaml", "openrlhf_cpu_e2e.yaml"} <= set(loaded)
    for name in loaded:
        trainer_config(load_config(CONFIGS / name))


def test_max_new_tokens_is_the_per_turn_cap_under_either_name():
    assert openrlhf(max_new_tokens=64).max_new_tokens_per_turn == 64
    cfg = openrlhf(max_new_tokens_per_turn=48)
    assert (cfg.max_new_tokens, cfg.max_new_tokens_per_turn) == (48, 48)
    assert openrlhf(max_new_tokens=32, max_new_tokens_per_turn=32).max_new_tokens_per_turn == 32
    with pytest.raises(ConfigError, match=r"max_new_tokens \(64\) and max_new_tokens_per_turn \(32\) are one"):
        openrlhf(max_new_tokens=64, max_new_tokens_per_turn=32)
    assert openrlhf().max_new_tokens_per_turn is None  # unset: the length budget decides


def test_eval_temperature_is_the_eval_sections_temperature():
    cfg = openrlhf(eval_temperature=0.3)
    assert cfg.eval.temperature == 0.3 and cfg.eval_temperature == 0.3
    assert openrlhf(eval={"temperature": 0.2}).eval_temperature == 0.2
    assert openrlhf().eval.temperature == 0.6  # OpenRLHF's evaluation default stays
    with pytest.raises(ConfigError, match=r"eval_temperature \(0.3\) and eval.temperature \(0.2\)"):
        openrlhf(eval_temperature=0.3, eval={"temperature": 0.2})
    with pytest.raises(ConfigError, match="eval_max_new_tokens is not read by the OpenRLHF trainer"):
        openrlhf(eval_max_new_tokens=64)


def test_a_mistyped_key_is_named_with_the_nearest_known_one():
    with pytest.raises(ConfigError, match=r"trainer\.group_sise: unknown key \(did you mean 'group_size'\?"):
        openrlhf(group_sise=4)
    with pytest.raises(ConfigError, match=r"trainer\.cluster\.vllm_num_engine: unknown key \(did you mean 'vllm_num"):
        openrlhf(cluster={"vllm_num_engine": 8})
    with pytest.raises(ConfigError, match=r"trainer\.zzz: unknown key \(check its spelling"):
        openrlhf(zzz=1)
    # A shared key's type is checked as the config loads, for either backend.
    with pytest.raises(ConfigError, match=r"trainer\.max_new_tokens: Input should be a valid integer"):
        openrlhf(max_new_tokens="many")
