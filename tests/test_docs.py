"""Every Python example in README.md and docs/*.md runs as written.

Each ```` ```python ```` block runs in a fresh interpreter (a subprocess, from the repository root), as a reader
pasting it would run it; the examples package must be installed (``pip install -e examples``, as CI does), since
some examples use its plugins. A block that defines ``test_*`` functions is run by pytest (with the
``rstar_env.testing`` plugin, installed with the package, and its ``math_env`` fixture); every test must pass.

An HTML comment on the line above a block changes what happens to it, visibly in the document's source:

- ``<!-- docs-test: skip (reason) -->``: not run (say why; use sparingly, e.g. a paid cloud account);
- ``<!-- docs-test: continue -->``: runs after the block before it, in the same interpreter (a documented chain);
- ``<!-- docs-test: slow (reason) -->``: runs only in the ``slow`` test (it loads the real model).
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.DOTALL | re.MULTILINE)
_MARKER = re.compile(r"<!--\s*docs-test:\s*(skip|continue|slow)\b\s*(?:\((.*?)\))?\s*-->")
_TIMEOUT_S = 300


@dataclass
class Block:
    document: Path
    line: int
    code: str
    marker: str | None
    reason: str

    @property
    def name(self) -> str:
        return f"{self.document.name}:{self.line}"


def blocks(document: Path) -> list[Block]:
    """The Python blocks of a document with their markers; a chained block carries the code before it."""
    text = document.read_text(encoding="utf-8")
    found: list[Block] = []
    for match in _FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        above = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = _MARKER.search(above)
        kind, reason = (marker.group(1), marker.group(2) or "") if marker else (None, "")
        if kind in ("skip", "slow") and not reason.strip():
            raise AssertionError(f"{document.name}:{line}: a docs-test {kind} marker needs a reason: ({kind} (why))")
        code = match.group(1)
        if kind == "continue":
            if not found:
                raise AssertionError(f"{document.name}:{line}: 'continue' on the first block: nothing to continue")
            previous = found[-1]
            code = previous.code + "\n" + code
            kind, reason = previous.marker if previous.marker != "continue" else None, previous.reason
        found.append(Block(document, line, code, kind, reason))
    return found


ALL = [b for d in DOCUMENTS for b in blocks(d)]
# A block that a 'continue' block extends runs as part of it: running it alone too would be redundant.
_EXTENDED = {id(a) for a, b in itertools.pairwise(ALL) if b.code.startswith(a.code + "\n")}
RUNNABLE = [b for b in ALL if id(b) not in _EXTENDED]


def run_block(block: Block, tmp_path: Path) -> None:
    tests = re.findall(r"^def (test_\w+)\(", block.code, re.MULTILINE)
    script = tmp_path / ("test_block.py" if tests else "block.py")
    script.write_text(block.code, encoding="utf-8")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if tests:
        # The documented plugin alone (rstar_env.testing, whose fixtures the examples use), not every installed one:
        # a user's run has them, but they only add start-up here.
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "rstar_env.testing",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(tmp_path),
            str(script),
        ]
    else:
        command = [sys.executable, str(script)]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=_TIMEOUT_S)
    output = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, f"{block.name} failed as written:\n{block.code}\n--- output ---\n{output}"
    if tests:
        assert f"{len(tests)} passed" in done.stdout, f"{block.name}: expected {len(tests)} passing tests:\n{output}"


def test_the_documents_have_examples():
    assert len(ALL) >= 5, [b.name for b in ALL]
    assert sum(b.marker == "skip" for b in ALL) <= 2, "skip markers are for examples that cannot run here"


@pytest.mark.parametrize("block", [b for b in RUNNABLE if b.marker is None], ids=lambda b: b.name)
def test_python_example_runs(block, tmp_path):
    pytest.importorskip("rstar_examples", reason="the docs use the example plugins: pip install -e examples")
    run_block(block, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(
    "block", [b for b in RUNNABLE if b.marker == "slow"] or [None], ids=lambda b: b.name if b else "none"
)
def test_python_example_with_the_real_model_runs(block, tmp_path):
    if block is None:
        pytest.skip("no example needs the real model")
    pytest.importorskip("rstar_examples", reason="the docs use the example plugins: pip install -e examples")
    run_block(block, tmp_path)


def test_markers_are_read(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nx = 1\n```\n<!-- docs-test: continue -->\n```python\nassert x == 1\n```\n"
        "<!-- docs-test: skip (needs a cloud account) -->\n```python\nraise SystemExit(1)\n```\n"
    )
    _, chained, skipped = blocks(doc)
    assert chained.code == "x = 1\n\nassert x == 1\n" and chained.marker is None
    assert (skipped.marker, skipped.reason) == ("skip", "needs a cloud account")
    doc.write_text("<!-- docs-test: skip -->\n```python\nx = 1\n```\n")
    with pytest.raises(AssertionError, match="needs a reason"):
        blocks(doc)
