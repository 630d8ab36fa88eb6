"""The tool contract: what a tool plugin is, what it is told about the episode, and argument checking.

A tool plugin is a class with a ``name``, an OpenAI function ``schema`` and ``call(arguments, episode) ->
ToolResult``, plus, optionally, ``close(episode)``. One tool instance serves many episodes (a vector env shares it),
so per-episode state is keyed by ``episode.episode_id`` (or kept in ``episode.state``), and ``close(episode)`` is
where it is released. ``call`` and ``close`` may be ``async def`` (run on the event loop every env of the process
shares: they must never block it) or plain ``def`` (run in a thread, for blocking or CPU-bound work).

Raising from ``call`` is allowed but discouraged: the environment turns an exception into a ``crash`` tool
result, so a buggy plugin cannot end an episode. Every call runs under the env's ``tool_timeout_s``; a tool may ask
for less with a ``call_timeout_s`` attribute. Past it the call is cancelled and answered with a ``timeout`` error.
The ``schema`` is checked when the tool is built (:func:`schema_problem`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from rstar_env.trajectory import ToolResult


@dataclass
class EpisodeContext:
    """What a tool may know about the episode that calls it."""

    episode_id: str
    problem: str = ""
    answer: str = ""
    turn: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    """Scratch space for plugins; dropped when the episode ends."""


@runtime_checkable
class Tool(Protocol):
    """A tool plugin. ``call`` is ``async def`` or plain ``def`` (run in a thread). Optional: ``close(episode)``
    (per-episode cleanup, also either kind), ``call_timeout_s`` (a lower time limit than the env's),
    ``options_model`` (see :mod:`rstar_env.plugin`) and ``async def aclose()`` (release what the instance holds
    when the env that built it closes)."""

    name: ClassVar[str] | str
    schema: dict[str, Any]

    def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> Awaitable[ToolResult] | ToolResult: ...


def function_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI function-tool schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def validate_arguments(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """Check ``arguments`` against a function schema's parameters; return what is wrong, or ``None``.

    Covers what models get wrong in practice: missing required fields, unknown fields (when the schema says
    ``additionalProperties: false``) and wrong JSON types. It is not a full JSON-Schema validator.
    """
    params = schema.get("function", schema).get("parameters", {})
    properties: dict[str, Any] = params.get("properties", {})
    missing = [key for key in params.get("required", []) if key not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    if params.get("additionalProperties") is False:
        unknown = sorted(set(arguments) - set(properties))
        if unknown:
            return f"unknown argument(s): {', '.join(unknown)}; expected {', '.join(properties)}"
    for key, value in arguments.items():
        expected = properties.get(key, {}).get("type")
        if expected is None:
            continue
        kinds = expected if isinstance(expected, list) else [expected]
        ok = any(
            isinstance(value, _JSON_TYPES.get(kind, (object,)))
            and not (kind in ("integer", "number") and isinstance(value, bool))
            for kind in kinds
        )
        if not ok:
            return f"argument {key!r} must be of type {' or '.join(kinds)}, got {type(value).__name__}"
    return None


def schema_problem(schema: Any, name: Any) -> str | None:
    """What is wrong with tool ``name``'s ``schema`` as an OpenAI function tool, or ``None`` when it is valid.

    Checked: the ``{"type": "function", "function": {...}}`` shape, the function's ``name`` equal to the plugin's,
    ``parameters`` a JSON Schema object (``type: object``, ``properties`` a mapping of schemas), every ``required``
    name a property, and the whole schema JSON-serialisable (it is shown to the model).
    """
    if not isinstance(schema, dict):
        return (f"schema must be a dict (an OpenAI function tool, e.g. from rstar_env.tool.function_schema), "
                f"got {type(schema).__name__}")
    if schema.get("type") != "function":
        return f"schema['type'] must be 'function', got {schema.get('type')!r}"
    function = schema.get("function")
    if not isinstance(function, dict):
        return "schema has no 'function' mapping (the OpenAI shape is {'type': 'function', 'function': {...}})"
    if function.get("name") != name:
        return f"schema['function']['name'] is {function.get('name')!r}, but the plugin's name is {name!r}"
    if not isinstance(function.get("description", ""), str):
        return "schema['function']['description'] must be a string"
    params = function.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        return "schema['function']['parameters'] must be a JSON Schema object ({'type': 'object', 'properties': ...})"
    properties = params.get("properties", {})
    if not isinstance(properties, dict) or not all(isinstance(p, dict) for p in properties.values()):
        return "schema['function']['parameters']['properties'] must map each argument name to a JSON Schema (dict)"
    required = params.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        return "schema['function']['parameters']['required'] must be a list of argument names"
    missing = [r for r in required if r not in properties]
    if missing:
        return f"required argument(s) {', '.join(map(repr, missing))} are not among the properties {list(properties)}"
    try:
        json.dumps(schema)
    except (TypeError, ValueError) as exc:
        return f"schema is not JSON-serialisable ({exc})"
    return None
