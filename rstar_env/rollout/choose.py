"""What a command rolls out with: the engines (``--endpoint`` or the config's), and the policy built on them (or on a
local model). The sampling settings come from the config's typed trainer section
(:meth:`rstar_env.config.TrainerSection.sampling`).

Interface-free: a problem is a :class:`PolicySetupError` (a ``ValueError``) whose message names the flag or key
and the fix; the commands print it as their one-line error.
"""

from __future__ import annotations

from collections.abc import Callable
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


__all__ = ["PolicySetupError", "build_policy", "endpoint_specs"]
