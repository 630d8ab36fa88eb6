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
