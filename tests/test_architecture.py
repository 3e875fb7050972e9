"""The shape of the code: no import cycles, and the imports the design keeps out.

Models know nothing of ranks or techniques, and the trainer knows no technique: it meets
the parallel modes only through ``distrec.parallel.mode`` and ``distrec.modes``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

FORBIDDEN = [
    ("distrec.train", "distrec.hotline"),
    ("distrec.train", "distrec.towers"),
    ("distrec.models", "distrec.towers"),
    ("distrec.models", "distrec.parallel"),
    ("distrec.models", "distrec.hotline"),
]


def module_imports(src: Path) -> dict[str, set[str]]:
    """Module name -> the distrec modules it imports (anywhere in the file, TYPE_CHECKING too)."""
    files = {".".join(f.relative_to(src).with_suffix("").parts).removesuffix(".__init__"): f for f in src.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                candidates = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                candidates = [base, *(f"{base}.{a.name}" for a in node.names)]
            else:
                continue
            for candidate in candidates:
                while candidate and candidate not in files:
                    candidate = candidate.rpartition(".")[0]
                if candidate and candidate != name:
                    targets.add(candidate)
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return module_imports(SRC)


def test_no_import_cycles(graph):
    assert cycles(graph) == []


@pytest.mark.parametrize("importer, imported", FORBIDDEN)
def test_forbidden_imports(graph, importer, imported):
    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    bad = sorted(f"{m} -> {t}" for m, targets in graph.items() if inside(m, importer) for t in targets if inside(t, imported))
    assert bad == []


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
