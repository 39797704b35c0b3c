"""The package's layout and import graph: the top level holds the entry points and the shared ground, every other
module sits in a layer's folder, imports run one way (ground <- engines <- speakers <- live <- store <- web <- pool
<- bench), and no module imports one that (directly or not) imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parent.parent / "realtime"
LAYERS = ("ground", "engines", "speakers", "live", "store", "web", "pool", "bench")
"""From the bottom: a module may import its own layer and the layers below it, never one above. Ground: audio,
settings and the Space's variables; the engines; the speaker model (it needs no engine); the live pipeline and the
file path; the history (a database of live sessions); the web faces; the Ray Serve pool (it serves the engines
behind the app's own HTTP API); the benchmarks, which measure everything."""


def layer(name: str) -> str | None:
    """The layer of a module; None for the entry points (`__main__` and the package's `__init__`)."""
    parts = name.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return None
    if len(parts) == 2 and parts[1] in ("audio", "config", "space"):
        return "ground"
    return parts[1] if parts[1] in LAYERS else "top level"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports, at the top or inside a function (both run)."""
    mods = modules()
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    if f"{target}.{alias.name}" in mods:
                        graph[name].add(f"{target}.{alias.name}")
                    elif target in mods:
                        graph[name].add(target)
            elif isinstance(node, ast.Import):
                graph[name].update(alias.name for alias in node.names if alias.name in mods)
        graph[name].discard(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle():
    graph = import_graph()
    assert "realtime.engines.policy" in graph["realtime.engines.base"], "the import scan found nothing: it is broken"
    assert cycles(graph) == []


def test_a_circle_is_found():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_imports_run_one_way():
    upward = []
    for name, targets in import_graph().items():
        own = layer(name)
        if own is None:
            continue
        assert own in LAYERS, f"{name} is in no layer"
        upward += [f"{name} -> {t}" for t in targets if layer(t) not in LAYERS[: LAYERS.index(own) + 1]]
    assert not upward, upward


def test_the_top_level_holds_only_entry_points_and_ground():
    top = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert top == ["__init__", "__main__", "audio", "config", "space"], top
