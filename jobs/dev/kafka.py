"""`python -m jobs.dev.kafka start|stop` (`make kafka`, `make kafka-stop`): a development Apache Kafka broker.
`scratch_kafka`: a throw-away one for tests and benchmarks.

The broker is Apache Kafka `KAFKA_VERSION` (`org.apache.kafka:kafka_2.13` and its dependencies from Maven Central),
resolved once with `mvn dependency:copy-dependencies` into `<venv>/mview-kafka/<version>/lib` (`broker_lib`). It
runs as one process in KRaft mode, broker and controller at once, on loopback only, with a small heap: the log
directory is formatted (`kafka.tools.StorageTool format`) on first use, then `kafka.Kafka server.properties`
starts it. Topics are never created automatically: the producer (`mview produce`) and the `kafka` job create
the topics they use, with `changelog.kafka.PARTITIONS` partitions.

- start: if a broker answers at KAFKA_BOOTSTRAP, nothing is done; else, for a loopback address, a broker starts
  there (controller on the next port) with its data and `server.log` under `LAKE_DIR/kafka`, its pid in
  `LAKE_DIR/kafka/pid`, and the command returns once it answers. Not loopback: a one-line error.
- stop: SIGTERM to the broker the pid file names (a clean shutdown), SIGKILL after 30 s.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from changelog.kafka import MAX_MESSAGE_BYTES, probe
from jobs.core.settings import Settings
from jobs.errors import JobsError, KafkaBrokerFailed

__all__ = [
    "KAFKA_VERSION",
    "LOG4J_VERSION",
    "broker_lib",
    "maven_lib",
    "java_exe",
    "new_cluster_id",
    "format_log_dir",
    "start_broker",
    "wait_broker",
    "scratch_kafka",
    "main",
]

KAFKA_VERSION = "4.4.0"  # the newest Kafka 4.x on Maven Central; runs on Java 17
LOG4J_VERSION = "2.25.5"  # the log4j-core Kafka brings; its slf4j binding sends the log lines to server.log
_MVN_MISSING = "mvn (Maven) is not installed, it fetches the Kafka broker's jars: apt-get install -y maven"
_JAVA_MISSING = (
    "java is not installed, the Kafka broker needs Java 17+: apt-get install -y openjdk-17-jre-headless"
)
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>mview</groupId><artifactId>kafka-broker</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>@V@</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>@L@</version></dependency>
  </dependencies>
</project>
"""
_LOG_CONFIG = """Configuration:
  Appenders:
    Console: {name: STDOUT, PatternLayout: {pattern: "[%d] %p %m (%c)%n"}}
  Loggers:
    Root: {level: INFO, AppenderRef: [{ref: STDOUT}]}
    Logger:
      - {name: kafka.request.logger, level: WARN}
      - {name: org.apache.kafka.controller, level: WARN}
      - {name: state.change.logger, level: WARN}
"""


def broker_lib(version: str = KAFKA_VERSION) -> Path:
    """The directory holding the broker's jars, resolved from Maven Central on first use (needs `mvn`)."""
    pom = _POM.replace("@V@", version).replace("@L@", LOG4J_VERSION)
    return maven_lib(Path(sys.prefix) / "mview-kafka" / version / "lib", pom, f"Kafka {version}")


def maven_lib(lib: Path, pom: str, what: str, error: type[JobsError] = KafkaBrokerFailed) -> Path:
    """`lib` holding the runtime jars of `pom`'s dependencies (`what` names them in errors), copied from Maven
    Central by `mvn dependency:copy-dependencies` on first use; `error` (saying what to do) if that fails."""
    if (lib / ".complete").exists():
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise error(_MVN_MISSING.replace("the Kafka broker's jars", f"the jars of {what}"))
    lib.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=lib.parent) as tmp:
        (Path(tmp) / "pom.xml").write_text(pom)
        out = Path(tmp) / "lib"
        cmd = [
            mvn,
            "-q",
            "-B",
            "dependency:copy-dependencies",
            f"-DoutputDirectory={out}",
            "-DincludeScope=runtime",
        ]
        done = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0:
            out_text = re.sub(r"\x1b\[[0-9;]*m", "", done.stdout + done.stderr)  # mvn's colours
            errors = [ln for ln in out_text.splitlines() if "ERROR" in ln]
            raise error(
                f"mvn could not fetch {what} from Maven Central: {(errors or ['no output'])[0].strip()}"
            )
        (out / ".complete").touch()
        shutil.rmtree(lib, ignore_errors=True)
        out.replace(lib)
    return lib


def _properties(data: Path, port: int, controller: int) -> str:
    return f"""process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data / "logs"}
num.partitions=3
default.replication.factor=1
auto.create.topics.enable=false
message.max.bytes={MAX_MESSAGE_BYTES + 4096}
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.retention.check.interval.ms=5000
"""


def java_exe() -> str:
    """The `java` of JAVA_HOME, else of PATH; KafkaBrokerFailed (saying how to install it) without one."""
    java = Path(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else None
    exe = str(java) if java and java.is_file() else shutil.which("java")
    if exe is None:
        raise KafkaBrokerFailed(_JAVA_MISSING)
    return exe


def new_cluster_id() -> str:
    """A fresh KRaft cluster id: the urlsafe base64 of a random UUID (22 characters; 1 in 64 starts with `-`)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def format_log_dir(data: Path, cluster_id: str) -> None:
    """Format the broker's log directory under `data` (its `server.properties` written) for `cluster_id`.
    The id is passed as `--cluster-id=<id>`: one argument, so an id that starts with `-` is not read as an
    option. KafkaBrokerFailed with the tool's own words if it fails."""
    props = data / "server.properties"
    fmt = [java_exe(), "-Xmx256m", "-cp", f"{broker_lib()}/*", "kafka.tools.StorageTool", "format"]
    done = subprocess.run(
        [*fmt, f"--cluster-id={cluster_id}", "-c", str(props)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise KafkaBrokerFailed(
            f"formatting {data / 'logs'} failed: {(done.stdout + done.stderr).strip()[-300:]}"
        )


def start_broker(data: Path, port: int, controller: int, *, detach: bool) -> subprocess.Popen:
    """Start a broker on 127.0.0.1:`port` (controller on `controller`) with its files under `data`, formatting
    the log directory on first use; return the process (not yet answering: see `_wait`). detach: in its own
    session, outliving this process; else it dies with the thread that started it (Linux, `setpriv`)."""
    lib, java = broker_lib(), java_exe()
    data.mkdir(parents=True, exist_ok=True)
    props, log_config = data / "server.properties", data / "log4j2.yaml"
    props.write_text(_properties(data, port, controller))
    log_config.write_text(_LOG_CONFIG)
    cp = f"{lib}/*"
    if not (data / "logs" / "meta.properties").exists():
        format_log_dir(data, new_cluster_id())
    cmd = [java, "-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"]
    cmd += [f"-Dlog4j2.configurationFile={log_config}", "-cp", cp, "kafka.Kafka", str(props)]
    setpriv = shutil.which("setpriv")
    if not detach and setpriv:
        cmd = [setpriv, "--pdeathsig", "KILL", *cmd]
    with open(data / "server.log", "ab") as out:
        return subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=detach
        )


def wait_broker(proc: subprocess.Popen, bootstrap: str, log: Path, timeout_s: float = 90.0) -> None:
    """Return once the broker `proc` answers at `bootstrap`; KafkaBrokerFailed (with the end of `log`) if it
    exits or does not answer within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-3:]
            raise KafkaBrokerFailed(
                f"the Kafka broker exited (code {proc.returncode}); see {log}: {' | '.join(tail)}"
            )
        if probe(bootstrap, timeout=1.0) is None:
            return
        time.sleep(0.2)
    proc.kill()
    raise KafkaBrokerFailed(
        f"the Kafka broker did not answer at {bootstrap} within {timeout_s:.0f} s; see {log}"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scratch_kafka(workdir: Path) -> tuple[subprocess.Popen, str]:
    """Start a broker on free loopback ports with its files under `workdir`; return the process (the caller
    terminates it) and its bootstrap address once it answers. KafkaBrokerFailed (saying what to do) if it cannot."""
    port, controller = _free_port(), _free_port()
    proc = start_broker(Path(workdir), port, controller, detach=False)
    bootstrap = f"127.0.0.1:{port}"
    wait_broker(proc, bootstrap, Path(workdir) / "server.log")
    return proc, bootstrap


def _start(s: Settings) -> int:
    bootstrap = s.kafka_bootstrap or "127.0.0.1:9092"
    if probe(bootstrap, timeout=2.0) is None:
        print(f"a Kafka broker answers at {bootstrap}")
        return 0
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if host not in ("127.0.0.1", "localhost") or not port.isdigit():
        print(
            f"no Kafka broker answers at KAFKA_BOOTSTRAP={bootstrap} and it is not loopback: start that broker",
            file=sys.stderr,
        )
        return 1
    data = s.lake_dir / "kafka"
    started = time.monotonic()
    try:
        proc = start_broker(data, int(port), int(port) + 1, detach=True)
        (data / "pid").write_text(f"{proc.pid}\n")
        wait_broker(proc, bootstrap, data / "server.log")
    except KafkaBrokerFailed as e:
        print(e, file=sys.stderr)
        return 1
    took = time.monotonic() - started
    print(
        f"started Kafka {KAFKA_VERSION} at {bootstrap} in {took:.1f}s (data and server.log in {data}; `make kafka-stop` stops it)"
    )
    return 0


def _stop(s: Settings) -> int:
    pid_file = s.lake_dir / "kafka" / "pid"
    try:
        pid = int(pid_file.read_text().strip())
        os.kill(pid, signal.SIGTERM)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        print("no Kafka broker started by `make kafka` is running; nothing to do")
        pid_file.unlink(missing_ok=True)
        return 0
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
        time.sleep(0.2)
    if Path(f"/proc/{pid}").exists():
        os.kill(pid, signal.SIGKILL)
    pid_file.unlink(missing_ok=True)
    print(f"stopped the Kafka broker (pid {pid})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    action = args[0] if args else "start"
    if action not in ("start", "stop"):
        print("usage: python -m jobs.dev.kafka start|stop", file=sys.stderr)
        return 2
    s = Settings.from_env()
    return _start(s) if action == "start" else _stop(s)


if __name__ == "__main__":
    sys.exit(main())
