"""The driver JVM's AOT cache: the JDK wrapper and when a cache is used (no Spark started here)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.core.settings import Settings
from jobs.dev.jvmcache import _spark_jars_stamp, _write_wrapper, driver_java

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
    stamp = {"java": sys.executable, "jars": _spark_jars_stamp()}
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
