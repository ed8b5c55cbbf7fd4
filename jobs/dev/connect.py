"""`scratch_connect`: a throw-away Kafka Connect worker (standalone mode) running the Debezium PostgreSQL
connector, for tests that feed the `profiles` topic from real Debezium change events.

The worker is Apache Kafka Connect `CONNECT_VERSION` (`org.apache.kafka:connect-runtime`, `connect-json`,
`connect-transforms`) with `io.debezium:debezium-connector-postgres` `DEBEZIUM_VERSION` on one classpath, all
resolved once with `mvn dependency:copy-dependencies` into `<venv>/mview-connect/<connect>-<debezium>/lib`
(`connect_lib`). Connect speaks the Kafka protocol, so this worker runs beside a broker of another 4.x version.
It starts as `org.apache.kafka.connect.cli.ConnectStandalone worker.properties connector.properties...`, with
its source offsets in a file and its REST interface on a free loopback port; its log is `connect.log`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from jobs.dev.kafka import LOG4J_VERSION, java_exe, maven_lib
from jobs.errors import JobsError, KafkaConnectFailed

__all__ = [
    "CONNECT_VERSION",
    "DEBEZIUM_VERSION",
    "connect_lib",
    "debezium_postgres",
    "scratch_connect",
    "wait_connect",
]

CONNECT_VERSION = "4.3.1"  # the newest connect-runtime on Maven Central (Debezium 3.6 is built against 4.3.0)
DEBEZIUM_VERSION = "3.6.1.Final"  # the newest Debezium whose parent POMs are all on Maven Central; Java 17
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>mview</groupId><artifactId>kafka-connect</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-runtime</artifactId><version>@C@</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-json</artifactId><version>@C@</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>connect-transforms</artifactId><version>@C@</version></dependency>
    <dependency><groupId>io.debezium</groupId><artifactId>debezium-connector-postgres</artifactId><version>@D@</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId><version>@L@</version></dependency>
  </dependencies>
</project>
"""
_LOG_CONFIG = """Configuration:
  Appenders:
    Console: {name: STDOUT, PatternLayout: {pattern: "[%d] %p %m (%c)%n"}}
  Loggers:
    Root: {level: INFO, AppenderRef: [{ref: STDOUT}]}
    Logger:
      - {name: org.apache.kafka.clients, level: WARN}
      - {name: org.apache.kafka.common, level: WARN}
      - {name: org.reflections, level: ERROR}
"""


def connect_lib(connect: str = CONNECT_VERSION, debezium: str = DEBEZIUM_VERSION) -> Path:
    """The directory holding the worker's and connector's jars, resolved from Maven Central on first use."""
    lib = Path(sys.prefix) / "mview-connect" / f"{connect}-{debezium}" / "lib"
    pom = _POM.replace("@C@", connect).replace("@D@", debezium).replace("@L@", LOG4J_VERSION)
    what = f"Kafka Connect {connect} and Debezium {debezium}"
    return maven_lib(lib, pom, what, KafkaConnectFailed)


def debezium_postgres(
    name: str, dsn: dict[str, str], table: str, slot: str, topic: str, **extra: str
) -> dict:
    """The properties of a Debezium PostgreSQL connector `name` capturing `public.<table>` through `pgoutput`
    with its own slot and publication `slot` (a filtered publication it creates), every event routed to the
    Kafka topic `topic` (a delete's tombstone, a null message, too). `dsn`: host, port, dbname, user (password
    optional); `extra` adds or overrides properties (e.g. `value.converter.schemas.enable`)."""
    props = {
        "name": name,
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "tasks.max": "1",
        "database.hostname": dsn["host"],
        "database.port": dsn["port"],
        "database.dbname": dsn["dbname"],
        "database.user": dsn["user"],
        "database.password": dsn.get("password", ""),
        "topic.prefix": name,
        "plugin.name": "pgoutput",
        "slot.name": slot,
        "publication.name": slot,
        "publication.autocreate.mode": "filtered",
        "table.include.list": f"public.{table}",
        "transforms": "route",
        "transforms.route.type": "org.apache.kafka.connect.transforms.RegexRouter",
        "transforms.route.regex": ".*",
        "transforms.route.replacement": topic,
    }
    return {**props, **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(workdir: Path, bootstrap: str) -> str:
    return f"""bootstrap.servers={bootstrap}
key.converter=org.apache.kafka.connect.json.JsonConverter
value.converter=org.apache.kafka.connect.json.JsonConverter
key.converter.schemas.enable=false
value.converter.schemas.enable=true
offset.storage.file.filename={workdir / "offsets"}
offset.flush.interval.ms=1000
listeners=http://127.0.0.1:{_free_port()}
plugin.discovery=only_scan
"""


def _props(values: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in values.items())


def scratch_connect(workdir: Path, bootstrap: str, connectors: list[dict]) -> subprocess.Popen:
    """Start a standalone Connect worker with the broker `bootstrap` running `connectors` (property dicts, e.g.
    `debezium_postgres(...)`), its files under `workdir`; return the process (the caller terminates it). It
    dies with the thread that started it (Linux, `setpriv`). KafkaConnectFailed if the jars or java are
    missing."""
    try:
        lib, java = connect_lib(), java_exe()
    except JobsError as e:
        raise KafkaConnectFailed(str(e)) from None
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "worker.properties").write_text(_worker(workdir, bootstrap))
    (workdir / "log4j2.yaml").write_text(_LOG_CONFIG)
    files = []
    for c in connectors:
        files.append(workdir / f"{c['name']}.properties")
        files[-1].write_text(_props(c))
    cmd = [java, "-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"]
    cmd += [f"-Dlog4j2.configurationFile={workdir / 'log4j2.yaml'}", "-cp", f"{lib}/*"]
    cmd += ["org.apache.kafka.connect.cli.ConnectStandalone", str(workdir / "worker.properties")]
    cmd += [str(f) for f in files]
    setpriv = shutil.which("setpriv")
    if setpriv:
        cmd = [setpriv, "--pdeathsig", "KILL", *cmd]
    with open(workdir / "connect.log", "ab") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)


def wait_connect(proc: subprocess.Popen, log: Path, ready, timeout_s: float = 120.0) -> None:
    """Return once `ready()` is true; KafkaConnectFailed (with the end of `log`) if the worker exits first or
    `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise KafkaConnectFailed(
                f"the Kafka Connect worker exited (code {proc.returncode}); see {log}: {' | '.join(tail)}"
            )
        if ready():
            return
        time.sleep(0.3)
    raise KafkaConnectFailed(f"the Kafka Connect worker was not ready within {timeout_s:.0f} s; see {log}")
