"""Every distribution ships all of its packages, modules and data files, and its py.typed marker.

Checked statically, through setuptools' own configuration of each project (setup.py and pyproject.toml, as a
build reads them) and its ``build_py`` command, which decides what goes into a wheel: a new subpackage, a folder
that lacks its ``__init__.py``, or a data file no ``package-data`` pattern matches fails here in a second, not in a
user's fresh install. ``scripts/check_dist.sh`` builds and installs the real wheels and sdist.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

setuptools = pytest.importorskip("setuptools")  # in the dev extra; the build backend itself

ROOT = Path(__file__).resolve().parents[1]

PROJECTS = {
    # project folder: (package name -> source folder, the packages that carry a py.typed marker)
    ".": (
        {"rstar_env": "rstar_env", "rstar_plugins": "plugins", "rstar_trainers": "trainers"},
        {"rstar_env", "rstar_plugins", "rstar_trainers"},
    ),
    "examples": ({"rstar_examples": "rstar_examples"}, {"rstar_examples"}),
    "testkit": ({"rstar_env_testkit": "rstar_env_testkit"}, set()),
}


def _build_py(project: Path, egg_base: Path, monkeypatch: pytest.MonkeyPatch) -> setuptools.Command:
    """The project's ``build_py`` command, configured exactly as ``python -m build`` configures it."""
    from distutils.core import run_setup  # setuptools' copy (imported above), which runs setup.py's setup()

    from setuptools.dist import Distribution

    monkeypatch.chdir(project)
    with warnings.catch_warnings():
        # Deprecations in [project] metadata are the build's business, not what this test checks.
        warnings.simplefilter("ignore", setuptools.SetuptoolsDeprecationWarning)
        if (project / "setup.py").is_file():
            dist = run_setup("setup.py", stop_after="config")
        else:
            dist = Distribution({"script_name": "setup.py"})  # as setuptools' build backend names it
            dist.parse_config_files()
        # build_py reads egg_info's file manifest (include-package-data): write it under tmp, not the checkout.
        dist.get_command_obj("egg_info").egg_base = str(egg_base)
        build_py = dist.get_command_obj("build_py")
        build_py.ensure_finalized()
        build_py.data_files  # noqa: B018 - computed (and egg_info run) inside the warnings filter
    return build_py


def _source_files(project: Path, layout: dict[str, str]) -> tuple[set[Path], set[Path]]:
    """All ``.py`` files and all other files under the layout's source folders (no caches)."""
    modules: set[Path] = set()
    data: set[Path] = set()
    for folder in layout.values():
        for path in (project / folder).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            (modules if path.suffix == ".py" else data).add(path.resolve())
    return modules, data


@pytest.mark.parametrize("name", list(PROJECTS))
def test_every_module_and_data_file_of_the_source_folders_is_in_the_distribution(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = ROOT / name
    layout, typed = PROJECTS[name]
    build_py = _build_py(project, tmp_path, monkeypatch)

    top_level = {package for package in build_py.packages if "." not in package}
    assert top_level == set(layout), f"{name}: top-level packages {sorted(top_level)}, the design says {sorted(layout)}"
    for package, folder in layout.items():
        assert (project / build_py.get_package_dir(package)).resolve() == (project / folder).resolve(), package

    modules, data = _source_files(project, layout)
    shipped = {(project / filename).resolve() for _package, _module, filename in build_py.find_all_modules()}
    missing = sorted(str(p.relative_to(project)) for p in modules - shipped)
    assert not missing, (
        f"{name}: these modules would not be in the wheel: {missing}. A folder of modules needs an __init__.py "
        "to be a package (packages are found, never listed: see setup.py / [tool.setuptools.packages.find])"
    )
    extra = sorted(str(p) for p in shipped - modules)
    assert not extra, f"{name}: modules from outside the source folders would ship: {extra}"

    shipped_data = {
        (project / source_dir / filename).resolve()
        for _package, source_dir, _build_dir, filenames in build_py.data_files
        for filename in filenames
    }
    missing = sorted(str(p.relative_to(project)) for p in data - shipped_data)
    assert not missing, (
        f"{name}: these files in the package folders would not be in the wheel: {missing}; add a pattern for "
        "them to [tool.setuptools.package-data] in its pyproject.toml"
    )
    for package in typed:
        marker = project / layout[package] / "py.typed"
        assert marker.is_file(), f"{name}: {package} has no py.typed marker (PEP 561) at {marker}"
        assert marker.resolve() in shipped_data, f"{name}: {marker} would not be in the wheel"
