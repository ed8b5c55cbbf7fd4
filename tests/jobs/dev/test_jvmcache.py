"""The driver JVM's AOT cache: the JDK wrapper, when a cache is used, and the training's workload of any pipeline
(no Spark started here)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from changelog.records import validate
from jobs.core.jvm import driver_java, spark_jars_stamp
from jobs.core.settings import Settings
from jobs.dev.jvmcache import (
    HOT,
    LIMIT,
    Synth,
    _write_wrapper,
    heavy_entries,
    match_fields,
    training_workload,
)
from spec.model import Pipeline
from views.pipeline import load_pipeline

ROOT = Path(__file__).resolve().parents[3]

JAVA = shutil.which("java")


@pytest.mark.skipif(JAVA is None, reason="no java on PATH")
def test_wrapper_drops_only_the_incubator_module_option(tmp_path):
    java = Path(JAVA).resolve()
    wrapper = _write_wrapper(tmp_path / "jdk", java)
    args = [
        "--add-modules=jdk.incubator.vector",
        "-Dmview.probe=kept",
        "-XshowSettings:properties",
        "-version",
    ]
    direct = subprocess.run([str(java), *args], capture_output=True, text=True).stderr
    wrapped = subprocess.run([str(wrapper), *args], capture_output=True, text=True).stderr
    assert "incubator" in direct  # the JVM names the module when it is given
    assert "incubator" not in wrapped
    assert "mview.probe = kept" in wrapped


def _settings(tmp_path, **env) -> Settings:
    return Settings.from_env({"JVM_CACHE": str(tmp_path), "SPARK_MASTER": "local[2]", **env})


def test_a_cache_is_used_only_when_present_and_built_for_these_jars(tmp_path):
    s = _settings(tmp_path)
    assert driver_java(s) is None  # nothing built
    (tmp_path / "spark.aot").write_bytes(b"x")
    stamp = {"java": sys.executable, "jars": spark_jars_stamp()}
    (tmp_path / "stamp.json").write_text(json.dumps(stamp))
    assert driver_java(s) is None  # no JDK wrapper to start it with
    _write_wrapper(tmp_path / "jdk", Path(sys.executable))
    home, opts = driver_java(s)
    assert home == str(tmp_path / "jdk")
    assert f"-XX:AOTCache={tmp_path / 'spark.aot'}" in opts.split()
    assert driver_java(_settings(tmp_path, SPARK_MASTER="spark://elsewhere:7077")) is None
    assert driver_java(s, "spark://elsewhere:7077") is None  # get_spark's master= overrides SPARK_MASTER
    assert driver_java(_settings(tmp_path, JVM_CACHE="off")) is None
    (tmp_path / "stamp.json").write_text(json.dumps({**stamp, "jars": "pyspark 0.0, 1 bytes of jars"}))
    assert driver_java(s) is None  # other Spark jars than it was built for
    (tmp_path / "stamp.json").write_text(json.dumps({**stamp, "java": str(tmp_path / "gone")}))
    assert driver_java(s) is None  # its JDK is gone


def test_the_default_cache_lives_in_the_venv():
    assert Settings.from_env({}).jvm_cache == Path(sys.prefix) / "mview-jvm"
    assert Settings.from_env({"JVM_CACHE": "off"}).jvm_cache is None


def test_the_cache_is_never_built_on_its_own_wrapper(tmp_path, monkeypatch):
    # get_spark points JAVA_HOME at the wrapper; a rebuild that took it as the JDK would write a wrapper that
    # runs itself. Every java counts as 25 here, so only the exclusion keeps the wrapper out.
    import jobs.dev.jvmcache as jvmcache

    wrapper = _write_wrapper(tmp_path / "cache" / "jdk", Path(sys.executable))
    monkeypatch.setattr(jvmcache, "_java_major", lambda java: 25)
    monkeypatch.setenv("JAVA_HOME", str(wrapper.parent.parent))
    monkeypatch.delenv("JVM_CACHE_JDK", raising=False)
    found = jvmcache._find_jdk(tmp_path / "cache")
    assert found is None or not found.is_relative_to((tmp_path / "cache").resolve())


# --- The training's workload: synthetic records of any pipeline's topics, made from their declarations. ---

PIPELINES = ROOT / "timeline_demo" / "pipelines"
_TYPES_FILE = """
topics:
  things:
    fields: {thing_id: id, label: string, count: long, weight: double, flag: boolean, seen: timestamp,
             note: string, ts: timestamp}
    optional: [note]
    id: thing_id
    time: ts
  kinds:
    fields: {label: string, size: long, ts: timestamp}
    key: label
    time: ts
    op: {upsert: set, remove: unset}
jobs:
  tagged:
    asof: {stream: things, table: kinds, match: {label: label}}
    views:
      by_label:
        count: {label: label}
        values: {n: 1}
"""


def _pipelines(tmp_path) -> dict[str, Pipeline]:
    (tmp_path / "types.yml").write_text(_TYPES_FILE)
    out = {p.stem: load_pipeline(p) for p in sorted(PIPELINES.glob("*.yml"))}
    return {**out, "types": load_pipeline(tmp_path / "types.yml")}


def test_every_record_of_every_pipelines_workload_is_valid_for_its_topic(tmp_path):
    for name, pipeline in _pipelines(tmp_path).items():
        workload = training_workload(pipeline, scale=0.1)
        read = {t for job in pipeline.jobs.values() for t in job.topics}
        assert set(workload) == read, name
        for topic, records in workload.items():
            assert records, (name, topic)
            for r in records:
                validate(pipeline.topics[topic], r)  # raises InvalidRecord with the reason


def test_the_workload_has_every_type_and_kind_of_record(tmp_path):
    pipeline = _pipelines(tmp_path)["types"]
    workload = training_workload(pipeline, scale=0.2)
    things, kinds = workload["things"], workload["kinds"]
    seen = {type(r[f]) for r in things for f in ("count", "weight", "flag", "seen", "ts")}
    assert {int, float, bool, str} <= seen  # longs, doubles, booleans; timestamps as epoch ms and as ISO text
    assert any(isinstance(r["ts"], str) for r in things) and any(isinstance(r["ts"], int) for r in things)
    assert any("note" not in r for r in things) and any("note" in r for r in things)  # optional
    assert len({r["thing_id"] for r in things}) < len(things)  # delivered twice
    assert {r["op"] for r in kinds} == {"set", "unset"}
    assert max(Counter(r["label"] for r in kinds).values()) > 1  # a key's changes


def test_hot_values_cross_the_fan_out_limit_and_the_heavy_batches_carry_one(tmp_path):
    pipeline = _pipelines(tmp_path)["builtin"]
    left, right = pipeline.jobs["timeline"].topics
    on_left, on_right = pipeline.jobs["timeline"].spec.match[0]
    workload = training_workload(pipeline)
    upserts = [r for r in workload[right] if r["op"] == pipeline.topics[right].op[0]]
    hot = Counter(r[on_right] for r in upserts).most_common(HOT)
    assert [v for v, _ in hot] and all(n > 2 * LIMIT for _, n in hot), hot
    assert sorted(v for v, _ in hot) == [str(i) for i in range(HOT)]
    entries = heavy_entries(Synth(pipeline, seed=6, first=10**9), pipeline, "timeline", 0, 4)
    ids = {r[i] for r in workload[left] for i in pipeline.topics[left].key}
    assert len(entries) == 4 and all(r[on_left] == "0" for r in entries)
    assert not ids & {e[i] for e in entries for i in pipeline.topics[left].key}  # new entries
    for r in entries:
        validate(pipeline.topics[left], r)


def test_an_asof_jobs_pins_name_versions_of_its_table(tmp_path):
    pipeline = _pipelines(tmp_path)["builtin"]
    (asof,) = [j for j in pipeline.jobs.values() if j.kind == "asof"]
    workload = training_workload(pipeline)
    table = pipeline.topics[asof.spec.table]
    versions = {"|".join(str(r[f]) for f in table.key) for r in workload[asof.spec.table]}
    pins = [r[asof.spec.pin] for r in workload[asof.spec.stream] if asof.spec.pin in r]
    assert pins and sum(p.rsplit("@", 1)[0] in versions for p in pins) > len(pins) / 2


def test_the_workload_is_seeded(tmp_path):
    pipeline = _pipelines(tmp_path)["shop"]
    assert training_workload(pipeline, scale=0.05) == training_workload(pipeline, scale=0.05)
    assert match_fields(pipeline)["payments"] == {"order_id", "currency"}
