"""The Spark private APIs, in one module (`joins.sparkapi`): the check of the installed Spark at start-up, each
function, and that no other module of the service, the demo or the benchmarks reaches a private API itself."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from joins import sparkapi
from joins.sparkapi import (
    SparkUnsupported,
    builder_option,
    check_jvm,
    check_python,
    codegen_compilations,
    driver_jvm,
    drop_builder_option,
    filter_python_includes,
    jvm,
    plan_text,
    size_estimate,
    supported,
    with_size_estimate,
)
from tests.test_domain import docstrings

FACTORY_MODE = "spark.sql.codegen.factoryMode"

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "version, ok",
    [
        ("4.0.0", False),
        ("4.0.1", True),
        ("4.1.1", True),
        ("4.2.0", True),
        ("4.2.9", True),
        ("4.2.1rc1", True),
        ("4.1.0.dev0", True),
        ("4.3.0", False),
        ("3.5.4", False),
        ("5.0.0", False),
        ("", False),
        ("four", False),
    ],
)
def test_the_versions_it_was_written_for(version, ok):
    assert supported(version) is ok


def test_the_installed_pyspark_passes():
    check_python()


def test_another_version_is_refused_in_one_line_that_says_what_to_do():
    with pytest.raises(SparkUnsupported) as e:
        check_python("4.3.0")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(
        "Spark 4.3.0 is not a version joins/sparkapi.py was written for (PySpark 4.0.1 up to 4.3.0"
    )
    assert "install the PySpark pyproject.toml pins" in msg and "port joins/sparkapi.py" in msg
    assert e.value.version == "4.3.0" and e.value.missing == ()


def test_a_missing_python_attribute_is_named(monkeypatch):
    from pyspark import SparkContext

    monkeypatch.delattr(SparkContext, "_python_includes")
    with pytest.raises(SparkUnsupported, match=r"lacks SparkContext\._python_includes \(PySpark"):
        check_python()


def test_the_sessions_jvm_has_every_class_and_method(spark):
    check_jvm(spark)


def test_a_missing_jvm_class_or_signature_is_named(spark, monkeypatch):
    methods = {
        **sparkapi._JVM_METHODS,
        "org.apache.spark.sql.execution.NoSuchPlan": (("copy", ""),),
        "org.apache.spark.sql.execution.LogicalRDD": (("copy", "Seq, RDD"), ("rdd", ""), ("gone", None)),
    }
    monkeypatch.setattr(sparkapi, "_JVM_METHODS", methods)
    with pytest.raises(SparkUnsupported) as e:
        check_jvm(spark)
    assert sorted(e.value.missing) == [
        "LogicalRDD.copy(Seq, RDD)",
        "LogicalRDD.gone(...)",
        "org.apache.spark.sql.execution.NoSuchPlan",
    ]
    assert "\n" not in str(e.value) and str(e.value).startswith(f"Spark {spark.version} lacks ")


def test_a_pass_is_remembered_per_spark_version_and_table_of_methods(spark, tmp_path, monkeypatch):
    check_jvm(spark, tmp_path)
    (marker,) = tmp_path.glob("sparkapi-*.ok")
    assert spark.version in marker.read_text()

    def unreachable(*_):
        raise AssertionError("the JVM was asked again")

    monkeypatch.setattr(sparkapi, "_jvm_class", unreachable)
    check_jvm(spark, tmp_path)  # remembered: only the version is compared
    monkeypatch.setattr(sparkapi, "_JVM_METHODS", {**sparkapi._JVM_METHODS, "scala.None$": (("get", ""),)})
    with pytest.raises(AssertionError, match="asked again"):
        check_jvm(spark, tmp_path)  # another table of methods: checked anew


def test_a_job_on_an_unsupported_spark_stops_before_its_jvm_in_one_line(tmp_path, redis_url):
    script = (
        "import sys, pyspark\n"
        "pyspark.__version__ = '4.3.0'\n"
        "from jobs.ops.cli import main\n"
        "sys.exit(main(['run', 'timeline', '--once']))\n"
    )
    env = {**os.environ, "LAKE_DIR": str(tmp_path / "lake"), "REDIS_URL": redis_url, "JVM_CACHE": "off"}
    env.pop("MVIEW_PIPELINE", None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mview: Spark 4.3.0 is not a version"), out.stderr


def test_a_builders_option_is_read_and_dropped():
    from pyspark.sql import SparkSession

    builder = SparkSession.Builder().config("spark.jars.packages", "a:b:1")
    assert builder_option(builder, "spark.jars.packages") == "a:b:1"
    assert builder_option(builder, "spark.nothing") is None
    drop_builder_option(builder, "spark.jars.packages")
    drop_builder_option(builder, "spark.nothing")
    assert builder_option(builder, "spark.jars.packages") is None


def test_python_includes_are_filtered():
    sc = SimpleNamespace(_python_includes=["/x/a.jar", "/x/b.py", "/x/c.JAR"])
    filter_python_includes(sc, lambda p: not p.lower().endswith(".jar"))
    assert sc._python_includes == ["/x/b.py"]
    empty = SimpleNamespace(_python_includes=None)
    filter_python_includes(empty, lambda p: False)
    assert empty._python_includes is None


def test_the_driver_jvm_is_this_sessions_java_process(spark):
    proc = driver_jvm(spark)
    assert proc is not None and proc.poll() is None
    assert Path(f"/proc/{proc.pid}/comm").read_text().strip() == "java"
    assert jvm(spark).java.lang.ProcessHandle.current().pid() == proc.pid
    assert driver_jvm(SimpleNamespace(sparkContext=SimpleNamespace())) is None


def test_codegen_compilations_count_new_code(spark):
    count = codegen_compilations(spark)
    mode = spark.conf.get(FACTORY_MODE)
    # code generated, as in a deployed job (the tests' JVMs interpret: tests/conftest.py)
    spark.conf.set(FACTORY_MODE, "FALLBACK")
    try:
        before = count()
        spark.range(7).selectExpr(f"id * {before + 12345} AS x").collect()  # a constant never compiled before
    finally:
        spark.conf.set(FACTORY_MODE, mode)
    assert isinstance(before, int) and count() > before


def test_a_checkpoints_size_estimate_follows_the_rows_it_is_given(spark):
    big = spark.range(100_000).selectExpr("id", "repeat('x', 100) AS pad")
    small = big.where("id < 3").localCheckpoint()
    assert size_estimate(small) > 1_000_000  # the estimate of the plan it was computed from
    counted = with_size_estimate(small, 3)
    assert size_estimate(counted) < 10_000
    assert sorted(r.id for r in counted.collect()) == [0, 1, 2]
    assert "LogicalRDD" in plan_text(counted, "analyzed")
    plain = spark.range(5)
    assert with_size_estimate(plain, 1) is plain  # not a checkpoint: as it is


def test_plan_text_of_each_stage(spark):
    df = spark.range(10).where("id > 3")
    assert "Range" in plan_text(df, "analyzed") and "Filter" in plan_text(df)
    assert "Range" in plan_text(df, "executed")


# --- No other module reaches a private Spark API: they are all in joins/sparkapi.py. ---

PACKAGES = ("spec", "changelog", "joins", "views", "jobs", "timeline_demo", "bench")
PRIVATE_ATTRIBUTES = {
    "_jdf",
    "_jvm",
    "_jsc",
    "_jsparkSession",
    "_gateway",
    "_options",
    "_python_includes",
    "_instantiatedSession",
    "_activeSession",
    "_active_spark_context",
    "_jcol",
    "_jconf",
    "_sc",
}
PRIVATE_NAMES = {"_parse_datatype_string", "_to_java_column", "_create_column_from_literal", "_to_seq"}
# JVM classes and methods reached through Py4J: as attributes (`jvm.org.apache...CodegenMetrics`) or as names in
# strings (`getSimpleName() == "LogicalRDD"`)
JVM_NAMES = {"LogicalRDD", "CodegenMetrics", "QueryExecution", "queryExecution", "ofRows"}


def _private_uses(path: Path) -> list[str]:
    """`<file>:<line>: <name>` for every use of a private PySpark attribute or function, or of a JVM class or method
    reached through Py4J, in `path` (docstrings aside)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docs, found = docstrings(tree), []
    for node in ast.walk(tree):
        what = None
        if isinstance(node, ast.Attribute) and node.attr in PRIVATE_ATTRIBUTES | JVM_NAMES:
            what = node.attr
        elif isinstance(node, ast.alias) and node.name.rpartition(".")[2] in PRIVATE_NAMES:
            what = node.name
        elif isinstance(node, ast.Name) and node.id in PRIVATE_NAMES:
            what = node.id
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            what = next((n for n in sorted(JVM_NAMES) if n in node.value), None)
        if what is not None:
            shown = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            found.append(f"{shown}:{node.lineno}: {what}")
    return found


def _modules() -> list[Path]:
    return sorted(
        p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if p != ROOT / "joins" / "sparkapi.py"
    )


def test_no_other_module_uses_a_private_spark_api():
    found = [line for path in _modules() for line in _private_uses(path)]
    assert not found, "move these behind a function of joins/sparkapi.py:\n" + "\n".join(found)


def test_the_guard_finds_a_private_use(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""A docstring may name LogicalRDD."""\n'
        "from pyspark.sql.types import _parse_datatype_string\n"
        "def f(df, spark):\n"
        "    plan = df._jdf.queryExecution().analyzed()\n"
        "    spark.sparkContext._jvm.java.lang.System.gc()\n"
        '    return plan.getClass().getSimpleName() == "LogicalRDD"\n'
    )
    assert sorted(_private_uses(probe)) == sorted(
        [
            "probe.py:2: _parse_datatype_string",
            "probe.py:4: _jdf",
            "probe.py:4: queryExecution",
            "probe.py:5: _jvm",
            "probe.py:6: LogicalRDD",
        ]
    )
