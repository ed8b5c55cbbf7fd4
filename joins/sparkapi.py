"""Every private PySpark and Spark API the service uses, each behind one function, and `check`, which tells at
start-up whether the installed Spark still has them.

Private means not in PySpark's public API: attributes with a leading underscore (`DataFrame._jdf`,
`SparkSession._jsparkSession`, `SparkContext._gateway`, `SparkSession.Builder._options`, ...) and the JVM classes
reached through Py4J (`LogicalRDD.copy`, `classic.Dataset.ofRows`, `CodegenMetrics`). Spark may change any of them
in any release, so they live here and nowhere else (a test walks the packages for them): a new Spark version is
ported in this one module. Each function's docstring says what it does and why no public API does it.

The module sits in `joins/`, the lowest layer that needs one of them (`joins.state.with_row_count`); the layers
above (`views`, `jobs`, the demo, the benchmarks) import it from here.

`jobs.core.spark.get_spark` checks every session it builds: `check_python()` before the JVM starts (the PySpark
version is one these were written for, `SUPPORTED`; the Python attributes exist), then `check_jvm(spark)` once the
session runs (the JVM's Spark version, and the JVM classes and methods below, by their signatures; a pass is
remembered per Spark version in the venv, so later starts only compare versions). A mismatch raises
`SparkUnsupported`, one line that says what to do.
"""

from __future__ import annotations

import hashlib
import inspect
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

__all__ = [
    "SUPPORTED",
    "SparkUnsupported",
    "check",
    "check_python",
    "check_jvm",
    "supported",
    "builder_option",
    "drop_builder_option",
    "filter_python_includes",
    "driver_jvm",
    "jvm",
    "hadoop_configuration",
    "parse_expression",
    "codegen_compilations",
    "with_size_estimate",
    "size_estimate",
    "plan_text",
]

# The PySpark versions this module was written for and tested with: from 4.0.1 (delta-spark 4.4.0's lowest, see
# pyproject.toml) up to, not including, 4.3.0. A version outside is refused at start (`check`).
SUPPORTED = ((4, 0, 1), (4, 3, 0))
_THIS = "joins/sparkapi.py"
_ADVICE = (
    "install the PySpark pyproject.toml pins (`make setup`, or `pip install -e .`), or port {module} to it"
    " and widen its SUPPORTED"
)

# The JVM methods the functions below call, by class: (name, parameter types as Py4J's help shows them, or None:
# any). `check_jvm` finds each by its signature.
_JVM_METHODS: dict[str, tuple[tuple[str, str | None], ...]] = {
    "org.apache.spark.sql.classic.Dataset": (
        ("ofRows", "SparkSession, LogicalPlan"),
        ("queryExecution", ""),
    ),
    "org.apache.spark.sql.execution.QueryExecution": (
        ("analyzed", ""),
        ("optimizedPlan", ""),
        ("executedPlan", ""),
    ),
    "org.apache.spark.sql.catalyst.plans.logical.LogicalPlan": (("stats", ""),),
    "org.apache.spark.sql.catalyst.plans.logical.Statistics": (("sizeInBytes", ""),),
    "org.apache.spark.sql.execution.LogicalRDD": (
        ("copy", "Seq, RDD, Partitioning, Seq, boolean, Option, SparkSession, Option, Option"),
        ("output", ""),
        ("rdd", ""),
        ("outputPartitioning", ""),
        ("outputOrdering", ""),
        ("isStreaming", ""),
        ("stream", ""),
    ),
    "scala.Some": (("apply", "Object"),),
    "scala.Option": (("empty", ""),),
    "org.apache.spark.metrics.source.CodegenMetrics": (("METRIC_COMPILATION_TIME", ""),),
}


class SparkUnsupported(RuntimeError):
    """The installed Spark is not one this module was written for, or lacks an API it uses. `version` is the
    version found, `missing` what is missing (empty: the version alone is refused). The message is one line that
    says what to do."""

    def __init__(self, version: str, missing: tuple[str, ...] = ()):
        lo, hi = (".".join(map(str, v)) for v in SUPPORTED)
        what = f"lacks {', '.join(missing)}" if missing else f"is not a version {_THIS} was written for"
        advice = _ADVICE.format(module=_THIS)
        super().__init__(f"Spark {version} {what} (PySpark {lo} up to {hi}, not included): {advice}")
        self.version, self.missing = version, tuple(missing)


def _version(text: str) -> tuple[int, int, int] | None:
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def supported(version: str) -> bool:
    """Whether `version` (`4.2.0`, `4.1.1rc1`, ...) is in `SUPPORTED` (a pre-release counts as its release)."""
    v = _version(version)
    return v is not None and SUPPORTED[0] <= v < SUPPORTED[1]


def check_python(version: str | None = None) -> None:
    """Raise `SparkUnsupported` unless PySpark's version (`version`, default the installed one) is `supported` and
    its private Python attributes used here exist. No JVM: run before a session starts."""
    import pyspark
    from pyspark import SparkContext
    from pyspark.sql import SparkSession
    from pyspark.sql.classic.dataframe import DataFrame

    version = pyspark.__version__ if version is None else version
    if not supported(version):
        raise SparkUnsupported(version)
    missing = []
    if not isinstance(getattr(SparkSession.Builder(), "_options", None), dict):
        missing.append("SparkSession.Builder._options")
    if not hasattr(SparkContext, "_python_includes"):
        missing.append("SparkContext._python_includes")
    if list(inspect.signature(DataFrame.__init__).parameters)[1:3] != ["jdf", "sql_ctx"]:
        missing.append("DataFrame(jdf, sql_ctx)")
    if missing:
        raise SparkUnsupported(version, tuple(missing))


def check_jvm(spark, verdicts: Path | None = None) -> None:
    """Raise `SparkUnsupported` unless the session's JVM runs a `supported` Spark (it may differ from PySpark's when
    SPARK_HOME names another Spark) and has every class and method of `_JVM_METHODS`, with those parameters.

    One Py4J call per method (Py4J's help of the class, filtered to the method): 40-90 ms at a session's start. With
    `verdicts` (a directory of this machine, beside the venv: never in the lake), a pass is remembered there for
    this Spark version and this module's table of methods (`sparkapi-<digest>.ok`), and a later start with the same
    finds it and asks the JVM for its version only."""
    version = spark.version
    if not supported(version):
        raise SparkUnsupported(version)
    digest = hashlib.sha256(repr((version, _JVM_METHODS)).encode()).hexdigest()[:16]
    passed = verdicts / f"sparkapi-{digest}.ok" if verdicts is not None else None
    if passed is not None and passed.is_file():
        return
    missing = []
    gateway = spark.sparkContext._gateway
    for name, methods in _JVM_METHODS.items():
        cls = _jvm_class(spark, name)
        if cls is None:
            missing.append(name)
            continue
        for method, params in methods:
            text = gateway.help(cls, pattern=f"{method}(*", display=False)
            found = re.findall(rf"^\|\s+{re.escape(method)}\(([^)]*)\)", text, re.M)
            if not found or (params is not None and params not in found):
                missing.append(
                    f"{name.rsplit('.', 1)[1]}.{method}({params if params is not None else '...'})"
                )
    if missing:
        raise SparkUnsupported(version, tuple(missing))
    if passed is not None:
        try:
            passed.parent.mkdir(parents=True, exist_ok=True)
            passed.write_text(f"Spark {version}: every API of {_THIS} found\n")
        except OSError:  # a read-only venv: every start checks, as without `verdicts`
            pass


def check(spark=None, verdicts: Path | None = None) -> None:
    """`check_python()`, and with a session `check_jvm(spark, verdicts)`: raises `SparkUnsupported` (one line) on a
    mismatch."""
    check_python()
    if spark is not None:
        check_jvm(spark, verdicts)


def _jvm_class(spark, name: str):
    """The Py4J JavaClass of the JVM class `name`, or None when the JVM has no such class (Py4J then gives a
    JavaPackage)."""
    from py4j.java_gateway import JavaClass

    node = spark._jvm
    for part in name.split("."):
        node = getattr(node, part)
    return node if isinstance(node, JavaClass) else None


def builder_option(builder, key: str) -> str | None:
    """The value `builder` (a `SparkSession.Builder`) holds for setting `key` (set by `.config` or by a library
    that configures it, as `delta.configure_spark_with_delta_pip` sets `spark.jars.packages`), or None. The builder
    has no getter: its settings are `Builder._options`."""
    return builder._options.get(key)


def drop_builder_option(builder, key: str) -> None:
    """Remove setting `key` from `builder`: `.config` can set a key, never unset one (an empty value is still a
    value: `spark.jars.packages=""` would still reach spark-submit)."""
    builder._options.pop(key, None)


def filter_python_includes(sc, keep: Callable[[str], bool]) -> None:
    """Keep on the Python path that `sc` (a SparkContext) gives every Python worker only the paths for which
    `keep` holds. spark-submit adds each `--packages` file there (`SparkContext._python_includes`); PySpark has no
    API to take one off."""
    includes = getattr(sc, "_python_includes", None)
    if includes:
        sc._python_includes = [p for p in includes if keep(p)]


def driver_jvm(spark) -> subprocess.Popen | None:
    """The process of the session's driver JVM when PySpark started it (the `java` of a local master, which runs the
    executors too), else None (a JVM PySpark only connected to). PySpark keeps it as `SparkContext._gateway.proc`;
    nothing public gives the JVM's process (its id, its CPU time, closing its stdin to let it exit)."""
    return getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)


def jvm(spark):
    """The Py4J view of the session's driver JVM (`jvm(spark).java.lang.System`), for public Java APIs PySpark does
    not wrap (the JVM's own process id, a GC, its arguments and version): `SparkContext._jvm`."""
    return spark.sparkContext._jvm


def hadoop_configuration(spark):
    """The session's Hadoop configuration (a JVM object), from which the driver's file systems and the
    configuration shipped with each task are made: `SparkContext._jsc.hadoopConfiguration()`."""
    return spark.sparkContext._jsc.hadoopConfiguration()


def parse_expression(spark, text: str):
    """The unresolved expression tree (a JVM Catalyst `Expression`, its functions not looked up) that the session's
    SQL parser makes of `text`; a text that does not parse raises PySpark's ParseException. PySpark parses only
    inside `expr`/`selectExpr`, which resolve at once; the parser is `SparkSession._jsparkSession.sessionState()
    .sqlParser()`."""
    return spark._jsparkSession.sessionState().sqlParser().parseExpression(text)


def codegen_compilations(spark) -> Callable[[], int]:
    """A function giving the number of generated-code compilations the driver JVM has made so far (whole-stage
    code generation and expression code; the count of Spark's `CodegenMetrics.METRIC_COMPILATION_TIME` histogram).
    Spark reports it only through its metrics system (a sink configured at start), never to PySpark. Raises (a
    Py4J error) where the JVM is not reachable, e.g. under Spark Connect."""
    return jvm(spark).org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount


def with_size_estimate(df, rows: int):
    """`df`, a local checkpoint (its analysed plan a `LogicalRDD`), as a DataFrame of the same RDD (not recomputed)
    whose plan carries the optimizer's statistics of `df.limit(rows)`: Spark's estimate for a plan known to hold
    `rows` rows. Any other `df` is returned as it is. A checkpoint keeps the statistics of the plan it was computed
    from; Spark has no API to give a plan other statistics, so the `LogicalRDD` is copied with them
    (`LogicalRDD.copy(..., originStats)`) and made a DataFrame again (`classic.Dataset.ofRows`)."""
    from pyspark.sql import DataFrame

    plan = df._jdf.queryExecution().analyzed()
    if plan.getClass().getSimpleName() != "LogicalRDD":
        return df
    session, vm = df.sparkSession._jsparkSession, df.sparkSession._jvm
    stats = df.limit(max(1, rows))._jdf.queryExecution().optimizedPlan().stats()
    counted = plan.copy(
        plan.output(),
        plan.rdd(),
        plan.outputPartitioning(),
        plan.outputOrdering(),
        plan.isStreaming(),
        plan.stream(),
        session,
        vm.scala.Some(stats),
        vm.scala.Option.empty(),
    )
    return DataFrame(vm.org.apache.spark.sql.classic.Dataset.ofRows(session, counted), df.sparkSession)


def size_estimate(df) -> int:
    """The optimizer's estimate of `df`'s size in bytes (what decides a broadcast join): the statistics of its
    optimized plan. PySpark shows them only as text (`explain(mode="cost")`)."""
    return int(df._jdf.queryExecution().optimizedPlan().stats().sizeInBytes())


def plan_text(df, stage: str = "optimized") -> str:
    """`df`'s plan after `stage` (`analyzed`, `optimized`, `executed`) as Spark prints it. PySpark's `explain`
    prints it to stdout only."""
    qe = df._jdf.queryExecution()
    plans = {"analyzed": qe.analyzed, "optimized": qe.optimizedPlan, "executed": qe.executedPlan}
    return plans[stage]().toString()
