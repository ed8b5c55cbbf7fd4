"""Helpers of the operations tests: a dedicated redis-server that a test may stop and restart, waiting on
`mview status`, reading a generation's whole Redis content, writing workload files, running the installed
`mview`, reading a Prometheus scrape."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from changelog.storage import Lake
from jobs.core.generations import key_kinds
from jobs.core.registry import job_spec
from jobs.core.runtime import committed_batches
from jobs.core.settings import Settings
from jobs.dev.redis import free_port
from jobs.ops.deploy import settings_env
from jobs.ops.status import job_status


class OwnRedis:
    """A redis-server on its own port with an fsync-always AOF, so a stop/start keeps every acknowledged write;
    with `persist=False`, no persistence at all: a restart starts empty."""

    def __init__(self, data_dir: Path, *, persist: bool = True):
        self.port, self.dir, self.persist = free_port(), data_dir, persist
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.password: str | None = None  # --requirepass at the next start, and in url()

    def url(self, db: int = 0) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/{db}"

    def start(self) -> OwnRedis:
        self.proc = subprocess.Popen(
            [
                shutil.which("redis-server"),
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                *(["--requirepass", self.password] if self.password else []),
                "--save",
                "",
                *(
                    ["--appendonly", "yes", "--appendfsync", "always"]
                    if self.persist
                    else ["--appendonly", "no"]
                ),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url())
        for _ in range(200):
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not start on port {self.port}")

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is saved."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(20)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        self.proc = None

    def wipe(self) -> None:
        """Delete what the stopped server persisted, so the next start is empty (a server lost with its disk)."""
        assert self.proc is None, "stop or kill the server first"
        shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)


MVIEW = str(Path(sys.executable).parent / "mview")


def mview(
    settings: Settings, *args, url: str | None = None, timeout: float = 300, umask: int = -1
) -> subprocess.CompletedProcess:
    """The installed `mview` run with `settings` in its environment (REDIS_URL replaced by `url` if given), killed
    after `timeout` seconds; with `umask` (e.g. 0o022, a shell's), run with that umask instead of this process's."""
    env = {**os.environ, **settings_env(settings)}
    if url is not None:
        env["REDIS_URL"] = url
    return subprocess.run(
        [MVIEW, *args], env=env, capture_output=True, text=True, timeout=timeout, umask=umask
    )


def mview_here(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    """`mview ARGS` through `jobs.ops.cli.main` in this process (a Spark command runs on the tests' session instead of
    starting a JVM), `settings` in the environment while it runs, stdout and stderr captured, a `SystemExit`
    turned into the exit status and stderr line the interpreter would print."""
    from jobs.ops.cli import main

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        for k, v in settings_env(settings).items():
            mp.setenv(k, v)
        try:
            code = main(list(args))
        except SystemExit as e:
            code = e.code
            if isinstance(code, str):
                print(code, file=sys.stderr)
                code = 1
    return subprocess.CompletedProcess(["mview", *args], code or 0, out.getvalue(), err.getvalue())


def one_line_error(r: subprocess.CompletedProcess, *expected: str) -> str:
    """Assert `r` failed with one `mview: ...` line on stderr holding each of `expected`; return that line."""
    assert r.returncode != 0, r
    assert r.stdout == "" or "deployed" not in r.stdout, r.stdout
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mview: "), r.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def metric_samples(text: str) -> dict:
    """{(sample name, sorted labels without `job`): value} of a Prometheus scrape."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "job"))
            out[(s.name, labels)] = s.value
    return out


def write_jsonl(path: Path, records) -> str:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return str(path)


def status_of(settings: Settings, job: str) -> dict:
    return job_status(settings)[job]


def not_owner_only(root: Path) -> list[str]:
    """The directories (root included) not 0700 and the files not 0600 under `root`, each with its mode: what a job's
    directory must never hold (README, "Credentials and Redis errors")."""
    out = []
    for path in [root, *sorted(root.rglob("*"))]:
        mode, want = stat.S_IMODE(path.stat().st_mode), 0o700 if path.is_dir() else 0o600
        if mode != want:
            out.append(f"{path.relative_to(root.parent)} {mode:04o}")
    return out


def wait_for(predicate, what: str, timeout_s: float = 1200.0, every_s: float = 0.2):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def log_tail(path: Path, lines: int = 120) -> str:
    """The last `lines` lines of a deployed job's log, without the JVM thread dumps (`jobs.ops.deploy.dump_stacks`;
    each from "Full thread dump" to its "JNI global refs" line) but with their Python threads' stacks: what a test
    that failed beside a deployed job prints of it."""
    kept, in_dump = [], False
    for line in path.read_text(errors="replace").splitlines() if path.exists() else []:
        if line.startswith("Full thread dump"):
            in_dump = True
            kept.append("[a JVM thread dump]")
        elif in_dump and line.startswith("JNI global refs"):
            in_dump = False
        elif not in_dump:
            kept.append(line)
    return "\n".join(kept[-lines:])


def batch_in_flight(lake: Lake, checkpoint: str) -> bool:
    """True while the query checkpointed at key `checkpoint` of `lake` (local, HDFS or S3) has planned a micro-batch
    (offsets/N) it has not committed (no commits/N: `jobs.core.runtime.committed_batches`)."""
    planned = [int(e.name) for e in lake.list(checkpoint, "offsets") if e.name.isdigit() and not e.is_dir]
    return bool(planned) and max(planned) > max(committed_batches(lake, checkpoint), default=-1)


def redis_content(client: redis.Redis, job: str, generation: int) -> dict:
    """Every key of `job`'s generation (views and extra keys, not the meta hash) with its full value, keyed by
    the key with the generation taken out, so two generations or two servers compare exactly."""
    out = {}
    for kind in key_kinds(job_spec(Settings.from_env({}), job)):  # the built-in pipeline's job
        for key in client.scan_iter(match=f"mv:{kind}:{generation}:*", count=1000):
            name = key.decode().replace(f":{generation}:", ":*:", 1)
            t = client.type(key).decode()
            if t == "string":
                out[name] = client.get(key)
            elif t == "zset":
                out[name] = client.zrange(key, 0, -1, withscores=True)
            elif t == "hash":
                out[name] = client.hgetall(key)
            elif t == "set":
                out[name] = sorted(client.smembers(key))
            elif t == "list":
                out[name] = client.lrange(key, 0, -1)
            else:
                out[name] = (t, client.dump(key))
    return out
