"""Benchmarks behind `rstar-env bench ...`: each module exposes a click command named for its target."""

from collections.abc import Collection


def require_vllm(engines: Collection[str]) -> None:
    """A clear error, before any work, when ``engines`` names vLLM and it is not installed."""
    import click

    if "vllm" not in engines:
        return
    from rstar_env.rollout.vllm import VLLM_INSTALL_HINT, vllm_available

    if not vllm_available():
        raise click.ClickException(f"vLLM is not installed: {VLLM_INSTALL_HINT} (or leave it out: --engine)")
