"""The code keeps the design's shape: the jobs are wiring and no function is too long to read.

Show it with `.venv/bin/python -m pytest -q tests/test_shape.py`.
- A job kind's runner (`jobs/kinds/<kind>.py`) is under 300 lines.
- No function of a service package (every top-level package but `tests`: spec, changelog, joins, views, jobs,
  timeline_demo, bench) is over 60 lines, unless the comment line right above its `def` (or its decorators)
  starts with `# long:` and says why.
- Nothing outside `views/` branches on a view's kind (a comparison with the name of a view kind): a job kind
  writes its views through `views.changes`, what a kind keeps or needs is asked of its module, and what the file
  accepts per kind is declared by its module too (`spec.viewfile`: the loader in `spec/` knows no kind). Only
  `timeline_demo/brute.py`, the reference computed independently of the service, defines each kind in plain Python.
- A view kind is one module: each kind `views.kinds` registers is declared by one module of `views/` (its file
  declaration, `FILE`, and its readers are that module's).
Read with `ast`, not imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
JOB_LINES, FUNCTION_LINES = 300, 60


def _job_modules() -> list[Path]:
    return sorted(p for p in (ROOT / "jobs" / "kinds").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", _job_modules(), ids=lambda p: p.name)
def test_a_job_module_is_wiring(path):
    n = len(path.read_text().splitlines())
    assert n < JOB_LINES, f"{path.relative_to(ROOT)} has {n} lines (a job module is wiring: < {JOB_LINES})"


def _long_functions(package: str) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = node.end_lineno - node.lineno + 1
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            above = lines[first - 2].strip() if first >= 2 else ""
            if length > FUNCTION_LINES and not above.startswith("# long:"):
                out.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({length} lines)")
    return out


def _service_packages() -> list[str]:
    """The top-level packages of the repository except the tests: those pyproject.toml's `packages` lists."""
    return sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")


def test_every_service_package_is_measured():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert _service_packages() == sorted(p for p in listed if "." not in p)


@pytest.mark.parametrize("package", _service_packages())
def test_no_function_is_too_long(package):
    found = _long_functions(package)
    assert not found, f"functions over {FUNCTION_LINES} lines without a `# long:` reason:\n" + "\n".join(
        found
    )


VIEW_KINDS = {"row", "count", "agg", "list", "log"}
_KIND_EXEMPT = ("views/", "timeline_demo/brute.py")


def _kind_branches() -> list[str]:
    """`X == "list"`, `X != "row"`, `X in ("count", "agg")`, ... outside views/: a comparison with a view kind's name."""
    out = []
    for package in _service_packages():
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(_KIND_EXEMPT):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if not isinstance(node, ast.Compare):
                    continue
                names = {
                    c.value
                    for side in [node.left, *node.comparators]
                    for c in ([side] if isinstance(side, ast.Constant) else getattr(side, "elts", []))
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
                kinds = any(
                    isinstance(s, ast.Attribute) and s.attr == "kind" for s in [node.left, *node.comparators]
                )
                if kinds and names & VIEW_KINDS:
                    out.append(f"{rel}:{node.lineno}")
    return out


def test_nothing_outside_views_branches_on_a_view_kind():
    found = _kind_branches()
    assert not found, "a branch on a view's kind outside views/ (ask the kind's module):\n" + "\n".join(found)
