from pathlib import Path

import pytest

from rstar_env.config import ConfigError, PluginSpec, load_config


def test_defaults_are_the_paper_recipe_shape():
    cfg = load_config()
    assert [t.name for t in cfg.tools] == ["python"]
    assert cfg.reward.name == "math" and cfg.sampler.name == "roc"
    assert cfg.env.max_turns == 10 and cfg.dataset.source == "arithmetic"


def test_yaml_with_shorthands(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "env: {max_turns: 3, max_length: 100}\n"
        "tools: python\n"
        "reward: {name: math, options: {timeout_s: 2}}\n"
        "dataset: data/train.jsonl\n"
    )
    cfg = load_config(path)
    assert cfg.tools == [PluginSpec(name="python")]
    assert cfg.reward.options == {"timeout_s": 2}
    assert cfg.dataset.source == "data/train.jsonl"
    assert cfg.env.max_length == 100


def test_overrides_replace_sections_and_ignore_none(tmp_path):
    cfg = load_config({"reward": "format"}, reward=None, tools=[{"name": "python", "options": {"timeout_s": 2}}])
    assert cfg.reward.name == "format" and cfg.tools[0].options == {"timeout_s": 2}


def test_errors_name_the_file_and_the_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("env:\n  max_turns: -1\n  max_turnz: 3\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    assert "env.max_turns: Input should be greater than 0 (got -1)" in message
    assert "env.max_turnz: unknown key" in message


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("env:\n  max_turns: [1\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: not valid YAML at line 3"):
        load_config(path)


def test_missing_file_and_wrong_shape(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "none.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(path)


def test_env_keyword_overrides_are_validated(math_env, echo_plugins):
    with pytest.raises(ConfigError, match="max_turns"):
        math_env(tools=["echo"], reward="exact_test", max_turns=0)
    with pytest.raises(ConfigError, match="no_such_option"):
        math_env(tools=["echo"], reward="exact_test", no_such_option=1)
    env = math_env(config={"env": {"max_turns": 2}, "tools": ["echo"], "reward": "exact_test"}, max_length=50)
    assert env.settings.max_turns == 2 and env.settings.max_length == 50


CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert cfg.tools and cfg.reward.name and cfg.sampler.name


def test_shipped_configs_are_found():
    assert {"quickstart.yaml", "stage1_8k.yaml", "stage1_8k_rstar2.yaml"} <= {p.name for p in CONFIGS}


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            {"sampler": {"name": "roc", "options": {"mode": "bogus"}}},
            r"sampler\.options\.mode: Input should be 'topk' or 'weighted' \(got 'bogus'\) \(sampler 'roc'\)",
        ),
        (
            {"tools": [{"name": "python", "options": {"timeout_s": -1}}]},
            r"tools\[0\]\.options\.timeout_s: Input should be greater than 0 \(got -1\) \(tool 'python'\)",
        ),
        (
            {"tools": ["python", {"name": "python_code_with_standard_io", "options": {"max_output_chars": 1}}]},
            r"tools\[1\]\.options\.max_output_chars: Input should be greater than or equal to 2 \(got 1\)",
        ),
        (
            {"tools": [{"name": "python", "options": {"backend": "docker"}}]},
            r"tools\[0\]\.options\.backend: unknown sandbox backend 'docker'; "
            r"choose one of e2b, local, ray, subprocess",
        ),
        (
            {"reward": {"name": "math", "options": {"workers": 0}}},
            r"reward\.options\.workers: Input should be greater than or equal to 1 \(got 0\)",
        ),
        (
            {"reward": {"name": "math", "options": {"boxes": "first"}}},
            r"reward\.options\.boxes: Input should be 'final' or 'last' \(got 'first'\)",
        ),
        (
            {"reward": {"name": "format", "options": {"penalty": "sometimes"}}},
            r"reward\.options\.penalty: Input should be a valid boolean",
        ),
        (
            {"sampler": {"name": "roc", "options": {"no_call_penalty": 1.5}}},
            r"sampler\.options\.no_call_penalty: Input should be less than or equal to 1 \(got 1\.5\)",
        ),
        (
            {"sampler": {"name": "grpo", "options": {"subsample": "last"}}},
            r"sampler\.options\.subsample: Input should be 'random' or 'first' \(got 'last'\)",
        ),
    ],
)
def test_a_builtin_plugins_bad_option_fails_at_load_naming_the_key(config, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config(config)


def test_plugin_options_are_checked_without_building_the_plugin(monkeypatch):
    from rstar_plugins.samplers.roc import RoCSampler
    from rstar_plugins.tools.python import PythonTool

    def refuse(self, *args, **kwargs):
        raise AssertionError("load_config built a plugin")

    monkeypatch.setattr(RoCSampler, "__init__", refuse)
    monkeypatch.setattr(PythonTool, "__init__", refuse)
    cfg = load_config(
        {
            "tools": [{"name": "python", "options": {"timeout_s": 2, "stateful": True}}],
            "sampler": {"name": "roc", "options": {"mode": "weighted", "eps": 0.1}},
        }
    )
    assert cfg.sampler.options == {"mode": "weighted", "eps": 0.1}  # kept as written, validated apart
    with pytest.raises(ConfigError, match=r"sampler\.options\.eps: Input should be greater than 0"):
        load_config({"sampler": {"name": "roc", "options": {"eps": 0}}})


def test_every_bad_option_is_listed_one_per_line():
    with pytest.raises(ConfigError) as err:
        load_config(
            {
                "tools": [{"name": "python", "options": {"timeout_s": 0, "max_output_chars": 10}}],
                "sampler": {"name": "roc", "options": {"mode": "bogus"}},
            }
        )
    lines = str(err.value).splitlines()
    assert lines[0] == "invalid config (dict):"
    assert [line.strip().split(":")[0] for line in lines[1:]] == [
        "tools[0].options.timeout_s",
        "tools[0].options.max_output_chars",
        "sampler.options.mode",
    ]


# -- the typed trainer section; the registry load_config checks against ------------------------------------------
def test_the_trainer_section_is_typed_and_reads_as_what_the_config_set():
    from rstar_env.config import TrainerSection, TrainerSettings

    cfg = load_config(
        {
            "trainer": {
                "backend": "openrlhf",
                "temperature": "0.5",
                "max_new_tokens_per_turn": 64,
                "cluster": {"nodes": 2},
            }
        }
    )
    assert isinstance(cfg.trainer, TrainerSection) and isinstance(cfg.trainer, TrainerSettings)
    assert cfg.trainer.temperature == 0.5  # typed: converted once, at load
    # a backend's own keys pass unchanged, and the section reads as the mapping the config wrote
    assert dict(cfg.trainer) == {
        "backend": "openrlhf",
        "temperature": 0.5,
        "max_new_tokens_per_turn": 64,
        "cluster": {"nodes": 2},
    }
    assert {**cfg.trainer}["cluster"] == {"nodes": 2} and cfg.trainer.get("stage") is None
    assert cfg.trainer.sampling(temperature=None, top_p=None, max_new_tokens=None) == {
        "temperature": 0.5,
        "max_new_tokens": 64,
    }
    assert load_config(cfg.model_dump()).trainer == cfg.trainer  # a dump loads back the same section
    with pytest.raises(ConfigError, match=r"trainer\.top_p: Input should be less than or equal to 1"):
        load_config({"trainer": {"top_p": 1.5}})


def test_both_trainers_extend_the_shared_trainer_settings():
    from rstar_env.config import TrainerSettings
    from rstar_trainers.hyperparams import RLHyperparameters
    from rstar_trainers.local.config import LocalTrainerConfig, trainer_config

    assert issubclass(LocalTrainerConfig, TrainerSettings) and issubclass(LocalTrainerConfig, RLHyperparameters)
    settings = trainer_config(load_config({"trainer": {"eval_max_new_tokens": 40, "max_new_tokens": 96}}))
    assert (settings.eval_max_new_tokens, settings.max_new_tokens) == (40, 96)


def test_load_config_checks_the_plugins_against_the_registry_it_is_given():
    from rstar_env.plugins import PluginRegistry, get_registry

    empty = PluginRegistry(load_entrypoints=False)
    with pytest.raises(ConfigError, match="unknown tool 'python'; registered tools: none"):
        load_config({}, registry=empty)
    assert "python" in get_registry().plugins("tool")  # the process's registry was neither used nor changed
    assert load_config({}, registry=get_registry()).tools[0].name == "python"
