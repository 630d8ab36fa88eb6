"""The one thing pyproject.toml cannot say: the package list, found by walking the source folders.

The distribution's top-level packages live in folders named otherwise (``plugins/`` is ``rstar_plugins``,
``trainers/`` is ``rstar_trainers``; ``[tool.setuptools.package-dir]`` in pyproject.toml holds that mapping).
``[tool.setuptools.packages.find]`` cannot rename a folder, and a list written by hand drifts: a new subpackage
left off it installs fine in editable mode and is missing from the wheel. So the list is computed here, every
build, from the mapping: each mapped folder and every folder under it that has an ``__init__.py``.
Everything else (metadata, mapping, package data) stays in pyproject.toml. ``tests/test_packaging.py`` checks the
result through setuptools itself.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from setuptools import find_packages, setup

ROOT = Path(__file__).resolve().parent


def discover_packages(root: Path = ROOT) -> list[str]:
    """Every package of the distribution: each ``package-dir`` entry and its subpackages, by dotted name."""
    package_dir: dict[str, str] = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
        "setuptools"
    ]["package-dir"]
    packages: list[str] = []
    for name, folder in package_dir.items():
        if not (root / folder / "__init__.py").is_file():
            raise SystemExit(f"setup.py: package-dir maps {name} to {folder}/, which has no __init__.py")
        packages += [name, *(f"{name}.{sub}" for sub in find_packages(str(root / folder)))]
    return sorted(packages)


if __name__ == "__main__":
    setup(packages=discover_packages())
