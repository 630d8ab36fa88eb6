"""An unknown key in a config is named with the nearest known key of its own section, at any depth."""

from __future__ import annotations

import pytest

from rstar_env.config import ConfigError, load_config


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"env": {"max_turnz": 3}}, r"env\.max_turnz: unknown key \(did you mean 'max_turns'\?"),
        ({"dataset": {"sorce": "x"}}, r"dataset\.sorce: unknown key \(did you mean 'source'\?"),
        ({"polcy": {}}, r"polcy: unknown key \(did you mean 'policy'\?"),
        ({"inference": {"endpoints": [{"urls": "x"}]}}, r"endpoints\.0\.urls: unknown key \(did you mean .url.\?"),
        ({"env": {"qqq": 1}}, r"env\.qqq: unknown key \(check its spelling against the config reference in README\)"),
    ],
)
def test_an_unknown_key_is_named_with_the_nearest_known_one(data, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(data)


def test_the_trainers_sections_name_the_nearest_key_too():
    from rstar_trainers.local.config import sft_config, trainer_config

    with pytest.raises(ConfigError, match=r"trainer\.group_sise: unknown key \(did you mean 'group_size'\?"):
        trainer_config(load_config({"trainer": {"group_sise": 3}}))
    with pytest.raises(ConfigError, match=r"trainer\.max_lenn: unknown key \(did you mean 'max_len'\?"):
        sft_config({"stage": "sft", "max_lenn": 512})
