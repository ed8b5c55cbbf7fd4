"""Delta's log store for a lake on S3 (`LOGSTORE_CLASS`, source in `java/ConditionalPutLogStore.java`): Spark
commits each Delta version with one conditional create (`If-None-Match: *`, Hadoop S3A's
`fs.option.create.conditional.overwrite`), as delta-rs does, so Spark and delta-rs writers on any machines can
commit to one table at once and a lost race becomes Delta's retry, never an overwritten commit.

`logstore_jar()` compiles the class once with `javac` against PySpark's Hadoop client and `delta-storage` of the
installed delta-spark (its jar fetched once from Maven Central, `MAVEN_REPO`) into
`<venv>/mview-java/logstore-<digest>/mview-logstore.jar`; `get_spark` puts it on the driver's class path (only
the driver commits) and sets `spark.delta.logStore.s3a.impl` (`logstore_conf`)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
import zipfile
from importlib.metadata import version
from pathlib import Path

from jobs.errors import JobsError

__all__ = ["LOGSTORE_CLASS", "logstore_jar", "logstore_conf", "LogStoreUnavailable"]

LOGSTORE_CLASS = "mview.delta.ConditionalPutLogStore"
_SOURCE = Path(__file__).with_name("java") / "ConditionalPutLogStore.java"
_JAVAC_MISSING = (
    "javac is not installed; it compiles the Delta log store of an S3 lake (one class): "
    "apt-get install -y openjdk-17-jdk-headless"
)


class LogStoreUnavailable(JobsError):
    """The log store's jar cannot be built (`reason` says what to do)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def logstore_conf() -> dict[str, str]:
    """The Spark settings that make Delta commit on `s3a://` through the log store."""
    return {"spark.delta.logStore.s3a.impl": LOGSTORE_CLASS}


def logstore_jar() -> Path:
    """The log store's jar, compiled on first use (and again when its source or delta-spark changes)."""
    delta = version("delta-spark")
    source = _SOURCE.read_text()
    digest = hashlib.sha256(f"{delta}\n{source}".encode()).hexdigest()[:12]
    root = Path(sys.prefix) / "mview-java"
    jar = root / f"logstore-{digest}" / "mview-logstore.jar"
    if jar.exists():
        return jar
    storage = _delta_storage_jar(root, delta)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root) as tmp:
        classes = Path(tmp, "classes")
        _javac(_SOURCE, classes, [storage, *_pyspark_jars()])
        built = Path(tmp, "mview-logstore.jar")
        with zipfile.ZipFile(built, "w") as z:
            for f in sorted(classes.rglob("*.class")):
                z.write(f, f.relative_to(classes).as_posix())
        jar.parent.mkdir(exist_ok=True)
        os.replace(built, jar)  # whole or absent, also when two processes build it at once
    return jar


def _pyspark_jars() -> list[Path]:
    import pyspark

    homes = [os.environ.get("SPARK_HOME", ""), str(Path(pyspark.__file__).parent)]
    return [Path(h, "jars", "*") for h in homes if h and Path(h, "jars").is_dir()]


def _javac(source: Path, out: Path, class_path: list[Path]) -> None:
    javac = shutil.which("javac")
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "javac").is_file():
        javac = str(Path(home, "bin", "javac"))
    if javac is None:
        raise LogStoreUnavailable(_JAVAC_MISSING)
    cp = ":".join(str(p) for p in class_path)
    done = subprocess.run(
        [javac, "-nowarn", "--release", "17", "-cp", cp, "-d", str(out), str(source)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise LogStoreUnavailable(
            f"javac could not compile {source.name}: {(done.stderr or done.stdout)[:300]}"
        )


def _delta_storage_jar(root: Path, delta: str) -> Path:
    """`io.delta:delta-storage:<delta>`'s jar, from Maven Central once, checked against its published SHA-1."""
    jar = root / f"delta-storage-{delta}.jar"
    if jar.exists():
        return jar
    repo = os.environ.get("MAVEN_REPO", "https://repo1.maven.org/maven2").rstrip("/")
    url = f"{repo}/io/delta/delta-storage/{delta}/delta-storage-{delta}.jar"
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            body = r.read()
        with urllib.request.urlopen(url + ".sha1", timeout=60) as r:
            want = r.read().decode().split()[0].strip()
    except OSError as e:
        raise LogStoreUnavailable(
            f"cannot fetch {url} ({e}); the Delta log store of an S3 lake is compiled against it: "
            "make Maven Central reachable or set MAVEN_REPO to a mirror"
        ) from None
    if hashlib.sha1(body).hexdigest() != want:
        raise LogStoreUnavailable(f"{url} does not match its published SHA-1; fetch it again")
    root.mkdir(parents=True, exist_ok=True)
    tmp = jar.with_name(f".{jar.name}.{os.getpid()}")
    tmp.write_bytes(body)
    os.replace(tmp, jar)
    return jar
