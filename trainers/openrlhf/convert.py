"""Turn function-calling chat data into our tool-call format, for the non-reasoning SFT stage.

Input rows (jsonl), either of the two common shapes:

- OpenAI: ``{"messages": [...], "tools"?: [...]}`` where assistant messages carry ``tool_calls`` (``[{"function":
  {"name", "arguments"}}]``, arguments a JSON string or an object) or a legacy ``function_call``, and tool results
  are ``role: tool`` (or ``function``) messages;
- ShareGPT: ``{"conversations": [{"from", "value"}, ...], "tools"?: "<json>", "system"?: str}`` with ``human``,
  ``gpt``, ``function_call`` (a JSON call or list of calls) and ``observation`` turns.

Output rows: ``{"messages": [{"role", "content"}, ...]}`` in the env's terms. The system message is the env's
system prompt with the tool schemas in the hermes preamble (the row's own system text and tools when it has them,
else the run config's); an assistant turn's calls become ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n
</tool_call>`` blocks after its text; consecutive tool results become one ``tool`` message whose content is the
``<tool_response>`` blocks the env renders. With the chat template the launcher gives OpenRLHF's SFT trainer
(:func:`rstar_trainers.openrlhf.launch.chat_template`), a converted conversation renders to exactly the text an
RL rollout of the env has.

A row that cannot be converted (no assistant turn, a call whose arguments are not JSON, an unknown role) is
skipped and counted, never half-converted.

    python -m rstar_trainers.openrlhf.convert --config configs/sft.yaml in.jsonl data/sft/tool_calls.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from rstar_env.format import DEFAULT_SYSTEM_PROMPT, format_tool_call, render_system_prompt, render_tool_responses


class ConversionError(ValueError):
    """One row cannot be converted; the message says why."""


_SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "function_call": "function_call",
    "observation": "tool",
    "tool": "tool",
    "function": "tool",
}


def _arguments(value: Any) -> dict[str, Any]:
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ConversionError(f"tool-call arguments are not JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ConversionError(f"tool-call arguments must be an object, got {type(value).__name__}")
    return value


def _call(value: Any) -> tuple[str, dict[str, Any]]:
    """``(name, arguments)`` of an OpenAI ``tool_calls`` item, a ``function_call`` or a ShareGPT call object."""
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        value = value["function"]
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        raise ConversionError(f"a tool call without a name: {value!r}")
    return value["name"], _arguments(value.get("arguments", value.get("parameters")))


def _schemas(value: Any) -> list[dict[str, Any]] | None:
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ConversionError("the row's tools are not JSON") from None
    if not isinstance(value, list) or not all(isinstance(s, dict) for s in value):
        raise ConversionError("the row's tools must be a list of function schemas")
    return value


def _normalised(row: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The row as OpenAI-style messages (calls as ``("name", args)`` lists) and its tool schemas."""
    schemas = _schemas(row.get("tools"))
    messages: list[dict[str, Any]] = []
    if "messages" in row:
        for message in row["messages"]:
            role = message.get("role")
            calls = [_call(c) for c in message.get("tool_calls") or []]
            if message.get("function_call"):
                calls.append(_call(message["function_call"]))
            if role == "function":
                role = "tool"
            if role not in ("system", "user", "assistant", "tool"):
                raise ConversionError(f"unknown role {role!r}")
            messages.append({"role": role, "content": message.get("content") or "", "calls": calls})
    elif "conversations" in row:
        if row.get("system"):
            messages.append({"role": "system", "content": row["system"], "calls": []})
        for turn in row["conversations"]:
            role = _SHAREGPT_ROLES.get(turn.get("from"))
            if role is None:
                raise ConversionError(f"unknown conversation role {turn.get('from')!r}")
            value = turn.get("value") or ""
            if role == "function_call":
                try:
                    parsed = json.loads(value)
                except json.JSONDecodeError:
                    raise ConversionError("a function_call turn is not JSON") from None
                calls = [_call(c) for c in (parsed if isinstance(parsed, list) else [parsed])]
                if messages and messages[-1]["role"] == "assistant" and not messages[-1]["calls"]:
                    messages[-1]["calls"] = calls  # "gpt" text followed by its call: one assistant turn
                else:
                    messages.append({"role": "assistant", "content": "", "calls": calls})
            else:
                messages.append({"role": role, "content": value, "calls": []})
    else:
        raise ConversionError("a row needs `messages` (OpenAI) or `conversations` (ShareGPT)")
    return messages, schemas


def convert_row(
    row: dict[str, Any],
    *,
    tool_schemas: Sequence[dict[str, Any]] = (),
    system_prompt: str | None = None,
) -> dict[str, Any]:
    """One input row as ``{"messages": [...]}`` in our format (see the module docstring).

    ``tool_schemas`` and ``system_prompt`` are the run config's, used when the row has no tools / no system
    message of its own. Raises :class:`ConversionError` for a row that cannot be converted.
    """
    messages, row_schemas = _normalised(row)
    schemas = row_schemas if row_schemas is not None else list(tool_schemas)
    system = system_prompt or DEFAULT_SYSTEM_PROMPT
    if messages and messages[0]["role"] == "system":
        system = messages.pop(0)["content"] or system
    out: list[dict[str, str]] = [{"role": "system", "content": render_system_prompt(system, schemas)}]
    pending_tool: list[str] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            pending_tool.append(message["content"])
            continue
        if pending_tool:
            out.append({"role": "tool", "content": render_tool_responses(pending_tool)})
            pending_tool = []
        if role == "system":
            raise ConversionError("a system message after the conversation started")
        content = message["content"].strip() if role == "assistant" else message["content"]
        if role == "assistant" and message["calls"]:
            blocks = "\n".join(format_tool_call(name, args) for name, args in message["calls"])
            content = f"{content}\n{blocks}" if content else blocks
        out.append({"role": role, "content": content})
    if pending_tool:
        out.append({"role": "tool", "content": render_tool_responses(pending_tool)})
    if not any(m["role"] == "assistant" for m in out):
        raise ConversionError("no assistant turn to train on")
    if out[-1]["role"] != "assistant":  # nothing after the last assistant turn is trained on: drop it
        out = out[: max(i for i, m in enumerate(out) if m["role"] == "assistant") + 1]
    return {"messages": out}


def convert_rows(
    rows: Iterable[dict[str, Any]], *, tool_schemas: Sequence[dict[str, Any]] = (), system_prompt: str | None = None
) -> Iterator[dict[str, Any] | ConversionError]:
    """:func:`convert_row` over ``rows``, yielding the error in place of a row that cannot be converted."""
    for row in rows:
        try:
            yield convert_row(row, tool_schemas=tool_schemas, system_prompt=system_prompt)
        except ConversionError as exc:
            yield exc


def config_tools(config: str | Path | None) -> tuple[list[dict[str, Any]], str | None]:
    """The tool schemas and system prompt of a run config (defaults: the ``python`` tool, the built-in prompt)."""
    from rstar_env.config import load_config
    from rstar_env.plugins import load_tool

    run = load_config(config)
    schemas = [load_tool(spec.name, **spec.options).schema for spec in run.tools]
    return schemas, run.env.system_prompt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rstar_trainers.openrlhf.convert", description=(__doc__ or "").split("\n\n")[0]
    )
    parser.add_argument("input", type=Path, help="jsonl of OpenAI `messages` or ShareGPT `conversations` rows")
    parser.add_argument("output", type=Path, help="jsonl of {messages: [...]} in our tool-call format")
    parser.add_argument("--config", help="run config whose tools and system prompt rows without their own get")
    args = parser.parse_args(argv)
    schemas, system = config_tools(args.config)
    written, skipped = 0, Counter[str]()
    args.output.parent.mkdir(parents=True, exist_ok=True)
    with args.input.open(encoding="utf-8") as src, args.output.open("w", encoding="utf-8") as dst:
        rows = (json.loads(line) for line in src if line.strip())
        for result in convert_rows(rows, tool_schemas=schemas, system_prompt=system):
            if isinstance(result, ConversionError):
                skipped[str(result)] += 1
                continue
            dst.write(json.dumps(result, ensure_ascii=False) + "\n")
            written += 1
    print(f"wrote {written} conversations to {args.output}; skipped {sum(skipped.values())}", file=sys.stderr)
    for reason, count in skipped.most_common(5):
        print(f"  {count} x {reason}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
