"""`python -m jobs.dev.s3 start|stop|env` (`make s3`, `make s3-stop`): a development S3-compatible server;
`scratch_s3` for tests; what Spark's S3A and delta-rs need to use it (`s3a_conf`, `s3a_jars`,
`delta_rs_options`).

The server is S3Proxy `S3PROXY_VERSION` (`org.gaul:s3proxy`, Apache-2.0, and its dependencies from Maven Central,
resolved once with `mvn dependency:copy-dependencies` into `<venv>/mview-s3proxy/<version>/lib`) with its
`filesystem` backend: a bucket is a directory, an object a file. Why this one (docs/lake.md, "Servers for a lake
beyond one machine"): it is a Java program from Maven Central like the other development servers (no new toolchain, no
binary download), it checks AWS signatures (V2 and V4) and serves path-style addressing, ListObjectsV2 and
multipart uploads, and it answers `If-None-Match: *` as S3 does with an atomic claim of the key (it publishes the
new object with link(2), which fails when the key exists), so of concurrent conditional puts of one key exactly
one succeeds and the others get 412 -- the primitive delta-rs commits by. tests/jobs/dev/test_s3.py checks that
with 32 concurrent puts before anything else.

It listens on 127.0.0.1 only, checks the fixed development credentials `DEV_CREDENTIALS` (not secret: never use
them for anything else) and holds the bucket `DEV_BUCKET`, created at start.

- start: if an HTTP server answers at S3_ENDPOINT (default `http://127.0.0.1:9100`), nothing is done; else, for a
  loopback address, S3Proxy starts there with its objects under `dev_dir("s3")/buckets` (LAKE_DIR/s3), its log in
  `s3.log` and pid in `pid` there, and the command returns once the bucket exists. Not loopback: a one-line error.
- stop: SIGTERM to the server, SIGKILL after 30 s.
- env: prints the `export` lines a shell needs to use it (`eval "$(python -m jobs.dev.s3 env)"`).
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote, urlparse

from jobs.dev import (
    DevServerFailed,
    dev_dir,
    free_port,
    jar_lib,
    java_exe,
    spawn,
    stop_pid_file,
    wait_until,
)

__all__ = [
    "S3PROXY_VERSION",
    "DEFAULT_ENDPOINT",
    "DEV_BUCKET",
    "DEV_CREDENTIALS",
    "S3Client",
    "S3Server",
    "s3proxy_lib",
    "start_s3",
    "wait_s3",
    "scratch_s3",
    "s3a_jars",
    "s3a_conf",
    "delta_rs_options",
    "main",
]

S3PROXY_VERSION = "4.1.0"  # the newest S3Proxy on Maven Central; runs on Java 17
DEFAULT_ENDPOINT = "http://127.0.0.1:9100"
DEV_BUCKET = "mview"
# Development credentials of the local server only: fixed, documented, not a secret.
DEV_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "mview-dev",
    "AWS_SECRET_ACCESS_KEY": "mview-dev-secret",
    "AWS_REGION": "us-east-1",
}
_MAIN = "org.gaul.s3proxy.Main"
# @M@: for S3Proxy, its own dependency management (the Jackson 3, AWS SDK and OpenTelemetry BOMs its release is
# built with): without it Maven's nearest-wins picks a jackson-annotations too old for Jackson 3 and the server
# fails at start (NoClassDefFoundError: com/fasterxml/jackson/annotation/JsonSerializeAs).
_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>mview</groupId><artifactId>@A@</artifactId><version>1</version>@M@
  <dependencies>
    <dependency><groupId>@G@</groupId><artifactId>@N@</artifactId><version>@V@</version></dependency>
  </dependencies>
</project>
"""
_BOM = """
  <dependencyManagement><dependencies>
    <dependency><groupId>org.gaul</groupId><artifactId>s3proxy</artifactId><version>@V@</version>
      <type>pom</type><scope>import</scope></dependency>
  </dependencies></dependencyManagement>"""
_LOGBACK = """<configuration>
  <appender name="OUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>[%d] %p %m [%c{30}]%n</pattern></encoder>
  </appender>
  <logger name="org.gaul.s3proxy" level="INFO"/>
  <root level="WARN"><appender-ref ref="OUT"/></root>
</configuration>
"""


def _pom(group: str, name: str, version: str, bom: str = "") -> str:
    return (
        _POM.replace("@M@", bom)
        .replace("@A@", f"{name}-jars")
        .replace("@G@", group)
        .replace("@N@", name)
        .replace("@V@", version)
    )


def s3proxy_lib(version: str = S3PROXY_VERSION) -> Path:
    """The directory holding S3Proxy's jars, resolved from Maven Central on first use (needs `mvn`)."""
    return jar_lib("s3proxy", version, _pom("org.gaul", "s3proxy", version, _BOM), f"S3Proxy {version}")


def s3a_jars(hadoop_version: str | None = None) -> list[Path]:
    """The jars Spark's S3A file system needs beside pyspark's Hadoop client: `hadoop-aws` of the Hadoop version
    PySpark ships and what it depends on (the AWS SDK v2 `bundle`, ~700 MB), resolved from Maven Central on first
    use into `<venv>/mview-hadoop-aws/<version>/lib`."""
    from jobs.dev.hdfs import hadoop_version as shipped

    version = hadoop_version or shipped()
    lib = jar_lib(
        "hadoop-aws", version, _pom("org.apache.hadoop", "hadoop-aws", version), f"hadoop-aws {version}"
    )
    return sorted(lib.glob("*.jar"))


def s3a_conf(endpoint: str, credentials: dict[str, str] | None = None) -> dict[str, str]:
    """Spark settings (`spark.hadoop.fs.s3a.*`) for `s3a://` paths on the S3-compatible server at `endpoint`:
    path-style addressing, plain HTTP when the endpoint is, the region and the credentials given (default
    `DEV_CREDENTIALS`)."""
    creds = credentials or DEV_CREDENTIALS
    return {
        "spark.hadoop.fs.s3a.endpoint": endpoint,
        "spark.hadoop.fs.s3a.endpoint.region": creds.get("AWS_REGION", "us-east-1"),
        "spark.hadoop.fs.s3a.path.style.access": "true",
        "spark.hadoop.fs.s3a.connection.ssl.enabled": str(endpoint.startswith("https:")).lower(),
        "spark.hadoop.fs.s3a.access.key": creds["AWS_ACCESS_KEY_ID"],
        "spark.hadoop.fs.s3a.secret.key": creds["AWS_SECRET_ACCESS_KEY"],
        "spark.hadoop.fs.s3a.aws.credentials.provider": (
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
        ),
    }


def delta_rs_options(endpoint: str, credentials: dict[str, str] | None = None) -> dict[str, str]:
    """delta-rs (`deltalake`) storage options for `s3://` tables on the server at `endpoint`: path-style
    addressing, HTTP allowed, and commits by conditional put (`conditional_put=etag`: `If-None-Match: *` on
    each commit file, safe with concurrent writers, no unsafe rename)."""
    creds = credentials or DEV_CREDENTIALS
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": creds["AWS_ACCESS_KEY_ID"],
        "AWS_SECRET_ACCESS_KEY": creds["AWS_SECRET_ACCESS_KEY"],
        "AWS_REGION": creds.get("AWS_REGION", "us-east-1"),
        "AWS_ALLOW_HTTP": str(endpoint.startswith("http:")).lower(),
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
        "conditional_put": "etag",
    }


class S3Client:
    """A minimal S3 client over `http.client`, signing with AWS Signature V4, path-style: enough for the
    development server's set-up and the conformance tests (no dependency on boto3). Each call opens its own
    connection, so one client may be used from many threads."""

    def __init__(self, endpoint: str, credentials: dict[str, str] | None = None):
        creds = credentials or DEV_CREDENTIALS
        parsed = urlparse(endpoint)
        self.endpoint, self.host, self.port = endpoint, parsed.hostname or "127.0.0.1", parsed.port or 80
        self.https = parsed.scheme == "https"
        self.key, self.secret = creds["AWS_ACCESS_KEY_ID"], creds["AWS_SECRET_ACCESS_KEY"]
        self.region = creds.get("AWS_REGION", "us-east-1")

    def request(
        self, method: str, path: str, query: dict[str, str] | None = None, body: bytes = b"", headers=None
    ) -> tuple[int, dict[str, str], bytes]:
        """Send one signed request for `path` (`/bucket/key`); return (status, headers, body)."""
        query = query or {}
        now = datetime.now(timezone.utc)
        amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
        payload = hashlib.sha256(body).hexdigest()
        host = self.host if self.port in (80, 443) else f"{self.host}:{self.port}"
        signed = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
        uri = quote(path, safe="/-_.~")
        qs = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items()))
        names = ";".join(sorted(signed))
        canonical = "\n".join(
            [method, uri, qs, "".join(f"{k}:{signed[k]}\n" for k in sorted(signed)), names, payload]
        )
        scope = f"{day}/{self.region}/s3/aws4_request"
        to_sign = f"AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{hashlib.sha256(canonical.encode()).hexdigest()}"
        k = f"AWS4{self.secret}".encode()
        for part in (day, self.region, "s3", "aws4_request"):
            k = hmac.new(k, part.encode(), hashlib.sha256).digest()
        signature = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        auth = f"AWS4-HMAC-SHA256 Credential={self.key}/{scope}, SignedHeaders={names}, Signature={signature}"
        conn_cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = conn_cls(self.host, self.port, timeout=60)
        try:
            conn.request(
                method,
                uri + (f"?{qs}" if qs else ""),
                body,
                {**signed, **(headers or {}), "Authorization": auth},
            )
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def create_bucket(self, bucket: str) -> None:
        """Create `bucket` unless this account already owns it; DevServerFailed otherwise."""
        status, _, body = self.request("PUT", f"/{bucket}")
        if status != 200 and b"BucketAlreadyOwnedByYou" not in body:
            raise DevServerFailed(
                f"S3 at {self.endpoint}: creating bucket {bucket} gave HTTP {status}: {body[:200]!r}"
            )

    def put(self, bucket: str, key: str, body: bytes, *, if_none_match: str | None = None) -> int:
        """PutObject; the HTTP status (200, or 412 when `if_none_match="*"` and the key exists)."""
        headers = {"If-None-Match": if_none_match} if if_none_match else {}
        return self.request("PUT", f"/{bucket}/{key}", body=body, headers=headers)[0]

    def get(self, bucket: str, key: str) -> tuple[int, bytes]:
        status, _, body = self.request("GET", f"/{bucket}/{key}")
        return status, body

    def list_v2(self, bucket: str, prefix: str = "", max_keys: int = 1000, token: str | None = None):
        """One page of ListObjectsV2: (keys, next continuation token or None)."""
        query = {"list-type": "2", "prefix": prefix, "max-keys": str(max_keys)}
        if token:
            query["continuation-token"] = token
        status, _, body = self.request("GET", f"/{bucket}", query)
        if status != 200:
            raise DevServerFailed(f"ListObjectsV2 gave HTTP {status}: {body[:200]!r}")
        root = ET.fromstring(body)
        ns = root.tag.partition("}")[0] + "}" if root.tag.startswith("{") else ""
        keys = [c.findtext(f"{ns}Key") for c in root.findall(f"{ns}Contents")]
        truncated = root.findtext(f"{ns}IsTruncated") == "true"
        return keys, (root.findtext(f"{ns}NextContinuationToken") if truncated else None)

    def multipart_put(
        self, bucket: str, key: str, parts: list[bytes], *, if_none_match: str | None = None
    ) -> int:
        """Upload `parts` as one object by CreateMultipartUpload, UploadPart and CompleteMultipartUpload (with
        `if_none_match` on the completion); the completion's HTTP status."""
        path = f"/{bucket}/{key}"
        status, _, body = self.request("POST", path, {"uploads": ""})
        if status != 200:
            raise DevServerFailed(f"CreateMultipartUpload gave HTTP {status}: {body[:200]!r}")
        root = ET.fromstring(body)
        ns = root.tag.partition("}")[0] + "}" if root.tag.startswith("{") else ""
        upload = root.findtext(f"{ns}UploadId")
        etags = []
        for n, data in enumerate(parts, 1):
            status, headers, body = self.request(
                "PUT", path, {"partNumber": str(n), "uploadId": upload}, data
            )
            if status != 200:
                raise DevServerFailed(f"UploadPart gave HTTP {status}: {body[:200]!r}")
            etags.append(headers["etag"])
        done = "".join(
            f"<Part><PartNumber>{n}</PartNumber><ETag>{e}</ETag></Part>" for n, e in enumerate(etags, 1)
        )
        headers = {"If-None-Match": if_none_match} if if_none_match else {}
        xml = f"<CompleteMultipartUpload>{done}</CompleteMultipartUpload>".encode()
        return self.request("POST", path, {"uploadId": upload}, xml, headers)[0]


def _properties(port: int, buckets: Path) -> str:
    return f"""s3proxy.endpoint=http://127.0.0.1:{port}
s3proxy.authorization=aws-v2-or-v4
s3proxy.identity={DEV_CREDENTIALS["AWS_ACCESS_KEY_ID"]}
s3proxy.credential={DEV_CREDENTIALS["AWS_SECRET_ACCESS_KEY"]}
jclouds.provider=filesystem
jclouds.filesystem.basedir={buckets}
"""


def start_s3(data: Path, port: int, *, detach: bool) -> subprocess.Popen:
    """Start S3Proxy on 127.0.0.1:`port` with its objects under `data/buckets`, its configuration (0600) and
    `s3.log` in `data`; return the process (not yet answering: `wait_s3`). detach: as `jobs.dev.spawn`."""
    lib, java = s3proxy_lib(), java_exe("S3Proxy")
    (data / "buckets").mkdir(parents=True, exist_ok=True)
    props, logback = data / "s3proxy.properties", data / "logback.xml"
    props.touch(mode=0o600)
    props.write_text(_properties(port, data / "buckets"))
    logback.write_text(_LOGBACK)
    cmd = [java, "-Xms32m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-XX:-UsePerfData"]
    cmd += [f"-Dlogback.configurationFile={logback}", "-cp", f"{lib}/*", _MAIN, "--properties", str(props)]
    return spawn(cmd, data / "s3.log", detach=detach)


def _answers(endpoint: str) -> bool:
    """Whether an HTTP server answers at `endpoint` (any status: an S3 server refuses an unsigned request)."""
    parsed = urlparse(endpoint)
    conn_cls = http.client.HTTPSConnection if parsed.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(parsed.hostname, parsed.port, timeout=2)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        return True
    except OSError:
        return False
    finally:
        conn.close()


def wait_s3(
    proc: subprocess.Popen, endpoint: str, log: Path, bucket: str = DEV_BUCKET, timeout_s: float = 120.0
) -> None:
    """Return once the server `proc` answers a signed request at `endpoint` and `bucket` exists (created if
    missing); DevServerFailed (with the end of `log`) if it exits first or takes longer than `timeout_s`."""
    client = S3Client(endpoint)

    def ready() -> bool:
        return client.request("GET", "/")[0] == 200

    wait_until(ready, [proc], log, "S3Proxy", timeout_s)
    client.create_bucket(bucket)


class S3Server:
    """A running S3Proxy of `scratch_s3`: `endpoint`, `bucket`, `credentials`, `data`; `client()` an `S3Client`,
    `env()` the variables a client process needs; `stop()` and `start()` take it down and bring it back on the
    same port with the same objects."""

    def __init__(self, data: Path, proc: subprocess.Popen, port: int):
        self.data, self.proc, self.port = data, proc, port
        self.endpoint, self.bucket = f"http://127.0.0.1:{port}", DEV_BUCKET
        self.credentials = dict(DEV_CREDENTIALS)

    def client(self) -> S3Client:
        return S3Client(self.endpoint, self.credentials)

    def env(self) -> dict[str, str]:
        return {**self.credentials, "S3_ENDPOINT": self.endpoint}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def start(self) -> None:
        self.proc = start_s3(self.data, self.port, detach=False)
        wait_s3(self.proc, self.endpoint, self.data / "s3.log")


def scratch_s3(workdir: Path) -> S3Server:
    """Start S3Proxy on a free loopback port with its files under `workdir` and the bucket `DEV_BUCKET`; return it
    once it answers (the caller stops it). DevServerFailed (saying what to do) if it cannot."""
    port = free_port()
    proc = start_s3(Path(workdir), port, detach=False)
    wait_s3(proc, f"http://127.0.0.1:{port}", Path(workdir) / "s3.log")
    return S3Server(Path(workdir), proc, port)


def _start(endpoint: str) -> int:
    parsed = urlparse(endpoint)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        print(f"make s3: S3_ENDPOINT={endpoint} is not an http:// URL", file=sys.stderr)
        return 1
    if _answers(endpoint):
        print(f"an HTTP server answers at {endpoint} (taken to be S3); nothing started")
        return 0
    if parsed.hostname not in ("127.0.0.1", "localhost") or parsed.scheme != "http":
        print(
            f"make s3: nothing answers at S3_ENDPOINT={endpoint} and it is not loopback: start that server",
            file=sys.stderr,
        )
        return 1
    data, started = dev_dir("s3"), time.monotonic()
    try:
        proc = start_s3(data, parsed.port or 80, detach=True)
        (data / "pid").write_text(f"{proc.pid}\n")
        wait_s3(proc, endpoint, data / "s3.log")
    except DevServerFailed as e:
        print(f"make s3: {e}", file=sys.stderr)
        return 1
    print(
        f"started S3Proxy {S3PROXY_VERSION} at {endpoint} with bucket {DEV_BUCKET} in {time.monotonic() - started:.1f}s "
        f'(objects and s3.log in {data}; development credentials: eval "$(.venv/bin/python -m jobs.dev.s3 env)"; '
        "`make s3-stop` stops it)"
    )
    return 0


def _stop() -> int:
    stopped = stop_pid_file(dev_dir("s3") / "pid", marker=_MAIN)
    print(
        f"stopped S3Proxy (pid {stopped[0]})"
        if stopped
        else "no S3Proxy started by `make s3` runs; nothing to do"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    action = args[0] if args else "start"
    endpoint = os.environ.get("S3_ENDPOINT") or DEFAULT_ENDPOINT
    if action == "env":
        for k, v in {**DEV_CREDENTIALS, "S3_ENDPOINT": endpoint}.items():
            print(f"export {k}={v}")
        return 0
    if action not in ("start", "stop"):
        print("usage: python -m jobs.dev.s3 start|stop|env", file=sys.stderr)
        return 2
    return _start(endpoint) if action == "start" else _stop()


if __name__ == "__main__":
    sys.exit(main())
