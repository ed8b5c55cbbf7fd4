"""`python -m jobs.dev.hdfs start|stop` (`make hdfs`, `make hdfs-stop`): a development HDFS; `scratch_hdfs` for tests.

The server is Hadoop's own NameNode and one DataNode in one JVM: `MiniDFSCluster` of
`org.apache.hadoop:hadoop-client-minicluster`, of the Hadoop version PySpark ships (`hadoop_version`, read from
the `hadoop-client-api` jar in pyspark's jars), resolved once with `mvn dependency:copy-dependencies` into
`<venv>/mview-hadoop/<version>/lib`. A small Java launcher (`_LAUNCHER`, compiled once with `javac` beside the
jars) builds the cluster with a fixed NameNode port and web port, formats its directories on first use only (a
restart keeps every file), and prints `READY` once the DataNode has registered and the NameNode has left safe
mode. Everything listens on 127.0.0.1 only: the NameNode's RPC at `hdfs://127.0.0.1:<port>`, its web UI and
WebHDFS at `http://127.0.0.1:<web port>/webhdfs/v1/`, the DataNode's ports (chosen by the OS). Development
settings: replication 1, permission checks off (any client user may write anywhere), no security.

- start: if something accepts connections at HDFS_URL's host and port (default `hdfs://127.0.0.1:9000`), nothing
  is done; else, for a loopback address, the cluster starts there with its data and `hdfs.log` under
  `dev_dir("hdfs")` (LAKE_DIR/hdfs), its web port 9870 (Hadoop's) when free, else one the OS picks (written to
  `webhdfs.url` there), its pid in `pid`, and the command returns once it answers. Not loopback: a one-line error.
- stop: SIGTERM to the JVM (the launcher then stops the DataNode and the NameNode and exits), SIGKILL after 30 s.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

import pyspark

from jobs.dev import (
    DevServerFailed,
    dev_dir,
    free_port,
    jar_lib,
    java_exe,
    port_answers,
    spawn,
    stop_pid_file,
    wait_until,
)

__all__ = [
    "DEFAULT_URL",
    "WEB_PORT",
    "hadoop_version",
    "hdfs_lib",
    "launcher_classes",
    "start_hdfs",
    "wait_hdfs",
    "scratch_hdfs",
    "HdfsServer",
    "webhdfs_answers",
    "main",
]

DEFAULT_URL = "hdfs://127.0.0.1:9000"
WEB_PORT = 9870  # Hadoop's default NameNode web port, used by `make hdfs` when free
_LAUNCHER_CLASS = "MviewMiniHdfs"
_JAVAC_MISSING = (
    "javac is not installed, it compiles the HDFS launcher (a few lines of Java): "
    "apt-get install -y openjdk-17-jdk-headless"
)
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>mview</groupId><artifactId>hdfs-minicluster</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-minicluster</artifactId>
      <version>@V@</version></dependency>
    <dependency><groupId>org.apache.hadoop</groupId><artifactId>hadoop-client-runtime</artifactId>
      <version>@V@</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
"""
_LOG4J = """log4j.rootLogger=WARN, out
log4j.logger.org.apache.hadoop.hdfs.MiniDFSCluster=INFO
log4j.logger.org.apache.hadoop.hdfs.server.namenode.NameNode=INFO
log4j.appender.out=org.apache.log4j.ConsoleAppender
log4j.appender.out.layout=org.apache.log4j.PatternLayout
log4j.appender.out.layout.ConversionPattern=[%d] %p %m (%c)%n
"""
# The launcher: args = base directory, NameNode RPC port, NameNode web port. Formats on first use only (the marker
# file says a format completed), so a restart keeps the namespace and the blocks.
_LAUNCHER = """import java.io.File;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

public class MviewMiniHdfs {
  public static void main(String[] args) throws Exception {
    File base = new File(args[0]).getAbsoluteFile();
    File formatted = new File(base, ".mview-formatted");
    boolean fresh = !formatted.exists();
    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, base.getPath());
    conf.setBoolean("dfs.permissions.enabled", false);
    conf.setInt("dfs.replication", 1);
    conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
    conf.set("dfs.namenode.http-bind-host", "127.0.0.1");
    conf.setBoolean("dfs.webhdfs.enabled", true);
    MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
        .nameNodePort(Integer.parseInt(args[1]))
        .nameNodeHttpPort(Integer.parseInt(args[2]))
        .numDataNodes(1)
        .storagesPerDatanode(1)
        .format(fresh)
        .manageNameDfsDirs(true)
        .manageDataDfsDirs(true)
        .waitSafeMode(true)
        .build();
    cluster.waitActive();
    if (fresh) {
      formatted.createNewFile();
    }
    // On SIGTERM or SIGINT: stop the DataNode and the NameNode, then exit (a JVM shutdown hook would race
    // Hadoop's own hooks, which refuse changes once the JVM's shutdown has begun).
    sun.misc.SignalHandler stop = signal -> {
      cluster.shutdown();
      System.out.println("STOPPED");
      System.out.flush();
      Runtime.getRuntime().halt(0);
    };
    sun.misc.Signal.handle(new sun.misc.Signal("TERM"), stop);
    sun.misc.Signal.handle(new sun.misc.Signal("INT"), stop);
    System.out.println("READY pid=" + ProcessHandle.current().pid() + " " + cluster.getURI() + " http://127.0.0.1:" + args[2]);
    System.out.flush();
    Thread.currentThread().join();
  }
}
"""


def hadoop_version() -> str:
    """The Hadoop version of the client jars PySpark ships (`pyspark/jars/hadoop-client-api-<version>.jar`)."""
    jars = sorted((Path(pyspark.__file__).parent / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise DevServerFailed("pyspark ships no hadoop-client-api jar: reinstall pyspark (make setup)")
    return jars[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def hdfs_lib(version: str | None = None) -> Path:
    """The directory holding the minicluster's jars, resolved from Maven Central on first use (needs `mvn`)."""
    version = version or hadoop_version()
    pom = _POM.replace("@V@", version)
    return jar_lib("hadoop", version, pom, f"the HDFS minicluster (Hadoop {version})")


def launcher_classes(lib: Path) -> Path:
    """The directory holding the compiled launcher (and its log4j.properties), beside `lib`; compiled with
    `javac` when missing or when `_LAUNCHER` changed."""
    digest = hashlib.sha256((_LAUNCHER + _LOG4J).encode()).hexdigest()[:12]
    out = lib.parent / f"launcher-{digest}"
    if (out / f"{_LAUNCHER_CLASS}.class").exists():
        return out
    javac = shutil.which("javac")
    if os.environ.get("JAVA_HOME") and Path(os.environ["JAVA_HOME"], "bin", "javac").is_file():
        javac = str(Path(os.environ["JAVA_HOME"], "bin", "javac"))
    if javac is None:
        raise DevServerFailed(_JAVAC_MISSING)
    tmp = lib.parent / f".launcher-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / f"{_LAUNCHER_CLASS}.java").write_text(_LAUNCHER)
    (tmp / "log4j.properties").write_text(_LOG4J)
    cmd = [javac, "-nowarn", "-cp", f"{lib}/*", "-d", str(tmp), str(tmp / f"{_LAUNCHER_CLASS}.java")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DevServerFailed(
            f"javac could not compile the HDFS launcher: {(done.stderr or done.stdout)[:300]}"
        )
    try:
        tmp.replace(out)
    except OSError:  # another process compiled it meanwhile
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def start_hdfs(data: Path, port: int, web_port: int, *, detach: bool) -> subprocess.Popen:
    """Start the NameNode (RPC on 127.0.0.1:`port`, web and WebHDFS on `web_port`) and a DataNode with their
    files under `data/dfs`, the log in `data/hdfs.log`; return the JVM's process (not yet ready: `wait_hdfs`).
    detach: as `jobs.dev.spawn`."""
    lib = hdfs_lib()
    classes, java = launcher_classes(lib), java_exe("HDFS")
    data.mkdir(parents=True, exist_ok=True)
    cmd = [java, "-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"]
    cmd += ["-Djava.net.preferIPv4Stack=true", f"-Dlog4j.configuration=file:{classes}/log4j.properties"]
    cmd += ["-cp", f"{classes}:{lib}/*", _LAUNCHER_CLASS, str(data / "dfs"), str(port), str(web_port)]
    return spawn(cmd, data / "hdfs.log", detach=detach)


def wait_hdfs(proc: subprocess.Popen, log: Path, timeout_s: float = 180.0) -> None:
    """Return once the cluster `proc` started has printed its READY line to `log` (DataNode registered, safe mode
    left); DevServerFailed (with the end of the log) if it exits first or takes longer than `timeout_s`."""
    line = f"READY pid={proc.pid} ".encode()

    def ready() -> bool:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 65536))
            return line in f.read()

    wait_until(ready, [proc], log, "the HDFS NameNode and DataNode", timeout_s)


class HdfsServer:
    """A running HDFS of `scratch_hdfs`: `url` (`hdfs://127.0.0.1:<port>`), `web_url` (NameNode web UI and
    WebHDFS), `data`; `stop()` and `start()` take it down and bring it back on the same ports with the same data
    (an outage under a running job)."""

    def __init__(self, data: Path, proc: subprocess.Popen, port: int, web_port: int):
        self.data, self.proc, self.port, self.web_port = data, proc, port, web_port
        self.url = f"hdfs://127.0.0.1:{port}"
        self.web_url = f"http://127.0.0.1:{web_port}"

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def start(self) -> None:
        self.proc = start_hdfs(self.data, self.port, self.web_port, detach=False)
        wait_hdfs(self.proc, self.data / "hdfs.log")


def scratch_hdfs(workdir: Path) -> HdfsServer:
    """Start an HDFS on free loopback ports with its files under `workdir`; return it once it answers (the caller
    stops it). DevServerFailed (saying what to do) if it cannot."""
    port, web_port = free_port(), free_port()
    proc = start_hdfs(Path(workdir), port, web_port, detach=False)
    wait_hdfs(proc, Path(workdir) / "hdfs.log")
    return HdfsServer(Path(workdir), proc, port, web_port)


def _start(url: str) -> int:
    parsed = urlparse(url)
    host, port = parsed.hostname or "", parsed.port or 8020
    if parsed.scheme != "hdfs":
        print(f"make hdfs: HDFS_URL={url} is not an hdfs:// URL", file=sys.stderr)
        return 1
    if port_answers(host, port):
        print(f"something answers at {url} (taken to be a NameNode); nothing started")
        return 0
    if host not in ("127.0.0.1", "localhost"):
        print(
            f"make hdfs: nothing answers at HDFS_URL={url} and it is not loopback: start that HDFS",
            file=sys.stderr,
        )
        return 1
    data = dev_dir("hdfs")
    web_port = WEB_PORT if not port_answers("127.0.0.1", WEB_PORT) else free_port()
    try:
        proc = start_hdfs(data, port, web_port, detach=True)
        (data / "pid").write_text(f"{proc.pid}\n")
        wait_hdfs(proc, data / "hdfs.log")
    except DevServerFailed as e:
        print(f"make hdfs: {e}", file=sys.stderr)
        return 1
    (data / "webhdfs.url").write_text(f"http://127.0.0.1:{web_port}\n")
    print(
        f"started HDFS (Hadoop {hadoop_version()}) at hdfs://127.0.0.1:{port}, web UI and WebHDFS at "
        f"http://127.0.0.1:{web_port} (data and hdfs.log in {data}; `make hdfs-stop` stops it)"
    )
    return 0


def _stop() -> int:
    data = dev_dir("hdfs")
    stopped = stop_pid_file(data / "pid", marker=_LAUNCHER_CLASS)
    print(
        f"stopped HDFS (pid {stopped[0]})"
        if stopped
        else "no HDFS started by `make hdfs` runs; nothing to do"
    )
    return 0


def webhdfs_answers(web_url: str) -> bool:
    """Whether WebHDFS at `web_url` lists the root directory."""
    with urllib.request.urlopen(f"{web_url}/webhdfs/v1/?op=LISTSTATUS", timeout=5) as r:
        return r.status == 200


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    action = args[0] if args else "start"
    if action not in ("start", "stop"):
        print("usage: python -m jobs.dev.hdfs start|stop", file=sys.stderr)
        return 2
    return _start(os.environ.get("HDFS_URL") or DEFAULT_URL) if action == "start" else _stop()


if __name__ == "__main__":
    sys.exit(main())
