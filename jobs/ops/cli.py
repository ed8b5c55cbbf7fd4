"""`mview`: the command line. Commands that only read Redis or the lake never start Spark.

Every command works on the pipeline of `MVIEW_PIPELINE` (the built-in one when unset): `main` refuses an invalid
pipeline before any command starts anything, with its problems one line each (`<file>:<line>: <key>: <what>`),
exactly as `mview check` prints them; `mview check [FILE]` validates a pipeline file without Spark. A pipeline
one of whose topics no longer fits the records its log holds (`changelog.topics.check_topic`) is invalid too: every
command refuses it (those that only read Redis or the lake's status included), in `mview check`'s lines; those
that write a log or start a job check their topics again when they open them."""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main"]


def _settings():
    from jobs.core.settings import Settings

    try:
        return Settings.from_env()
    except ValueError as e:
        raise SystemExit(f"mview: bad configuration: {e}") from None


def _spark(settings, app: str):
    try:
        from jobs.core.spark import get_spark
    except ImportError as e:  # pragma: no cover - only without `make setup`
        raise SystemExit(f"mview: missing dependency ({e.name}): run `make setup`") from None
    return get_spark(settings, app)


def _lake(settings, *, write: bool):
    from jobs.core.lake import require_lake

    return require_lake(settings, write=write)


def _redis(settings):
    from views.errors import RedisUnavailable
    from views.redis_io import connect

    try:
        return connect(settings.redis_url, cluster=settings.redis_cluster, wait=False)
    except RedisUnavailable as e:
        raise SystemExit(f"mview: {e}") from None


def _pipeline(settings):
    """The settings' pipeline (`main` has refused an invalid one)."""
    return settings.pipeline()


def _topic(settings, name: str):
    """The pipeline's topic `name`; an unknown one is one line naming the pipeline's topics."""
    return settings.topic(name)


def _check_topics(settings, topics) -> None:
    """Refuse (`TopicChanged`, one line) when the declaration of one of `topics` no longer fits the records its
    log holds; a log that only needs to grow, or does not exist yet, is fine (it is brought to the declaration when
    it is opened)."""
    from changelog.topics import check_topic

    for topic in topics:
        check_topic(settings.lake, topic)


def _job_topics(settings, job: str) -> list:
    """The topics the job `job` reads (a pipeline job) or writes (kafka: every topic; cdc: the captured ones), but
    those read from a view, whose logs their jobs write. `ChainNotRun` if `job` reads a view that keeps no table
    log."""
    from jobs.core.chain import check_chain
    from jobs.core.registry import job_spec

    pipeline = _pipeline(settings)
    if job in pipeline.jobs:
        check_chain(pipeline, job)
    return [pipeline.topics[t] for t in job_spec(settings, job).topics if pipeline.topics[t].view is None]


def _commit_bound() -> dict:
    """`mview ingest`'s commit bound: INGEST_COMMIT_RECORDS and INGEST_COMMIT_BYTES (positive integers), each
    defaulting to `changelog.ingest`'s."""
    from changelog import ingest as module

    bound = {}
    for var, key, default in (
        ("INGEST_COMMIT_RECORDS", "commit_records", module.COMMIT_RECORDS),
        ("INGEST_COMMIT_BYTES", "commit_bytes", module.COMMIT_BYTES),
    ):
        text = os.environ.get(var, "").strip().replace("_", "")
        if not text:
            bound[key] = default
        elif text.isdigit() and int(text) > 0:
            bound[key] = int(text)
        else:
            raise SystemExit(f"mview: bad configuration: {var} must be a positive integer, not {text!r}")
    return bound


def _ingested(topic: str, files: list[dict]) -> None:
    """One line per file ingested: its counts, and the lines an earlier run had committed."""
    for f in files:
        before = f.get("already_committed")
        earlier = f"; lines 1-{before:,} were committed before" if before else ""
        print(
            f"{topic}: {f['file']}: accepted {f['accepted']:,}, rejected {f['rejected']:,}{earlier}"
            f" ({f['seconds']}s)"
        )


def cmd_ingest(args) -> int:
    from changelog.errors import IngestFailed, NotStored
    from changelog.ingest import deadletter_path, ingest

    settings = _settings()
    topic = _topic(settings, args.topic)
    bound = _commit_bound()
    _lake(settings, write=True)
    missing = [f for f in args.files if f != "-" and not os.path.isfile(f)]
    if missing:
        raise SystemExit(f"mview: no such file: {missing[0]}")
    try:  # no Spark: ingest appends with delta-rs
        result = ingest(
            None,
            settings.lake,
            topic,
            args.files,
            progress=lambda m: print(m, file=sys.stderr, flush=True),
            quiet=True,  # a failure is one line: delta-rs's Rust panic report is not shown
            **bound,
        )
    except FileNotFoundError as e:
        raise SystemExit(f"mview: no such file: {e.filename}") from None
    except (IngestFailed, NotStored) as e:  # the files before it are ingested whole: say so first
        done = getattr(e, "result", None)
        if done is not None:
            _ingested(args.topic, done.files)
            sys.stdout.flush()
        raise
    _ingested(args.topic, result.files)
    if result.rejected:
        print(f"{args.topic}: rejected lines and reasons are in {deadletter_path(settings.lake, topic)}")
    if args.json:
        print(json.dumps(result.summary()))
    return 0


def cmd_produce(args) -> int:
    from changelog.errors import NotProduced
    from changelog.kafka import publish

    settings = _settings()
    topic = _topic(settings, args.topic)
    if not settings.kafka_bootstrap:
        raise SystemExit(
            "mview: Kafka is not configured: set KAFKA_BOOTSTRAP (e.g. 127.0.0.1:9092 after `make kafka`)"
        )
    missing = [f for f in args.files if f != "-" and not os.path.isfile(f)]
    if missing:
        raise SystemExit(f"mview: no such file: {missing[0]}")
    if settings.lake_dir is None or settings.lake_dir.is_dir():  # the logs the kafka job will copy into
        from changelog.storage import LakeUnreachable

        try:
            _check_topics(settings, [topic])
        except LakeUnreachable:  # a lake that does not answer now: the kafka job checks when it copies
            pass
    try:
        result = publish(settings.kafka_bootstrap, settings.kafka_topic_prefix, topic, args.files)
    except NotProduced as e:  # what did reach the broker, then the one line of the failure
        _published(e.result, args.json)
        sys.stdout.flush()
        raise
    _published(result, args.json)
    return 0


def _published(result, as_json: bool) -> None:
    """`mview produce`'s report: the messages acknowledged, each line skipped (over the maximum message size) and
    the lines not acknowledged, as a line of JSON or for people."""
    from changelog.errors import line_ranges
    from changelog.kafka import MAX_MESSAGE_BYTES

    if as_json:
        print(json.dumps(result.summary()))
        return
    print(f"{result.topic}: produced {result.produced:,} messages")
    for file, line, size in result.skipped:
        print(
            f"{result.topic}: {file}: line {line:,} skipped: {size:,} bytes, over the maximum message size of"
            f" {MAX_MESSAGE_BYTES:,} bytes (and the maximum record size)"
        )
    for file, ranges in result.not_acknowledged:
        print(f"{result.topic}: {file}: not acknowledged: line(s) {line_ranges(ranges)}")


def cmd_run(args) -> int:
    from jobs.core.registry import job_spec

    settings = _settings()
    spec = job_spec(settings, args.job)
    _lake(settings, write=True)
    _check_topics(settings, _job_topics(settings, spec.name))
    if spec.source:  # copies an outside system into the logs: no Spark, no Redis, no generations
        if not args.once:
            from jobs.ops.source import serve_source

            return serve_source(settings, spec.name)
        from jobs.ops.service import once_lease

        with once_lease(settings, spec.name):
            _summary(args, spec, spec.run(None, settings, once=True))
        return 0
    if not args.once:  # deployed: follows replays, restarts on failure, waits for Redis (jobs.ops.service)
        from jobs.ops.service import serve

        return serve(_spark(settings, f"mview-{spec.name}"), settings, spec.name)
    _redis(settings)
    for up in _pipeline(settings).chain(spec.name):  # what the job reads the views of, first
        _check_topics(settings, _job_topics(settings, up))
        _summary(args, job_spec(settings, up), _once(settings, up))
    _summary(args, spec, _once(settings, spec.name))
    return 0


def _once(settings, job: str) -> dict:
    """Run pipeline job `job` once (everything its logs hold now); its totals."""
    from jobs.core.registry import job_spec
    from jobs.core.replay import caught_up
    from jobs.ops.service import once_lease

    with once_lease(settings, job):  # refused while another driver runs the job
        if caught_up(settings, job):  # nothing new in its logs: no Spark to start
            return {"batches": 0, "events": 0, "seconds": 0.0}
        return job_spec(settings, job).run(_spark(settings, f"mview-{job}"), settings, once=True)


def _summary(args, spec, totals: dict) -> None:
    """One line of a run's totals, or JSON with --json (a source job's summary is its own: kafka, per topic)."""
    if getattr(args, "json", False):
        print(json.dumps(totals if spec.source else {"job": spec.name, **totals}))
    else:
        print(f"{spec.name}: " + ", ".join(f"{k} {_number(v)}" for k, v in totals.items()))


def _number(value) -> str:
    """A summary value for people: ints with thousands separators, floats to two places, anything else as JSON."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return json.dumps(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.2f}"


def cmd_query(args) -> int:
    from jobs.core.registry import view_job
    from views.read import query_view

    settings = _settings()
    job = view_job(settings, args.view)
    result = query_view(
        _redis(settings), args.view, args.key, limit=args.limit, job=job, pipeline=settings.pipeline()
    )
    if args.json:
        print(json.dumps(result))
    else:
        from views.read import format_result

        text = format_result(args.view, result, pipeline=settings.pipeline())
        if text:
            print(text)
    return 0


def cmd_export(args) -> int:
    from jobs.core.registry import view_job
    from views.kinds import view_kind
    from views.read import export_view

    out = sys.stdout
    settings = _settings()
    job = view_job(settings, args.view)
    pipeline = settings.pipeline()
    if not view_kind(pipeline.views[args.view]).in_redis:  # an output log in the lake, read with Spark
        _lake(settings, write=False)
    rows = export_view(
        _redis(settings),
        args.view,
        job=job,
        lake=settings.lake,
        spark=lambda: _spark(settings, f"mview-export-{args.view}"),
        pipeline=pipeline,
    )
    for row in rows:
        out.write(json.dumps(row) + "\n")
    return 0


def cmd_status(args) -> int:
    from jobs.errors import LakeUnusable
    from jobs.ops.status import drivers_here, job_status

    settings = _settings()
    try:
        _lake(settings, write=False)
    except LakeUnusable:  # what this machine knows without the lake, then the one-line error
        for job, d in drivers_here(settings).items():
            print(
                f"{job}: running here (pid {d['pid']}); its status is in the lake; its log says: {d['log']}"
            )
        raise
    status = job_status(settings)
    if not args.json:
        for job, s in status.items():
            print(f"{job}: " + ", ".join(f"{k}={v}" for k, v in s.items()))
    else:
        print(json.dumps(status))
    return 0


def cmd_deploy(args) -> int:
    from jobs.ops.deploy import deploy

    settings = _settings()
    _lake(settings, write=True)
    _check_topics(settings, _job_topics(settings, args.job))
    return deploy(settings, args.job)


def cmd_stop(args) -> int:
    from jobs.core.registry import job_spec
    from jobs.ops.deploy import stop

    settings = _settings()
    if args.drop_slot and job_spec(settings, args.job).name != "cdc":
        raise SystemExit("mview: --drop-slot is for the cdc job only")
    code = stop(settings, args.job)
    if args.drop_slot:  # the slot holds WAL on the server for as long as it exists
        from jobs.kinds.cdc import drop

        removed = drop(settings)
        print(f"cdc: removed {' and '.join(removed)}" if removed else "cdc: no slot or publication to remove")
    return code


def cmd_replay(args) -> int:
    from jobs.core.registry import job_spec
    from jobs.ops.replay import replay

    settings = _settings()
    if job_spec(settings, args.job).source:  # an unknown job is one line at once, not after Spark's start
        raise SystemExit(
            f"mview: {args.job} copies an outside system into the logs: it has no views to replay"
        )
    _lake(settings, write=True)
    _check_topics(settings, _job_topics(settings, args.job))
    _redis(settings)
    code = replay(_spark(settings, f"mview-replay-{args.job}"), settings, args.job)
    if code == 0:
        _rebuild_downstream(args, settings)
    return code


def _rebuild_downstream(args, settings) -> None:
    """After a replay of `args.job`: each job that reads its views (directly or through others), in chain order, run
    once, which rebuilds it from the new generation's logs (`jobs.core.chain`); a deployed one follows by itself."""
    from jobs.core.registry import job_spec
    from jobs.errors import JobRunning

    for job in _pipeline(settings).downstream(args.job):
        try:
            _summary(args, job_spec(settings, job), _once(settings, job))
        except JobRunning:
            print(f"{job}: deployed: it rebuilds from the new generation by itself")


def cmd_maintain(args) -> int:
    from jobs.ops.maintain import maintain, start_scheduler

    settings = _settings()
    _lake(settings, write=True)
    _redis(settings)
    spark = _spark(settings, "mview-maintain")
    if args.once:
        report = maintain(spark, settings)
        print(json.dumps(report) if args.json else "\n".join(f"{k}: {v}" for k, v in report.items()))
        return 0
    start_scheduler(spark, settings, background=False)
    return 0


def _changed_topics(pipeline) -> list[str]:
    """One line per topic of `pipeline` whose log holds records its declaration no longer fits
    (`changelog.topics.check_topic`), where LAKE_DIR exists (a local directory, or a store that answers; one that
    does not is left to the command); only the line of `changelog.lakeformat.format_problem` for a lake of another
    format. Reads only: creates and writes nothing."""
    from changelog.errors import TopicChanged
    from changelog.lakeformat import format_problem
    from changelog.storage import StorageError, open_lake
    from changelog.topics import check_topic
    from jobs.core.settings import lake_location

    local, uri = lake_location()
    problems = []
    if local is None or local.is_dir():
        try:
            lake = open_lake(uri)
            problem = format_problem(lake)
            if problem:
                return [f"LAKE_DIR {lake.uri()} {problem}"]
            for topic in pipeline.topics.values():
                if topic.view is not None:  # its log is the view's, of the generation its job writes
                    continue
                try:
                    check_topic(lake, topic)
                except TopicChanged as e:
                    problems.append(str(e))
        except StorageError:  # a store that does not answer (or refuses): the file alone is checked
            pass
    return problems


def cmd_check(args) -> int:
    """Validate the pipeline file `args.file` (default: MVIEW_PIPELINE's, else the built-in one) without Spark:
    its problems one line each and exit 1, or a short summary and exit 0. Where LAKE_DIR exists (a local directory,
    or a store that answers), each topic's log is compared with its declaration too (a change its records do not
    follow is a problem)."""
    from changelog.postgres import captured_topics
    from spec import PipelineError
    from views.pipeline import load_pipeline, pipeline_file

    file = args.file or pipeline_file()
    try:
        pipeline = load_pipeline(file)
    except PipelineError as e:
        print(str(e), file=sys.stderr)
        return 1
    problems = _changed_topics(pipeline)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    captured = {t.name: t.capture.postgres for t in captured_topics(pipeline.topics.values())}
    views = pipeline.views
    print(f"{file}: valid: {len(pipeline.topics)} topics, {len(pipeline.jobs)} jobs, {len(views)} views")
    topics = [
        f"{n} ({t.kind}{', captured from ' + captured[n] if n in captured else ''}"
        f"{', read from ' + t.source if t.source else ''}{', view ' + t.view if t.view else ''})"
        for n, t in pipeline.topics.items()
    ]
    print(f"topics: {', '.join(topics)}")
    if pipeline.jobs:
        jobs = [
            f"{n} ({j.kind}: {' x '.join(j.topics)}"
            + (f"; after {', '.join(pipeline.chain(n))}" if pipeline.upstream(n) else "")
            + ")"
            for n, j in pipeline.jobs.items()
        ]
        print(f"jobs: {', '.join(jobs)}")
        shown = (
            f"{n} ({v.kind} of {v.job}{', ' + v.window.text if v.window else ''})" for n, v in views.items()
        )
        print(f"views: {', '.join(shown)}")
    return 0


def cmd_ui(args) -> int:
    from jobs.ops.httpd import serve_until_interrupted
    from jobs.ops.ui import serve_in_thread

    settings = _settings()
    _lake(settings, write=False)
    server = serve_in_thread(settings, "127.0.0.1", args.port, page_url=args.page_url)
    print(f"operations page at http://127.0.0.1:{server.server_port}/  (Ctrl-C stops)", flush=True)
    serve_until_interrupted(server)
    return 0


_JSON = ("--json", {"action": "store_true", "help": "machine-readable output (JSON)"})
_ONCE = ("--once", {"action": "store_true"})

# command -> (function, help, arguments): every subcommand of the contract, one row each.
_COMMANDS = {
    "ingest": (
        cmd_ingest,
        "append the valid records of FILEs (- = stdin) to TOPIC's log",
        [
            ("topic", {}),
            ("files", {"nargs": "+"}),
            ("--json", {"action": "store_true", "help": "end with a JSON summary line"}),
        ],
    ),
    "produce": (
        cmd_produce,
        "publish every non-blank line of FILEs (- = stdin) to TOPIC's Kafka topic, unvalidated",
        [("topic", {}), ("files", {"nargs": "+"}), _JSON],
    ),
    "run": (
        cmd_run,
        "run JOB; --once processes everything in its logs now and exits",
        [("job", {}), _ONCE, _JSON],
    ),
    "deploy": (cmd_deploy, "start JOB as a background streaming query", [("job", {})]),
    "stop": (
        cmd_stop,
        "stop a deployed JOB after its batch in flight",
        [
            ("job", {}),
            (
                "--drop-slot",
                {"action": "store_true", "help": "cdc: also remove its replication slot and publication"},
            ),
        ],
    ),
    "query": (
        cmd_query,
        "one KEY of VIEW, from Redis",
        [("view", {}), ("key", {}), ("--limit", {"type": int, "default": None}), _JSON],
    ),
    "export": (cmd_export, "every key of VIEW as JSON lines", [("view", {})]),
    "replay": (
        cmd_replay,
        "rebuild JOB's views into a new generation, then switch atomically (then the jobs over its views)",
        [("job", {})],
    ),
    "maintain": (
        cmd_maintain,
        "OPTIMIZE/VACUUM/compact logs and state, drop old generations",
        [
            (
                "--once",
                {
                    "action": "store_true",
                    "help": "one round now, then exit (default: every MAINTENANCE_INTERVAL)",
                },
            ),
            _JSON,
        ],
    ),
    "status": (cmd_status, "per job: running, generation, last batch, lag, counts", [_JSON]),
    "check": (
        cmd_check,
        "validate a pipeline file (default: MVIEW_PIPELINE's) without Spark: its problems, or a summary",
        [("file", {"nargs": "?", "default": None})],
    ),
    "ui": (
        cmd_ui,
        "serve the operations page on 127.0.0.1 (every job, live charts)",
        [
            ("--port", {"type": int, "default": 8764}),
            (
                "--page-url",
                {
                    "default": "http://127.0.0.1:8765/",
                    "help": "a page the operations page links to (the demo's live page)",
                },
            ),
        ],
    ),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mview", description="Stream joins and materialized views on Spark, Delta and Redis"
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, (func, help_text, arguments) in _COMMANDS.items():
        s = sub.add_parser(name, help=help_text)
        for flag, options in arguments:
            s.add_argument(flag, **options)
        s.set_defaults(func=func)
    return p


def _shown(error) -> str:
    """An error as the command line prints it: every password masked (`changelog.errors.redact`), those of
    REDIS_URL and PG_DSN wherever they appear in it."""
    from changelog.errors import redact

    return redact(error, os.environ.get("REDIS_URL"), os.environ.get("PG_DSN"))


def _refuse_invalid_pipeline() -> None:
    """Exit 1 with the pipeline's problems, one line each (as `mview check` prints them), when the pipeline of
    the environment is not valid, or one of its topics no longer fits the records its log holds
    (`_changed_topics`): before a command starts anything. A valid one stays loaded for the command."""
    from spec import PipelineError
    from views.pipeline import default_pipeline

    try:
        _settings().pipeline()
        # the topics whose logs it does not fit, the file named as MVIEW_PIPELINE names it (as `mview check`)
        problems = "\n".join(_changed_topics(default_pipeline()))
        if not problems:
            return
    except PipelineError as e:
        problems = e
    try:  # the same problems, the file named as MVIEW_PIPELINE names it (the settings resolve the path)
        default_pipeline()
    except PipelineError as e:
        problems = e
    print(_shown(problems), file=sys.stderr)
    raise SystemExit(1)


def main(argv: list[str] | None = None) -> int:
    from changelog.errors import ChangelogError
    from jobs.errors import JobsError
    from joins.sparkapi import SparkUnsupported
    from views.errors import ViewError

    args = build_parser().parse_args(argv)
    try:
        if args.func is not cmd_check:
            _refuse_invalid_pipeline()
        return args.func(args) or 0
    except (ChangelogError, JobsError, ViewError, SparkUnsupported) as e:
        print(f"mview: {_shown(e)}", file=sys.stderr)
        return 1
    except SystemExit as e:  # a command's one-line refusal (`raise SystemExit("mview: ...")`)
        if isinstance(e.code, str):
            raise SystemExit(_shown(e.code)) from None
        raise
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
