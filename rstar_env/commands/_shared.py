"""What several commands share: option help that reads the same everywhere, and the policy set-up's errors as the
command's one-line error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from rstar_env._cli_util import fail

T = TypeVar("T")

ENDPOINT_HELP = (
    "OpenAI-compatible base URL (e.g. http://localhost:8000/v1); repeat for several engines, "
    "requests go to the one with the most free KV capacity."
)
CAPACITY_HELP = (
    "KV-cache tokens of each --endpoint (one value for all, or one per endpoint); default: read "
    "from its vLLM /metrics, else --engine-concurrency."
)


def or_fail(build: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``build(*args, **kwargs)``, its :class:`~rstar_env.rollout.choose.PolicySetupError` ended as the command's
    one-line error."""
    from rstar_env.rollout.choose import PolicySetupError

    try:
        return build(*args, **kwargs)
    except PolicySetupError as exc:
        fail(str(exc))
