"""What a command rolls out with: the engines (``--endpoint`` or the config's), the policy built on them (or on a
local model), and the sampling settings (a command-line value, else the config's trainer section).

Interface-free: a problem is a :class:`PolicySetupError` (a ``ValueError``) whose message names the flag or key
and the fix; the commands print it as their one-line error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rstar_env.config import EndpointSpec, RunConfig


class PolicySetupError(ValueError):
    """The flags or the config name no usable engine or policy; the message says which and how to fix it."""


def endpoint_specs(
    cfg: RunConfig | None, endpoints: tuple[str, ...], capacities: tuple[int, ...], concurrency: int | None
) -> list[EndpointSpec]:
    """The engines to use: ``--endpoint`` (with ``--engine-capacity``, ``--engine-concurrency``) or the config's."""
    if not endpoints:
        specs = list(cfg.inference.endpoints) if cfg is not None else []
        if capacities:
            raise PolicySetupError(
                "--engine-capacity goes with --endpoint (or set capacity_tokens in inference.endpoints)"
            )
    else:
        if capacities and len(capacities) not in (1, len(endpoints)):
            raise PolicySetupError(
                f"--engine-capacity: give one value for all endpoints or one per --endpoint "
                f"({len(endpoints)}), got {len(capacities)}"
            )
        specs = []
        for i, url in enumerate(endpoints):
            capacity = capacities[0] if len(capacities) == 1 else capacities[i] if capacities else None
            specs.append(EndpointSpec(url=url, capacity_tokens=capacity))
    if concurrency is not None:
        specs = [spec.model_copy(update={"max_concurrency": concurrency}) for spec in specs]
    return specs


def build_policy(
    model: str | None,
    endpoints: list[EndpointSpec],
    served_model: str | None,
    sampling: Any,
    batch_size: int,
    env: Any,
    native_tools: bool = True,
    engine: str = "transformers",
    token_ids: bool = False,
    note: Callable[[str], None] | None = None,
) -> Any:
    """The policy: the served model behind ``endpoints``, else the local ``model`` on ``engine`` (the config's
    ``policy.engine``; ``note`` receives what :func:`~rstar_env.rollout.vllm.choose_engine` says of its choice)."""
    if endpoints:
        from rstar_env.rollout.dispatch import endpoint_policy

        name = served_model or model
        if not name:
            raise PolicySetupError("--endpoint needs the served model's name: --served-model NAME")
        try:
            return endpoint_policy(
                env, endpoints, name, sampling=sampling, native_tools=native_tools, return_token_ids=token_ids
            )
        except ValueError as exc:
            raise PolicySetupError(str(exc)) from exc
    from rstar_env.rollout.local import ModelNotFoundError, TransformersPolicy
    from rstar_env.rollout.vllm import VLLMPolicy, choose_engine

    try:
        chosen, said = choose_engine(engine)
        if said and note is not None:
            note(said)
        if chosen == "vllm":
            return VLLMPolicy(model, sampling=sampling)
        return TransformersPolicy(model, sampling=sampling, batch_size=batch_size)
    except (ModelNotFoundError, ImportError) as exc:
        raise PolicySetupError(str(exc)) from exc


SAMPLING_KEYS: dict[str, tuple[str, ...]] = {
    "temperature": ("eval_temperature", "temperature"),
    "top_p": ("top_p",),
    "max_new_tokens": ("eval_max_new_tokens", "max_new_tokens", "max_new_tokens_per_turn"),
}
"""Where a config's trainer section keeps each sampling setting, first found wins: the held-out (``eval_``) value,
then the rollouts' (``max_new_tokens_per_turn`` is the OpenRLHF trainer's name)."""


def config_sampling(trainer: Mapping[str, Any] | Any, **given: float | int | None) -> dict[str, Any]:
    """The sampling settings: a value given on the command line, else the config's trainer section
    (:data:`SAMPLING_KEYS`), else :class:`~rstar_env.rollout.policy.SamplingParams`' default (left out)."""
    section = trainer if isinstance(trainer, Mapping) else trainer.model_dump()
    chosen: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            key = next((k for k in SAMPLING_KEYS[name] if section.get(k) is not None), None)
            if key is None:
                continue
            value = section[key]
            integer = name == "max_new_tokens"
            if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
                raise PolicySetupError(
                    f"trainer.{key} must be {'an integer' if integer else 'a number'}, got {value!r} (fix the "
                    f"config, or pass --{name.replace('_', '-')})"
                )
        chosen[name] = value
    return chosen


__all__ = ["SAMPLING_KEYS", "PolicySetupError", "build_policy", "config_sampling", "endpoint_specs"]
