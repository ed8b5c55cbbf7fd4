"""The project's layers: imports point one way only and never run in a circle.

Show it with `.venv/bin/python -m pytest -q tests/test_layers.py`.

Layers, lowest first: spec < changelog < joins < views < jobs < timeline_demo < bench; inside jobs, jobs.errors <
jobs.core < jobs.kinds < jobs.ops (jobs.dev, the development launchers, apart: no service module imports it). A module may import modules of
its own layer and of the layers below it, never above: jobs never imports timeline_demo or bench, the demo never
imports the benchmarks (the benchmarks use the demo's workload generators). Every import counts, those inside
functions too. Among the modules' module-level imports (what runs when a module is imported) there is no cycle.
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


def _imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported project module, line, at module level) for every import statement of `module`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                names = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: from the package, up level - 1
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
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
