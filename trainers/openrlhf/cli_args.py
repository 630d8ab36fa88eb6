"""OpenRLHF's real command-line parsers, without starting OpenRLHF.

OpenRLHF builds its argument parsers inline under ``if __name__ == "__main__":`` in ``openrlhf/cli/train_ppo_ray.py``
and ``openrlhf/cli/train_sft.py``, and the modules import Ray, vLLM and DeepSpeed at the top. To check our flags
against the parser of the installed version, :func:`openrlhf_parser` reads that block from the installed source and
runs only its statements up to ``parser.parse_args()`` (they use nothing but ``argparse`` and ``datetime``).
:func:`check_args` then parses a command line with it and runs the rest of the block (OpenRLHF's own argument
validation: its asserts and fix-ups) except the final ``train(args)`` call, so a configuration OpenRLHF would
reject at start-up is rejected here.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import importlib.util
import io
import os
from pathlib import Path
from typing import Any, Literal

Script = Literal["train_ppo_ray", "train_sft"]

SCRIPTS: dict[str, str] = {"train_ppo_ray": "openrlhf.cli.train_ppo_ray", "train_sft": "openrlhf.cli.train_sft"}


class OpenRLHFArgsError(ValueError):
    """OpenRLHF's parser or its validation rejected a command line; the message says what it said."""


def _main_block(script: Script) -> tuple[list[ast.stmt], list[ast.stmt], str]:
    spec = importlib.util.find_spec(SCRIPTS[script])
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{SCRIPTS[script]} is not installed: pip install --no-deps 'openrlhf==0.11.*'")
    source = Path(spec.origin).read_text(encoding="utf-8")
    tree = ast.parse(source, filename=spec.origin)
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ):
            body = node.body
            break
    else:
        raise RuntimeError(f"{spec.origin}: no `if __name__ == '__main__':` block; OpenRLHF changed its layout")
    for index, stmt in enumerate(body):
        if (
            isinstance(stmt, ast.Assign)
            and isinstance(stmt.value, ast.Call)
            and isinstance(stmt.value.func, ast.Attribute)
            and stmt.value.func.attr == "parse_args"
        ):
            return body[:index], body[index + 1 :], spec.origin
    raise RuntimeError(f"{spec.origin}: no `args = parser.parse_args()` in the main block; OpenRLHF changed its layout")


def _run(statements: list[ast.stmt], filename: str, namespace: dict[str, Any]) -> None:
    module = ast.Module(body=statements, type_ignores=[])
    exec(compile(module, filename, "exec"), namespace)


def openrlhf_parser(script: Script = "train_ppo_ray") -> argparse.ArgumentParser:
    """The ``argparse`` parser of the installed OpenRLHF's ``openrlhf.cli.<script>``."""
    before, _, filename = _main_block(script)
    namespace: dict[str, Any] = {"argparse": argparse, "datetime": datetime.datetime, "os": os}
    _run(before, filename, namespace)
    return namespace["parser"]


def _is_exit_call(stmt: ast.stmt) -> bool:
    """``train(args)`` and the ModelScope hub patch: what starts work rather than checking arguments."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        func = stmt.value.func
        return isinstance(func, ast.Name) and func.id in ("train", "patch_hub")
    return False


def check_args(script: Script, argv: list[str]) -> Any:
    """Parse ``argv`` with OpenRLHF's parser and run its post-parse validation; return the hierarchical args.

    Raises :class:`OpenRLHFArgsError` with OpenRLHF's message for an unknown flag, a bad value, or a failed
    assertion. What OpenRLHF prints while validating (its warnings) is returned as ``args._rstar_warnings``.
    """
    before, after, filename = _main_block(script)
    namespace: dict[str, Any] = {"argparse": argparse, "datetime": datetime.datetime, "os": os}
    _run(before, filename, namespace)
    parser: argparse.ArgumentParser = namespace["parser"]
    # argparse accepts unambiguous prefixes of flags; we emit full names, so anything else is a typo.
    inexact = [a for a in argv if a.startswith("--") and a.split("=", 1)[0] not in parser._option_string_actions]
    if inexact:
        raise OpenRLHFArgsError(f"OpenRLHF's {script} parser has no flag named {', '.join(inexact)}")
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            namespace["args"] = parser.parse_args(argv)
    except SystemExit:  # argparse exits; the message went to stderr
        said = [line for line in errors.getvalue().splitlines() if line.strip()] or ["?"]
        raise OpenRLHFArgsError(f"OpenRLHF's {script} parser rejected the command line: {said[-1]}") from None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        # The validation statements, minus anything nested that would start training (there is none in 0.11.x;
        # `if args.use_ms:` only patches the hub, and use_ms is never set by us).
        statements = [s for s in after if not _is_exit_call(s)]
        try:
            _run(statements, filename, namespace)
        except AssertionError as exc:
            raise OpenRLHFArgsError(f"OpenRLHF's {script} validation failed: {exc}") from None
    args = namespace["args"]
    args._rstar_warnings = [line for line in printed.getvalue().splitlines() if line.strip()]
    return args
