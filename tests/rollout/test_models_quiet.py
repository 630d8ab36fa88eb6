"""A first run writes the GGUF model's dequantized copy without drawing transformers' "Writing model shards" bar
in the user's terminal (seen in the main job's output before the SFT table)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")

from rstar_env.rollout import models


def test_the_dequantized_copy_is_written_without_a_library_bar(tmp_path, monkeypatch, capfd, tiny_llama):
    monkeypatch.setenv("RSTAR_ENV_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "src" / "tiny.Q4_1.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF stand-in")
    monkeypatch.setattr(models, "load_pretrained", lambda folder, name, **kwargs: tiny_llama)
    capfd.readouterr()
    copy = models.ensure_copy(gguf.parent, gguf.name, Path(tmp_path / "cache" / "models" / "tiny"), overwrite=False)
    out, err = capfd.readouterr()
    assert (copy / "config.json").is_file()
    assert "Writing model shards" not in out + err, err
