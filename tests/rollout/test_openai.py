"""OpenAIPolicy against a local replay server: message building, native tool calls, retries, timeouts, limits."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from rstar_env.format import DEFAULT_SYSTEM_PROMPT, format_tool_call
from rstar_env.rollout.openai import OpenAIPolicy
from rstar_env.rollout.policy import Generation, Policy, Request, SamplingParams
from rstar_env.trajectory import ToolCall, ToolResult, Trajectory, Turn
from rstar_env_testkit.replay_server import ReplayServer, disconnect, fault, reply, slow, validate_messages

DATA = Path(__file__).resolve().parents[1] / "fixtures"
PROBLEM = {"problem": "What is 6 * 7?", "answer": "42"}
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05}


@pytest.fixture
def server():
    with ReplayServer() as srv:
        yield srv


@pytest.fixture
def env(math_env, echo_plugins):
    return math_env(tools=["echo"], reward="exact_test", max_turns=4)


def canned(*contents: str) -> tuple[object, list[dict]]:
    """An endpoint in process, with no server: an ``httpx.MockTransport`` answering each request with the next
    content, and the request bodies it got."""
    import httpx

    sent: list[dict] = []
    replies = iter(contents)

    def handle(request: httpx.Request) -> httpx.Response:
        if not request.url.path.endswith("/chat/completions"):
            return httpx.Response(404, json={"error": {"message": f"no route {request.url.path}"}})
        sent.append(
            {
                "url": str(request.url),
                "authorization": request.headers.get("authorization"),
                **json.loads(request.content),
            }
        )
        message = {"role": "assistant", "content": next(replies)}
        return httpx.Response(
            200,
            json={
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            },
        )

    return httpx.MockTransport(handle), sent


def generate(policy: OpenAIPolicy, requests: list[Request]) -> list[Generation]:
    """One batch on a fresh event loop, closing the policy's connections before the loop ends."""

    async def main():
        try:
            return await policy.generate(requests)
        finally:
            await policy.aclose()

    return asyncio.run(main())


def run_episode(env, policy: OpenAIPolicy, options=PROBLEM) -> tuple[Trajectory, list[Generation]]:
    """reset, then policy.generate -> env.astep until the episode ends (all on one event loop)."""

    async def main():
        gens = []
        _, info = await env.areset(options=options)
        traj = info["trajectory"]
        try:
            while not traj.done:
                [gen] = await policy.generate([Request(traj)])
                gens.append(gen)
                assert gen.finish_reason != "error", gen.metadata
                *_, info = await env.astep(gen.text)
                traj = info["trajectory"]
        finally:
            await policy.aclose()
        return traj, gens

    return asyncio.run(main())


def traj_with(*turns: Turn) -> Trajectory:
    return Trajectory(problem="What is 6 * 7?", answer="42", turns=list(turns))


def ok(text: str) -> ToolResult:
    return ToolResult(text)


# -- end to end through MathToolEnv ---------------------------------------------------------------------------------
def test_recorded_native_tool_calls_drive_an_episode(env):
    with ReplayServer(DATA / "openai_echo_episode.jsonl") as srv:
        policy = OpenAIPolicy.for_env(
            env,
            srv.base_url,
            "Qwen/Qwen2.5-7B-Instruct",
            sampling=SamplingParams(temperature=0.6, top_p=0.95, max_new_tokens=256, seed=7),
            extra_body={"skip_special_tokens": False},
        )
        assert isinstance(policy, Policy) and policy.tokenizer is None
        traj, gens = run_episode(env, policy)

    # The native call became a hermes block the env parsed, ran and recorded.
    assert gens[0].finish_reason == "tool_call" and gens[1].finish_reason == "stop"
    assert gens[0].text == "I will check the product with the echo tool.\n\n" + format_tool_call("echo", {"text": "42"})
    assert gens[0].metadata["prompt_tokens"] == 412 and gens[0].metadata["completion_tokens"] == 31
    assert gens[0].metadata["attempts"] == 1
    [call] = traj.tool_calls
    assert (call.name, call.arguments, call.result.text, call.error) == ("echo", {"text": "42"}, "42", None)
    assert traj.end_reason == "answer" and traj.reward == 1.0 and traj.num_assistant_turns == 2

    first, second = srv.requests
    assert first["model"] == "Qwen/Qwen2.5-7B-Instruct"
    assert (first["temperature"], first["top_p"], first["max_tokens"]) == (0.6, 0.95, 256)
    assert (first["seed"], second["seed"]) == (7, 8)  # seed + n: the samples of a group differ
    assert first["skip_special_tokens"] is False
    assert first["tools"] == [env.tools["echo"].schema]
    # Native tools: the server's template describes them, so the system prompt has no hermes preamble.
    assert first["messages"] == [
        {"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
        {"role": "user", "content": "What is 6 * 7?"},
    ]
    assert second["messages"][2:] == [
        {
            "role": "assistant",
            "content": "I will check the product with the echo tool.",
            "tool_calls": [
                {"id": "call_0_0", "type": "function", "function": {"name": "echo", "arguments": '{"text": "42"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_0_0", "content": "42"},
    ]
    assert srv.headers[0]["Authorization"].startswith("Bearer ")


def test_bad_arguments_json_becomes_a_bad_call_and_is_shown_back(env, server):
    server.add(
        reply("Let me try.", [{"name": "echo", "arguments": '{"text": "4'}]),  # truncated JSON from the server
        reply("", [{"name": "echo", "arguments": {"text": "42"}}, {"name": "nope", "arguments": {}}]),
        reply("<answer>\\boxed{42}</answer>"),
    )
    policy = OpenAIPolicy.for_env(env, server.base_url, "m")
    traj, gens = run_episode(env, policy)

    assert '{"name": "echo", "arguments": {"text": "4}' in gens[0].text  # the raw string, nothing lost
    bad = traj.turns[0].tool_calls[0]
    assert bad.error == "bad_call" and bad.name is None and "not valid JSON" in bad.result.text
    assert [c.error for c in traj.turns[1].tool_calls] == [None, "bad_call"]  # unknown tool "nope"
    assert traj.tool_error_counts() == {"bad_call": 2} and traj.reward == 1.0

    # Turn 0's unreadable call has no native form: raw block in the content, its error as a user message.
    second = server.requests[1]["messages"]
    assert second[2] == {"role": "assistant", "content": gens[0].text}
    assert "tool_calls" not in second[2]
    assert second[3]["role"] == "user" and second[3]["content"].startswith("<tool_response>\nError: tool call is not")
    # Turn 1: both calls are readable (an unknown tool is still a named call): native calls, error in its tool message.
    third = server.requests[2]["messages"]
    assert third[4]["content"] is None
    assert [c["id"] for c in third[4]["tool_calls"]] == ["call_1_0", "call_1_1"]
    assert third[5] == {"role": "tool", "tool_call_id": "call_1_0", "content": "42"}
    assert third[6]["tool_call_id"] == "call_1_1" and "unknown tool 'nope'" in third[6]["content"]
    assert len(third) == 7 and validate_messages(third) is None


def test_text_mode_sends_no_tools_and_env_rendering(env, server):
    server.add(reply(format_tool_call("echo", {"text": "hi"}) + "\n"), reply("<answer>\\boxed{42}</answer>"))
    policy = OpenAIPolicy.for_env(env, server.base_url, "m", native_tools=False)
    traj, gens = run_episode(env, policy)
    assert gens[0].finish_reason == "tool_call"  # hermes text in content counts as a tool call
    assert traj.tool_calls[0].result.text == "hi" and traj.reward == 1.0
    first, second = server.requests
    assert "tools" not in first and first["messages"][0]["content"] == env.system_prompt
    assert '"name": "echo"' in env.system_prompt  # the tools are described in text
    assert second["messages"][2:] == [
        {"role": "assistant", "content": gens[0].text},
        {"role": "user", "content": "<tool_response>\nhi\n</tool_response>"},
    ]


# -- message building -----------------------------------------------------------------------------------------------
def test_messages_for_mixed_calls_keep_order_and_ids():
    action = (
        "Two checks."
        + format_tool_call("echo", {"text": "a"})
        + "\n<tool_call>\n{oops\n</tool_call>\n"
        + format_tool_call("echo", {"text": "b"})
    )
    turn = Turn(
        action=action,
        tool_calls=[
            ToolCall("x", "echo", {"text": "a"}, ok("a")),
            ToolCall("\n{oops\n", None, None, ToolResult("Error: bad json", "bad_call")),
            ToolCall("y", "echo", {"text": "b"}, ok("b")),
        ],
    )
    policy = OpenAIPolicy("http://127.0.0.1:9/v1", "m", system_prompt="SYS")
    messages = policy.build_messages(
        traj_with(
            turn,
            Turn(
                action="again" + format_tool_call("echo", {"text": "c"}),
                tool_calls=[ToolCall("z", "echo", {"text": "c"}, ok("c"))],
            ),
        )
    )
    assert messages[:2] == [{"role": "system", "content": "SYS"}, {"role": "user", "content": "What is 6 * 7?"}]
    assert messages[2]["content"] == "Two checks.\n<tool_call>\n{oops\n</tool_call>"
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["call_0_0", "call_0_2"]
    assert [json.loads(c["function"]["arguments"]) for c in messages[2]["tool_calls"]] == [{"text": "a"}, {"text": "b"}]
    assert messages[3:6] == [
        {"role": "tool", "tool_call_id": "call_0_0", "content": "a"},
        {"role": "tool", "tool_call_id": "call_0_2", "content": "b"},
        {"role": "user", "content": "<tool_response>\nError: bad json\n</tool_response>"},
    ]
    assert messages[6]["tool_calls"][0]["id"] == "call_1_0" and messages[7]["tool_call_id"] == "call_1_0"
    assert validate_messages(messages) is None


def test_text_mode_messages_are_verbatim():
    action = "think " + format_tool_call("echo", {"text": "a"}) + format_tool_call("echo", {"text": "b"})
    turn = Turn(
        action=action,
        tool_calls=[ToolCall("", "echo", {"text": "a"}, ok("A")), ToolCall("", "echo", {"text": "b"}, ok("B"))],
    )
    policy = OpenAIPolicy("http://127.0.0.1:9/v1", "m", native_tools=False)
    messages = policy.build_messages(traj_with(turn))
    assert messages[2:] == [
        {"role": "assistant", "content": action},
        {"role": "user", "content": "<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n</tool_response>"},
    ]


def test_response_parsing():
    def payload(message, finish="stop"):
        return {"choices": [{"message": message, "finish_reason": finish}], "usage": {"prompt_tokens": 3}}

    gen = OpenAIPolicy.parse_response(payload({"content": "x" * 5}, "length"))
    assert (gen.text, gen.finish_reason, gen.metadata["prompt_tokens"]) == ("xxxxx", "length", 3)
    # A stop string that cut "</tool_call>" still reads as a tool call.
    gen = OpenAIPolicy.parse_response(payload({"content": '<tool_call>\n{"name": "echo"'}))
    assert gen.finish_reason == "tool_call"
    gen = OpenAIPolicy.parse_response(
        payload(
            {
                "content": None,
                "tool_calls": [{"id": "1", "type": "function", "function": {"name": "echo", "arguments": ""}}],
            },
            "tool_calls",
        )
    )
    assert gen.text == format_tool_call("echo", {}) and gen.finish_reason == "tool_call"
    gen = OpenAIPolicy.parse_response(payload({"content": "ok", "reasoning_content": "hmm"}, "abort"))
    assert (gen.finish_reason, gen.metadata["finish_reason_raw"], gen.metadata["reasoning_content"]) == (
        "stop",
        "abort",
        "hmm",
    )


def test_token_ids_and_logprobs_are_read_and_required_when_asked():
    def payload(**choice):
        return {"choices": [{"message": {"content": "ab"}, "finish_reason": "stop", **choice}]}

    logprobs = {"content": [{"token": "a", "logprob": -0.5}, {"token": "b", "logprob": -1.25}]}
    gen = OpenAIPolicy.parse_response(payload(token_ids=[7, 9], logprobs=logprobs), token_ids=True)
    assert (gen.token_ids, gen.logprobs) == ([7, 9], [-0.5, -1.25])
    # vLLM's return_tokens_as_token_ids: the ids are in the log-prob entries.
    as_ids = {"content": [{"token": "token_id:7", "logprob": -0.5}, {"token": "token_id:9", "logprob": -1.25}]}
    gen = OpenAIPolicy.parse_response(payload(logprobs=as_ids), token_ids=True)
    assert (gen.token_ids, gen.logprobs) == ([7, 9], [-0.5, -1.25])
    # Not asked and absent: none (both or neither); asked and absent, or not pairing up: an error naming the cause.
    assert OpenAIPolicy.parse_response(payload(logprobs=logprobs)).token_ids is None
    assert OpenAIPolicy.parse_response(payload(logprobs=logprobs)).logprobs is None
    with pytest.raises(Exception, match="no token ids and log-probs"):
        OpenAIPolicy.parse_response(payload(), token_ids=True)
    with pytest.raises(Exception, match="2 token ids but 1 log-probs"):
        OpenAIPolicy.parse_response(payload(token_ids=[7, 9], logprobs={"content": logprobs["content"][:1]}))
    body = OpenAIPolicy("http://127.0.0.1:9/v1", "m", return_token_ids=True).build_body(Request(traj_with()))
    assert body["logprobs"] is True and body["return_token_ids"] is True
    assert "return_token_ids" not in OpenAIPolicy("http://127.0.0.1:9/v1", "m").build_body(Request(traj_with()))


# -- failures ---------------------------------------------------------------------------------------------------------
def test_retries_429_500_and_disconnect_then_succeeds(server):
    server.add(fault(429, retry_after=0.02), fault(500), disconnect(), fault(503), reply("done"))
    policy = OpenAIPolicy(server.base_url, "m", max_retries=4, **FAST)
    [gen] = generate(policy, [Request(traj_with())])
    assert (gen.text, gen.finish_reason, gen.metadata["attempts"]) == ("done", "stop", 5)
    assert len(server.requests) == 5 and server.remaining == 0


def test_gives_up_with_an_error_generation_not_an_exception(server):
    server.add(*[fault(500, message="engine dead")] * 3, reply("never"))
    policy = OpenAIPolicy(server.base_url, "m", max_retries=2, **FAST)
    [gen] = generate(policy, [Request(traj_with())])
    assert gen.finish_reason == "error" and gen.text == ""
    assert "HTTP 500: engine dead" in gen.metadata["error"] and "3 attempts" in gen.metadata["error"]
    assert len(server.requests) == 3 and server.remaining == 1


def test_client_errors_are_not_retried_and_do_not_sink_the_batch(server):
    server.add(fault(400, message="maximum context length is 4096 tokens", match="bad"), reply("fine", match="good"))
    policy = OpenAIPolicy(server.base_url, "m", **FAST)
    bad, good = Trajectory(problem="bad", answer=""), Trajectory(problem="good", answer="")
    gens = generate(policy, [Request(bad), Request(good)])
    assert gens[0].finish_reason == "error" and "maximum context length" in gens[0].metadata["error"]
    assert gens[0].metadata["attempts"] == 1
    assert gens[1].text == "fine"


def test_unreachable_server_is_an_error():
    with ReplayServer() as srv:
        url = srv.base_url  # closed at once: nothing listens there any more
    policy = OpenAIPolicy(url, "m", max_retries=1, **FAST)
    [gen] = generate(policy, [Request(traj_with())])
    assert gen.finish_reason == "error" and "connection error" in gen.metadata["error"]


def test_timeout_is_retried(server):
    # The prompt reply must come within the timeout on a busy machine too: 1 s, against 3 s for the late one.
    server.add(slow(3.0, reply("late")), reply("on time"))
    policy = OpenAIPolicy(server.base_url, "m", timeout_s=1.0, max_retries=1, **FAST)
    [gen] = generate(policy, [Request(traj_with())])
    assert (gen.text, gen.metadata["attempts"]) == ("on time", 2)


def test_timeout_gives_up(server):
    server.add(slow(2.0), slow(2.0))
    policy = OpenAIPolicy(server.base_url, "m", timeout_s=0.2, max_retries=1, **FAST)
    [gen] = generate(policy, [Request(traj_with())])
    assert gen.finish_reason == "error" and "timed out" in gen.metadata["error"]
    assert len(server.requests) == 2


def test_strict_server_rejects_unanswered_tool_calls():
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "echo", "arguments": "{}"}}],
        },
        {"role": "user", "content": "next"},
    ]
    assert "not answered" in validate_messages(messages)
    assert "no preceding tool call" in validate_messages([{"role": "tool", "tool_call_id": "z", "content": ""}])


# -- concurrency ------------------------------------------------------------------------------------------------------
def test_concurrency_limit_is_respected_and_order_kept():
    with ReplayServer(default=reply("same", delay_s=0.1)) as srv:
        srv.add(*[reply(f"answer {i}", match=f"problem {i}", delay_s=0.1) for i in range(12)])
        policy = OpenAIPolicy(srv.base_url, "m", max_concurrency=3)
        requests = [Request(Trajectory(problem=f"problem {i}", answer="")) for i in range(12)]
        gens = generate(policy, requests)
        assert [g.text for g in gens] == [f"answer {i}" for i in range(12)]
        assert srv.max_in_flight == 3
        # A closed policy reopens on the next call, here on another event loop with its own semaphore.
        gens = generate(policy, requests[:4])
        assert [g.text for g in gens] == ["same"] * 4 and srv.max_in_flight == 3


def test_backoff_is_exponential_jittered_capped_and_honours_retry_after():
    policy = OpenAIPolicy("http://127.0.0.1:9/v1", "m", backoff_s=1.0, max_backoff_s=5.0)
    waits = [policy._backoff(attempt, None) for attempt in (1, 2, 3, 4, 5)]
    assert 0.5 <= waits[0] <= 1.0 and 1.0 <= waits[1] <= 2.0 and 2.0 <= waits[2] <= 4.0
    assert 2.5 <= waits[3] <= 5.0 and 2.5 <= waits[4] <= 5.0
    assert policy._backoff(1, 0.25) == 0.25 and policy._backoff(1, 600.0) == 5.0


def test_for_env_accepts_wrapped_and_vector_envs(echo_plugins):
    import gymnasium

    import rstar_env  # noqa: F401  (registers the env ids)

    env = gymnasium.make("rstar_env/MathTool-v0", tools=["echo"], reward="exact_test")
    vec = gymnasium.make_vec(
        "rstar_env/MathTool-v0",
        num_envs=2,
        vectorization_mode="vector_entry_point",
        tools=["echo"],
        reward="exact_test",
    )
    try:
        for e in (env, vec):
            policy = OpenAIPolicy.for_env(e, "http://127.0.0.1:9/v1", "m")
            assert [t["function"]["name"] for t in policy.tools] == ["echo"]
            assert policy.system_prompt == DEFAULT_SYSTEM_PROMPT
        assert OpenAIPolicy.for_env(vec, "http://x/v1", "m", native_tools=False).system_prompt.endswith("</tool_call>")
    finally:
        env.close()
        vec.close()


def test_missing_httpx_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "httpx", None)
    with pytest.raises(ImportError, match=r"pip install 'rstar-env\[openai\]'"):
        OpenAIPolicy("http://127.0.0.1:9/v1", "m")


def test_invalid_settings_are_rejected():
    with pytest.raises(ValueError, match="max_concurrency"):
        OpenAIPolicy("http://127.0.0.1:9/v1", "m", max_concurrency=0)


def test_a_request_s_own_seed_is_sent_whatever_the_order():
    """The collector's per-request seed goes to the server as is (vLLM seeds that request alone), so a rerun that
    sends the requests in another order asks for the same draws; requests without one fall back to seed + n."""
    transport, sent = canned(*(f"r{i}" for i in range(5)))
    policy = OpenAIPolicy("http://endpoint.test/v1", "m", sampling=SamplingParams(seed=7), transport=transport, **FAST)
    traj = Trajectory(problem="What is 6 * 7?", answer="42")
    generate(policy, [Request(traj, seed=123456789012345), Request(traj, seed=5)])
    generate(policy, [Request(traj, seed=5), Request(traj, seed=123456789012345), Request(traj)])
    seeds = [r["seed"] for r in sent]
    # Concurrent requests reach the server in any order: compare the sets each call sent.
    assert sorted(seeds[:2]) == [5, 123456789012345]
    assert sorted(seeds[2:]) == [5, 7 + 4, 123456789012345]  # no seed of its own: the policy's seed + n


def test_a_transport_carries_the_requests_with_no_server():
    transport, sent = canned("The answer is \\boxed{42}.")
    policy = OpenAIPolicy("http://endpoint.test/v1", "m", api_key="k", transport=transport)
    [gen] = generate(policy, [Request(traj_with())])
    assert (gen.text, gen.finish_reason, gen.metadata["completion_tokens"]) == ("The answer is \\boxed{42}.", "stop", 1)
    assert sent[0]["url"] == "http://endpoint.test/v1/chat/completions" and sent[0]["authorization"] == "Bearer k"
    assert sent[0]["model"] == "m" and sent[0]["messages"][-1]["content"] == "What is 6 * 7?"


def test_endpoint_policy_sends_generations_and_metrics_through_the_transport(env):
    from rstar_env.rollout.dispatch import endpoint_policy

    transport, sent = canned("first", "second")
    policy = endpoint_policy(env, ["http://a.test/v1", "http://b.test/v1"], "m", transport=transport)
    gens = generate(policy, [Request(traj_with()), Request(traj_with())])
    assert sorted(g.text for g in gens) == ["first", "second"] and len(sent) == 2
    assert {r["url"] for r in sent} <= {"http://a.test/v1/chat/completions", "http://b.test/v1/chat/completions"}
    # The metrics were read through the transport too: its 404, not a failed connection to a.test.
    assert [e["metrics_error"] for e in policy.stats()] == [
        f"http://{h}.test/metrics is not served (404): no live KV metrics" for h in "ab"
    ]
