"""The project's layers: imports point one way only and never run in a circle.

Show it with `.venv/bin/python -m pytest -q tests/test_layers.py`.

Layers, lowest first: spec < changelog < joins < views < jobs < timeline_demo < bench; inside jobs, jobs.errors <
jobs.core < jobs.kinds < jobs.ops (jobs.dev, the development launchers, apart: no service module imports it). A module may import modules of
its own layer and of the layers below it, never above: jobs never imports timeline_demo or bench, the demo never
imports the benchmarks (the benchmarks use the demo's workload generators). Every import counts, those inside
functions too. Among the modules' module-level imports (what runs when a module is imported) there is no cycle.
A join reads no view: no module of `joins` imports `views` or takes a view's declaration (`spec.model.View`).
The modules are read with `ast`, not imported, so the test needs no Spark and no Redis.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["spec", "changelog", "joins", "views", "jobs", "timeline_demo", "bench"]


def _modules() -> dict[str, Path]:
    """Dotted name -> file of every module of the layered packages (a package is its __init__.py)."""
    out = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module `name` refers to (itself or its nearest enclosing module), or None if not ours."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _package(module: str, path: Path) -> str:
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def _from_base(package: str, node: ast.ImportFrom) -> str:
    """The absolute module a `from ... import` of a module of `package` imports from."""
    base = node.module or ""
    if node.level:  # relative: from the package, up level - 1
        anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return base


def _imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported project module, line, at module level) for every import statement of `module`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = _package(module, path)
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = _from_base(package, child)
                # `from pkg import mod` imports the module pkg.mod when there is one
                names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names]
            else:
                inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                visit(child, inner)
                continue
            for name in names:
                target = _resolve(name)
                if target is not None and target != module:
                    found.append((target, child.lineno, top))

    visit(tree, True)
    return found


IMPORTS = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_every_layered_package_is_read():
    assert {m.split(".")[0] for m in MODULES} == set(LAYERS)
    assert "jobs.ops.cli" in MODULES and "bench.report" in MODULES


def test_no_import_points_up_a_layer():
    upward = sorted(
        {
            f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {t} ({t.split('.')[0]} is above {m.split('.')[0]})"
            for m, found in IMPORTS.items()
            for t, line, _ in found
            if _layer(t) > _layer(m)
        }
    )
    assert not upward, "imports pointing up a layer:\n" + "\n".join(upward)


JOBS_LAYERS = ["jobs.errors", "jobs.core", "jobs.kinds", "jobs.ops"]


def _jobs_layer(module: str) -> int | None:
    """The sublayer of a module of `jobs` (None for `jobs` itself, its `__main__` and `jobs.dev`)."""
    return next((i for i, p in enumerate(JOBS_LAYERS) if module == p or module.startswith(p + ".")), None)


def test_no_import_points_up_a_layer_inside_jobs():
    upward = sorted(
        f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {t} ({JOBS_LAYERS[_jobs_layer(t)]} is above "
        f"{JOBS_LAYERS[_jobs_layer(m)]})"
        for m, found in IMPORTS.items()
        if _jobs_layer(m) is not None
        for t, line, _ in found
        if _jobs_layer(t) is not None and _jobs_layer(t) > _jobs_layer(m)
    )
    assert not upward, "imports pointing up a layer inside jobs:\n" + "\n".join(upward)


def _cycles() -> list[list[str]]:
    """The strongly connected components of more than one module in the module-level import graph (Tarjan)."""
    graph = {m: sorted({t for t, _, top in found if top}) for m, found in IMPORTS.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return out


def test_no_import_cycle_at_module_level():
    cycles = _cycles()
    assert not cycles, "modules importing each other at module level: " + "; ".join(
        " <-> ".join(c) for c in cycles
    )


@pytest.mark.parametrize(
    "source, expected",
    [
        ("from jobs.core import registry\n", ("jobs.core.registry", True)),
        ("def f():\n    from bench.report import plot\n", ("bench.report", False)),
        ("import views.keys as k\n", ("views.keys", True)),
        ("from .report import plot\n", ("bench.report", True)),
    ],
)
def test_imports_are_resolved_to_project_modules(tmp_path, source, expected):
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert [(t, top) for t, _, top in _imports("bench.mod", path)] == [expected]


def test_no_module_of_the_service_imports_the_development_launchers():
    """`jobs.dev` (local servers, the JVM cache's build) is for development: the service's modules never import it
    (the demo, the benchmarks and the tests may)."""
    service = ("spec", "changelog", "joins", "views", "jobs.core", "jobs.kinds", "jobs.ops", "jobs.errors")
    found = sorted(
        f"{MODULES[m].relative_to(ROOT)}:{line}: {t}"
        for m, imports in IMPORTS.items()
        if m.startswith(service)
        for t, line, _ in imports
        if t.startswith("jobs.dev")
    )
    assert not found, "service modules importing jobs.dev:\n" + "\n".join(found)


def _view_declarations(module: str, path: Path) -> list[int]:
    """Lines where `module` takes `spec.model.View` (a view's declaration), at any depth: `from spec.model import
    View` (or `*`), or `.View` of `spec.model` or of a name bound to it (`import spec.model as m`, `from spec import
    model`)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package, bound, lines = _package(module, path), {"spec.model"}, set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = _from_base(package, node)
            if base == "spec.model":
                lines |= {node.lineno for a in node.names if a.name in ("View", "*")}
            elif base == "spec":
                bound |= {a.asname or a.name for a in node.names if a.name == "model"}
        elif isinstance(node, ast.Import):
            bound |= {a.asname for a in node.names if a.name == "spec.model" and a.asname}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "View" and ast.unparse(node.value) in bound:
            lines.add(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize(
    "source, lines",
    [
        ("from spec.model import Topic, View\n", [1]),
        ("def f():\n    from spec import model\n    return model.View\n", [3]),
        ("import spec.model as m\n\n\ndef f(v: m.View): ...\n", [4]),
        ("import spec.model\nx = spec.model.View\n", [2]),
        ("from ..spec.model import *\n", [1]),
        ("from spec.model import Topic\nView = 1\n", []),
    ],
)
def test_a_view_declaration_is_found_wherever_it_is_taken(tmp_path, source, lines):
    path = tmp_path / "mod.py"
    path.write_text(source)
    assert _view_declarations("joins.mod", path) == lines


def test_no_join_module_reads_a_view():
    """`joins/` is an operator per join kind with its state and knows nothing of views: none of its modules imports
    `views` or takes a view's declaration (`spec.model.View`). Which of a join's algorithms serves a view, and the
    join-level spec it runs with, `views` decides from the declaration (`views.list.join`)."""
    joins = {m: p for m, p in MODULES.items() if m.split(".")[0] == "joins"}
    found = sorted(
        [
            f"{MODULES[m].relative_to(ROOT)}:{line}: imports {t}"
            for m in joins
            for t, line, _ in IMPORTS[m]
            if t.split(".")[0] == "views"
        ]
        + [
            f"{p.relative_to(ROOT)}:{line}: takes spec.model.View"
            for m, p in joins.items()
            for line in _view_declarations(m, p)
        ]
    )
    assert not found, "join modules reading a view:\n" + "\n".join(found)
