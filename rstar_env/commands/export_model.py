"""``rstar-env export-model``: a model written as a Hugging Face directory an engine can serve."""

from __future__ import annotations

import click

from rstar_env._cli_util import fail


@click.command("export-model")
@click.option("--model", default=None, help="'smollm2' (default), a model directory or a .gguf file.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default=None,
    help="Directory to write (default: ~/.cache/rstar-env/models/NAME, or $RSTAR_ENV_CACHE/models/NAME).",
)
@click.option("--overwrite", is_flag=True, help="Write again even if the directory holds an export.")
def export_model_command(model: str | None, out: str | None, overwrite: bool) -> None:
    """Write a model as a Hugging Face directory that `transformers serve` or vLLM can serve; prints its path."""
    from rstar_env.rollout.local import ModelNotFoundError

    try:
        from rstar_env.rollout.export import export_model

        path = export_model(model, out, overwrite=overwrite)
    except (ModelNotFoundError, ImportError, OSError) as exc:
        fail(str(exc))
    click.echo(str(path))


command = export_model_command
