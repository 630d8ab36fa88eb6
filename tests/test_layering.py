"""The product's import graph, read statically (``ast``): no circle among rstar_env's modules, nothing of the
plugins, the trainers or the testkit imported by rstar_env, and the low layers import nothing above them.

Every import counts, lazy ones inside functions included: a lazy import hides a circle from ``import`` but not from
the reader who has to understand which module stands on which.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import rstar_env

ROOT = Path(rstar_env.__file__).resolve().parent
FORBIDDEN = ("rstar_plugins", "rstar_trainers", "rstar_env_testkit")
"""Top-level packages rstar_env must never import, with no exception: plugins and trainers stand above it (the
trainers mount their commands into ``rstar-env`` through entry points); the testkit is test code (a benchmark plays
its scripted endpoint through an ``httpx.MockTransport`` of its own)."""
LOW_LAYERS = {
    # module (or package) -> what it may import from rstar_env; anything else of rstar_env is above it.
    "rstar_env.data": ("rstar_env.data",),
    "rstar_env.outcomes": ("rstar_env.outcomes",),
    "rstar_env.trajectory": ("rstar_env.trajectory", "rstar_env.format", "rstar_env.outcomes"),
    "rstar_env.format": ("rstar_env.format",),
    "rstar_env.sandbox": ("rstar_env.sandbox", "rstar_env.outcomes", "rstar_env.runtime"),
    "rstar_env.aio": ("rstar_env.aio", "rstar_env.runtime"),
    "rstar_env.runtime": ("rstar_env.runtime",),  # the process runtime is the floor: it stands on nothing of ours
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str, known: set[str]) -> Iterator[tuple[str, int]]:
    """(imported module, line) for every import in the file; ``from a import b`` names ``a.b`` when it is a module."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield (sub if sub in known else target), node.lineno


def graph() -> dict[str, dict[str, int]]:
    files = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}
    known = set(files)
    edges: dict[str, dict[str, int]] = {}
    for name, path in files.items():
        edges[name] = {}
        for target, line in imports_of(path, name, known):
            edges[name].setdefault(target, line)
    return edges


def cycles(edges: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself), Tarjan's way."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, {}):
            if w not in edges:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges[v]:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_the_graph_is_read() -> None:
    edges = graph()
    # The reader sees what it should: relative, absolute and lazy imports.
    assert "rstar_env.data.records" in edges["rstar_env.data.load"]
    assert "rstar_env.env" in edges["rstar_env.vector"]
    assert "rstar_env.data" in edges["rstar_env.env"]  # imported inside a method


def test_no_import_circle() -> None:
    found = cycles(graph())
    assert not found, "import circles among rstar_env's modules: " + "; ".join(" <-> ".join(c) for c in found)


def test_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


def test_rstar_env_imports_no_plugin_trainer_or_testkit() -> None:
    bad = [
        f"{name} imports {target} (line {line})"
        for name, targets in graph().items()
        for target, line in targets.items()
        if any(within(target, top) for top in FORBIDDEN)
    ]
    assert not bad, "rstar_env must not depend on what stands above it: " + "; ".join(bad)


def test_low_layers_import_nothing_above_them() -> None:
    bad = []
    for name, targets in graph().items():
        for layer, allowed in LOW_LAYERS.items():
            if not within(name, layer):
                continue
            for target, line in targets.items():
                above = within(target, "rstar_env") and target != "rstar_env"
                if above and not any(within(target, a) for a in allowed):
                    bad.append(f"{name} imports {target} (line {line})")
    assert not bad, "a low layer imports one above it: " + "; ".join(bad)


ADAPTERS = {"rstar_env.proctree": "rstar_env.sandbox._proctree"}
"""Public modules that stand for a private one: the code stays where processes that load it by path find it."""
PENDING = ("rstar_env.bench.sandbox imports rstar_env.sandbox._proctree",)
"""Reach-ins still to replace by the public module (the sandbox benchmark's owner)."""


def private_reach_ins(edges: dict[str, dict[str, int]]) -> list[str]:
    """Imports of a private module (``_name``) of another package: ``a.b`` may import ``a.b._c``, not ``a.d._c``."""
    bad = []
    for name, targets in edges.items():
        for target, line in targets.items():
            parts = target.split(".")
            private = next((i for i, p in enumerate(parts) if p.startswith("_") and not p.startswith("__")), None)
            if not within(target, "rstar_env") or private is None or ADAPTERS.get(name) == target:
                continue
            if not within(name, ".".join(parts[:private])):
                bad.append(f"{name} imports {target} (line {line})")
    return bad


def test_no_module_imports_another_packages_private_module():
    bad = [b for b in private_reach_ins(graph()) if not b.startswith(PENDING)]
    assert not bad, "private modules imported from outside their package: " + "; ".join(bad)


def test_the_reach_in_finder_finds_one():
    edges = {
        "rstar_env.threads": {"rstar_env.sandbox._proctree": 3},
        "rstar_env.sandbox.local": {"rstar_env.sandbox._pool": 1},
        "rstar_env.proctree": {"rstar_env.sandbox._proctree": 11},
    }
    assert private_reach_ins(edges) == ["rstar_env.threads imports rstar_env.sandbox._proctree (line 3)"]


PUBLIC_FOR_PLUGINS = (
    "rstar_env.plugins",
    "rstar_env.plugin",
    "rstar_env.tool",
    "rstar_env.reward",
    "rstar_env.sampler",
    "rstar_env.trajectory",
    "rstar_env.format",
    "rstar_env.sandbox",
)
"""What the built-in plugins may import of rstar_env: the author surface and the public modules it names, so a
built-in has nothing an outside plugin could not have."""
LEAN_WORKERS = {"rstar_plugins.rewards._worker": "rstar_env.data.numbers"}
"""A worker process started bare (``python -m``) that must not load the plugin machinery to answer."""


def test_builtin_plugins_import_only_what_an_outside_plugin_can():
    import rstar_plugins

    root = Path(rstar_plugins.__file__).resolve().parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        parts = [rstar_plugins.__name__, *path.relative_to(root).with_suffix("").parts]
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for target, line in imports_of(path, name, set()):
            if not within(target, "rstar_env") or any(within(target, p) for p in PUBLIC_FOR_PLUGINS):
                continue
            if LEAN_WORKERS.get(name) == target:
                continue
            bad.append(f"{name} imports {target} (line {line})")
    bad = list(dict.fromkeys(bad))
    assert not bad, "a built-in plugin reaches past the author surface: " + "; ".join(bad)
