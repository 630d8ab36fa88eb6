import json

import pytest
from click.testing import CliRunner

from rstar_env.cli import main
from rstar_env.testing import answer, tool_call


def test_plugins_lists_sources(echo_plugins):
    result = CliRunner().invoke(main, ["plugins", "--json"])
    assert result.exit_code == 0, result.output
    listing = json.loads(result.output)
    rows = {(r["kind"], r["name"]): r for r in listing["plugins"]}
    assert listing["failed"] == []
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


def _served_tool_call(code: str) -> dict:
    return {"name": "python", "arguments": {"code": code}}


def test_chat_with_a_served_model_shows_tool_calls(tmp_path):
    from rstar_env_testkit.replay_server import ReplayServer, reply

    entries = [reply("Let me compute.", [_served_tool_call("6 * 7")]), reply("<answer>\\boxed{42}</answer>")]
    with ReplayServer(entries) as server:
        result = CliRunner().invoke(
            main, ["chat", "--endpoint", server.base_url, "--served-model", "m", "--answer", "42"],
            input="What is 6 times 7?\n\n",
        )
    assert result.exit_code == 0, result.output
    assert "tool python" in result.output and "42" in result.output
    assert "episode over: answer; answer '42'  reward 1.0" in result.output


def test_eval_against_a_served_model_writes_trajectories(tmp_path):
    from rstar_env_testkit.replay_server import ReplayServer, reply

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i} + 1?", "answer": str(i + 1), "id": f"q{i}"}) + "\n"
                            for i in range(2)))
    default = reply("<answer>\\boxed{1}</answer>")
    out = tmp_path / "eval.jsonl"
    with ReplayServer([], default=default) as server:
        result = CliRunner().invoke(main, ["eval", "--endpoint", server.base_url, "--served-model", "m",
                                           "--dataset", str(data), "--samples", "2", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["episodes"] == 4 and summary["pass@1"] == 0.5 and summary["pass@2"] == 0.5
    assert len(out.read_text().splitlines()) == 4


def test_eval_never_shows_another_models_episodes_and_honours_limit(tmp_path):
    from rstar_env.rollout.replay_server import ReplayServer, reply

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"problem": f"{i} + 1?", "answer": str(i + 1), "id": f"q{i}"}) + "\n"
                            for i in range(3)))
    out = tmp_path / "eval.jsonl"

    def run(served: str, *extra: str):
        with ReplayServer([], default=reply("<answer>\\boxed{1}</answer>")) as server:
            return CliRunner().invoke(main, ["eval", "--endpoint", server.base_url, "--served-model", served,
                                             "--dataset", str(data), "--out", str(out), *extra])

    first = run("model-a", "--samples", "2", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.output[first.output.index("{"):])["model"]["model"] == "model-a"
    other = run("model-b", "--samples", "2")
    assert other.exit_code == 1
    assert "'model-a'" in other.output and "'model-b'" in other.output and "pass@1" not in other.output
    assert "Traceback" not in other.output
    limited = run("model-a", "--samples", "2", "--limit", "2", "--json")
    assert limited.exit_code == 0, limited.output
    summary = json.loads(limited.output[limited.output.index("{"):])
    assert summary["problems"] == 2 and summary["episodes"] == 4 and summary["resumed"] == 4


def test_eval_default_out_is_one_file_per_model(tmp_path, monkeypatch):
    from rstar_env.rollout.replay_server import ReplayServer, reply

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"problem": "1 + 1?", "answer": "2", "id": "q0"}) + "\n")
    for served in ("model-a", "model-b"):
        with ReplayServer([], default=reply("<answer>\\boxed{2}</answer>")) as server:
            result = CliRunner().invoke(main, ["eval", "--endpoint", server.base_url, "--served-model", served,
                                               "--dataset", str(data), "--json"])
        assert result.exit_code == 0, result.output
        summary = json.loads(result.output[result.output.index("{"):])
        assert summary["resumed"] == 0 and summary["trajectories_file"] == f"runs/eval/{served}.jsonl"


def test_chat_without_an_answer_is_unscored_on_stdout_without_markers(tmp_path):
    from rstar_env.rollout.replay_server import ReplayServer, reply

    entries = [reply("Let me compute.<|im_end|>", [_served_tool_call("print(6 * 7)")]),
               reply("<answer>\\boxed{42}</answer><|im_end|>")]
    with ReplayServer(entries) as server:
        result = CliRunner().invoke(main, ["chat", "--endpoint", server.base_url, "--served-model", "m"],
                                    input="What is 6 times 7?\n\n")
    assert result.exit_code == 0, result.output
    assert "Let me compute." in result.stdout and "tool python" in result.stdout and "42" in result.stdout
    assert "episode over: answer; answer '42'  (unscored: no --answer)" in result.stdout
    assert "<|im_end|>" not in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_chat_with_the_real_model_verbatim():
    """The README's `rstar-env chat` with SmolLM2: no gold answer needed, no raw chat markers shown."""
    result = CliRunner().invoke(main, ["chat", "--max-new-tokens", "48", "--max-turns", "2"],
                                input="What is 2 + 3?\n\n")
    assert result.exit_code == 0, result.output
    assert "assistant" in result.stdout and "episode over" in result.stdout and "unscored" in result.stdout
    assert "<|im_end|>" not in result.output and "<|im_start|>" not in result.output


def test_run_tool_errors_in_one_line():
    result = CliRunner().invoke(main, ["run-tool", "python", "--backend", "nope"], input="print(1)\n")
    assert result.exit_code == 1
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert "unknown sandbox backend 'nope'" in result.output
