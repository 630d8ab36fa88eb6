"""Write a model as a plain Hugging Face directory that an OpenAI-compatible server (``transformers serve``, vLLM)
can serve. For a GGUF model this is its dequantized copy (:func:`rstar_env.rollout.models.dequantized_copy`)::

    rstar-env export-model                       # -> ~/.cache/rstar-env/models/smollm2 (printed)
    transformers serve --port 8000               # then request the directory as the model name
    rstar-env eval --endpoint http://localhost:8000/v1 --served-model ~/.cache/rstar-env/models/smollm2 --text-tools
"""

from __future__ import annotations

import os
from pathlib import Path

from rstar_env.rollout.models import default_export_dir, ensure_copy, has_weights, load_model, resolve_model


def export_model(
    model: str | os.PathLike[str] | None = None, out: str | os.PathLike[str] | None = None, *, overwrite: bool = False
) -> Path:
    """Write ``model`` (default: SmolLM2-135M-Instruct) to ``out`` as a Hugging Face directory; return ``out``.

    Without ``out``, a GGUF model's directory is its dequantized copy (see
    :func:`~rstar_env.rollout.models.dequantized_copy`). An existing export (a directory with ``config.json`` and
    weights; for a GGUF copy, of the same source) is kept unless ``overwrite``.
    """
    folder, gguf = resolve_model(model)
    if out is None and gguf is not None:
        return ensure_copy(folder, gguf, default_export_dir(model), overwrite=overwrite)
    target = Path(out).expanduser() if out is not None else default_export_dir(model)
    if not overwrite and has_weights(target):
        return target
    loaded, tokenizer = load_model(model, cache=False)
    target.mkdir(parents=True, exist_ok=True)
    loaded.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


__all__ = ["default_export_dir", "export_model"]
