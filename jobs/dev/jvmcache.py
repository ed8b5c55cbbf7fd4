"""`python -m jobs.dev.jvmcache` (`make jvm-cache`): an ahead-of-time cache for the Spark driver's JVM.

A `--once` run starts a new JVM, and most of its first batch is the JVM warming up: loading and linking ~20,000
classes and profiling methods before the JIT compiles them (figures: docs/architecture.md). JDK 25's AOT cache (JEPs 483, 514, 515) stores the classes of a
training run already loaded and linked, with their method profiles, and a later JVM maps it at start.

`build()` makes it: a training run of the timeline job on a generated workload (`_training_workload`) in a JVM
started with `-XX:AOTMode=record`, then `-XX:AOTMode=create` with the same class path and options. `driver_java`
tells `jobs.core.spark.get_spark` to use it: a JDK 25+ and the cache's options, for a local master only.

- Needs a JDK 25 or newer (found under /usr/lib/jvm, JAVA_HOME or JVM_CACHE_JDK); without one nothing is built
  and every job runs on the default `java` as before.
- Spark's launcher adds `--add-modules=jdk.incubator.vector` (used only by MLlib's BLAS, which falls back to
  plain Java without it); an incubator module turns off the archived module graph and with it class linking and
  profiles in the cache. The cache's JDK is therefore a two-line wrapper that drops that one option.
- The cache is tied to the venv's Spark jars and the JDK: a stamp records both, and a cache whose stamp no longer
  matches is not used (run `make jvm-cache` again). A JVM that cannot map it runs without it.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from jobs.core.settings import Settings

__all__ = ["build", "driver_java"]

_DROPPED = "--add-modules=jdk.incubator.vector"
_WRAPPER = f"""#!/bin/bash
# Written by `make jvm-cache` (jobs/dev/jvmcache.py): the JDK below without Spark's incubator module option, which
# would turn off class linking in the AOT cache. With MVIEW_JVM_ARGV set, the driver's argv is saved there.
args=()
for a in "$@"; do [ "$a" = "{_DROPPED}" ] || args+=("$a"); done
if [ -n "$MVIEW_JVM_ARGV" ] && [[ " ${{args[*]}} " == *" org.apache.spark.deploy.SparkSubmit "* ]]; then
  printf '%s\\0' "${{args[@]}}" > "$MVIEW_JVM_ARGV"
fi
exec "@JAVA@" "${{args[@]}}"
"""
_RECORD = "MVIEW_JVM_RECORD"  # set by build() for the training run: the AOT configuration file to record


def _say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] jvm-cache: {msg}", flush=True)


def _java_major(java: Path) -> int:
    try:
        out = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return 0
    for token in out.split():
        token = token.strip('"')
        if token[:2].isdigit():
            return int(token.split(".")[0].split("-")[0].split("+")[0])
    return 0


def _find_jdk(cache_dir: Path) -> Path | None:
    """The newest `java` of version 25 or later: JVM_CACHE_JDK, JAVA_HOME, then /usr/lib/jvm/*; never the wrapper
    under `cache_dir` (get_spark points JAVA_HOME there), which build() replaces."""
    homes = [os.environ.get("JVM_CACHE_JDK", ""), os.environ.get("JAVA_HOME", "")]
    homes += sorted(str(p) for p in Path("/usr/lib/jvm").glob("*"))
    best: tuple[int, Path] | None = None
    for home in homes:
        java = Path(home) / "bin" / "java"
        if home and java.is_file() and not java.resolve().is_relative_to(cache_dir.resolve()):
            major = _java_major(java)
            if major >= 25 and (best is None or major > best[0]):
                best = (major, java.resolve())
    return best[1] if best else None


def _spark_jars_stamp() -> str:
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    return f"pyspark {pyspark.__version__}, {sum(p.stat().st_size for p in jars.glob('*.jar'))} bytes of jars"


def driver_java(settings: Settings, master: str | None = None) -> tuple[str, str] | None:
    """(JAVA_HOME, extra driver JVM options) that start the driver with the AOT cache, or None: no cache, a stale
    one (other jars or JDK than it was built with), JVM_CACHE=off, or a master other than local (`master`, else
    SPARK_MASTER), whose executors run their own Java."""
    if settings.jvm_cache is None or not (master or settings.spark_master).startswith("local"):
        return None
    d = settings.jvm_cache
    home = d / "jdk"
    record = os.environ.get(_RECORD)
    if record:
        return str(home), f"-XX:AOTMode=record -XX:AOTConfiguration={record} -Xlog:aot*=error"
    try:
        stamp = json.loads((d / "stamp.json").read_text())
    except (OSError, ValueError):
        return None
    if not (d / "spark.aot").is_file() or not (home / "bin" / "java").is_file():
        return None
    if not Path(stamp.get("java", "")).is_file():
        return None
    if stamp.get("jars") != _spark_jars_stamp():
        return None
    return str(home), f"-XX:AOTCache={d / 'spark.aot'} -Xlog:aot*=error"


def _training_workload(
    seed: int = 5, users: int = 2_000, follows: int = 6_000, tweets: int = 6_000
) -> tuple[list[dict], list[dict]]:
    """(tweets, follows) records for the training run, seeded: every kind the ingest and the timeline job handle
    (posts, deletes, follows, unfollows, re-follows, duplicate deliveries, `ts` as epoch ms and as ISO-8601),
    authors and followees drawn with a strong bias to the first three users (celebrities), so both fan-out paths
    of the job get exercised."""
    rng = random.Random(seed)
    t0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

    def ts(ms: int):
        iso = datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
        return iso.replace("+00:00", "Z") if rng.random() < 0.5 else ms

    def user(celebrity_share: float) -> str:
        return f"u{rng.randrange(3) if rng.random() < celebrity_share else rng.randrange(users)}"

    tw, fo = [], []
    for i in range(tweets):
        author, at = user(0.3), t0 + rng.randrange(6 * 3_600_000)
        tw.append(
            {"op": "post", "tweet_id": f"t{i:07d}", "user_id": author, "text": f"tweet {i}", "ts": ts(at)}
        )
        if rng.random() < 0.08:
            tw.append({"op": "delete", "tweet_id": f"t{i:07d}", "user_id": author, "ts": ts(at + 60_000)})
    for _ in range(follows):
        a, b, at = user(0.0), user(0.5), t0 + rng.randrange(6 * 3_600_000)
        if a != b:
            fo.append({"op": "follow", "follower_id": a, "followee_id": b, "ts": ts(at)})
            if rng.random() < 0.15:
                fo.append({"op": "unfollow", "follower_id": a, "followee_id": b, "ts": ts(at + 600_000)})
                if rng.random() < 0.4:
                    fo.append({"op": "follow", "follower_id": a, "followee_id": b, "ts": ts(at + 1_200_000)})
    for recs in (tw, fo):  # duplicate deliveries
        recs.extend(rng.choice(recs) for _ in range(len(recs) * 3 // 100))
    return tw, fo


def _ingest(spark, lake: Path, topic: str, records: list[dict], path: Path) -> None:
    from changelog.ingest import ingest

    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    ingest(spark, lake, topic, [str(path)])


def _train(lake: Path) -> None:
    """The training run (in its own process and JVM): the timeline job over `_training_workload()`, two batches,
    then the same workload under a fan-out limit followed by four one-tweet batches of a celebrity."""
    from jobs.core.registry import job_spec
    from jobs.core.spark import get_spark
    from jobs.dev.redis import scratch_redis

    def run_timeline(spark, settings, **kwargs):
        return job_spec(settings, "timeline").run(spark, settings, **kwargs)

    proc, port = scratch_redis(lake.parent)
    try:
        env = {"LAKE_DIR": str(lake), "REDIS_URL": f"redis://127.0.0.1:{port}/0", "SPARK_MASTER": "local[2]"}
        settings = Settings.from_env({**os.environ, **env})
        spark = get_spark(settings, "mview-jvm-training")
        tweets, follows = _training_workload()
        for half in (0, 1):
            _ingest(spark, lake, "tweets", tweets[half::2], lake.parent / f"tweets{half}.jsonl")
            _ingest(spark, lake, "follows", follows[half::2], lake.parent / f"follows{half}.jsonl")
            _say(f"training batch {half + 1}/2: {run_timeline(spark, settings, once=True)}")
        # The path of a deployed job under a fan-out limit: the workload's three celebrities over the limit, then
        # batches of their tweets only (posted before the batch is counted, `jobs.timeline`).
        hybrid = lake.parent / "lake-hybrid"
        over = {"LAKE_DIR": str(hybrid), "REDIS_URL": f"redis://127.0.0.1:{port}/1", "FANOUT_LIMIT": "100"}
        settings = Settings.from_env({**os.environ, **env, **over})
        _ingest(spark, hybrid, "follows", follows, lake.parent / "follows-h.jsonl")
        _ingest(spark, hybrid, "tweets", tweets, lake.parent / "tweets-h.jsonl")
        run_timeline(spark, settings, once=True)
        for n in range(4):
            post = {
                "op": "post",
                "tweet_id": f"h{n}",
                "user_id": "u0",
                "text": "hybrid",
                "ts": 1_767_250_000_000 + n,
            }
            _ingest(spark, hybrid, "tweets", [post], lake.parent / f"tweet-h{n}.jsonl")
            run_timeline(spark, settings, once=True)
        _say("training: the batches of a celebrity's tweets under a fan-out limit")
        # The JVM writes the recorded configuration as it exits, which it does when its stdin closes: wait for it.
        jvm = spark.sparkContext._gateway.proc
        spark.stop()
        atexit.unregister(spark.stop)  # get_spark's stop at exit would find the JVM gone
        jvm.stdin.close()
        jvm.wait(timeout=600)
    finally:
        proc.terminate()


def _write_wrapper(home: Path, java: Path) -> Path:
    """A JAVA_HOME at `home` whose bin/java runs `java` without Spark's incubator module option."""
    (home / "bin").mkdir(parents=True, exist_ok=True)
    wrapper = home / "bin" / "java"
    wrapper.write_text(_WRAPPER.replace("@JAVA@", str(java)))
    wrapper.chmod(0o755)
    return wrapper


def build(settings: Settings) -> Path | None:
    """Build the AOT cache under settings.jvm_cache; return its path, or None (saying why) when it cannot."""
    if settings.jvm_cache is None:
        _say("JVM_CACHE=off: nothing to build")
        return None
    java = _find_jdk(settings.jvm_cache)
    if java is None:
        _say(
            "no JDK 25+ found (set JVM_CACHE_JDK to one's home); jobs run on the default java without a cache"
        )
        return None
    d = settings.jvm_cache
    shutil.rmtree(d, ignore_errors=True)
    _write_wrapper(d / "jdk", java)
    conf, argv_file, cache = d / "spark.aotconf", d / "driver.argv", d / "spark.aot"
    started = time.monotonic()
    _say(f"training run with {java} (about 2 minutes)")
    with tempfile.TemporaryDirectory(prefix="mview-jvm-") as tmp:
        env = dict(os.environ, **{_RECORD: str(conf), "MVIEW_JVM_ARGV": str(argv_file)})
        env["JVM_CACHE"] = str(d)
        code = subprocess.call(
            [sys.executable, "-m", "jobs.dev.jvmcache", "--train", str(Path(tmp) / "lake")], env=env
        )
    if code != 0 or not conf.is_file() or not argv_file.is_file():
        _say(f"training run failed (exit {code}); no cache built, jobs run without one")
        shutil.rmtree(d, ignore_errors=True)
        return None
    argv = argv_file.read_bytes().decode().split("\0")[:-1]
    jvm_args = argv[: argv.index("org.apache.spark.deploy.SparkSubmit")]
    jvm_args = [a for a in jvm_args if not a.startswith(("-XX:AOTMode", "-XX:AOTConfiguration", "-Xlog:aot"))]
    _say("creating the cache from the training's profile")
    out = subprocess.run(
        [str(java), "-XX:AOTMode=create", f"-XX:AOTConfiguration={conf}", f"-XX:AOTCache={cache}"] + jvm_args,
        capture_output=True,
        text=True,
    )
    conf.unlink(missing_ok=True)
    argv_file.unlink(missing_ok=True)
    if out.returncode != 0 or not cache.is_file():
        _say(f"creating the cache failed (exit {out.returncode}): {(out.stdout + out.stderr)[-600:]}")
        shutil.rmtree(d, ignore_errors=True)
        return None
    (d / "stamp.json").write_text(json.dumps({"java": str(java), "jars": _spark_jars_stamp()}))
    _say(f"{cache} ({cache.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f}s")
    return cache


if __name__ == "__main__":
    if sys.argv[1:2] == ["--train"]:
        _train(Path(sys.argv[2]))
    else:
        build(Settings.from_env())
