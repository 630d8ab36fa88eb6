import json

import pytest

from rstar_env.trajectory import RewardResult, ToolCall, ToolResult, Trajectory, Turn


def sample() -> Trajectory:
    ok = ToolCall("raw", "python", {"code": "1"}, ToolResult("1", None, duration_s=0.1))
    bad = ToolCall("{x", None, None, ToolResult("Error: bad", "bad_call"))
    timeout = ToolCall("raw", "python", {"code": "loop"}, ToolResult("TimeoutError", "timeout"))
    return Trajectory(
        problem="p",
        answer="1",
        prompt="PROMPT",
        turns=[
            Turn("a1", [ok, bad], feedback="f1", action_tokens=3, feedback_tokens=2),
            Turn("a2 <answer>\\boxed{1}</answer>", [timeout], feedback="f2", action_tokens=4, feedback_tokens=1),
            Turn("<answer>\\boxed{1}</answer>", action_tokens=5),
        ],
        reward=1.0,
        reward_result=RewardResult(1.0, "1", "exact"),
        end_reason="answer",
        id="p-1",
        metadata={"k": [1, 2]},
        duration_s=3.0,
    )


def test_summary_properties():
    t = sample()
    assert t.num_assistant_turns == 3
    assert t.num_tool_calls == 3
    assert t.num_tool_errors == 2
    assert t.tool_error_counts() == {"bad_call": 1, "timeout": 1}
    assert t.num_answer_blocks == 2
    assert t.final_answer == "1"
    assert t.response == "a1f1a2 <answer>\\boxed{1}</answer>f2<answer>\\boxed{1}</answer>"
    assert t.response_tokens == 3 + 2 + 4 + 1 + 5
    assert t.done and not t.truncated


def test_json_round_trip_is_exact():
    t = sample()
    back = Trajectory.from_dict(json.loads(json.dumps(t.to_dict())))
    assert back == t
    assert back.to_dict() == t.to_dict()


def test_copy_shares_nothing():
    t = sample()
    c = t.copy()
    c.turns[0].tool_calls[0].arguments["code"] = "changed"
    c.metadata["k"].append(3)
    assert t.turns[0].tool_calls[0].arguments["code"] == "1"
    assert t.metadata["k"] == [1, 2]


def test_timing_is_not_part_of_equality():
    a, b = sample(), sample()
    b.duration_s = 99.0
    b.turns[0].tool_calls[0].result.duration_s = 5.0
    assert a == b


def test_invalid_error_kind_is_rejected():
    with pytest.raises(ValueError, match="must be None or one of"):
        ToolResult("x", "oops")  # type: ignore[arg-type]
