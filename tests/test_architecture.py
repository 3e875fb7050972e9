"""The shape of the code: no import cycles between modules or between packages, and the
imports the design keeps out.

Models know nothing of ranks or techniques, and the trainer knows no technique: it meets
the parallel modes only through ``distrec.parallel.mode`` and ``distrec.modes``. The parts
both use (optimizers, schedules, the step, checkpoint files, the time breakdown) live in
``distrec.components``, below both, so neither the modes nor Hotline import the trainer.
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
    ("distrec.parallel", "distrec.train"),
    ("distrec.hotline", "distrec.train"),
    *(("distrec.components", above) for above in ("distrec.train", "distrec.parallel", "distrec.hotline", "distrec.modes", "distrec.cli")),
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


def packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed to distrec's top-level packages and modules (``distrec.x``)."""

    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    collapsed: dict[str, set[str]] = {}
    for module, targets in graph.items():
        collapsed.setdefault(top(module), set()).update(top(t) for t in targets if top(t) != top(module))
    return collapsed


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_no_package_cycles(graph):
    assert cycles(packages(graph)) == []


@pytest.mark.parametrize("importer, imported", FORBIDDEN)
def test_forbidden_imports(graph, importer, imported):
    def inside(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    bad = sorted(f"{m} -> {t}" for m, targets in graph.items() if inside(m, importer) for t in targets if inside(t, imported))
    assert bad == []


def test_packages_collapse_modules_into_their_package():
    graph = {"distrec.a.x": {"distrec.b.y"}, "distrec.b.y": {"distrec.a.z"}, "distrec.a.z": set()}
    assert cycles(graph) == []
    assert cycles(packages(graph)) == [["distrec.a", "distrec.b"]]


def test_the_checker_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
