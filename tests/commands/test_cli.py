import json

import pytest
from click.testing import CliRunner

from rstar_env.cli import main
from rstar_env.plugin import ToolResult, function_schema, register, unregister
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
        main,
        [
            "episode",
            "--config",
            str(config),
            "--problem",
            "3+4?",
            "--answer",
            "7",
            "--script",
            str(script),
            "--out",
            str(out),
        ],
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
            main,
            ["chat", "--endpoint", server.base_url, "--served-model", "m", "--answer", "42"],
            input="What is 6 times 7?\n\n",
        )
    assert result.exit_code == 0, result.output
    assert "tool python" in result.output and "42" in result.output
    assert "episode over (the model answered): final answer 42; reward 1 against --answer 42" in result.output


def test_eval_against_a_served_model_writes_trajectories(tmp_path):
    from rstar_env_testkit.replay_server import ReplayServer, reply

    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i} + 1?", "answer": str(i + 1), "id": f"q{i}"}) + "\n" for i in range(2))
    )
    default = reply("<answer>\\boxed{1}</answer>")
    out = tmp_path / "eval.jsonl"
    with ReplayServer([], default=default) as server:
        result = CliRunner().invoke(
            main,
            [
                "eval",
                "--endpoint",
                server.base_url,
                "--served-model",
                "m",
                "--dataset",
                str(data),
                "--samples",
                "2",
                "--out",
                str(out),
                "--json",
            ],
        )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert summary["episodes"] == 4 and summary["pass@1"] == 0.5 and summary["pass@2"] == 0.5
    assert len(out.read_text().splitlines()) == 4


def test_eval_never_shows_another_models_episodes_and_honours_limit(tmp_path):
    from rstar_env_testkit.replay_server import ReplayServer, reply

    data = tmp_path / "rows.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i} + 1?", "answer": str(i + 1), "id": f"q{i}"}) + "\n" for i in range(3))
    )
    out = tmp_path / "eval.jsonl"

    def run(served: str, *extra: str):
        with ReplayServer([], default=reply("<answer>\\boxed{1}</answer>")) as server:
            return CliRunner().invoke(
                main,
                [
                    "eval",
                    "--endpoint",
                    server.base_url,
                    "--served-model",
                    served,
                    "--dataset",
                    str(data),
                    "--out",
                    str(out),
                    *extra,
                ],
            )

    first = run("model-a", "--samples", "2", "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.output[first.output.index("{") :])["model"]["model"] == "model-a"
    other = run("model-b", "--samples", "2")
    assert other.exit_code == 1
    assert "'model-a'" in other.output and "'model-b'" in other.output and "pass@1" not in other.output
    assert "Traceback" not in other.output
    limited = run("model-a", "--samples", "2", "--limit", "2", "--json")
    assert limited.exit_code == 0, limited.output
    summary = json.loads(limited.output[limited.output.index("{") :])
    assert summary["problems"] == 2 and summary["episodes"] == 4 and summary["resumed"] == 4


def test_eval_default_out_is_one_file_per_model(tmp_path, monkeypatch):
    from rstar_env_testkit.replay_server import ReplayServer, reply

    monkeypatch.chdir(tmp_path)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"problem": "1 + 1?", "answer": "2", "id": "q0"}) + "\n")
    for served in ("model-a", "model-b"):
        with ReplayServer([], default=reply("<answer>\\boxed{2}</answer>")) as server:
            result = CliRunner().invoke(
                main,
                ["eval", "--endpoint", server.base_url, "--served-model", served, "--dataset", str(data), "--json"],
            )
        assert result.exit_code == 0, result.output
        summary = json.loads(result.output[result.output.index("{") :])
        assert summary["resumed"] == 0 and summary["trajectories_file"] == f"runs/eval/{served}.jsonl"


def test_chat_without_an_answer_is_unscored_on_stdout_without_markers(tmp_path):
    from rstar_env_testkit.replay_server import ReplayServer, reply

    entries = [
        reply("Let me compute.<|im_end|>", [_served_tool_call("print(6 * 7)")]),
        reply("<answer>\\boxed{42}</answer><|im_end|>"),
    ]
    with ReplayServer(entries) as server:
        result = CliRunner().invoke(
            main, ["chat", "--endpoint", server.base_url, "--served-model", "m"], input="What is 6 times 7?\n\n"
        )
    assert result.exit_code == 0, result.output
    assert "Let me compute." in result.stdout and "tool python" in result.stdout and "42" in result.stdout
    assert "episode over (the model answered): final answer 42; unscored: no --answer" in result.stdout
    assert "<|im_end|>" not in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_chat_with_the_real_model_verbatim():
    """`rstar-env chat` with SmolLM2: no gold answer needed, no raw chat markers shown."""
    result = CliRunner().invoke(
        main, ["chat", "--max-new-tokens", "48", "--max-turns", "2"], input="What is 2 + 3?\n\n"
    )
    assert result.exit_code == 0, result.output
    assert "assistant" in result.stdout and "episode over" in result.stdout and "unscored" in result.stdout
    assert "<|im_end|>" not in result.output and "<|im_start|>" not in result.output


def test_run_tool_errors_in_one_line():
    result = CliRunner().invoke(main, ["run-tool", "python", "--backend", "nope"], input="print(1)\n")
    assert result.exit_code == 1
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
    assert "unknown sandbox backend 'nope'" in result.output


class PlainFactorize:
    """The docs' plain-`def` tool style (docs/plugins.md): `call` returns a ToolResult, it is no coroutine."""

    name = "plain_factorize_test"
    schema = function_schema("plain_factorize_test", "Prime factors of n.", {"n": {"type": "integer"}}, ["n"])

    def call(self, arguments, episode):
        n, factors, p = arguments["n"], [], 2
        while n > 1:
            while n % p == 0:
                factors.append(p)
                n //= p
            p += 1
        return ToolResult(" ".join(map(str, factors)))


def test_run_tool_calls_a_plain_def_tool():
    register(PlainFactorize)
    try:
        result = CliRunner().invoke(main, ["run-tool", "plain_factorize_test", "--arguments", '{"n": 12}'])
    finally:
        unregister(PlainFactorize)
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["text"] == "2 2 3"


def _rows(path, n):
    path.write_text(
        "".join(json.dumps({"problem": f"{i} + 1?", "answer": str(i + 1), "id": f"q{i}"}) + "\n" for i in range(n))
    )
    return path


def test_eval_in_a_log_prints_progress_lines(tmp_path):
    from rstar_env_testkit.replay_server import ReplayServer, reply

    data = _rows(tmp_path / "rows.jsonl", 3)
    with ReplayServer([], default=reply("<answer>\\boxed{1}</answer>")) as server:
        result = CliRunner().invoke(
            main,
            [
                "eval",
                "--endpoint",
                server.base_url,
                "--served-model",
                "m",
                "--dataset",
                str(data),
                "--samples",
                "2",
                "--out",
                str(tmp_path / "e.jsonl"),
            ],
        )
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("eval: ")]
    assert lines[0].startswith("eval: 0/6 (0%)"), result.stderr  # the run has started: the log is not silent
    assert lines[-1].startswith("eval: 6/6 (100%)  pass@1 0.333") and "elapsed" in lines[-1], result.stderr
    assert len(lines) == 7  # every episode is a tenth or more of six


def test_progress_lines_have_a_heartbeat():
    import io
    import time

    from rich.console import Console

    from rstar_env.progress import RunProgress

    buffer = io.StringIO()
    reporter = RunProgress(Console(file=buffer, width=200), every_s=3600, heartbeat_s=0.05, every_fraction=0.1)
    with reporter as log:
        log.update("eval", 0, 1000)
        log.update("eval", 1, 1000, text="pass@1 1.000")  # not a tenth: no line of its own
        deadline = time.monotonic() + 10  # a hang guard: the heartbeat wakes every heartbeat_s (at most 5 s)
        while "pass@1 1.000" not in buffer.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        log.update("eval", 100, 1000, text="pass@1 0.500")  # a tenth
    lines = buffer.getvalue().splitlines()
    assert lines[0].startswith("eval: 0/1000 (0%)")
    assert any(line.startswith("eval: 1/1000 (0%)  pass@1 1.000  elapsed") for line in lines[1:]), lines
    assert lines[-1].startswith("eval: 100/1000 (10%)  pass@1 0.500")


def test_eval_takes_sampling_from_the_config_unless_a_flag_says_otherwise(tmp_path):
    from pathlib import Path

    from rstar_env_testkit.replay_server import ReplayServer, reply

    quickstart = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    data = _rows(tmp_path / "rows.jsonl", 1)

    def sent(*extra: str) -> dict:
        with ReplayServer([], default=reply("<answer>\\boxed{1}</answer>")) as server:
            result = CliRunner().invoke(
                main,
                [
                    "eval",
                    "--endpoint",
                    server.base_url,
                    "--served-model",
                    "m",
                    "--config",
                    str(quickstart),
                    "--dataset",
                    str(data),
                    "--json",
                    "--out",
                    str(tmp_path / f"e{len(extra)}.jsonl"),
                    *extra,
                ],
            )
            assert result.exit_code == 0, result.output
            return server.requests[-1]

    from_config = sent()
    assert (from_config["max_tokens"], from_config["temperature"]) == (96, 1.0)  # trainer.max_new_tokens: 96
    flags = sent("--max-new-tokens", "40", "--temperature", "0.5", "--top-p", "0.9")
    assert (flags["max_tokens"], flags["temperature"], flags["top_p"]) == (40, 0.5, 0.9)
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: {max_new_tokens: many}\n")
    refused = CliRunner().invoke(main, ["eval", "--config", str(bad), "--dataset", str(data)])
    assert refused.exit_code == 1 and "trainer.max_new_tokens: Input should be a valid integer" in refused.output


@pytest.mark.parametrize("command", ["/quit", "/exit", "/QUIT"])
def test_chat_quit_commands_are_not_asked(command):
    from rstar_env_testkit.replay_server import ReplayServer, reply

    with ReplayServer([], default=reply("<answer>\\boxed{1}</answer>")) as server:
        result = CliRunner().invoke(
            main,
            ["chat", "--endpoint", server.base_url, "--served-model", "m"],
            input=f"What is 1 + 0?\n{command}\nWhat is 2 + 0?\n",
        )
    assert result.exit_code == 0, result.output
    assert len(server.requests) == 1  # the first question only: the command ended the chat
    assert "/quit, /exit" in result.stdout  # the chat says how to end it


def test_chat_says_when_no_answer_was_found():
    from rstar_env_testkit.replay_server import ReplayServer, reply

    with ReplayServer([reply("I am not sure.")]) as server:
        result = CliRunner().invoke(
            main,
            ["chat", "--endpoint", server.base_url, "--served-model", "m", "--answer", "7"],
            input="What is 3 + 4?\n\n",
        )
    assert result.exit_code == 0, result.output
    assert (
        "episode over (the model answered): no answer found in the model's reply; reward 0 against --answer 7"
        in result.stdout
    ), result.stdout


class LongNamedReward:
    name = "a_verifier_whose_name_is_longer_than_any_terminal_table_column_would_show_whole"

    def score(self, response, answer):
        raise AssertionError("listed, never called")


def test_plugins_piped_prints_whole_names():
    register(LongNamedReward)
    try:
        result = CliRunner().invoke(main, ["plugins"])  # stdout is not a terminal here, as in `| grep`
    finally:
        unregister(LongNamedReward)
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert rows[0] == ["kind", "name", "source", "class"]
    assert ["reward", LongNamedReward.name, "runtime", f"{__name__}.LongNamedReward"] in rows
    assert ["tool", "python"] in [row[:2] for row in rows]


def test_chat_takes_max_new_tokens_from_the_config():
    from pathlib import Path

    from rstar_env_testkit.replay_server import ReplayServer, reply

    quickstart = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
    with ReplayServer([], default=reply("<answer>\\boxed{1}</answer>")) as server:
        result = CliRunner().invoke(
            main,
            ["chat", "--endpoint", server.base_url, "--served-model", "m", "--config", str(quickstart)],
            input="What is 1 + 0?\n/quit\n",
        )
    assert result.exit_code == 0, result.output
    assert server.requests[0]["max_tokens"] == 96  # quickstart's trainer.max_new_tokens: what the model trained at
