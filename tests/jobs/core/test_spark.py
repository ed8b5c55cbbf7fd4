"""The shared SparkSession: the Delta jars (on the JVM's class path, used by every Delta test) are on no Python
path, where each new Python worker had spent about 1 s reading them on its first imports; a start reuses the jar
files an earlier resolution of the same packages found while they all exist; with a local master the driver JVM
(of the session, of a job run through the installed `mview`, of `python -m jobs.core.submit`) listens on loopback only,
as the kernel's socket tables say."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jobs.core.runtime import read_status
from jobs.ops.deploy import settings_env
from joins.sparkapi import driver_jvm
from tests.conftest import make_settings
from tests.jobs.opshelp import MVIEW, wait_for


def test_delta_jars_are_off_the_python_path_of_driver_and_workers(spark):
    def _worker_jars(_rows):  # pickled by value: runs in a Python worker
        import sys as worker_sys

        yield [p for p in worker_sys.path if p.lower().endswith(".jar") and "delta" in p.lower()]

    assert [p for p in sys.path if p.lower().endswith(".jar")] == []
    per_worker = spark.sparkContext.parallelize(range(2), 2).mapPartitions(_worker_jars).collect()
    assert per_worker == [[], []]


def test_vacuum_lists_a_small_table_in_as_few_tasks_as_cores(spark, tmp_path):
    """Delta's VACUUM lists files in spark.sql.sources.parallelPartitionDiscovery.parallelism tasks (10,000 by
    default): on two cores that was 1-2 minutes per small table in `mview maintain`."""
    from delta.tables import DeltaTable

    path = str(tmp_path / "t")
    spark.range(10).write.format("delta").save(path)
    sc = spark.sparkContext
    sc.setJobGroup("vacuum-tasks", "VACUUM of a small table")
    try:
        DeltaTable.forPath(spark, path).vacuum(168)
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker = sc.statusTracker()
    stages = [s for j in tracker.getJobIdsForGroup("vacuum-tasks") for s in tracker.getJobInfo(j).stageIds]
    tasks = [tracker.getStageInfo(s).numTasks for s in stages if tracker.getStageInfo(s)]
    assert tasks and max(tasks) <= 2, tasks


def test_a_small_aggregation_takes_small_memory_pages(spark):
    """Every aggregation, sort and hashed relation takes at least one memory page, however few its rows: the pages
    are 1 MB whatever the driver's heap and cores (from which Spark sizes them by default)."""
    sc = spark.sparkContext
    sc.setJobGroup("page-size", "a small aggregation")
    try:
        spark.range(100).selectExpr("id % 7 AS k").groupBy("k").count().collect()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker, store = sc.statusTracker(), sc._jsc.sc().statusStore()
    stages = [s for j in tracker.getJobIdsForGroup("page-size") for s in tracker.getJobInfo(j).stageIds]
    deadline = time.monotonic() + 10  # the status store is fed by an asynchronous listener
    while time.monotonic() < deadline and any(
        store.lastStageAttempt(s).status().toString() != "COMPLETE" for s in stages
    ):
        time.sleep(0.1)
    peaks = [store.lastStageAttempt(s).peakExecutionMemory() for s in stages]
    assert stages and 0 < max(peaks) <= 8 * 2**20, peaks  # the sum over a stage's tasks of their peak


def test_building_a_column_costs_no_call_site_round_trips(spark):
    """With PySpark's DataFrame debugging on, every Column function also fetched the session and a conf and set
    the call site in the JVM: three more Py4J round trips per function, in every micro-batch's plan building."""
    import threading

    import py4j.clientserver
    from pyspark.sql import functions as F

    conn = py4j.clientserver.ClientServerConnection
    sent, original, me = [], conn.send_command, threading.get_ident()

    def counting(self, command):
        if threading.get_ident() == me:  # not a thread an earlier test left running in this process
            sent.append(command)
        return original(self, command)

    F.concat(F.lit("warm"), F.col("up"))  # the JVM class and method lookups of a first call are not counted
    conn.send_command = counting
    try:
        F.concat(F.lit("a"), F.col("b"))
    finally:
        conn.send_command = original
    # 3 functions (each a class lookup, a method lookup and the call) and the Seq of concat's two arguments (6);
    # with the call sites recorded, 25.
    assert len(sent) <= 15, sent


_DRIVER = """
import os, sys, threading, time
from jobs.core.settings import Settings
from jobs.core.spark import get_spark
spark = get_spark(Settings.from_env(), "mview-test-deathsig")
busy = threading.Thread(target=lambda: spark.range(10**12).selectExpr("sum(id)").collect(), daemon=True)
busy.start()
time.sleep(2)
print("ready", flush=True)
time.sleep(600)
"""


def _children(pid: int) -> list[int]:
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(p))
    return out


def test_the_driver_jvm_dies_with_a_killed_driver(tmp_path):
    env = {**os.environ, "LAKE_DIR": str(tmp_path), "SPARK_MASTER": "local[1]", "SPARK_DRIVER_MEMORY": "512m"}
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        jvms = [c for c in _children(proc.pid) if b"java" in open(f"/proc/{c}/cmdline", "rb").read()]
        assert len(jvms) == 1, jvms
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 2.0  # the kernel kills it at once; Spark's own exit took 4-25 s
        while os.path.exists(f"/proc/{jvms[0]}") and time.monotonic() < deadline:
            time.sleep(0.05)
        state = (
            open(f"/proc/{jvms[0]}/stat").read().split()[2] if os.path.exists(f"/proc/{jvms[0]}") else None
        )
        assert state in (None, "Z"), f"the driver's JVM {jvms[0]} still runs after its driver was killed"
    finally:
        proc.kill()


def test_resolved_jars_are_reused_while_every_file_is_there(spark, tmp_path):
    from jobs.core.spark import _jars_record, _known_jars, _remember_jars

    used = spark.sparkContext.getConf().get("spark.jars", "")
    assert "delta-spark" in used  # the session's Delta jars, resolved or remembered
    packages = f"test:mview-{os.getpid()}:{time.time_ns()}"
    jars = [tmp_path / "a.jar", tmp_path / "b.jar"]
    for j in jars:
        j.write_bytes(b"PK")
    listed = ",".join(f"file://{j}" for j in jars)
    try:
        assert _known_jars(packages) is None  # never resolved: Ivy resolves
        _remember_jars(packages, listed)
        assert _known_jars(packages) == listed
        assert _known_jars(packages + ",other:pkg:1") is None  # other packages: resolved anew
        jars[1].unlink()
        assert _known_jars(packages) is None  # a file gone from the Ivy cache: resolved anew
    finally:
        _jars_record(packages).unlink(missing_ok=True)


def _listening(pid: int) -> list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]]:
    """(address, port) of every TCP socket process `pid` listens on, from /proc/net/tcp{,6} (IPv4-mapped IPv6
    addresses as IPv4): the kernel's view, whatever the process logs."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:  # closed meanwhile
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = b"".join(bytes.fromhex(hex_addr[i : i + 8])[::-1] for i in range(0, len(hex_addr), 8))
            addr = ipaddress.ip_address(raw)
            if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
                addr = addr.ipv4_mapped
            out.append((addr, int(hex_port, 16)))
    return out


def _jvms(pid: int) -> list[int]:
    """The `java` processes among `pid` and its descendants."""
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += _children(p)
    out = []
    for p in tree:
        try:
            if Path(f"/proc/{p}/comm").read_text().strip() == "java":
                out.append(p)
        except OSError:
            pass
    return out


def _exposed(sockets) -> list[str]:
    return [f"{a}:{port}" for a, port in sockets if not a.is_loopback]


def test_the_sessions_driver_listens_on_loopback_only(spark):
    sockets = _listening(driver_jvm(spark).pid)
    assert len(sockets) >= 3, sockets  # Py4J's gateway, the RPC endpoint, the block manager
    assert _exposed(sockets) == [], f"the driver JVM listens beyond loopback: {sockets}"


def _job_listens_on_loopback_only(cmd: list[str], env: dict, settings, tmp_path: Path) -> None:
    """Start `cmd` (a continuous timeline job), wait until it runs, and check its JVM's listening sockets: the
    driver's RPC endpoint, its block manager and Spark's web UI (SPARK_UI=true), each on loopback only."""
    log = tmp_path / "job.out"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:

        def started() -> bool:
            status = read_status(settings, "timeline")
            return proc.poll() is not None or (
                status.get("state") == "running" and status.get("spark_ui_url")
            )

        wait_for(started, "the job to run", timeout_s=600)
        assert proc.poll() is None, log.read_text()[-3000:]
        ui = read_status(settings, "timeline")["spark_ui_url"]
        [jvm] = _jvms(proc.pid)
        sockets = _listening(jvm)
        assert int(ui.rstrip("/").rsplit(":", 1)[1]) in [port for _a, port in sockets], (ui, sockets)
        assert len(sockets) >= 4, sockets  # Py4J's gateway, RPC, block manager, web UI
        assert _exposed(sockets) == [], f"the job's JVM listens beyond loopback: {sockets}"
        assert ui.startswith("http://127.0.0.1:"), ui  # what it advertises
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)


def _job_env(tmp_path: Path, redis_url: str):
    settings = make_settings(
        tmp_path / "lake", redis_url, SPARK_MASTER="local[1]", SPARK_UI="true", SPARK_DRIVER_MEMORY="1g"
    )
    env = {**os.environ, **settings_env(settings), "METRICS_PORT": "off"}
    env.pop("SPARK_LOCAL_IP", None)  # what a user's shell has
    return settings, env


@pytest.mark.slow  # a continuous job in a JVM of its own
def test_a_job_run_through_mview_listens_on_loopback_only(tmp_path, redis_url):
    """Before: the RPC endpoint and the block manager listened on the machine's external address (its name
    resolves to 127.0.0.1 here, so Spark took the first other interface's) and the web UI on every interface."""
    settings, env = _job_env(tmp_path, redis_url)
    _job_listens_on_loopback_only([MVIEW, "run", "timeline"], env, settings, tmp_path)


@pytest.mark.slow  # a continuous job in a JVM of its own
def test_a_job_under_spark_submit_listens_on_loopback_only(tmp_path, redis_url):
    from jobs.core.submit import submit_command

    settings, env = _job_env(tmp_path, redis_url)
    _job_listens_on_loopback_only(
        [sys.executable, "-m", "jobs.core.submit", "run", "timeline"], env, settings, tmp_path
    )
    cmd = submit_command(settings, ["run", "timeline"])  # the command says so
    assert "spark.driver.bindAddress=127.0.0.1" in cmd and "spark.driver.host=127.0.0.1" in cmd
    cluster = make_settings(tmp_path / "lake", redis_url, SPARK_MASTER="spark://10.0.0.5:7077")
    assert not [a for a in submit_command(cluster, ["run", "timeline"]) if a.startswith("spark.driver.")]


def test_spark_submit_adds_s3a_and_the_log_store_for_a_lake_on_s3_and_never_its_credentials(
    tmp_path, redis_url
):
    from jobs.core.logstore import logstore_jar
    from jobs.core.spark import s3a_package
    from jobs.core.submit import submit_command

    s3 = make_settings(
        "s3a://bucket/lake",
        redis_url,
        S3_ENDPOINT="http://127.0.0.1:1",
        AWS_ACCESS_KEY_ID="k",
        AWS_SECRET_ACCESS_KEY="sekrit",
    )
    packages = submit_command(s3, ["run", "timeline"])
    packages = packages[packages.index("--packages") + 1]
    assert s3a_package() in packages.split(",") and s3a_package().startswith("org.apache.hadoop:hadoop-aws:")
    assert "sekrit" not in " ".join(submit_command(s3, ["run", "timeline"]))
    cmd = submit_command(s3, ["run", "timeline"])
    assert cmd[cmd.index("--jars") + 1] == str(logstore_jar()) and logstore_jar().stat().st_size > 0
    local = submit_command(make_settings(tmp_path / "lake", redis_url), ["run", "timeline"])
    assert "hadoop-aws" not in local[local.index("--packages") + 1] and "--jars" not in local
