"""`python -m jobs.dev.jvmcache` (`make jvm-cache`): an ahead-of-time cache for the Spark driver's JVM.

A `--once` run starts a new JVM, and most of its first batch is the JVM warming up: loading and linking ~20,000
classes and profiling methods before the JIT compiles them (figures: docs/architecture.md). JDK 25's AOT cache
(JEPs 483, 514, 515) stores the classes of a training run already loaded and linked, with their method profiles, and
a later JVM maps it at start.

`build()` makes it: a training run in a JVM started with `-XX:AOTMode=record`, then `-XX:AOTMode=create` with the
same class path and options. `driver_java` tells `jobs.core.spark.get_spark` to use it: a JDK 25+ and the cache's
options, for a local master only.

The training runs the pipeline of the settings (MVIEW_PIPELINE, the built-in one by default) on synthetic records
made from its topics' declarations alone (`training_workload`, `Synth`): each job twice, the `join` kind most (a
cold batch of it is the longest), interval and asof jobs on fewer records; then each join job with a list view
again under a fan-out limit its hot values cross, ending with batches of one entry of a hot value (`heavy_entries`),
the path of a deployed job under a `fanout_limit`. About two minutes for the built-in pipeline.

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
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from jobs.core.jvm import RECORD as _RECORD
from jobs.core.jvm import spark_jars_stamp
from jobs.core.settings import Settings
from joins.sparkapi import driver_jvm
from spec.model import Pipeline, Topic

__all__ = ["build", "training_workload", "match_fields", "heavy_entries", "Synth"]

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


# The training's workload: JOIN_RECORDS records per topic a join job reads (the `join` kind's paths are most of a
# cold batch), OTHER_RECORDS per topic only interval and asof jobs read; ids drawn from POOL values, the first HOT of
# them drawn HOT_SHARE of the time in a field some job matches on; the hybrid run's fan-out limit LIMIT, crossed by
# the hot values, then HEAVY_BATCHES batches of one entry of a hot value each.
JOIN_RECORDS, OTHER_RECORDS, POOL, HOT, HOT_SHARE = 6_000, 1_500, 2_000, 3, 0.3
LIMIT, HEAVY_BATCHES = 100, 4
_T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
_SPAN = 6 * 3_600_000  # the records' times: six hours from _T0
_STRINGS = tuple(f"s{k}" for k in range(10)) + ("ünïcødé ✓", "two words", "")


def match_fields(pipeline: Pipeline) -> dict[str, set[str]]:
    """topic -> its fields some job of `pipeline` matches on as they are (a `match` side that is a bare field name):
    where the workload draws hot values, so joins find partners and a few values are heavy."""
    out: dict[str, set[str]] = {}
    for job in pipeline.jobs.values():
        for pair in job.spec.match:
            for topic, expr in zip(job.topics, pair, strict=True):
                if expr in pipeline.topics[topic].names:
                    out.setdefault(topic, set()).add(expr)
    return out


class Synth:
    """Seeded synthetic records of a pipeline's topics, made from their declarations only: every field type (ids,
    strings, longs, doubles, booleans, timestamps as epoch ms and as ISO-8601), optional fields absent a quarter of
    the time, hot values in the fields jobs match on (`match_fields`), unique identities, changes and removes of
    a table's rows, duplicate deliveries, and the pins of asof jobs (`<key>@<ms>` of a version, or of none)."""

    def __init__(self, pipeline: Pipeline, seed: int = 5, pool: int = POOL, first: int = 0):
        self.pipeline, self.rng, self.pool = pipeline, random.Random(seed), pool
        self.hot = match_fields(pipeline)
        self.serials: dict[str, int] = {}  # topic -> the next value of its unique identity field
        self.first = first

    def _draw(self, hot: bool) -> int:
        rng = self.rng
        return rng.randrange(HOT) if hot and rng.random() < HOT_SHARE else rng.randrange(self.pool)

    def value(self, topic: Topic, name: str, at: int):
        """A value of field `name` of `topic` (a timestamp as epoch ms) for a record at time `at`."""
        kind, hot, rng = topic.type_of(name), name in self.hot.get(topic.name, ()), self.rng
        if kind == "id":
            return str(self._draw(hot))
        if kind == "long":
            return self._draw(True) if hot else rng.randrange(-5, 50)
        if kind == "double":
            return rng.randrange(100) if rng.random() < 0.1 else round(rng.uniform(-10, 1_000), 2)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "timestamp":
            return at + rng.randrange(-3_600_000, 3_600_000)
        return rng.choice(_STRINGS)

    def _unique(self, topic: Topic) -> str | None:
        """The identity field that gets a new value per record (0, 1, ... per topic, so the fields of other topics
        drawn from the pool find them): an event topic's first id or long identity field, a table topic's key when
        it is one such field not matched on; else None (drawn like any field: a table's rows then change)."""
        ids = [f for f in topic.identity if topic.type_of(f) in ("id", "long")]
        if topic.kind == "table" and (len(topic.key) > 1 or set(ids) & self.hot.get(topic.name, set())):
            return None
        return ids[0] if ids else None

    def record(self, topic: Topic, at: int, **fixed) -> dict:
        """An upsert (or an event) of `topic` at time `at` (epoch ms), its fields drawn (`value`) but for `fixed`
        and a new value of its unique identity field."""
        unique = self._unique(topic)
        rec = {"op": topic.op[0]} if topic.op else {}
        for name in topic.names:
            if name in fixed:
                rec[name] = fixed[name]
            elif name == topic.time:
                rec[name] = at
            elif name == unique:
                n = self.serials.get(topic.name, self.first)
                self.serials[topic.name] = n + 1
                rec[name] = str(n) if topic.type_of(name) == "id" else n
            elif name in topic.optional and self.rng.random() < 0.25:
                continue
            else:
                rec[name] = self.value(topic, name, at)
        return rec

    def records(self, topic: Topic, n: int) -> list[dict]:
        """`n` records of `topic` (and its changes, removes and duplicates), times as stored (epoch ms)."""
        rng, out = self.rng, []
        for _ in range(n):
            at = _T0 + rng.randrange(_SPAN)
            rec = self.record(topic, at)
            out.append(rec)
            if topic.kind == "event":
                continue
            key = {f: rec[f] for f in topic.key}
            r = rng.random()
            if topic.op and r < 0.1:  # removed later (and sometimes back again)
                kept = {f: rec[f] for f in topic.remove_fields if f in rec}
                out.append({"op": topic.op[1], **key, **kept, topic.time: at + 600_000})
                if rng.random() < 0.4:
                    out.append(self.record(topic, at + 1_200_000, **key))
            elif r < 0.2:  # changed later
                out.append(self.record(topic, at + 300_000, **key))
        out.extend(dict(rng.choice(out)) for _ in range(len(out) * 3 // 100))  # delivered twice
        return out

    def pin(self, stream: list[dict], field: str, table: Topic, versions: list[dict]) -> None:
        """Set `field` of `stream`'s events: 15% the id of one of `versions` (`<key>@<ms>`, the key fields' text
        joined by `|`), 5% a pin of no version, the others none."""
        rng, upserts = self.rng, [v for v in versions if not table.op or v.get("op") == table.op[0]]
        for rec in stream:
            r = rng.random()
            if r < 0.15 and upserts:
                v = rng.choice(upserts)
                rec[field] = "|".join(str(v[f]) for f in table.key) + f"@{v[table.time]}"
            elif r < 0.2:
                rec[field] = f"{self._draw(True)}@{_T0 + rng.randrange(_SPAN)}"
            else:
                rec.pop(field, None)


def _encoded(topic: Topic, rec: dict, iso: bool) -> dict:
    """`rec` as a line of its topic's file: timestamps as ISO-8601 text when `iso`, else epoch ms."""
    if not iso:
        return rec
    out = dict(rec)
    for name, kind in topic.fields:
        if kind == "timestamp" and isinstance(out.get(name), int):
            text = datetime.fromtimestamp(out[name] / 1000, tz=timezone.utc).isoformat(
                timespec="milliseconds"
            )
            out[name] = text.replace("+00:00", "Z")
    return out


def training_workload(pipeline: Pipeline, seed: int = 5, scale: float = 1.0) -> dict[str, list[dict]]:
    """topic -> its records (JSON values, as `mview ingest` reads them) for the training run, seeded: every topic
    some job of `pipeline` reads, JOIN_RECORDS records for a topic a join job reads and OTHER_RECORDS for the
    others (times `scale`), made by `Synth`, in the order of their times (so a batch of the first half and one of
    the second are an earlier and a later stretch of time, not a second batch of late events); half the
    timestamps as ISO-8601 text."""
    synth = Synth(pipeline, seed)
    joined = {t for job in pipeline.jobs.values() if job.kind == "join" for t in job.topics}
    read = [t for job in pipeline.jobs.values() for t in job.topics]
    out: dict[str, list[dict]] = {}
    for name in dict.fromkeys(read):
        n = max(10, round((JOIN_RECORDS if name in joined else OTHER_RECORDS) * scale))
        out[name] = synth.records(pipeline.topics[name], n)
    for job in pipeline.jobs.values():
        if job.kind == "asof" and job.spec.pin is not None:
            table = pipeline.topics[job.spec.table]
            synth.pin(out[job.spec.stream], job.spec.pin, table, out[job.spec.table])
    return {
        name: [
            _encoded(pipeline.topics[name], r, synth.rng.random() < 0.5)
            for r in sorted(recs, key=lambda r: r[pipeline.topics[name].time])
        ]
        for name, recs in out.items()
    }


def heavy_entries(synth: Synth, pipeline: Pipeline, job: str, entry_side: int, n: int) -> list[dict]:
    """`n` new records of join job `job`'s topic on `entry_side` (the entry side of a list view), each matching the
    hottest value (`0`) wherever its side of a match is a bare field: one per batch of the hybrid training, the
    entries of a heavy value that a job under a fan-out limit writes before it counts the batch."""
    spec, topic = pipeline.jobs[job].spec, pipeline.topics[pipeline.jobs[job].topics[entry_side]]
    hot = {
        pair[entry_side]: ("0" if topic.type_of(pair[entry_side]) == "id" else 0)
        for pair in spec.match
        if pair[entry_side] in topic.names
    }
    return [synth.record(topic, _T0 + _SPAN + i, **hot) for i in range(n)]


def _ingest(lake: Path, topic: Topic, records: list[dict], path: Path) -> None:
    from changelog.ingest import ingest
    from changelog.storage import as_lake

    path.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in records))
    ingest(None, as_lake(lake), topic, [str(path)])


def _limited(spark, pipeline: Pipeline) -> tuple[Pipeline, dict[str, int]]:
    """`pipeline` with a fan-out limit of LIMIT on every list view of a join job that can have one (the list shape
    of `joins.table_list`, `views.list.join.list_shape`), and the entry side of each job that has such a view."""
    from joins.table import TableJoin
    from views.list import join_lists

    jobs, sides = dict(pipeline.jobs), {}
    for job in pipeline.jobs.values():
        if job.kind != "join":
            continue
        join = TableJoin(spark, *pipeline.sides(job.name), job.spec.match)
        shapes = {lv.view.name: lv.shape for lv in join_lists(join, job.views)}
        shaped = {name: shape for name, shape in shapes.items() if shape is not None}
        if shaped:
            views = tuple(replace(v, fanout_limit=LIMIT) if v.name in shaped else v for v in job.views)
            jobs[job.name] = replace(job, views=views)
            sides[job.name] = 1 - next(iter(shaped.values())).side
    return replace(pipeline, jobs=jobs), sides


def _train(lake: Path) -> None:
    """The training run (in its own process and JVM): each job of the settings' pipeline over
    `training_workload()`, twice (the earlier half of the records, then the later), then every join job with a list view again under a
    fan-out limit (`_limited`), on the whole workload and then in HEAVY_BATCHES batches of one entry of a hot
    value each (`heavy_entries`)."""
    from jobs.core.registry import job_spec
    from jobs.core.spark import get_spark
    from jobs.dev.redis import scratch_redis

    proc, port = scratch_redis(lake.parent)
    try:
        env = {"LAKE_DIR": str(lake), "REDIS_URL": f"redis://127.0.0.1:{port}/0", "SPARK_MASTER": "local[2]"}
        env["METRICS_PORT"] = "off"
        settings = Settings.from_env({**os.environ, **env})
        pipeline = settings.pipeline()
        spark = get_spark(settings, "mview-jvm-training")
        workload = training_workload(pipeline)
        for half in (0, 1):
            for name, records in workload.items():
                part = records[: len(records) // 2] if half == 0 else records[len(records) // 2 :]
                _ingest(lake, pipeline.topics[name], part, lake.parent / f"{name}{half}.jsonl")
            for job in pipeline.jobs:
                totals = job_spec(settings, job).run(spark, settings, once=True)
                _say(f"training batch {half + 1}/2 of {job}: {totals}")
        # The path of a deployed job under a fan-out limit: hot values over the limit, then batches of entries of
        # one of them only (written before the batch is counted, `jobs.kinds.join`).
        hybrid = lake.parent / "lake-hybrid"
        over = {"LAKE_DIR": str(hybrid), "REDIS_URL": f"redis://127.0.0.1:{port}/1"}
        settings = Settings.from_env({**os.environ, **env, **over})
        limited, sides = _limited(spark, pipeline)
        synth = Synth(pipeline, seed=6, first=10**9)  # new entries, not changes of the workload's
        for job, side in sides.items():
            spec = job_spec(settings, job)
            for name in pipeline.jobs[job].topics:
                _ingest(hybrid, pipeline.topics[name], workload[name], lake.parent / f"{name}-h.jsonl")
            spec.call("runner", spark, settings, limited, job, once=True)
            entry_topic = pipeline.topics[pipeline.jobs[job].topics[side]]
            for n, rec in enumerate(heavy_entries(synth, pipeline, job, side, HEAVY_BATCHES)):
                _ingest(hybrid, entry_topic, [rec], lake.parent / f"{entry_topic.name}-h{n}.jsonl")
                spec.call("runner", spark, settings, limited, job, once=True)
            _say(f"training: {job}'s batches of a hot value's entries under a fan-out limit")
        # The JVM writes the recorded configuration as it exits, which it does when its stdin closes: wait for it.
        jvm = driver_jvm(spark)
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
    _say("creating the cache from what the training recorded")
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
    (d / "stamp.json").write_text(json.dumps({"java": str(java), "jars": spark_jars_stamp()}))
    _say(f"{cache} ({cache.stat().st_size / 2**20:.0f} MiB) in {time.monotonic() - started:.0f}s")
    return cache


if __name__ == "__main__":
    if sys.argv[1:2] == ["--train"]:
        _train(Path(sys.argv[2]))
    else:
        build(Settings.from_env())
