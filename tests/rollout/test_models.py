"""A GGUF model is dequantized once per machine: ``load_model`` keeps its copy as a Hugging Face directory and
loads that afterwards (``rstar_env.rollout.models.dequantized_copy``)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from rstar_env.rollout import export, models  # noqa: E402
from rstar_env.rollout.models import load_model  # noqa: E402


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch, tiny_llama):
    """A .gguf file whose "dequantization" returns the tiny Llama (counted), with the cache in a folder of its own."""
    monkeypatch.setenv("RSTAR_ENV_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "src" / "tiny.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF stand-in")
    calls = []
    real = models.load_pretrained

    def dequantize(folder: Path, name: str | None, **kwargs):
        if name is None:  # a Hugging Face directory: the real loader
            return real(folder, name, **kwargs)
        calls.append((folder, name))
        return tiny_llama

    monkeypatch.setattr(models, "load_pretrained", dequantize)
    return gguf, calls


def _same_weights(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_the_first_load_writes_the_copy_and_later_loads_read_it(fake_gguf, tiny_llama):
    gguf, calls = fake_gguf
    model, tokenizer = load_model(gguf, cache=False)
    copy = Path(os.environ["RSTAR_ENV_CACHE"]) / "models" / "tiny.Q4_1"
    assert len(calls) == 1 and model.name_or_path == str(copy)
    assert _same_weights(model, tiny_llama[0]) and model is not tiny_llama[0]
    assert tokenizer.encode("What is 3 + 4?") == tiny_llama[1].encode("What is 3 + 4?")
    stamp = json.loads((copy / models.SOURCE_STAMP).read_text())
    assert stamp["gguf"] == str(gguf.resolve()) and stamp["size"] == gguf.stat().st_size
    assert [p.name for p in copy.parent.iterdir()] == [copy.name]  # no staging folder left behind

    again, _ = load_model(gguf, cache=False)
    assert len(calls) == 1 and _same_weights(again, tiny_llama[0])
    assert export.export_model(gguf) == copy and len(calls) == 1  # `rstar-env export-model` reuses it


def test_a_changed_source_or_a_damaged_copy_is_written_again(fake_gguf):
    gguf, calls = fake_gguf
    load_model(gguf, cache=False)
    stat = gguf.stat()
    os.utime(gguf, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a new file in its place
    load_model(gguf, cache=False)
    assert len(calls) == 2
    copy = models.default_export_dir(gguf)
    for weights in copy.glob("*.safetensors"):
        weights.unlink()  # a copy cut short by hand
    load_model(gguf, cache=False)
    assert len(calls) == 3 and any(copy.glob("*.safetensors"))
    export.export_model(gguf, overwrite=True)
    assert len(calls) == 4


def test_an_unwritable_cache_warns_and_the_gguf_is_loaded_directly(fake_gguf, caplog, tiny_llama):
    gguf, calls = fake_gguf
    blocker = Path(os.environ["RSTAR_ENV_CACHE"])
    blocker.write_text("a file where the cache folder should be")
    with caplog.at_level(logging.WARNING, logger="rstar_env.rollout.models"):
        model, _ = load_model(gguf, cache=False)
    assert model is tiny_llama[0] and [name for _, name in calls] == [gguf.name]  # dequantized once, not twice
    (warning,) = [r.getMessage() for r in caplog.records]
    assert str(gguf) in warning and "RSTAR_ENV_CACHE" in warning


def test_a_model_directory_is_loaded_where_it_is(tmp_path, monkeypatch, tiny_llama):
    monkeypatch.setenv("RSTAR_ENV_CACHE", str(tmp_path / "cache"))
    model, tokenizer = tiny_llama
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    loaded, _ = load_model(tmp_path / "m", cache=False)
    assert loaded.name_or_path == str(tmp_path / "m") and not (tmp_path / "cache").exists()


@pytest.mark.slow
def test_the_copy_of_the_default_model_is_the_gguf_dequantized(smollm2):
    """The session's SmolLM2 (read from the machine's copy once one exists) against a fresh dequantization."""
    folder, gguf = models.resolve_model("smollm2")
    assert gguf is not None
    copied, copied_tokenizer = smollm2
    assert Path(copied.name_or_path) == models.default_export_dir("smollm2")
    direct, direct_tokenizer = models.load_pretrained(folder, gguf)
    assert _same_weights(copied, direct)
    text = '<|im_start|>user\nWhat is 3+4? <tool_call>{"name": "python"}</tool_call> 你好<|im_end|>'
    assert copied_tokenizer.encode(text) == direct_tokenizer.encode(text)
    assert copied_tokenizer.chat_template == direct_tokenizer.chat_template
    assert copied.generation_config.to_dict() == direct.generation_config.to_dict()
