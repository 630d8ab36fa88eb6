"""Function-call chat data -> our tool-call format, rendered exactly like an env rollout."""

from __future__ import annotations

import json

import pytest

from rstar_env.format import get_chat_format, render_system_prompt
from rstar_trainers.openrlhf.convert import ConversionError, convert_row, main

SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run code.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}},
    },
}

OPENAI_ROW = {
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2**10?"},
        {
            "role": "assistant",
            "content": "Let me compute.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "python", "arguments": '{"code": "2**10"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "1024"},
        {"role": "assistant", "content": "<answer>\\boxed{1024}</answer>"},
    ],
    "tools": [SCHEMA],
}

SHAREGPT_ROW = {
    "conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": '{"name": "weather", "arguments": {"city": "Paris"}}'},
        {"from": "observation", "value": '{"temp": 21}'},
        {"from": "gpt", "value": "It is 21 degrees."},
    ],
    "tools": json.dumps([{"name": "weather", "parameters": {"type": "object"}}]),
}


def test_openai_row_becomes_the_env_rendering():
    out = convert_row(OPENAI_ROW)["messages"]
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "assistant"]
    assert out[0]["content"] == render_system_prompt("You are terse.", [SCHEMA])
    assert out[2]["content"] == (
        'Let me compute.\n<tool_call>\n{"name": "python", "arguments": {"code": "2**10"}}\n</tool_call>'
    )
    assert out[3]["content"] == "<tool_response>\n1024\n</tool_response>"
    # Rendered with the env's markers, the conversation is prompt + action + env feedback + action.
    fmt = get_chat_format("chatml")
    text = fmt.render_prompt(out[0]["content"], out[1]["content"]) + out[2]["content"]
    text += fmt.render_feedback(out[2]["content"], ["1024"]) + out[4]["content"]
    assert "<|im_start|>user\n<tool_response>\n1024\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text


def test_sharegpt_row_with_config_system_prompt():
    out = convert_row(SHAREGPT_ROW, tool_schemas=[SCHEMA], system_prompt="Be helpful.")["messages"]
    weather = [{"name": "weather", "parameters": {"type": "object"}}]
    assert out[0]["content"] == render_system_prompt("Be helpful.", weather)
    assert out[2] == {
        "role": "assistant",
        "content": '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    }
    assert out[3]["content"] == '<tool_response>\n{"temp": 21}\n</tool_response>'
    assert out[4] == {"role": "assistant", "content": "It is 21 degrees."}


def test_row_without_tools_gets_the_config_tools_and_parallel_results_merge():
    row = {
        "messages": [
            {"role": "user", "content": "Q"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"function": {"name": "python", "arguments": {"code": "1"}}},
                    {"function": {"name": "python", "arguments": '{"code": "2"}'}},
                ],
            },
            {"role": "tool", "content": "1"},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "trailing question with no answer"},
        ]
    }
    out = convert_row(row, tool_schemas=[SCHEMA])["messages"]
    assert out[0]["content"].startswith("You are a helpful assistant") and '"name": "python"' in out[0]["content"]
    assert out[2]["content"].count("<tool_call>") == 2
    assert out[3]["content"] == "<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response>"
    assert out[-1] == {"role": "assistant", "content": "done"}  # nothing after the last assistant turn


@pytest.mark.parametrize(
    "row, why",
    [
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        (
            {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]},
            "not JSON",
        ),
        ({"messages": [{"role": "critic", "content": "x"}]}, "unknown role"),
        ({"text": "plain"}, "needs `messages`"),
    ],
)
def test_unconvertible_rows_raise(row, why):
    with pytest.raises(ConversionError, match=why):
        convert_row(row)


def test_cli_converts_a_file_and_skips_bad_rows(tmp_path, capsys):
    src, dst = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in (OPENAI_ROW, {"text": "bad"}, SHAREGPT_ROW)) + "\n")
    assert main([str(src), str(dst)]) == 0
    rows = [json.loads(line) for line in dst.read_text().splitlines()]
    assert len(rows) == 2 and all(r["messages"][0]["role"] == "system" for r in rows)
    assert "wrote 2 conversations" in capsys.readouterr().err
