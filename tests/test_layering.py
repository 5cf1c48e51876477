"""The package's import layering (docs/architecture.md): lower layers never import higher ones,
a feature reaches another feature only through its package's public names, no import circle
(counting imports under ``TYPE_CHECKING`` and inside functions), and no oversized module.

The graph is read from the source with ``ast``, so a lazy import cannot hide a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "django_redispatterns"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE

#: Layer of each top-level module or subpackage; a module may import only its own layer's
#: neighbours (same feature) or lower layers.
LAYERS: dict[str, int] = {
    "exceptions": 0,
    "signals": 0,
    "conf": 1,
    "keys": 2,
    "connection": 2,
    "scripts": 2,
    "problems": 2,
    "tracking": 2,
    "cache": 3,
    "ratelimit": 3,
    "idempotency": 3,
    "sessions": 3,
    "locks": 3,
    "middleware": 4,
    "contrib": 4,
    "checks": 4,
    "management": 4,
    "receivers": 4,
    "apps": 4,
    "__init__": 5,
}
FEATURES = {name for name, layer in LAYERS.items() if layer == 3}
MAX_LINES = 400


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def imports_of(name: str) -> Iterator[str]:
    """Every module of the package that ``name`` imports, wherever the import statement is."""
    tree = ast.parse(MODULES[name].read_text(), filename=str(MODULES[name]))
    here = name if is_package(name) else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            targets = [
                f"{source}.{alias.name}" if f"{source}.{alias.name}" in MODULES else source
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target.startswith(PACKAGE + ".") or target == PACKAGE:
                yield target


GRAPH: dict[str, set[str]] = {name: set(imports_of(name)) - {name} for name in MODULES}


def top(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_module_has_a_layer() -> None:
    assert sorted({top(name) for name in MODULES} - set(LAYERS)) == []


def test_lower_layers_never_import_higher_ones() -> None:
    wrong = sorted(
        f"{name} (layer {LAYERS[top(name)]}) imports {target} (layer {LAYERS[top(target)]})"
        for name, targets in GRAPH.items()
        for target in targets
        if LAYERS[top(target)] > LAYERS[top(name)]
    )
    assert wrong == []


def test_features_reach_other_features_only_through_their_public_names() -> None:
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        for target in targets
        if top(target) in FEATURES
        and top(target) != top(name)
        and target != f"{PACKAGE}.{top(target)}"
        and LAYERS[top(name)] == 3
    )
    assert wrong == []


def test_no_module_imports_its_own_package() -> None:
    """A module inside a package that imports the package's ``__init__`` closes a circle."""
    wrong = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        for target in targets
        if is_package(target) and name.startswith(target + ".") and target != PACKAGE
    )
    assert wrong == []


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    # A package importing its own submodules (to re-export them) is not a circle; a
    # submodule importing its package back is (see the test above).
    graph = {
        name: {t for t in targets if not (is_package(name) and t.startswith(name + "."))}
        for name, targets in GRAPH.items()
    }
    assert strongly_connected(graph) == []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_oversized_module(name: str) -> None:
    lines = len(MODULES[name].read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines (split it by job)"


def test_the_circle_finder_finds_circles() -> None:
    """The checker itself: it reports exactly the modules on a circle."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert strongly_connected(graph) == [["a", "b", "c"]]
