import json

from click.testing import CliRunner

from rstar_env.cli import main
from rstar_env.testing import answer, tool_call


def test_plugins_lists_sources(echo_plugins):
    result = CliRunner().invoke(main, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    rows = {(r["kind"], r["name"]): r for r in json.loads(result.output)}
    assert rows[("tool", "python")]["source"] == "rstar-env"
    assert rows[("tool", "echo")]["source"] == "runtime"
    table = CliRunner().invoke(main, ["plugins"])
    assert table.exit_code == 0 and "python" in table.output


def test_episode_plays_a_script(tmp_path, echo_plugins):
    config = tmp_path / "c.yaml"
    config.write_text("tools: [echo]\nreward: exact_test\nenv: {max_turns: 3}\n")
    script = tmp_path / "s.json"
    script.write_text(json.dumps([tool_call("echo", text="hello"), answer(7)]))
    out = tmp_path / "t.json"
    result = CliRunner().invoke(
        main, ["episode", "--config", str(config), "--problem", "3+4?", "--answer", "7",
               "--script", str(script), "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "hello" in result.output and "end: answer" in result.output
    traj = json.loads(out.read_text())
    assert traj["reward"] == 1.0 and traj["turns"][0]["tool_calls"][0]["result"]["text"] == "hello"


def test_episode_reads_turns_from_the_terminal(tmp_path, echo_plugins):
    config = tmp_path / "c.yaml"
    config.write_text("tools: [echo]\nreward: exact_test\n")
    typed = tool_call("echo", text="typed") + "\n.\n" + answer(7) + "\n.\n"
    result = CliRunner().invoke(
        main, ["episode", "--config", str(config), "--problem", "3+4?", "--answer", "7"], input=typed
    )
    assert result.exit_code == 0, result.output
    assert "typed" in result.output and "reward: 1.0" in result.output


def test_bad_config_is_a_clean_error(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("env: {max_turns: zero}\n")
    result = CliRunner().invoke(main, ["episode", "--config", str(config)])
    assert result.exit_code == 1
    assert "env.max_turns" in result.output and "Traceback" not in result.output


def test_run_tool_with_json_arguments(echo_plugins):
    result = CliRunner().invoke(main, ["run-tool", "echo", "--arguments", '{"text": "x"}'])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["text"] == "x"
    unknown = CliRunner().invoke(main, ["run-tool", "nope"])
    assert unknown.exit_code == 1 and "unknown tool 'nope'" in unknown.output
