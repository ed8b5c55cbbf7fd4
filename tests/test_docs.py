"""The docs and the code name the same things.

Every command of `mview` (the CLI's parser), every make target with a `##` comment (the Makefile) and every
environment variable the code reads appears in README.md or a page of docs/; and every `mview X`, `make X` and
backticked variable-looking name (`ALL_CAPS_NAME`, or `ALL_CAPS_NAME=value`) the docs mention still exists in the
code. Every page of docs/ is reachable from the README in one link. Reads text only: no Spark, no Redis.

Show it with `.venv/bin/python -m pytest -q tests/test_docs.py`.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The packages whose environment reads are the service's and its development servers' (jobs/dev is in jobs).
SERVICE = ["spec", "changelog", "joins", "views", "jobs", "timeline_demo", "bench"]

# Environment variables the code reads or sets that are not ours to document: Java's, Spark's and the AWS SDK's
# own names, which the docs may mention for how to configure those tools, and one internal hand-over.
NOT_OURS = {
    "JAVA_HOME",  # the JDK's; the docs say when it is used
    "JAVA_TOOL_OPTIONS",  # the JVM's; the tests set it
    "SPARK_HOME",  # pyspark's; read to find its scripts
    "SPARK_LOCAL_IP",  # Spark's; set for a local master (docs/security.md)
    "SPARK_CONF_DIR",  # Spark's configuration directory
    "SPARK_MASTER_HOST",  # Spark standalone's spark-env.sh
    "SPARK_WORKER_DIR",  # Spark standalone's, set by `make spark-cluster` per worker
    "SPARK_LOCAL_DIRS",  # Spark's, likewise
    "PYSPARK_PYTHON",  # pyspark's, set to the venv's interpreter when unset
    "PYSPARK_DRIVER_PYTHON",  # likewise
    "PYSPARK_SUBMIT_ARGS",  # pyspark's
    "XDG_STATE_HOME",  # the XDG base directory specification's
    "AWS_ACCESS_KEY_ID",  # the AWS SDK's and delta-rs's names for S3 settings
    "AWS_SECRET_ACCESS_KEY",
    "AWS_REGION",
    "AWS_ENDPOINT_URL",
    "AWS_ALLOW_HTTP",
    "AWS_S3_ALLOW_UNSAFE_RENAME",
    "MVIEW_JVM_ARGV",  # internal: jobs.dev.jvmcache hands a file name to its own wrapper script
}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _docs() -> str:
    return "\n".join(_text(p) for p in DOCS)


# docs/extending.md's worked examples name the files, targets and variables a new view kind (`set`), join kind
# (`union`) and source (`mysql`) would add: not in the code, by design. The checks that the docs name only what
# exists skip the spans of that page that name them.
EXAMPLES = re.compile(r"(?<![A-Za-z])(?:set|union|mysql)(?![a-z])", re.I)


def _named_docs() -> str:
    """The docs' text for the checks that what they name exists: the worked examples' new names left out."""
    parts = []
    for p in DOCS:
        text = _text(p)
        if p.name == "extending.md":
            text = re.sub(r"`[^`\n]+`", lambda m: "" if EXAMPLES.search(m.group(0)) else m.group(0), text)
        parts.append(text)
    return "\n".join(parts)


def _code_files() -> list[Path]:
    files = [p for pkg in SERVICE for p in (ROOT / pkg).rglob("*.py")]
    return files + [ROOT / "Makefile", *sorted((ROOT / "timeline_demo" / "pipelines").glob("*.yml"))]


def commands() -> set[str]:
    from jobs.ops.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]  # argparse keeps subparsers as an action
    return set(sub.choices)


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-zA-Z0-9_-]+):[^\n]*##", _text(ROOT / "Makefile"), re.M))


_READ = re.compile(
    r"""(?:environ|\benv|\be)\.(?:get|pop|setdefault)\(\s*["']([A-Z][A-Z0-9_]+)["']"""
    r"""|environ\[\s*["']([A-Z][A-Z0-9_]+)["']\]|getenv\(\s*["']([A-Z][A-Z0-9_]+)["']"""
)


def env_vars() -> set[str]:
    """Every variable the code reads: `environ.get("X")`, `env.get("X")` (a settings mapping), `environ["X"]`,
    `("X", ...)` tuples of a module that reads `os.environ.get(var)` in a loop, a pipeline file's `${X}`, and the
    Makefile's `X ?=` defaults."""
    found: set[str] = set()
    for path in _code_files():
        text = _text(path)
        if path.suffix == ".py":
            found |= {n for m in _READ.findall(text) for n in m if n}
            if re.search(r"environ\.get\(\s*var\b", text):
                found |= set(re.findall(r"\(\s*\"([A-Z][A-Z0-9]*_[A-Z0-9_]+)\",", text))
        elif path.suffix == ".yml":
            found |= set(re.findall(r"\$\{([A-Z][A-Z0-9_]*)", text))
    found |= set(re.findall(r"^([A-Z][A-Z0-9_]*) \?=", _text(ROOT / "Makefile"), re.M))
    return found - {"VENV"}  # the venv's path, a make variable for the Makefile's own use


def _code_spans(text: str) -> list[str]:
    """Inline code (`...`), fenced blocks and indented blocks: where the docs name commands and variables."""
    spans = re.findall(r"`([^`\n]+)`", text)
    spans += re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
    spans += [
        line for line in text.splitlines() if line.startswith("    ") and not line.lstrip().startswith("-")
    ]
    return spans


def _mentioned(pattern: str) -> set[str]:
    return {m for span in _code_spans(_named_docs()) for m in re.findall(pattern, span)}


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z0-9_-]+", text))


def test_every_command_is_documented():
    words = _docs()
    missing = sorted(c for c in commands() if f"mview {c}" not in words)
    assert not missing, f"commands of jobs/ops/cli.py no page names as `mview X`: {missing}"


def test_every_make_target_is_documented():
    words = _docs()
    missing = sorted(t for t in make_targets() if not re.search(rf"\bmake {re.escape(t)}\b", words))
    assert not missing, f"make targets no page names as `make X`: {missing}"


def test_every_environment_variable_is_documented():
    words = _words(_docs())
    missing = sorted(v for v in env_vars() - NOT_OURS if v not in words)
    assert not missing, f"environment variables the code reads that no page names: {missing}"


def test_every_command_the_docs_name_exists():
    named = _mentioned(r"(?<![<\w./=-])mview ([a-z][a-z-]*)")
    gone = sorted(named - commands())
    assert not gone, f"`mview X` in the docs that the CLI does not have: {gone}"


def test_every_make_target_the_docs_name_exists():
    named = _mentioned(r"(?<![\w/-])make ([a-z][a-z0-9-]*)")
    gone = sorted(named - make_targets())
    assert not gone, f"`make X` in the docs that the Makefile does not have: {gone}"


def test_every_variable_the_docs_name_exists():
    """A backticked `NAME` or `NAME=...` with an underscore: an environment variable the code reads, a variable
    not ours, or a name the code still holds (a constant such as `MAX_RECORD_BYTES`)."""
    spans = re.findall(r"`([^`\n]+)`", _named_docs())
    named = {
        m.group(1) for s in spans if (m := re.fullmatch(r"([A-Z][A-Z0-9]*_[A-Z0-9_]+)(=.*)?", s.strip()))
    }
    code = _words("\n".join(_text(p) for p in _code_files()))
    gone = sorted(n for n in named - env_vars() - NOT_OURS if n not in code)
    assert not gone, f"names in the docs that the code no longer has: {gone}"


def test_every_page_is_one_link_from_the_readme():
    readme = _text(ROOT / "README.md")
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", readme))
    pages = {f"docs/{p.name}" for p in DOCS[1:]}
    assert not pages - linked, f"pages the README does not link: {sorted(pages - linked)}"
    assert not linked - pages, f"links of the README to no page: {sorted(linked - pages)}"


def _resolves(dotted: str) -> bool:
    """`pkg.module` or `pkg.module.name`: the module's file exists (and holds the name)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                rest = parts[i:]
                return not rest or (len(rest) == 1 and re.search(rf"\b{re.escape(rest[0])}\b", _text(path)))
    return False


def test_every_module_and_file_the_docs_name_exists():
    """A backticked module (`jobs.core.lease`, `views.list.read_list`) or path (`jobs/core/lease.py`) of ours."""
    roots = "|".join(SERVICE + ["tests"])
    spans = re.findall(r"`([^`\n]+)`", _named_docs())
    links = re.findall(r"\]\(((?:" + roots + r")/[^)#\s]+)\)", _named_docs())
    dotted = {
        m
        for s in spans
        if ".yml" not in s
        for m in re.findall(rf"(?<![\w./-])((?:{roots})(?:\.[A-Za-z_]\w*)+)", s)
    }
    paths = {m for s in spans for m in re.findall(rf"(?<![\w./-])((?:{roots})/[\w./-]*\w)", s)} | set(links)
    gone = sorted(d for d in dotted if not d.startswith("tests.") and not _resolves(d))
    gone += sorted(p for p in paths if "<" not in p and "*" not in p and not (ROOT / p).exists())
    assert not gone, f"modules and files the docs name that are gone: {gone}"
