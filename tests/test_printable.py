"""Control characters in tool output (issue 34, finding 9): the observation and the trajectory keep them, what is
printed on a terminal (``render()``, ``rstar-env episode``) shows them as visible marks."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rstar_env.cli import main
from rstar_env.format import printable
from rstar_env.testing import answer, tool_call

HOSTILE = "\x1b[2J\x1b]0;owned\x07\x00boom\r\x9b31m\u202eevil"
"""Clear screen, set the title, a NUL, a carriage return, a C1 CSI and a right-to-left override."""


def _raw_controls(text: str) -> set[str]:
    return {c for c in text if (ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F or c == "\u202e"}


def test_printable_marks_every_control_but_newline_and_tab() -> None:
    shown = printable(HOSTILE)
    assert _raw_controls(shown) == set()
    assert shown == "\u241b[2J\u241b]0;owned\u2407\u2400boom\u240d<U+009B>31m<U+202E>evil"
    assert printable("a\r\nb") == "a\nb"  # a CRLF line ending is a line ending
    plain = "x = 1\n\tprint(x)  # é, 中文, $\\frac{1}{2}$"
    assert printable(plain) == plain


def test_render_marks_controls_and_the_observation_keeps_them(math_env, echo_plugins) -> None:
    env = math_env(tools=["echo"], reward="exact_test", render_mode="ansi")
    env.reset(options={"problem": "p", "answer": "1"})
    obs, *_ = env.step(tool_call("echo", text=HOSTILE))
    assert HOSTILE in obs  # the model sees the data as the tool printed it
    shown = env.render()
    assert _raw_controls(shown) == set()
    assert "\u241b[2J" in shown and "\u2400boom" in shown


@pytest.mark.parametrize("where", ["tool output", "action"])
def test_episode_command_prints_marks_and_writes_the_data(tmp_path, echo_plugins, where: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("tools: [echo]\nreward: exact_test\nenv: {max_turns: 3}\n")
    first = tool_call("echo", text=HOSTILE) if where == "tool output" else tool_call("echo", text="x") + HOSTILE
    script = tmp_path / "s.json"
    script.write_text(json.dumps([first, answer(7)]))
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
    assert _raw_controls(result.output) == set()
    assert "\u241b[2J" in result.output
    turn = json.loads(out.read_text())["turns"][0]
    kept = turn["tool_calls"][0]["result"]["text"] if where == "tool output" else turn["action"]
    assert HOSTILE in kept
