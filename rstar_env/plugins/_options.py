"""A plugin's options, declared once: pydantic models built from an ``options_model``, a dataclass plugin's fields
or a constructor's signature, and the validation that names each bad option."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import types
import typing
import weakref
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model

from ._errors import OptionsError, PluginError

M = TypeVar("M")


def model_fields(model: Any, label: str) -> list[str]:
    """The fields of an ``options_model`` (a pydantic model or a dataclass), or :class:`PluginError`."""
    if inspect.isclass(model) and issubclass(model, BaseModel):
        return list(model.model_fields)
    if inspect.isclass(model) and dataclasses.is_dataclass(model):
        return [f.name for f in dataclasses.fields(model) if f.init]
    raise PluginError(f"{label}: options_model must be a pydantic BaseModel subclass or a dataclass, got {model!r}")


def validate(model: Any, fields: list[str], options: dict[str, Any], label: str) -> Any:
    """``options`` validated by ``model``: :class:`PluginError` for an unknown key, :class:`OptionsError` for a bad
    value."""
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise PluginError(
            f"{label} has no option(s) {', '.join(map(repr, unknown))}; its options are: {', '.join(fields) or 'none'}"
        )
    return validated(model, options, f"{label} rejects its options")


def validated(model: Any, options: Mapping[str, Any], prefix: str) -> Any:
    """``options`` validated by ``model`` (a pydantic model or a dataclass), or :class:`OptionsError`."""
    try:
        if issubclass(model, BaseModel):
            return model.model_validate(options)
        return TypeAdapter(model).validate_python(options)
    except ValidationError as exc:
        raise OptionsError(prefix, _problems(exc)) from None


def _problems(exc: ValidationError) -> list[tuple[str, str]]:
    """``(option, message)`` for each error of ``exc``, the message with the value it got."""
    problems = []
    for error in exc.errors():
        got = "" if error["type"] == "missing" else f" (got {_short(repr(error.get('input')))})"
        # A validator's own ValueError says it all; pydantic would prefix it with "Value error, ".
        message = str(error["ctx"]["error"]) if error["type"] == "value_error" else error["msg"]
        problems.append((".".join(str(p) for p in error["loc"]), f"{message}{got}"))
    return problems


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def dataclass_model(cls: type) -> type[BaseModel]:
    """A pydantic model of a dataclass plugin's init fields, to validate its options without building it."""
    hints = typing.get_type_hints(cls)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            fields[f.name] = (hints.get(f.name, Any), f.default)
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name] = (hints.get(f.name, Any), Field(default_factory=f.default_factory))
        else:
            fields[f.name] = (hints.get(f.name, Any), ...)
    return create_model(f"{cls.__name__}Options", __config__={"arbitrary_types_allowed": True}, **fields)


# Per plugin class: the model of its constructor's keyword parameters and, per field, the parameter it stands for.
_SIGNATURE_MODELS: weakref.WeakKeyDictionary[type, tuple[type[BaseModel], dict[str, str]]] = weakref.WeakKeyDictionary()


def validate_signature(cls: type, options: dict[str, Any], label: str) -> dict[str, Any]:
    """``options`` (already bound to ``cls``'s signature) validated by the constructor's type annotations and
    converted as pydantic's ``validate_call`` would; keys that only ``**kwargs`` takes pass unchanged."""
    built = _signature_model(cls)
    if built is None:
        return options
    model, params = built
    checked = validated(model, options, f"{label} rejects its options")
    out = dict(options)
    for field, param in params.items():
        if param in options:
            out[param] = getattr(checked, field)
    return out


def _signature_model(cls: type) -> tuple[type[BaseModel], dict[str, str]] | None:
    """A pydantic model of the keyword parameters of ``cls``'s constructor, as ``validate_call`` builds one: an
    annotated parameter is validated by its type, an unannotated one (or one whose annotation pydantic cannot
    check, or that does not resolve) is ``Any``; ``**kwargs`` allows extra keys. Fields are named ``p0``, ``p1``,
    ... with the parameter's name as alias, so a parameter may be called ``schema`` or ``model_config``."""
    with contextlib.suppress(TypeError):  # an unhashable or non-weakref-able class: just rebuild it
        if cls in _SIGNATURE_MODELS:
            return _SIGNATURE_MODELS[cls]
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a builtin without a signature: binding already said what it could
        return None
    init = getattr(cls, "__init__", None)
    namespace = getattr(init, "__globals__", {})
    fields: dict[str, Any] = {}
    params: dict[str, str] = {}
    extra: Literal["allow", "forbid"] = "forbid"
    for param in signature.parameters.values():
        if param.kind is param.VAR_KEYWORD:
            extra = "allow"
            continue
        if param.kind in (param.VAR_POSITIONAL, param.POSITIONAL_ONLY):  # never given by a config's keys
            continue
        field = f"p{len(params)}"
        default = ... if param.default is param.empty else param.default
        fields[field] = (_checkable(param.annotation, namespace), Field(default, alias=param.name))
        params[field] = param.name
    config = ConfigDict(arbitrary_types_allowed=True, extra=extra)
    model = create_model(f"{cls.__name__}Options", __config__=config, **fields)
    with contextlib.suppress(TypeError):
        _SIGNATURE_MODELS[cls] = (model, params)
    return model, params


def _checkable(annotation: Any, namespace: dict[str, Any]) -> Any:
    """``annotation`` resolved (a string under ``from __future__ import annotations``), or ``Any`` when it is
    absent, does not resolve, or is a type pydantic cannot validate (a plain ``Protocol``, say)."""
    if annotation is inspect.Parameter.empty:
        return Any
    if isinstance(annotation, str):
        holder = types.SimpleNamespace(__annotations__={"value": annotation})
        try:
            annotation = typing.get_type_hints(holder, globalns=namespace, include_extras=True)["value"]
        except Exception:  # a name only imported under TYPE_CHECKING, a typo: not ours to fail on
            return Any
    try:
        create_model("_Probe", __config__=ConfigDict(arbitrary_types_allowed=True), value=(annotation, ...))
    except Exception:
        return Any
    return annotation


def has_init(cls: type) -> bool:
    return any("__init__" in vars(base) for base in cls.__mro__ if base is not object)


def takes_options_object(cls: type, fields: list[str]) -> bool:
    """Whether ``cls`` is built with the validated options model (``cls(options=...)``) rather than its fields."""
    if not has_init(cls):
        return True
    params = inspect.signature(cls).parameters
    return "options" in params and "options" not in fields


def plugin_options(model: type[M], options: M | Mapping[str, Any] | None = None, settings: Mapping[str, Any] = {}) -> M:
    """The validated options of a constructor that takes its ``options_model`` or keywords, or both::

        def __init__(self, options: MyOptions | None = None, **settings: Any) -> None:
            self.options = plugin_options(MyOptions, options, settings)

    so ``load_tool("my_tool", timeout_s=2)`` (the registry passes the model it validated, which is returned as is)
    and ``MyTool(timeout_s=2)`` both work, with the constraints declared once, in the model. ``settings`` override
    ``options``. Raises ``TypeError`` for a key that is no option, :class:`OptionsError` (a ``ValueError``) for bad
    values, naming each option.
    """
    fields = model_fields(model, model.__name__)
    if isinstance(options, model) and not settings:
        return options
    if options is None:
        given: dict[str, Any] = {}
    elif isinstance(options, model):
        given = {field: getattr(options, field) for field in fields}
    elif isinstance(options, Mapping):
        given = dict(options)
    else:
        raise TypeError(f"options must be a {model.__name__}, a mapping or None, got {type(options).__name__}")
    given.update(settings)
    unknown = sorted(set(given) - set(fields))
    if unknown:
        raise TypeError(f"{', '.join(map(repr, unknown))}: no such option; the options are {', '.join(fields)}")
    return typing.cast(M, validated(model, given, f"invalid {model.__name__}"))
