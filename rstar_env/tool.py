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

A failure of the system, not of the model's call (the sandbox had no room before its queue deadline, its pool died),
is raised as :class:`ToolUnavailable`: the env then ends the episode ``env_error``, unscored, and the model never
reads it nor is charged a tool error for it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

from pydantic import BaseModel

from rstar_env.trajectory import ToolResult


class ToolUnavailable(RuntimeError):
    """Raised by a tool's ``call`` when the system, not the model, failed the call: the sandbox had no room for it
    before its queue deadline, the sandbox's pool died under it, the backend cannot start. The env ends the episode
    ``env_error``, unscored, with this message in ``Trajectory.error``: it is never the model's tool response, and
    never counted as its tool error (trainers leave ``env_error`` episodes out)."""


@dataclass
class EpisodeContext:
    """What a tool may know about the episode that calls it."""

    episode_id: str
    problem: str = ""
    answer: str = ""
    turn: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    """Scratch space for plugins; dropped when the episode ends."""
    client: str | None = None
    """Whose episode it is (``MathToolEnv.client``, set by a server per client): a tool on a shared pool queues its
    calls under it, so clients are served in turn. None: the one default client."""


@runtime_checkable
class Tool(Protocol):
    """A tool plugin. ``call`` is ``async def`` or plain ``def`` (run in a thread).

    Optional members (not part of this protocol's ``isinstance`` check):

    - ``close(episode) -> None``, ``async def`` or plain ``def``: release what the tool kept for one episode.
      Called once per episode, for every tool of the env, when the episode ends or the env is reset or closed
      before it ends; under the tool's time limit. What it raises is logged as a warning and otherwise ignored.

      Args:
          episode: the :class:`EpisodeContext` of the episode that ended (the one ``call`` was given).

    - ``call_timeout_s: float``: a lower time limit than the env's ``tool_timeout_s`` (a tool can only lower it).
    - ``options_model``: a pydantic model (or dataclass) of the constructor's options, checked when a config loads
      (see :mod:`rstar_env.plugins`).
    - ``async def aclose() -> None``: release what the instance holds (a pool, a client) when the env that built it
      closes.
    """

    name: ClassVar[str] | str
    """The name the model calls the tool by and configs name it by; equal to the schema's function name."""
    schema: dict[str, Any]
    """The OpenAI function schema shown to the model (:func:`tool_schema` derives it from an arguments model)."""

    def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> Awaitable[ToolResult] | ToolResult:
        """Run one tool call of the model.

        Runs under the env's ``tool_timeout_s`` (or the tool's lower ``call_timeout_s``): past it the call is
        cancelled (a plain ``def`` keeps its thread until it returns) and answered with a ``timeout`` error.

        Args:
            arguments: the call's arguments, already checked against ``schema`` (required fields present, JSON
                types right; unknown keys refused when the schema says ``additionalProperties: false``).
            episode: the episode that makes the call; key per-episode state by ``episode.episode_id`` or keep it
                in ``episode.state``: one instance serves many episodes at once.

        Returns:
            A :class:`ToolResult`: ``text`` is what the model reads; ``error`` is ``None`` on success, or the kind
            of failure (``exception`` for a call the tool refuses, ``timeout``, ``crash``, ``output_limit``).
            Tool errors are counted from ``error``, never from the text.

        Raises:
            :class:`ToolUnavailable` for a failure of the system (the episode ends ``env_error``, unscored).
            Nothing else, ideally: another exception is caught by the env and answered as a ``crash`` tool result,
            so a bug in a tool never ends the episode; return ``ToolResult("Error: ...", "exception")`` for the
            model's mistakes.
        """
        ...


def function_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """An OpenAI function-tool schema from JSON Schema ``properties`` written by hand (see :func:`tool_schema` to
    derive them from an arguments model)."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def tool_schema(name: str, description: str, arguments: type[BaseModel]) -> dict[str, Any]:
    """The OpenAI function-tool schema of a tool whose arguments are the fields of the pydantic model ``arguments``.

    Written in the class body, after ``name``, the tool's name is written once::

        class Arguments(BaseModel):
            expression: str = Field(description="e.g. (3 + 4) * 2")

        class Calculator:
            name = "calculator"
            schema = tool_schema(name, "Evaluate an arithmetic expression.", Arguments)

    A field without a default is a required argument. The schema is what the model reads in its system prompt, so
    it is kept to what the model needs: pydantic's ``title`` and ``default`` are left out (an omitted optional
    argument gets its default from the tool), ``type`` and ``description`` come first, and ``X | None`` reads as
    ``"type": ["x", "null"]``. ``extra="forbid"`` on the model becomes ``additionalProperties: false``, which the
    env enforces (:func:`validate_arguments`).

    Args:
        name: the tool's name, as the model calls it (the plugin's ``name``).
        description: what the tool does, for the model.
        arguments: a pydantic model, one field per argument.

    Returns:
        ``{"type": "function", "function": {"name", "description", "parameters"}}``, as :func:`function_schema`.
    """
    generated = arguments.model_json_schema()
    parameters: dict[str, Any] = {
        "type": "object",
        "properties": {key: _tidy(value) for key, value in generated.get("properties", {}).items()},
        "required": list(generated.get("required", [])),
    }
    if "additionalProperties" in generated:
        parameters["additionalProperties"] = _tidy(generated["additionalProperties"])
    if "$defs" in generated:  # nested models, referenced from the properties
        parameters["$defs"] = {key: _tidy(value) for key, value in generated["$defs"].items()}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


# JSON Schema keywords whose value is a schema, a list of schemas, or a mapping of names to schemas.
_SUBSCHEMA = ("items", "additionalProperties", "not")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "$defs", "patternProperties")


def _tidy(schema: Any) -> Any:
    """A pydantic-generated JSON Schema as a model should read it (see :func:`tool_schema`)."""
    if not isinstance(schema, dict):
        return schema
    alternatives = schema.get("anyOf")
    if (
        isinstance(alternatives, list)
        and alternatives
        and all(isinstance(a, dict) and set(a) == {"type"} and isinstance(a["type"], str) for a in alternatives)
    ):  # int | None -> {"type": ["integer", "null"]}
        schema = {"type": [a["type"] for a in alternatives], **{k: v for k, v in schema.items() if k != "anyOf"}}
    tidy: dict[str, Any] = {key: schema[key] for key in ("type", "description") if key in schema}
    for key, value in schema.items():
        if key in tidy or key in ("title", "default"):
            continue
        if key in _SUBSCHEMA:
            tidy[key] = _tidy(value)
        elif key in _SUBSCHEMA_LISTS and isinstance(value, list):
            tidy[key] = [_tidy(v) for v in value]
        elif key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            tidy[key] = {k: _tidy(v) for k, v in value.items()}
        else:
            tidy[key] = value
    return tidy


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
        return (
            f"schema must be a dict (an OpenAI function tool, e.g. from rstar_env.tool.function_schema), "
            f"got {type(schema).__name__}"
        )
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
