"""Synthetic tool-use SFT data, made by driving the env itself (so it sits above the env, beside rollouts).

Each example is one episode of :class:`~rstar_env.env.MathToolEnv` on a generated problem, played by a scripted
"teacher": short reasoning, a ``python`` tool call, the tool response (the sandbox really runs the code; its output
is what the model sees, never a hard-coded string), then ``<answer>\\boxed{N}</answer>`` with N read from that
output. So the data is in the RL format by construction: the same system prompt, tool schemas, chat markers and
feedback rendering as a rollout.

Styles, with configurable shares:

* ``tool``: one call that prints the result, then the answer;
* ``fix``: a first call that fails (``NameError`` from an undefined or misspelled variable, or a ``SyntaxError``),
  a next turn that quotes the error the sandbox printed and fixes the code, then the answer (the paper's "reflect on
  tool feedback");
* ``no_tool``: a direct answer without the tool (small problems only).

Rows are ``{"messages": [...], "id", "problem", "answer", "style"}``: the OpenRLHF SFT shape (what
``rstar_trainers.openrlhf.convert`` writes, loss on assistant messages), so the same file trains either backend.
:func:`sft_tokens` turns a row into the exact token ids and loss mask the env would produce for that episode.
Source spec for configs: ``toolsft:n=512,seed=0,level=1-3,fix=0.25,no_tool=0.1`` (keys as in
:func:`generate_tool_sft`).
"""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rstar_env.data import DataError, generate_problems

__all__ = ["SFTTokens", "generate_tool_sft", "parse_tool_sft_spec", "sft_tokens"]

_STYLES = ("tool", "fix", "no_tool")
_ERRORS = ("undefined_name", "misspelled_name", "syntax")
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.DOTALL)
_NUMBER = re.compile(r"-?\d+")


def parse_tool_sft_spec(spec: str) -> dict[str, Any] | None:
    """``"toolsft[:key=value,...]"`` -> keyword arguments of :func:`generate_tool_sft`; ``None`` for another
    source. Keys: ``n``, ``seed``, ``level`` (as for generated problems: ``1``..``5`` or ``lo-hi``), ``kind``,
    ``fix`` and ``no_tool`` (shares)."""
    head, _, params = spec.strip().partition(":")
    if head != "toolsft":
        return None
    out: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in params.split(","))):
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or key not in ("n", "seed", "level", "kind", "fix", "no_tool"):
            raise DataError(
                f"bad parameter {item!r} in {spec!r}: expected n=INT, seed=INT, level=1..5|LO-HI, "
                "kind=arithmetic, fix=SHARE, no_tool=SHARE"
            )
        try:
            out[key] = int(value) if key in ("n", "seed") else float(value) if key in ("fix", "no_tool") else value
        except ValueError:
            raise DataError(f"bad {key}={value!r} in {spec!r}") from None
    return out


def generate_tool_sft(
    n: int,
    *,
    seed: int = 0,
    level: Any = "1-3",
    kind: str = "arithmetic",
    fix: float = 0.25,
    no_tool: float = 0.1,
    config: Any = None,
    concurrency: int = 8,
    on_done: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """``n`` SFT conversations, each an episode of the env driven with a scripted teacher (see the module doc).

    ``fix``/``no_tool``: shares of error-then-fix and tool-free examples (the rest makes one clean call).
    ``config``: the run config (its env system prompt, tools and chat format are used, so the data matches the RL
    stage's prompts); default: the default config. Deterministic in ``seed`` (the sandbox's output of
    deterministic code is too). Raises :class:`DataError` if the sandbox output or the reward disagrees with the
    problem's answer (the data would teach wrong answers). ``on_done(done, n)`` is called as each example is made
    (progress).
    """
    if kind != "arithmetic":
        raise DataError(
            f"tool SFT data is generated from arithmetic problems (their expression is the code); got kind={kind!r}"
        )
    if not (0 <= fix <= 1 and 0 <= no_tool <= 1 and fix + no_tool <= 1):
        raise DataError(f"shares must lie in [0, 1] and fix + no_tool <= 1; got fix={fix}, no_tool={no_tool}")
    from rstar_env import aio

    problems = generate_problems(n, kind="arithmetic", level=level, seed=seed)
    rng = random.Random(f"toolsft|{seed}")
    plans = []
    for p in problems:
        draw = rng.random()
        # A direct answer only where a small model can do it in its head: one operation on small numbers.
        style = "fix" if draw < fix else "no_tool" if draw < fix + no_tool and abs(int(p.answer)) < 100 else "tool"
        plans.append((p, style, rng.choice(_ERRORS), rng.randrange(1 << 30)))
    if on_done is not None:
        on_done(0, len(plans))
    return aio.run_sync(_drive_all(plans, config, max(1, concurrency), on_done))


async def _drive_all(
    plans: list[tuple[Any, str, str, int]],
    config: Any,
    concurrency: int,
    on_done: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    from rstar_env.env import MathToolEnv

    first = MathToolEnv(config=config, max_turns=4, max_length=None)
    envs = [first] + [
        MathToolEnv(
            config=first.config, tools=list(first.tools.values()), reward=first.reward_fn, max_turns=4, max_length=None
        )
        for _ in range(min(concurrency, len(plans)) - 1)
    ]
    out: list[dict[str, Any] | None] = [None] * len(plans)
    done = 0

    async def worker(k: int) -> None:
        nonlocal done
        for i in range(k, len(plans), len(envs)):
            out[i] = await _drive_one(envs[k], *plans[i])
            done += 1
            if on_done is not None:
                on_done(done, len(plans))

    try:
        await asyncio.gather(*(worker(k) for k in range(len(envs))))
    finally:
        for env in reversed(envs):
            await env.aclose()
    return [row for row in out if row is not None]


def _code(expression: str, error: str | None, name: str, rng: random.Random) -> str:
    if error == "undefined_name":
        other = rng.choice([x for x in ("result", "value", "total", "answer") if x != name])
        return f"{name} = {expression}\nprint({other})"
    if error == "misspelled_name":
        return f"{name} = {expression}\nprint({name[:-1]})"
    if error == "syntax":
        return f"print({expression}"
    return f"{name} = {expression}\nprint({name})"


async def _drive_one(env: Any, problem: Any, style: str, error: str, salt: int) -> dict[str, Any]:
    from rstar_env.format import format_tool_call, render_tool_responses

    rng = random.Random(salt)
    expression = problem.metadata["expression"]
    await env.areset(options={"problem": problem.problem, "answer": problem.answer, "id": problem.id})
    actions: list[str] = []

    async def act(text: str) -> tuple[float, bool, Any]:
        actions.append(text)
        _, reward, terminated, truncated, info = await env.astep(text)
        return reward, terminated or truncated, info["trajectory"]

    if style == "no_tool":
        reward, done, traj = await act(
            f"{expression} = {problem.answer}.\n<answer>\\boxed{{{problem.answer}}}</answer>"
        )
    else:
        lead = rng.choice(
            ("Let me compute it with Python.", "I will use Python to calculate this.", "I can check this with Python.")
        )
        name = rng.choice(("result", "value", "total", "answer"))
        first = _code(expression, error if style == "fix" else None, name, rng)
        reward, done, traj = await act(f"{lead}\n{format_tool_call('python', {'code': first})}")
        call = traj.turns[-1].tool_calls[0]
        if style == "fix":
            if call.error is None:
                raise DataError(f"{problem.id}: the faulty code {first!r} ran without error: {call.result.text!r}")
            last = call.result.text.strip().splitlines()[-1] if call.result.text.strip() else call.error
            fixed = _code(expression, None, name, rng)  # the fix keeps the variable the code defined
            reward, done, traj = await act(
                f"The code failed: {last.strip()}. Let me fix it.\n{format_tool_call('python', {'code': fixed})}"
            )
            call = traj.turns[-1].tool_calls[0]
        printed = _NUMBER.findall(call.result.text)
        if call.error is not None or not printed or printed[-1] != problem.answer:
            raise DataError(
                f"{problem.id}: the sandbox printed {call.result.text!r} for {expression} (expected {problem.answer})"
            )
        reward, done, traj = await act(f"The result is {printed[-1]}.\n<answer>\\boxed{{{printed[-1]}}}</answer>")
    if not done or reward <= 0:
        raise DataError(f"{problem.id}: the scripted episode ended {traj.end_reason!r} with reward {reward}")
    messages = [
        {"role": "system", "content": env.system_prompt},
        {"role": "user", "content": env.settings.user_template.replace("{problem}", problem.problem)},
    ]
    for turn in traj.turns:
        messages.append({"role": "assistant", "content": turn.action})
        if turn.tool_calls:
            outputs = [c.result.text for c in turn.tool_calls]
            messages.append({"role": "tool", "content": render_tool_responses(outputs)})
    return {
        "id": problem.id,
        "problem": problem.problem,
        "answer": problem.answer,
        "style": style,
        "error": error if style == "fix" else None,
        "messages": messages,
    }


@dataclass
class SFTTokens:
    """One conversation as the policy would see it: ids and which of them the loss trains on."""

    input_ids: list[int]
    loss_mask: list[int]
    """1 on assistant tokens (the model's own actions and the end-of-turn marker of its final answer); 0 on the
    prompt, on tool responses and on the chat markers the env writes around them."""


def sft_tokens(messages: Sequence[dict[str, Any]], tokenizer: Any, chat_format: Any = "chatml") -> SFTTokens:
    """The ids and loss mask of a ``messages`` conversation, exactly as the env lays out an episode: the prompt
    encoded as the env encodes it, each assistant action as the policy's tokens, each tool message as the env's
    feedback (template markers as special ids, tool output encoded as data). The final assistant turn ends with the
    template's end-of-turn marker (what a policy samples to stop). Raises ``ValueError`` naming the message that
    does not fit the ``system, user, (assistant, tool)*, assistant`` shape."""
    from rstar_env.format import get_chat_format
    from rstar_env.special_tokens import SpecialTokens, encode_parts

    fmt = get_chat_format(chat_format)
    roles = [m.get("role") for m in messages]
    if len(roles) < 3 or roles[0] != "system" or roles[1] != "user" or roles[-1] != "assistant":
        raise ValueError(f"an SFT conversation is system, user, (assistant, tool)*, assistant; got roles {roles}")
    ids = list(
        tokenizer.encode(fmt.render_prompt(messages[0]["content"], messages[1]["content"]), add_special_tokens=False)
    )
    mask = [0] * len(ids)
    specials = SpecialTokens.of(tokenizer).strings
    body = messages[2:]
    for k, message in enumerate(body):
        expected = "assistant" if k % 2 == 0 else "tool"
        if message.get("role") != expected:
            raise ValueError(f"message {k + 2} has role {message.get('role')!r}, expected {expected!r}")
        text = str(message["content"])
        if expected == "assistant":
            if k == len(body) - 1 and not text.endswith(fmt.turn_end.rstrip()):
                text += fmt.turn_end.rstrip()
            action = list(tokenizer.encode(text, add_special_tokens=False))
            ids += action
            mask += [1] * len(action)
        else:
            outputs = _RESPONSE.findall(text)
            if not outputs:
                raise ValueError(f"message {k + 2} (tool) holds no <tool_response> block")
            feedback = encode_parts(tokenizer, fmt.feedback_parts(str(body[k - 1]["content"]), outputs, specials))
            ids += feedback
            mask += [0] * len(feedback)
    return SFTTokens(ids, mask)
