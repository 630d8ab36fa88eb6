"""``rstar-env chat``: a conversation with a model that can run Python, each question an episode."""

from __future__ import annotations

import sys
import uuid
from typing import Any

import click
from rich.console import Console

from rstar_env._cli_util import console, fail, stops_on_sigterm

from ._shared import ENDPOINT_HELP, or_fail


@click.command()
@click.option("--model", default=None, help="Local model: 'smollm2' (default), a model directory or a .gguf file.")
@click.option("--endpoint", "endpoints", multiple=True, help=ENDPOINT_HELP)
@click.option("--served-model", default=None, help="Model name to request from --endpoint.")
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Run config (tools, reward, env).")
@click.option("--temperature", type=float, default=0.7, show_default=True)
@click.option(
    "--max-new-tokens",
    type=int,
    default=None,
    help="Per assistant turn [default: the config's trainer.max_new_tokens, else 512].",
)
@click.option("--max-turns", type=int, default=10, show_default=True)
@click.option("--answer", "gold", default=None, help="A gold answer to score the final response against.")
@stops_on_sigterm
def chat(
    model: str | None,
    endpoints: tuple[str, ...],
    served_model: str | None,
    config: str | None,
    temperature: float,
    max_new_tokens: int | None,
    max_turns: int,
    gold: str | None,
) -> None:
    """Chat with a model that can run Python: each question is an episode; tool calls and their results are shown
    as they happen. Type a question; /quit, /exit, an empty line or Ctrl-D ends the chat. Without --answer the
    episodes are unscored."""
    from rich.markup import escape

    from rstar_env import aio
    from rstar_env.config import ConfigError, load_config
    from rstar_env.env import MathToolEnv
    from rstar_env.format import extract_answer, printable
    from rstar_env.plugins import PluginError
    from rstar_env.rollout.choose import build_policy, endpoint_specs
    from rstar_env.rollout.collect import context_ids
    from rstar_env.rollout.policy import Request, SamplingParams

    out = Console(highlight=False)  # the conversation is the command's output: stdout
    try:
        cfg = load_config(config)
        if gold is None:  # a question typed in a chat has no gold answer: run it unscored, not as a data error
            cfg = cfg.model_copy(update={"dataset": cfg.dataset.model_copy(update={"allow_unscored": True})})
        env = MathToolEnv(config=cfg, max_turns=max_turns)
    except (ConfigError, PluginError) as exc:
        fail(str(exc))
    sampling = SamplingParams(
        temperature=temperature, **cfg.trainer.sampling(max_new_tokens=max_new_tokens)
    )  # as trained
    specs = or_fail(endpoint_specs, cfg, endpoints, (), None)
    with out.status("loading the model...", spinner="dots"):
        policy = or_fail(
            build_policy,
            model,
            specs,
            served_model or cfg.inference.served_model,
            sampling,
            1,
            env,
            engine=cfg.policy.engine,
            note=lambda text: console.print(f"[dim]{text}[/]"),
        )
    env.tokenizer = policy.tokenizer
    hidden = _chat_markers(env, policy.tokenizer)

    async def episode(question: str) -> None:
        await env.areset(options={"problem": question, "answer": gold})
        key = uuid.uuid4().hex  # one key per episode: several engines keep its turns on one (prefix cache)
        while True:
            trajectory = env.trajectory
            assert trajectory is not None
            ids = context_ids(trajectory) if policy.tokenizer is not None else None
            with out.status("the model is writing...", spinner="dots"):
                (generation,) = await policy.generate([Request(trajectory, ids, episode=key)])
            out.rule("[bold cyan]assistant")
            out.print(printable(hidden.sub("", generation.text).strip()), markup=False)
            with out.status("running tools...", spinner="dots"):
                _, reward, terminated, truncated, info = await env.astep(
                    generation.text, token_ids=generation.token_ids, logprobs=generation.logprobs
                )
            for call in info["trajectory"].turns[-1].tool_calls:
                style = "red" if call.error else "green"
                out.rule(f"[{style}]tool {call.name or '?'}" + (f" ({call.error})" if call.error else ""))
                out.print(printable(call.result.text), markup=False)
            if terminated or truncated:
                final = info["trajectory"]
                said = final.final_answer
                if said is None and final.turns:  # unscored: no reward plugin ran, so read the answer format here
                    said = extract_answer(final.turns[-1].action)
                text = _episode_end(final.end_reason, said, reward, gold, info.get("error"))
                out.print(f"[dim]{escape(text)}[/]", soft_wrap=True)
                return

    out.print(
        "[dim]Type a question and press Enter; /quit, /exit, an empty line or Ctrl-D ends the chat.[/]", soft_wrap=True
    )
    try:
        while True:
            out.print("[bold]you>[/] ", end="")
            question = sys.stdin.readline().strip()
            if not question or question.lower() in _CHAT_QUIT:
                return
            aio.run_sync(episode(question))
    finally:
        aio.run_sync(policy.aclose())
        env.close()


_CHAT_QUIT = frozenset({"/quit", "/exit"})
"""Lines that end a chat instead of being asked."""

_END_REASONS = {
    "answer": "the model answered",
    "max_turns": "the turn limit (--max-turns) was reached",
    "length": "the reply outgrew the length budget",
    "action_too_long": "a reply was too long to run",
    "time_limit": "the time limit was reached",
    "env_error": "the environment failed",
    "policy_error": "the model failed to generate",
}


def _episode_end(
    end_reason: str | None, said: str | None, reward: float, gold: str | None, error: str | None = None
) -> str:
    """How a chat episode ended, in words: why, the final answer (or that none was found), and the score."""
    why = _END_REASONS.get(end_reason or "", end_reason or "unknown")
    answer = f"final answer {said}" if said else "no answer found in the model's reply"
    if end_reason in ("env_error", "policy_error"):
        scored = "not scored" + (f": {error.strip().splitlines()[-1]}" if error and error.strip() else "")
    elif gold is None:
        scored = "unscored: no --answer"
    else:
        scored = f"reward {reward:g} against --answer {gold}"
    return f"episode over ({why}): {answer}; {scored}"


def _chat_markers(env: Any, tokenizer: Any) -> Any:
    """A pattern matching the chat template's control markers (``<|im_end|>``, any ``<|name|>``) and the
    tokenizer's special tokens: the model's raw turn end is protocol, not something to show a person."""
    import re

    markers = {*env.chat_format.control_markers, *(getattr(tokenizer, "all_special_tokens", None) or [])}
    markers = {m for m in markers if isinstance(m, str) and m.strip() and m.startswith("<")}
    alternatives = [re.escape(m) for m in sorted(markers, key=len, reverse=True)] + [r"<\|[^|<>\s]{1,40}\|>"]
    return re.compile("|".join(alternatives))


command = chat
