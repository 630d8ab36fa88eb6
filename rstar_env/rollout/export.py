"""Write a model as a plain Hugging Face directory that an OpenAI-compatible server can serve.

The default model is a GGUF file; ``transformers serve`` (and vLLM) want a model directory. Loading the GGUF with
transformers (``gguf_file=``) dequantizes it; :func:`~rstar_env.rollout.local.load_model` drops the GGUF
quantization config, and ``save_pretrained`` writes safetensors weights, config and tokenizer::

    rstar-env export-model                       # -> ~/.cache/rstar-env/models/smollm2 (printed)
    transformers serve --port 8000               # then request the directory as the model name
    rstar-env eval --endpoint http://localhost:8000/v1 --served-model ~/.cache/rstar-env/models/smollm2 --text-tools
"""

from __future__ import annotations

import os
from pathlib import Path

from rstar_env.rollout.local import DEFAULT_MODEL, load_model, resolve_model


def default_export_dir(model: str | os.PathLike[str] | None = None) -> Path:
    """``$RSTAR_ENV_CACHE`` (default ``~/.cache/rstar-env``) ``/models/<name>``: outside any repository."""
    root = Path(os.environ.get("RSTAR_ENV_CACHE") or Path.home() / ".cache" / "rstar-env")
    folder, gguf = resolve_model(model)
    name = (
        DEFAULT_MODEL
        if model is None or str(model).lower().startswith("smollm2")
        else (Path(gguf).stem if gguf else folder.name)
    )
    return root / "models" / name


def export_model(
    model: str | os.PathLike[str] | None = None, out: str | os.PathLike[str] | None = None, *, overwrite: bool = False
) -> Path:
    """Write ``model`` (default: SmolLM2-135M-Instruct) to ``out`` as a Hugging Face directory; return ``out``.

    An existing export (a directory with ``config.json`` and weights) is kept unless ``overwrite``.
    """
    target = Path(out).expanduser() if out is not None else default_export_dir(model)
    if not overwrite and (target / "config.json").is_file() and any(target.glob("*.safetensors")):
        return target
    loaded, tokenizer = load_model(model, cache=False)
    target.mkdir(parents=True, exist_ok=True)
    loaded.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target
