"""``env.preset: rstar2``: golden episodes in the reference implementation's format (microsoft/rStar, rStar2-Agent).

The golden strings below are written out by hand from the reference's chat template, tool config and agent loop
(``rstar2_agent/config/rstar2_agent_trainer.yaml``, ``config/tool_config/python_tool_config.yaml``,
``tools/code_judge_utils.py``, ``rollout/rstar2_agent_loop.py``), not built from our own constants, so a change
to our rendering that the reference would not make fails here.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import rstar_env  # noqa: F401  (registers the env)
from rstar_env.config import ConfigError, load_config
from rstar_env.env import MathToolEnv
from rstar_env.format import format_tool_call
from rstar_env.plugins import load_sampler, load_tool
from rstar_env.sandbox import ExecResult
from rstar_plugins.samplers.roc import counted_turns

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

GOLDEN_SYSTEM = (
    "<|im_start|>system\n"
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. The Assistant "
    "first thinks about the reasoning process in the mind and then provides the User with the answer. The reasoning "
    "process is enclosed within <reason> </reason> and answer is enclosed within <answer> </answer> tags, "
    "respectively, i.e., <reason> reasoning process here </reason> <answer> answer here </answer>."
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "python_code_with_standard_io", "description": "Execute Python code '
    "with standard input and capture standard output. This function takes a Python code string and an input string, "
    "provides the input string through standard input (stdin) to the code, and captures and returns any output "
    "produced through standard output (stdout). If the executed code raises an exception, the error message will be "
    'captured and returned instead.", "parameters": {"type": "object", "properties": {"code": {"type": "string", '
    '"description": "A string containing Python code to be executed. The code can read from standard input using '
    'the input() function."}, "input": {"type": "string", "description": "A string that will be provided as standard '
    'input to the code when it calls input()."}}, "required": ["code", "input"]}}}'
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
)
GOLDEN_USER = (
    "<|im_start|>user\nYou must put your answer inside <answer> </answer> tags, i.e., <answer> answer here </answer>. "
    "And your final answer will be extracted automatically by the \\boxed{} tag.\nThis is the problem:\n"
    "What is 6 * 7?<|im_end|>\n<|im_start|>assistant\n<reason>"
)
GOLDEN_PROMPT = GOLDEN_SYSTEM + GOLDEN_USER

ACTION_1 = (
    "I multiply with the tool.\n</reason>\n<tool_call>\n"
    '{"name": "python_code_with_standard_io", "arguments": {"code": "print(int(input()) * 7)", "input": "6"}}\n'
    "</tool_call><|im_end|>"
)
FEEDBACK_1 = (
    "<|im_start|>user\n<tool_response>\nTool call success\nstdout: 42\n\nexecution time: 0.05s\n</tool_response>"
    "<|im_end|>\n<|im_start|>assistant\n<reason>"
)
ACTION_2 = (
    "Check that 42 / 7 is 6.\n</reason>\n<tool_call>\n"
    '{"name": "python_code_with_standard_io", "arguments": {"code": "assert 42 / 7 == 7", "input": ""}}\n'
    "</tool_call><|im_end|>"
)
FEEDBACK_2 = (
    "<|im_start|>user\n<tool_response>\nTool call failure\nreason: \nstderr: AssertionError\n\n"
    "execution time: 0.03s\n</tool_response><|im_end|>\n<|im_start|>assistant\n<reason>"
)
ACTION_3 = "My check was wrong: 42 / 7 is 6, as required.\n</reason>\n<answer>\\boxed{42}</answer><|im_end|>"
GOLDEN_EPISODE = GOLDEN_PROMPT + ACTION_1 + FEEDBACK_1 + ACTION_2 + FEEDBACK_2 + ACTION_3

# What verl's agent loop strips from an encoded tool message: the system block the chat template puts first.
GOLDEN_SYSTEM_NO_TOOLS = GOLDEN_SYSTEM.split("\n\n# Tools")[0] + "<|im_end|>\n"


class ScriptedSandbox:
    """A sandbox stand-in that answers with fixed results (the execution time of a real run varies), and records
    what it was asked to run."""

    def __init__(self, *results: ExecResult) -> None:
        self.results = list(results)
        self.calls: list[tuple[str, str, Any]] = []

    async def execute(self, code: str, *, stdin: str = "", session: Any = None, timeout_s: Any = None) -> ExecResult:
        self.calls.append((code, stdin, session))
        return self.results.pop(0)

    async def close_session(self, session: Any) -> None:
        pass

    async def aclose(self) -> None:
        pass


def scripted_env(*results: ExecResult, **options: Any) -> tuple[MathToolEnv, ScriptedSandbox]:
    sandbox = ScriptedSandbox(*results)
    tool = load_tool("python_code_with_standard_io", sandbox=sandbox)
    return gym.make("rstar_env/MathTool-v0", preset="rstar2", tools=[tool], **options).unwrapped, sandbox


def ok(stdout: str = "", stderr: str = "", seconds: float = 0.05) -> ExecResult:
    return ExecResult(stdout, stderr, "ok", duration_s=seconds)


def call(code: str, stdin: str = "") -> str:
    return format_tool_call("python_code_with_standard_io", {"code": code, "input": stdin})


PROBLEM = {"problem": "What is 6 * 7?", "answer": "42"}
GOLDEN_RESULTS = (ok("42\n"), ExecResult("", "AssertionError\n", "exception", duration_s=0.03))


# -- the settings ---------------------------------------------------------------------------------------------------
def test_make_accepts_the_preset_like_any_option() -> None:
    env = gym.make("rstar_env/MathTool-v0", preset="rstar2").unwrapped
    try:
        assert list(env.tools) == ["python_code_with_standard_io"]
        s = env.settings
        assert (s.preset, s.max_turns, s.max_tool_calls_per_turn, s.chat_format) == ("rstar2", 5, 1, "rstar2")
        assert (s.extra_tool_calls, s.tools_on_last_turn, s.score_truncated, s.scored_text) == (
            "ignore",
            False,
            True,
            "all_actions",
        )
        assert env.config.sampler.options == {"turn_count": "after_first"}
        assert env.chat_format.prefill == "<reason>"
    finally:
        env.close()
    # A resolved config given to the env still takes a preset: only what it set explicitly stays.
    env = MathToolEnv(config=load_config({"env": {"max_tool_calls_per_turn": 2}}), preset="rstar2")
    try:
        assert (env.settings.max_turns, env.settings.max_tool_calls_per_turn, list(env.tools)) == (
            5,
            2,
            ["python_code_with_standard_io"],
        )
        check_env(env, skip_render_check=True)
    finally:
        env.close()
    # What a caller writes wins over the preset; the rest of the preset stays.
    env = gym.make("rstar_env/MathTool-v0", preset="rstar2", max_turns=8, tools=["python"]).unwrapped
    try:
        assert (env.settings.max_turns, env.settings.max_tool_calls_per_turn, list(env.tools)) == (8, 1, ["python"])
    finally:
        env.close()


def test_preset_under_a_config_and_a_clear_error_for_an_unknown_one() -> None:
    cfg = load_config(
        {"env": {"preset": "rstar2", "max_length": 100}, "sampler": {"name": "roc", "options": {"mode": "weighted"}}}
    )
    assert (cfg.env.max_turns, cfg.env.max_length) == (5, 100)
    assert cfg.sampler.options == {"turn_count": "after_first", "mode": "weighted"}  # options merge, config's win
    assert load_config(cfg) == cfg and load_config(cfg.model_dump()) == cfg  # a resolved config stays the same
    assert load_config({"env": {"preset": "rstar2"}, "sampler": "grpo"}).sampler.options == {}
    with pytest.raises(ConfigError, match=r"env\.preset: .*unknown preset 'rstar3'; choose one of \['rstar2'\]"):
        load_config({"env": {"preset": "rstar3"}})
    with pytest.raises(ConfigError, match=r"env\.user_template: .*'\{problem\}'"):
        load_config({"env": {"user_template": "Solve it."}})


@pytest.mark.parametrize("name", ["stage1_8k_rstar2.yaml", "stage2_12k_rstar2.yaml", "stage3_hard_rstar2.yaml"])
def test_stage_configs_use_the_preset(name: str) -> None:
    cfg = load_config(CONFIGS / name)
    assert cfg.env.preset == "rstar2" and cfg.env.chat_format == "rstar2" and cfg.env.max_turns == 5
    assert [t.name for t in cfg.tools] == ["python_code_with_standard_io"]
    assert cfg.sampler.name == "roc" and cfg.sampler.options["turn_count"] == "after_first"
    assert cfg.trainer["max_response_tokens"] == cfg.env.max_length


# -- golden episodes ------------------------------------------------------------------------------------------------
def test_golden_episode_text() -> None:
    env, sandbox = scripted_env(*GOLDEN_RESULTS)
    try:
        obs, _ = env.reset(options=PROBLEM)
        assert obs == GOLDEN_PROMPT  # <reason> is prefilled, in the observation
        obs, reward, terminated, truncated, _ = env.step(ACTION_1)
        assert (obs, reward, terminated, truncated) == (FEEDBACK_1, 0.0, False, False)
        obs, reward, terminated, truncated, _ = env.step(ACTION_2)
        assert (obs, reward, terminated, truncated) == (FEEDBACK_2, 0.0, False, False)
        obs, reward, terminated, truncated, info = env.step(ACTION_3)
        assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    finally:
        env.close()
    traj = info["trajectory"]
    assert traj.prompt + traj.response == GOLDEN_EPISODE
    assert sandbox.calls == [("print(int(input()) * 7)", "6", None), ("assert 42 / 7 == 7", "", None)]
    # Errors are the structured kinds: the failed run is one, whatever its text says.
    assert [c.result.error for c in traj.tool_calls] == [None, "exception"]
    assert (traj.num_tool_calls, traj.num_tool_errors, traj.num_answer_blocks) == (2, 1, 1)


def test_a_policy_that_drops_the_end_marker_gets_the_same_episode() -> None:
    env, _ = scripted_env(*GOLDEN_RESULTS)
    try:
        env.reset(options=PROBLEM)
        obs, *_ = env.step(ACTION_1.removesuffix("<|im_end|>"))
        assert obs == "<|im_end|>" + FEEDBACK_1  # the marker comes back as env text, with no newline after it
    finally:
        env.close()


@pytest.mark.slow
def test_golden_episode_tokens(smollm2) -> None:
    """Token for token: the prompt is the template's text encoded whole, and each feedback is what verl's agent loop
    appends: the tool message encoded after a system block, with the system block's ids cut off."""
    _, tokenizer = smollm2
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    env, _ = scripted_env(*GOLDEN_RESULTS)
    env.tokenizer = tokenizer
    try:
        env.reset(options=PROBLEM)
        actions = [encode(a) for a in (ACTION_1, ACTION_2, ACTION_3)]
        for text, ids in zip((ACTION_1, ACTION_2, ACTION_3), actions, strict=True):
            *_, info = env.step(text, token_ids=ids)
    finally:
        env.close()
    traj = info["trajectory"]
    assert traj.prompt_token_ids == encode(GOLDEN_PROMPT)
    system = encode(GOLDEN_SYSTEM_NO_TOOLS)
    for turn, feedback in zip(traj.turns, (FEEDBACK_1, FEEDBACK_2), strict=False):
        reference = encode(GOLDEN_SYSTEM_NO_TOOLS + feedback)
        assert reference[: len(system)] == system
        assert turn.feedback_token_ids == reference[len(system) :]
    sequence = list(traj.prompt_token_ids)
    for turn in traj.turns:
        sequence += turn.action_token_ids + (turn.feedback_token_ids or [])
    assert tokenizer.decode(sequence) == GOLDEN_EPISODE
    assert traj.turns[-1].feedback_token_ids is None


def test_one_call_per_turn_the_rest_ignored() -> None:
    env, sandbox = scripted_env(ok("1\n"), ok("2\n"))
    try:
        env.reset(options=PROBLEM)
        obs, *_ = env.step(f"Two calls.\n</reason>\n{call('print(1)')}\n{call('print(2)')}<|im_end|>")
        traj = env.trajectory
        assert obs.count("<tool_response>") == 1 and "stdout: 1\n" in obs
        assert sandbox.calls == [("print(1)", "", None)]
        assert (traj.num_tool_calls, traj.num_tool_errors) == (1, 0)
    finally:
        env.close()
    # Our default answers the extra call with an error instead.
    env, sandbox = scripted_env(ok("1\n"), extra_tool_calls="error")
    try:
        env.reset(options=PROBLEM)
        obs, *_ = env.step(f"{call('print(1)')}\n{call('print(2)')}<|im_end|>")
        assert obs.count("<tool_response>") == 2 and "too many tool calls" in obs
        assert env.trajectory.num_tool_errors == 1
    finally:
        env.close()


def test_five_turns_and_the_last_turns_calls_are_not_run() -> None:
    env, sandbox = scripted_env(*[ok(f"{i}\n") for i in range(5)])
    try:
        env.reset(options=PROBLEM)
        # The answer comes early, in a turn that also calls the tool; the reference scores the whole response.
        steps = [
            env.step(
                f"Turn {i}. " + ("<answer>\\boxed{42}</answer> " if i == 1 else "") + call(f"print({i})") + "<|im_end|>"
            )
            for i in range(5)
        ]
    finally:
        env.close()
    assert [s[2] or s[3] for s in steps] == [False] * 4 + [True]
    obs, reward, terminated, truncated, info = steps[-1]
    traj = info["trajectory"]
    assert (traj.end_reason, obs, reward, terminated, truncated) == ("max_turns", "", 1.0, False, True)
    assert len(sandbox.calls) == 4  # the fifth turn's call was never run, as in the reference
    assert (traj.num_tool_calls, traj.turns[-1].feedback) == (4, None)


def test_a_truncated_response_is_scored_as_it_stands() -> None:
    text = "So the product is \\boxed{42}, and to double-check " + "x" * 200
    env, _ = scripted_env(max_length=100)
    try:
        env.reset(options=PROBLEM)
        *_, info = env.step(text)
        assert (info["trajectory"].end_reason, info["trajectory"].reward) == ("length", 1.0)
    finally:
        env.close()
    env, _ = scripted_env(max_length=100, score_truncated=False)  # our default: reward 0
    try:
        env.reset(options=PROBLEM)
        *_, info = env.step(text)
        assert (info["trajectory"].end_reason, info["trajectory"].reward) == ("length", 0.0)
    finally:
        env.close()


def test_reference_turn_regex_counts_what_after_first_counts() -> None:
    """The reference's format penalty counts turns with this regex over the response; ``turn_count: after_first``
    must count the same on the episodes the preset renders."""
    reference_turns = re.compile(r"<\|im_start\|>assistant.*?<\|im_end\|>", re.DOTALL)
    for answer_turn in range(5):
        env, _ = scripted_env(*[ok("0\n")] * 5)
        try:
            env.reset(options=PROBLEM)
            for i in range(answer_turn):
                env.step(f"step {i}\n</reason>\n{call('print(0)')}<|im_end|>")
            *_, info = env.step("done\n</reason>\n<answer>\\boxed{42}</answer><|im_end|>")
        finally:
            env.close()
        traj = info["trajectory"]
        assert traj.num_assistant_turns == answer_turn + 1
        assert len(reference_turns.findall(traj.response)) == counted_turns(traj, "after_first") == answer_turn
    sampler = load_sampler("roc", turn_count="after_first")
    assert sampler.format_penalty(traj) == 0.0


# -- the tool on the real sandbox -----------------------------------------------------------------------------------
def test_tool_response_format_on_the_local_sandbox() -> None:
    env = gym.make(
        "rstar_env/MathTool-v0",
        preset="rstar2",
        max_turns=6,
        tools=[{"name": "python_code_with_standard_io", "options": {"timeout_s": 1}}],
    ).unwrapped
    time_line = r"execution time: \d+\.\d\ds"
    try:
        env.reset(options=PROBLEM)
        cases = [
            ("print(input()[::-1])", "olleh", rf"^Tool call success\nstdout: hello\n\n{time_line}$", None),
            ("print('no error here')", "", rf"^Tool call success\nstdout: no error here\n\n{time_line}$", None),
            ("x = 2\nx ** 10", "", rf"^Tool call success\nstdout: 1024\n\n{time_line}$", None),
            (
                "1 / 0",
                "",
                rf"^Tool call failure\nreason: \nstderr: Traceback .*ZeroDivisionError: division by "
                rf"zero\n\n{time_line}$",
                "exception",
            ),
            (
                "import time\ntime.sleep(30)",
                "",
                rf"^Tool call failure\nreason: worker_timeout\n{time_line}$",
                "timeout",
            ),
        ]
        for code, stdin, pattern, error in cases:
            env.step(call(code, stdin) + "<|im_end|>")
            result = env.trajectory.turns[-1].tool_calls[0].result
            assert re.match(pattern, result.text, re.DOTALL), result.text
            assert result.error == error
    finally:
        env.close()


def test_long_output_is_cut_in_the_middle_to_256_characters() -> None:
    tool = load_tool("python_code_with_standard_io")
    long = ok("".join(f"{i:04d}" for i in range(200)) + "\n", seconds=0.25)
    text = tool.render(long)
    full = "Tool call success\nstdout: " + long.stdout + "\nexecution time: 0.25s"
    assert text == full[:128] + "...(truncated)..." + full[-128:]
    assert len(text) == 256 + len("...(truncated)...")
    assert tool.render(ok("short\n")) == "Tool call success\nstdout: short\n\nexecution time: 0.05s"
    # The schema says both arguments are required: a call without "input" is a bad call that says so.
    env, sandbox = scripted_env()
    try:
        env.reset(options=PROBLEM)
        obs, *_ = env.step(format_tool_call("python_code_with_standard_io", {"code": "print(1)"}) + "<|im_end|>")
        assert "missing required argument(s): input" in obs and sandbox.calls == []
    finally:
        env.close()


def test_a_prefill_opens_every_assistant_turn_of_any_format() -> None:
    from rstar_env.format import get_chat_format

    fmt = get_chat_format("chatml").with_prefill("<think>\n")
    assert fmt.render_prompt("S", "U").endswith("<|im_start|>assistant\n<think>\n")
    assert fmt.render_feedback("x<|im_end|>", ["1"]).endswith("<|im_end|>\n<|im_start|>assistant\n<think>\n")
    assert fmt.prefill == "<think>\n" and get_chat_format("chatml").prefill == ""
