"""A model as a plain Hugging Face directory: what servers read, and the dequantized copy of a GGUF model.

The default model is a GGUF file; ``transformers serve`` (and vLLM) want a model directory. Loading the GGUF with
transformers (``gguf_file=``) dequantizes it, which takes 30-40 s for SmolLM2-135M on 2 cores; ``save_pretrained``
then writes float32 safetensors, config and tokenizer, which load in about a second. So a GGUF model is dequantized
once per machine: :func:`dequantized_copy` writes the copy on first use (``load_model`` calls it) and keeps it with
a stamp of its source (path, size, modification time, transformers version); a changed source is copied again::

    rstar-env export-model                       # -> ~/.cache/rstar-env/models/smollm2 (printed)
    transformers serve --port 8000               # then request the directory as the model name
    rstar-env eval --endpoint http://localhost:8000/v1 --served-model ~/.cache/rstar-env/models/smollm2 --text-tools
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rstar_env.rollout.local import DEFAULT_MODEL, load_model, load_pretrained, resolve_model

log = logging.getLogger(__name__)

SOURCE_STAMP = "rstar-env-source.json"
"""The file in a dequantized copy that names the GGUF it was made from."""


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


def dequantized_copy(model: str | os.PathLike[str] | None = None) -> Path | None:
    """The Hugging Face directory holding GGUF ``model`` dequantized (written now if missing or stale), or ``None``
    when ``model`` is not a GGUF file or the copy cannot be written (logged: the caller loads the GGUF itself)."""
    folder, gguf = resolve_model(model)
    if gguf is None:
        return None
    target = default_export_dir(model)
    try:
        return _ensure_copy(folder, gguf, target, overwrite=False)
    except OSError as exc:
        log.warning(
            "could not keep a dequantized copy of %s in %s (%s): the GGUF file is dequantized on every load "
            "(30-40 s for SmolLM2 on 2 cores); point RSTAR_ENV_CACHE at a writable directory to fix it",
            folder / gguf,
            target,
            exc,
        )
        return None


def export_model(
    model: str | os.PathLike[str] | None = None, out: str | os.PathLike[str] | None = None, *, overwrite: bool = False
) -> Path:
    """Write ``model`` (default: SmolLM2-135M-Instruct) to ``out`` as a Hugging Face directory; return ``out``.

    Without ``out``, a GGUF model's directory is its dequantized copy (see :func:`dequantized_copy`). An existing
    export (a directory with ``config.json`` and weights; for a GGUF copy, of the same source) is kept unless
    ``overwrite``.
    """
    folder, gguf = resolve_model(model)
    if out is None and gguf is not None:
        return _ensure_copy(folder, gguf, default_export_dir(model), overwrite=overwrite)
    target = Path(out).expanduser() if out is not None else default_export_dir(model)
    if not overwrite and _has_weights(target):
        return target
    loaded, tokenizer = load_model(model, cache=False)
    target.mkdir(parents=True, exist_ok=True)
    loaded.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return target


def _has_weights(folder: Path) -> bool:
    return (folder / "config.json").is_file() and any(folder.glob("*.safetensors"))


def _stamp(folder: Path, gguf: str) -> dict[str, Any]:
    import transformers

    source = (folder / gguf).resolve()
    stat = source.stat()
    return {
        "gguf": str(source),
        "size": stat.st_size,
        "mtime_ns": stat.st_mtime_ns,
        "transformers": transformers.__version__,
    }


def _is_copy_of(target: Path, stamp: dict[str, Any]) -> bool:
    try:
        return _has_weights(target) and json.loads((target / SOURCE_STAMP).read_text()) == stamp
    except (OSError, ValueError):
        return False


def _ensure_copy(folder: Path, gguf: str, target: Path, *, overwrite: bool) -> Path:
    stamp = _stamp(folder, gguf)
    if not overwrite and _is_copy_of(target, stamp):
        return target
    # Written beside the target and renamed into place: a reader never sees half a copy, and two processes that
    # write at once each finish a whole one. The folder first: an unwritable cache fails before the slow load.
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        log.info("dequantizing %s once into %s (later loads read that)", folder / gguf, target)
        model, tokenizer = load_pretrained(folder, gguf)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / SOURCE_STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
        staging.chmod(0o755)
        _replace(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _replace(staging: Path, target: Path) -> None:
    if target.exists():
        retired = target.with_name(f".{target.name}-old-{os.getpid()}")
        try:
            target.rename(retired)
        except FileNotFoundError:  # another writer moved it first
            pass
        else:
            shutil.rmtree(retired, ignore_errors=True)
    try:
        staging.rename(target)
    except OSError:
        if not _has_weights(target):  # not a concurrent writer's finished copy: a real failure
            raise
