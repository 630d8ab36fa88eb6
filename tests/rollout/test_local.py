"""Rollouts with the real SmolLM2-135M-Instruct: token-level truth across turns, batching, the collector."""

from __future__ import annotations

import asyncio

import pytest

from rstar_env.data import generate_problems
from rstar_env.rollout.collect import collect, jobs_for, trajectory_tokens
from rstar_env.rollout.local import ModelNotFoundError, TransformersPolicy, resolve_model
from rstar_env.rollout.policy import Generation, Request, SamplingParams
from rstar_env.testing import answer, tool_call

torch = pytest.importorskip("torch")


class ScriptedFirstTurn:
    """Wraps a policy: turn 1 is a scripted tool call given as a *non-canonical* token split (what a sampler can
    produce but re-tokenizing the text never would); later turns come from the model. Records every request."""

    def __init__(self, inner: TransformersPolicy, action: str) -> None:
        self.inner, self.tokenizer = inner, inner.tokenizer
        ids: list[int] = []
        for ch in action:  # one token per character: valid ids, never what encode(action) gives
            ids += self.tokenizer.encode(ch, add_special_tokens=False)
        self.first_ids = ids
        self.requests: list[Request] = []

    async def generate(self, requests):
        self.requests += [Request(r.trajectory.copy(), list(r.context_ids), r.max_new_tokens) for r in requests]
        scripted = [r for r in requests if not r.trajectory.turns]
        rest = [r for r in requests if r.trajectory.turns]
        generated = iter(await self.inner.generate(rest)) if rest else iter(())
        out = []
        for r in requests:
            if r in scripted:
                out.append(
                    Generation(
                        self.tokenizer.decode(self.first_ids),
                        list(self.first_ids),
                        [0.0] * len(self.first_ids),
                        "tool_call",
                    )
                )
            else:
                out.append(next(generated))
        return out

    async def aclose(self):
        pass


@pytest.fixture
def policy(smollm2):
    model, tokenizer = smollm2
    return TransformersPolicy(
        model, tokenizer=tokenizer, batch_size=4, sampling=SamplingParams(temperature=1.0, max_new_tokens=24, seed=0)
    )


def test_ids_are_exactly_what_the_trainer_scores(policy, echo_plugins):
    action = tool_call("echo", "Let me check.", text="7")
    scripted = ScriptedFirstTurn(policy, action)
    assert scripted.first_ids != policy.tokenizer.encode(action, add_special_tokens=False)
    rows = [
        {"problem": "What is 3 + 4?", "answer": "7", "id": "a"},
        {"problem": "What is 10 - 2?", "answer": "8", "id": "b"},
    ]
    trajectories = asyncio.run(
        collect(scripted, jobs_for(rows, samples=2), width=4, tools=["echo"], reward="exact_test", max_turns=2)
    )
    assert len(trajectories) == 4
    for traj in trajectories:
        tokens = trajectory_tokens(traj)
        # The scripted split survived: nothing was re-tokenized from text.
        first = traj.turns[0]
        assert first.action_token_ids == scripted.first_ids
        assert first.tool_calls[0].result.text == "7"
        # Every context the policy saw is a prefix of the final sequence.
        seen = [
            r
            for r in scripted.requests
            if r.trajectory.id == traj.id
            and len(r.trajectory.turns) <= len(traj.turns)
            and r.trajectory.problem == traj.problem
        ]
        for request in seen:
            assert tokens.input_ids[: len(request.context_ids)] == request.context_ids
        # The mask marks the generated ids and nothing else.
        generated = sum(len(t.action_token_ids) for t in traj.turns)
        assert sum(tokens.action_mask) == generated
        feedback = traj.turns[0].feedback_token_ids
        start = tokens.prompt_length + len(first.action_token_ids)
        assert tokens.input_ids[start : start + len(feedback)] == feedback
        assert tokens.action_mask[start : start + len(feedback)] == [0] * len(feedback)
        # The text view agrees with the ids.
        assert policy.tokenizer.decode(tokens.input_ids) == traj.prompt + traj.response


def test_sampling_logprobs_match_a_teacher_forced_forward(policy, echo_plugins):
    """KV-cached, left-padded batch sampling, with the prefill shared by samples of one prompt, gives the log-probs
    a full forward pass on the final ids gives: the trainer's view and the sampler's view of the tokens agree."""
    rows = [{"problem": p.problem, "answer": p.answer, "id": p.id} for p in generate_problems(2, seed=1)]
    rows[0]["problem"] += " Explain each step in detail, then check your work twice."  # unequal lengths: padding
    trajectories = asyncio.run(
        collect(policy, jobs_for(rows, samples=2), width=4, tools=["echo"], reward="exact_test", max_turns=1)
    )
    assert trajectories[0].turns[0].action_token_ids != trajectories[1].turns[0].action_token_ids
    model = policy.model
    for traj in trajectories:
        tokens = trajectory_tokens(traj)
        ids = torch.tensor([tokens.input_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]
        positions = [i for i, m in enumerate(tokens.action_mask) if m]
        expected = torch.tensor([logp[i - 1].item() for i in positions])
        got = torch.tensor([tokens.logprobs[i] for i in positions])
        assert torch.allclose(got, expected, atol=2e-3), (got - expected).abs().max()


def test_turn_cap_and_budget_are_respected(policy, echo_plugins):
    rows = [{"problem": "Write a long story about numbers.", "answer": "0", "id": "s"}]
    (traj,) = asyncio.run(
        collect(
            policy,
            jobs_for(rows),
            tools=["echo"],
            reward="exact_test",
            max_turns=3,
            max_length=10,
            length_unit="tokens",
        )
    )
    # The budget (10) leaves room for 11 tokens at most in the first turn, so a long answer ends by length.
    assert len(traj.turns[0].action_token_ids) <= 11
    if traj.end_reason == "length":
        assert traj.reward == 0.0


def test_same_seed_same_samples(smollm2, echo_plugins):
    model, tokenizer = smollm2
    rows = [{"problem": "What is 2 + 2?", "answer": "4", "id": "x"}]

    def run():
        pol = TransformersPolicy(model, tokenizer=tokenizer, sampling=SamplingParams(max_new_tokens=12, seed=3))
        return asyncio.run(collect(pol, jobs_for(rows, samples=2), tools=["echo"], reward="exact_test", max_turns=1))

    a, b = run(), run()
    assert [t.turns[0].action_token_ids for t in a] == [t.turns[0].action_token_ids for t in b]


def test_real_rollout_on_generated_problems_with_the_python_tool(policy):
    pytest.importorskip("rstar_env.sandbox.local")
    rows = generate_problems(4, seed=0)
    trajectories = asyncio.run(collect(policy, jobs_for(rows, samples=2), width=8, max_turns=2))
    assert len(trajectories) == 8
    for traj in trajectories:
        assert traj.done and traj.end_reason in ("answer", "max_turns", "length")
        assert traj.reward in (0.0, 1.0)
        assert trajectory_tokens(traj).input_ids[: len(traj.prompt_token_ids)] == traj.prompt_token_ids
    assert {t.metadata["sample"] for t in trajectories} == {0, 1}
    assert policy.tokens_per_second > 0


def test_unknown_model_path_says_what_to_do(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no hub download is attempted"):
        resolve_model(tmp_path / "missing")
    assert resolve_model("smollm2")[1].endswith(".gguf")


def test_answer_helper_is_scored_by_the_real_math_reward():
    pytest.importorskip("rstar_plugins.rewards.math_reward")
    from rstar_env.plugins import load_reward

    reward = load_reward("math")
    result = asyncio.run(reward.score(answer("\\frac{1}{2}"), "0.5"))
    assert result.reward == 1.0


def test_a_shared_prompt_prefix_is_prefilled_once_and_changes_nothing(smollm2, monkeypatch):
    """Contexts that open with the same system prompt share its prefill ([prefix | padding | rest] layout); the
    next-token log-probs and a greedy continuation are those of prefilling every context whole."""
    from rstar_env.rollout import local

    model, tokenizer = smollm2
    system = tokenizer.encode("You are a careful assistant. Solve the problem and show your work. " * 3)
    contexts = [
        system + tokenizer.encode(q) for q in ("What is 3 + 4?", "Compute 12 * 11 - 5, then halve it.", "2 + 2?")
    ]
    assert local._common_prefix_length(contexts) >= len(system) >= local._MIN_SHARED_PREFIX

    def run(policy):
        requests = [Request(None, c, None) for c in contexts]  # type: ignore[arg-type]
        generations = policy.generate_sync(requests)
        return [g.token_ids for g in generations], [g.logprobs for g in generations]

    calls = []
    real_forward = model.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape)
        return real_forward(*args, **kwargs)

    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    monkeypatch.setattr(model, "forward", counting)
    shared_ids, shared_logprobs = run(TransformersPolicy(model, tokenizer=tokenizer, sampling=greedy, batch_size=3))
    assert calls[0] == (1, local._common_prefix_length(contexts))  # the prefix ran once, alone
    monkeypatch.setattr(local, "_MIN_SHARED_PREFIX", 10**9)
    calls.clear()
    whole_ids, whole_logprobs = run(TransformersPolicy(model, tokenizer=tokenizer, sampling=greedy, batch_size=3))
    assert calls[0] == (3, max(len(c) for c in contexts))
    assert shared_ids == whole_ids
    for a, b in zip(shared_logprobs, whole_logprobs, strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=2e-3)
