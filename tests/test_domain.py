"""The service's packages know no domain: no identifier or string literal of `changelog/ joins/ views/ jobs/`
names a topic, view or field of the built-in pipeline (docstrings aside). The built-in pipeline lives in its file
(`timeline_demo/pipelines/builtin.yml`) and in the demo.

Identifiers are split into words (`snake_case` and `CamelCase`), string literals into names and then words; a word
or name of `DOMAIN` is a finding. Words that are ordinary English or programming words as well (`ts`, `name`,
`text`, `query`, `url`, `action`, `search`, `session`, ...) are not in `DOMAIN`; the compound field names that hold
them are (`session_id`). The package name `timeline_demo` is not a finding (it names the demo, not a view).

Show it with `.venv/bin/python -m pytest -q tests/test_domain.py`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("changelog", "joins", "views", "jobs")

TOPICS = {"tweets", "follows", "searches", "clicks", "activity", "profiles"}
VIEWS = {"timeline", "search_clicks", "ctr", "enriched_activity", "activity_by_country", "enrichment"}
FIELDS = {
    "tweet_id",
    "user_id",
    "follower_id",
    "followee_id",
    "search_id",
    "session_id",
    "click_id",
    "event_id",
    "profile_version",
    "country",
}
WORDS = {
    "tweet",
    "follower",
    "followers",
    "followee",
    "celeb",
    "celebs",
    "celebrity",
    "celebrities",
    "profile",
}
WORDS |= {"timelines", "countries", "authored", "enriched"}
DOMAIN = TOPICS | VIEWS | FIELDS | WORDS
PACKAGE_NAMES = {"timeline_demo"}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CAMEL = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|[0-9]+")


def _words(name: str) -> set[str]:
    """A name, its snake_case parts and their CamelCase parts, lower-cased (`TimelineStore` -> timeline, store)."""
    out = {name.lower()}
    for part in name.split("_"):
        out.add(part.lower())
        out.update(w.lower() for w in _CAMEL.findall(part))
    return out


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of `tree` (module, class and function docstrings), which the walks skip."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def findings(path: Path) -> list[str]:
    """`<file>:<line>: <word>` for every identifier or string literal of `path` naming the built-in domain."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = docstrings(tree)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name]
        elif isinstance(node, ast.keyword) and node.arg:
            names = [node.arg]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            names = _NAME.findall(node.value)
        for name in names:
            for part in name.split("."):
                if part in PACKAGE_NAMES:
                    continue
                hit = _words(part) & DOMAIN
                if hit:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {sorted(hit)[0]} ({name!r})")
    return found


def _files() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


# Modules still to be made generic (issue #34). The list only shrinks; it is empty when the work is done.
NOT_YET: set[str] = set()


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_service_module_names_no_built_in_topic_view_or_field(path):
    rel = str(path.relative_to(ROOT))
    if rel in NOT_YET:
        pytest.skip("not generic yet (issue #34)")
    found = findings(path)
    assert not found, "\n".join(found)


def test_the_list_of_modules_not_yet_generic_only_names_modules_that_still_need_it():
    stale = sorted(rel for rel in NOT_YET if (ROOT / rel).exists() and not findings(ROOT / rel))
    assert not stale, f"remove from NOT_YET, they are generic now: {stale}"
