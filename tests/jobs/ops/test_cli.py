"""The command line as a user meets it: every command of the contract run through the installed entry point
(`.venv/bin/mview` in a subprocess), for every job and view, with and without `--json`: the exit status, the
output's shape and content, and a one-line error (non-zero, no traceback) for each documented failure.

One lake and one Redis database for the module, filled step by step: each Spark command starts a JVM of its own,
so the scenario is cut into few commands that each check what they print. Every command runs at least once through
the entry point; repeats of a command (the other jobs and views) run `jobs.ops.cli.main` in this process (`world["here"]`,
same arguments, environment, exit status, stdout and stderr), where Spark is the session's JVM, already warm."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from changelog.deadletters import read_dead_letters
from changelog.storage import as_lake
from changelog.topics import MAX_BEFORE
from jobs.core.registry import jobs
from jobs.core.settings import Settings
from tests.conftest import make_settings, write_jsonl
from tests.jobs.opshelp import wait_for
from tests.lakehelp import as_topic

JOBS = jobs(Settings.from_env({}))  # the built-in pipeline's jobs

MVIEW = str(Path(sys.executable).with_name("mview"))
T0 = 1_700_000_000_000
MIN, HOUR = 60_000, 3_600_000

RECORDS = {
    "follows": [
        {"op": "follow", "follower_id": "b", "followee_id": "a", "ts": T0},
        {"op": "follow", "follower_id": "c", "followee_id": "a", "ts": T0},
        {"op": "unfollow", "follower_id": "c", "followee_id": "a", "ts": T0 + MIN},
    ],
    "tweets": [
        {"op": "post", "tweet_id": "t1", "user_id": "a", "text": "first", "ts": T0 + 1},
        {"op": "post", "tweet_id": "t2", "user_id": "a", "text": "gone", "ts": T0 + 2},
        {"op": "delete", "tweet_id": "t2", "user_id": "a", "ts": T0 + 3},
        {"op": "post", "tweet_id": "t3", "user_id": "a", "text": "bell \x1b[31mred\x07", "ts": T0 + 4},
    ],
    "searches": [
        {"search_id": "s1", "session_id": "x", "query": "q", "ts": T0},
        {"search_id": "s2", "session_id": "y", "query": "q", "ts": T0},
        {"search_id": "s3", "session_id": "z", "query": "later", "ts": T0 + 3 * HOUR},
    ],
    "clicks": [{"click_id": "c1", "session_id": "x", "url": "/r", "ts": T0 + MIN}],
    "profiles": [
        {"op": "upsert", "user_id": "a", "name": "Ann", "country": "NL", "ts": T0},
        {"op": "upsert", "user_id": "zz", "name": "Zed", "country": "FR", "ts": T0 + 2 * HOUR},
    ],
    "activity": [
        {"event_id": "e1", "user_id": "a", "action": "view", "ts": T0 + 5 * MIN},
        {"event_id": "e2", "user_id": "nobody", "action": "view", "ts": T0 + 6 * MIN},
    ],
}


class Cli:
    def __init__(self, env: dict[str, str], tmp: Path):
        self.env, self.tmp = env, tmp

    def __call__(self, *args: str, ok: bool = True, env: dict | None = None, timeout: float = 600):
        return self.check(self._run(args, {**self.env, **(env or {})}, timeout), args, ok=ok)

    def _run(self, args, env: dict, timeout: float) -> subprocess.CompletedProcess:
        return subprocess.run(
            [MVIEW, *args], env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    def start(self, *args: str) -> subprocess.Popen:
        """The command started in the background; `finish` waits for it and checks its exit status."""
        return subprocess.Popen(
            [MVIEW, *args],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )

    def finish(self, proc: subprocess.Popen, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        out, err = proc.communicate(timeout=timeout)
        return self.check(subprocess.CompletedProcess(proc.args, proc.returncode, out, err), args)

    @staticmethod
    def check(proc: subprocess.CompletedProcess, args, *, ok: bool = True) -> subprocess.CompletedProcess:
        if ok:
            assert proc.returncode == 0, (
                f"mview {' '.join(args)}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
            )
        return proc

    def error(self, *args: str, env: dict | None = None, says: str) -> str:
        """Run a command that must fail: exit non-zero, one line on stderr that contains `says`, no traceback."""
        proc = self(*args, ok=False, env=env)
        assert proc.returncode != 0, f"mview {' '.join(args)} succeeded: {proc.stdout}"
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert "Traceback" not in proc.stderr, proc.stderr
        assert len(lines) == 1 and lines[0].startswith("mview: ") and says in lines[0], proc.stderr
        return lines[0]

    def json_line(self, *args: str):
        proc = self(*args, "--json")
        return json.loads(proc.stdout.strip().splitlines()[-1])


class InProcess(Cli):
    """The same commands through `jobs.ops.cli.main` in this process: the environment set while it runs, stdout and
    stderr captured, a `SystemExit` turned into the exit status and stderr line the interpreter would print."""

    def _run(self, args, env: dict, timeout: float) -> subprocess.CompletedProcess:
        from jobs.ops.cli import main

        out, err = io.StringIO(), io.StringIO()
        with (
            pytest.MonkeyPatch.context() as mp,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            for k, v in env.items():
                if os.environ.get(k) != v:
                    mp.setenv(k, v)
            try:
                code = main(list(args))
            except SystemExit as e:  # a message: printed to stderr, exit status 1 (as the interpreter does)
                code = e.code
                if isinstance(code, str):
                    print(code, file=sys.stderr)
                    code = 1
        return subprocess.CompletedProcess(["mview", *args], code or 0, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def world(redis_server, tmp_path_factory, spark):
    tmp = tmp_path_factory.mktemp("cli")
    url = redis_server["url"].rsplit("/", 1)[0] + "/3"
    redis.Redis.from_url(url).flushdb()
    settings = make_settings(tmp / "lake", url)
    env = {
        **os.environ,
        "LAKE_DIR": str(settings.lake_dir),
        "REDIS_URL": url,
        "SPARK_MASTER": "local[2]",
        "SHUFFLE_PARTITIONS": "2",
        "SPARK_DRIVER_MEMORY": "1g",
        "TRIGGER_INTERVAL": "200 ms",
        "REPLAY_GRACE": "0 s",
        "PYSPARK_PYTHON": sys.executable,
    }
    files = {t: write_jsonl(tmp / f"{t}.jsonl", rs) for t, rs in RECORDS.items()}
    return {
        "cli": Cli(env, tmp),
        "here": InProcess(env, tmp),
        "settings": settings,
        "files": files,
        "tmp": tmp,
        "spark": spark,
    }


def test_ingest_with_and_without_json_and_its_errors(world):
    cli, tmp, files = world["cli"], world["tmp"], world["files"]
    bad = tmp / "tweets-bad.jsonl"
    bad.write_bytes(Path(files["tweets"]).read_bytes() + b'not json\n{"op":"post"}\n')
    out = cli("ingest", "tweets", str(bad), "--json").stdout.strip().splitlines()
    assert json.loads(out[-1]) == {"topic": "tweets", "accepted": 4, "rejected": 2}
    assert "accepted 4, rejected 2" in out[0]
    text = cli("ingest", "follows", files["follows"]).stdout
    assert "accepted 3, rejected 0" in text and not text.strip().splitlines()[-1].startswith("{")
    dead = list(read_dead_letters(world["settings"].lake, world["settings"].topic("tweets")))
    assert [(d["file"], d["line"]) for d in dead] == [(str(bad), 5), (str(bad), 6)]
    # The other topics: ingest starts no JVM, so it works where Java cannot be found.
    no_java = {"JAVA_HOME": str(tmp / "no-java"), "PATH": str(tmp / "no-bin")}
    for topic in ("searches", "clicks", "profiles", "activity"):
        out = cli("ingest", topic, files[topic], "--json", env=no_java).stdout.strip().splitlines()
        assert json.loads(out[-1])["rejected"] == 0

    cli.error("ingest", "nope", files["tweets"], says="unknown topic 'nope'")
    cli.error("ingest", "tweets", str(tmp / "missing.jsonl"), says="no such file")
    if _unwritable("/sys/kernel"):  # a directory even root cannot write to (sysfs is read-only here)
        cli.error(
            "ingest", "tweets", files["tweets"], env={"LAKE_DIR": "/sys/kernel"}, says="cannot be written"
        )
        cli.error(
            "run", "timeline", "--once", env={"LAKE_DIR": "/sys/kernel/mview"}, says="cannot be written"
        )


def _unwritable(path: str) -> bool:
    try:
        Path(path, ".mview-probe").touch()
    except OSError:
        return True
    Path(path, ".mview-probe").unlink()
    return False


@pytest.mark.slow
def test_run_once_every_job_with_and_without_json(world):
    cli, here = world["cli"], world["here"]
    timeline = cli.start("run", "timeline", "--once", "--json")  # its own JVM, while the others run here
    text = here("run", "clicks", "--once").stdout.strip().splitlines()[-1]
    assert text.startswith("clicks: batches ") and "events 4" in text
    summary = here.json_line("run", "enrichment", "--once")
    assert summary["job"] == "enrichment" and summary["events"] == 2
    summary = json.loads(cli.finish(timeline, "run", "timeline").stdout.strip().splitlines()[-1])
    assert summary["job"] == "timeline" and summary["events"] == 7 and summary["entries"] >= 2
    cli.error("run", "nope", "--once", says="unknown job 'nope'")
    cli.error(
        "run", "timeline", "--once", env={"REDIS_URL": "redis://127.0.0.1:1/0"}, says="cannot reach Redis"
    )


@pytest.fixture(scope="module")
def ran(world):
    """Every built-in job run once here over the ingested records: the views the read commands read (a no-op fast
    path where test_run_once_every_job ran them, a slow test that `make test-fast` leaves out)."""
    for job in ("timeline", "clicks", "enrichment"):
        world["here"]("run", job, "--once")
    return world


def test_query_every_view_with_and_without_json(ran):
    cli, here = ran["cli"], ran["here"]
    got = cli.json_line("query", "timeline", "b")
    assert got["user_id"] == "b" and got["generation"] == 1
    assert [t["tweet_id"] for t in got["tweets"]] == ["t3", "t1"] and "tweet_ids" not in got
    assert got["tweets"][1] == {"tweet_id": "t1", "user_id": "a", "text": "first", "ts": T0 + 1}
    text = cli("query", "timeline", "b").stdout
    assert "\x1b" not in text and "\\x1b[31mred\\x07" in text and "t1  @a: first" in text
    assert here.json_line("query", "timeline", "b", "--limit", "1")["tweets"][0]["tweet_id"] == "t3"
    assert here.json_line("query", "timeline", "c") == {}  # unfollowed: no entry, `{}` as every kind, exit 0
    assert here("query", "timeline", "nobody").stdout == ""

    s1 = here.json_line("query", "search_clicks", "s1")
    line = {"search_id": "s1", "session_id": "x", "query": "q", "ts": T0, "clicked": True, "clicks": 1}
    assert {k: s1[k] for k in line} == line and s1["final"] is True
    assert json.loads(here("query", "search_clicks", "s2").stdout)["clicked"] is False
    # every count view's query adds `generation` (the contract's rule; decided for the built-in ones in #34)
    assert here.json_line("query", "ctr", "q") == {"query": "q", "searches": 2, "clicked": 1, "generation": 1}
    nl = {"country": "NL", "events": 1, "generation": 1}
    assert here.json_line("query", "activity_by_country", "NL") == nl
    assert here.json_line("query", "activity_by_country", "XX") == {}  # a key with no entry (decided, #34)
    assert here("query", "activity_by_country", "NL").stdout.split() == ["NL", "1"]
    assert here("query", "ctr", "no-such-query").stdout.strip() in ("", "{}")

    here.error("query", "enriched_activity", "e1", says="output log")
    cli.error("query", "nope", "k", says="unknown view 'nope'")
    cli.error("query", "timeline", "b", env={"REDIS_URL": "redis://127.0.0.1:1/0"}, says="cannot reach Redis")


def test_export_every_view(ran):
    cli, here = ran["cli"], ran["here"]

    def lines(view, cli=here):
        return [json.loads(x) for x in cli("export", view).stdout.splitlines()]

    assert lines("timeline", cli) == [{"user_id": "b", "tweet_ids": ["t3", "t1"]}]
    closed = {r["search_id"]: r for r in lines("search_clicks")}
    assert closed["s1"]["clicked"] is True and closed["s2"]["clicked"] is False and "s3" not in closed
    assert lines("ctr") == [{"query": "q", "searches": 2, "clicked": 1}]
    assert lines("activity_by_country") == [
        {"country": "NL", "events": 1},
        {"country": "unknown", "events": 1},
    ]
    enriched = lines("enriched_activity")
    assert enriched == [
        {"event_id": "e1", "user_id": "a", "action": "view", "ts": T0 + 5 * MIN,
         "profile_version": f"a@{T0}", "name": "Ann", "country": "NL"},
        {"event_id": "e2", "user_id": "nobody", "action": "view", "ts": T0 + 6 * MIN,
         "profile_version": None, "name": None, "country": None},
    ]  # fmt: skip
    cli.error("export", "nope", says="unknown view 'nope'")


@pytest.mark.slow  # three deployed drivers and a replay of its own: JVMs that run tens of seconds
def test_status_deploy_stop_and_replay(world):
    cli, here = world["cli"], world["here"]
    status = cli.json_line("status")
    status = {j: r for j, r in status.items() if not JOBS[j].source}  # the source jobs have their own tests
    assert set(status) == {"timeline", "clicks", "enrichment"}
    for job, row in status.items():
        assert row["running"] is False and row["pid"] is None and row["generation"] == 1, (job, row)
        assert row["lag_versions"] == 0, (job, row)
    assert status["timeline"]["rejected"] == 2
    text = cli("status").stdout
    assert "timeline: running=False" in text and "generation=1" in text

    jobs = ("timeline", "clicks", "enrichment")
    assert "deployed" in cli("deploy", "timeline").stdout
    for job in jobs[1:]:
        assert "deployed" in here("deploy", job).stdout
    assert "already running" in cli("deploy", "timeline").stdout

    def running():  # asked here: a poll that starts a Python process takes CPU from the starting JVMs
        rows = here.json_line("status")
        return rows if all(rows[j]["running"] and rows[j].get("state") == "running" for j in jobs) else None

    rows = wait_for(running, "the three deployed jobs", timeout_s=600, every_s=1.0)
    assert all(isinstance(rows[j]["pid"], int) for j in jobs) and len({rows[j]["pid"] for j in jobs}) == 3
    assert "running=True" in cli("status").stdout
    stopping = [cli.start("stop", job) for job in jobs]  # each waits for its job's batch in flight: at once
    for job, proc in zip(jobs, stopping, strict=True):
        assert "stopped" in cli.finish(proc, "stop", job).stdout
    assert "not running" in cli("stop", "timeline").stdout
    assert not any(r["running"] for r in cli.json_line("status").values())

    replaying = cli.start("replay", "timeline")  # its own JVM, while the others replay here
    for job in jobs[1:]:
        out = here("replay", job).stdout
        assert f"{job}: replayed into generation 2" in out, out
    out = cli.finish(replaying, "replay", "timeline").stdout
    assert "timeline: replayed into generation 2" in out, out
    assert [json.loads(x) for x in cli("export", "timeline").stdout.splitlines()] == [
        {"user_id": "b", "tweet_ids": ["t3", "t1"]}
    ]
    assert here.json_line("query", "ctr", "q") == {"query": "q", "searches": 2, "clicked": 1, "generation": 2}
    assert {j: r["generation"] for j, r in here.json_line("status").items() if not JOBS[j].source} == {
        "timeline": 2, "clicks": 2, "enrichment": 2
    }  # fmt: skip
    cli.error("deploy", "nope", says="unknown job 'nope'")
    cli.error("replay", "nope", says="unknown job 'nope'")


def test_read_only_commands_never_create_a_lake(world):
    cli, tmp = world["cli"], world["tmp"]
    missing = tmp / "typo" / "lake"
    cli.error("status", env={"LAKE_DIR": str(missing)}, says="does not exist")
    cli.error("status", "--json", env={"LAKE_DIR": str(missing)}, says="does not exist")
    cli("query", "timeline", "b", env={"LAKE_DIR": str(missing)})
    cli("export", "timeline", env={"LAKE_DIR": str(missing)})
    assert not (tmp / "typo").exists()
    # A read-only lake with no job in it: status reads, reports, creates nothing.
    if _unwritable("/sys/kernel"):
        rows = json.loads(cli("status", "--json", env={"LAKE_DIR": "/sys/kernel"}).stdout.splitlines()[-1])
        assert {j: (r["running"], r["lag_versions"]) for j, r in rows.items() if not JOBS[j].source} == {
            "timeline": (False, 0), "clicks": (False, 0), "enrichment": (False, 0)
        }  # fmt: skip


SHOP = Path(__file__).resolve().parents[3] / "timeline_demo" / "pipelines" / "shop.yml"


def _installed(*args: str, env: dict, cwd=None) -> subprocess.CompletedProcess:
    """The installed `.venv/bin/mview` with `env` over the process environment."""
    return subprocess.run(
        [MVIEW, *args], env={**os.environ, **env}, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_a_chain_is_checked_with_its_order_and_a_job_over_an_interval_row_view_says_in_one_line_it_does_not_run(
    tmp_path,
):
    """A pipeline with a job over other jobs' views: `mview check` shows what each job runs after; `run` of a job
    over an interval job's row view (whose rows change until their window closes), and `ingest` into a view's
    topic, refuse in one line, before Spark or the lake."""
    from tests.spec.test_load import CHAIN

    paid = (
        "  paid:\n    interval: {left: orders, right: payments, match: {order_id: order_id}, within: [0 s, 30 min]}\n"
        "    views: {paid_rows: {row: {order_id: order_id}, fields: {amount: amount}}}\n"
        "  recount:\n    select: {from: paid_table}\n    views: {n: {count: {amount: amount}, values: {n: 1}}}\n"
    )
    text = CHAIN.replace("jobs:\n", "  paid_table: {from: {view: paid_rows}}\njobs:\n" + paid)
    (tmp_path / "chain.yml").write_text(text)
    env = {"LAKE_DIR": str(tmp_path / "lake"), "MVIEW_PIPELINE": str(tmp_path / "chain.yml")}
    check = _installed("check", env=env)
    assert check.returncode == 0, check.stderr
    assert "rich (join: totals x tiers; after sums, tiers_job)" in check.stdout
    assert "totals (table, view by_customer)" in check.stdout
    run = _installed("run", "recount", "--once", env=env)
    assert run.returncode == 1 and run.stderr.splitlines() == [
        "mview: recount reads 'paid_table', row view 'paid_rows' of interval job 'paid': a job over an agg, count or "
        "log view, or a row view of a join, select or asof job, runs; over this one it is checked (mview check) but "
        "does not run yet; read the topics of its job instead"
    ]
    (tmp_path / "one.jsonl").write_text("{}\n")
    ingest = _installed("ingest", "totals", str(tmp_path / "one.jsonl"), env=env)
    assert ingest.returncode == 1 and "the view's job writes it" in ingest.stderr
    assert not (tmp_path / "lake" / "topics" / "totals").exists()


def test_check_says_every_problem_of_a_pipeline_one_line_each_and_every_command_refuses_it(tmp_path):
    """`mview check FILE` through the installed command: the shop passes with a summary; a broken copy gives one
    `<file>:<line>: <key>: ...` line per problem, exit 1, no traceback, no Spark; any other command with that
    file as MVIEW_PIPELINE prints the same lines and starts nothing (not even the lake)."""
    lake = tmp_path / "lake"
    env = {"LAKE_DIR": str(lake)}
    good = _installed("check", str(SHOP), env=env)
    assert good.returncode == 0 and good.stderr == "", good.stderr
    assert good.stdout.splitlines()[0] == f"{SHOP}: valid: 4 topics, 4 jobs, 17 views"
    assert (
        "customers (table, captured from public.customers)" in good.stdout and "paid (interval" in good.stdout
    )
    default = _installed("check", env=env)  # MVIEW_PIPELINE unset: the built-in pipeline
    assert default.returncode == 0 and "6 topics, 3 jobs, 5 views" in default.stdout

    text = SHOP.read_text()
    broken = (
        text.replace("within: [0 s, 30 min]", "within: [0 s, 30 minutes please]")
        .replace("amount: double, currency: string, method", "amount: dbl, currency: string, method")
        .replace("cap: 5", "cap: 0")
    )
    assert broken.count("\n") == text.count("\n")
    (tmp_path / "shop.yml").write_text(broken)
    line_of = {
        key: n
        for n, line in enumerate(broken.splitlines(), 1)
        for key in ("dbl", "please", "cap: 0")
        if key in line
    }
    done = _installed("check", "shop.yml", env=env, cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines == [
        f"shop.yml:{line_of['dbl']}: topics.payments.fields.amount: field 'amount' has type 'dbl': choose one of"
        " id, string, long, double, boolean, timestamp",
        f"shop.yml:{line_of['please']}: jobs.paid.interval.within.1: cannot parse duration '30 minutes please': a"
        " number and a unit (ms, s, min, h, d or their words), e.g. '500 ms', '30 s', '10 min', '1.5 h', '2 hours'",
        f"shop.yml:{line_of['cap: 0']}: jobs.customer_orders.views.newest_orders.cap: a list view needs `cap`, a"
        " number >= 1: the entries kept per key",
    ]

    for args in (("ingest", "orders", str(tmp_path / "none.jsonl")), ("status",), ("run", "paid", "--once")):
        refused = _installed(*args, env={**env, "MVIEW_PIPELINE": "shop.yml"}, cwd=tmp_path)
        assert (refused.returncode, refused.stdout, refused.stderr.splitlines()) == (1, "", lines), args
    assert not lake.exists()


def _topic_log(lake: Path, topic: str) -> list[dict]:
    from deltalake import DeltaTable, QueryBuilder

    t = (
        QueryBuilder()
        .register("t", DeltaTable(str(lake / "topics" / topic)))
        .execute("SELECT * FROM t")
        .read_all()
    )
    cols = {n: t.column(n).to_pylist() for n in t.column_names if n != MAX_BEFORE}  # the log's own stamp
    return [dict(zip(cols, row, strict=True)) for row in zip(*cols.values(), strict=True)]


def test_ingest_of_a_pipelines_own_topics_through_the_command_line(tmp_path):
    """MVIEW_PIPELINE names the shop: `mview ingest` takes each of its topics (bad lines dead-lettered with the
    shop's reasons, a Debezium event of the captured `customers`), an unknown topic is one line naming the shop's
    topics; a topic that gains an optional field goes on, one whose field changes type is refused in one line."""
    lake = tmp_path / "lake"
    env = {"LAKE_DIR": str(lake), "MVIEW_PIPELINE": str(SHOP)}
    t0 = 1_767_225_600_000
    files = {
        "orders": [
            {"order_id": "o1", "customer_id": "c1", "amount": 10, "currency": "EUR", "ts": t0, "extra": 1},
            {"order_id": "o2", "customer_id": "c1", "amount": 2.5, "currency": "EUR", "coupon": "X", "ts": t0 + 1},
            {"order_id": "o3", "customer_id": "c2", "amount": "12", "currency": "EUR", "ts": t0 + 2},
        ],
        "payments": [
            {"payment_id": "p1", "order_id": "o1", "amount": 10.0, "currency": "EUR", "method": "card", "ts": t0 + 5},
            {"payment_id": "p2", "order_id": "o2", "amount": 2.5, "currency": "EUR", "ts": t0 + 6},
        ],
        "customers": [
            {"op": "upsert", "customer_id": "c1", "name": "Ann", "tier": "gold", "country": "DE", "ts": t0},
            {"op": "delete", "customer_id": "c2", "ts": t0 + 1},
            {"op": "c", "after": {"customer_id": "c3", "name": "Cy", "tier": "silver", "country": "FR",
                                  "updated_at": None}, "source": {"ts_ms": t0 + 2}},
            {"op": "open", "customer_id": "c4", "ts": t0},
        ],
        "open_orders": [
            {"op": "open", "order_id": "o1", "customer_id": "c1", "amount": 10.0, "ts": t0},
            {"op": "close", "order_id": "o1", "ts": t0 + 5},
            {"op": "upsert", "order_id": "o2", "ts": t0},
        ],
    }  # fmt: skip
    expected = {"orders": (2, 1), "payments": (1, 1), "customers": (3, 1), "open_orders": (2, 1)}
    for topic, records in files.items():
        path = write_jsonl(tmp_path / f"{topic}.jsonl", records)
        done = _installed("ingest", topic, path, "--json", env=env)
        assert done.returncode == 0, done.stderr
        accepted, rejected = expected[topic]
        assert json.loads(done.stdout.splitlines()[-1]) == {
            "topic": topic,
            "accepted": accepted,
            "rejected": rejected,
        }
    reasons = {
        topic: [d["reason"] for d in read_dead_letters(as_lake(lake), as_topic(topic, SHOP))]
        for topic in files
    }
    assert reasons == {
        "orders": ["field 'amount' must be a number, got str"],
        "payments": ["missing field 'method'"],
        "customers": ["unknown op 'open' (one of upsert, delete)"],
        "open_orders": ["unknown op 'upsert' (one of open, close)"],
    }
    assert sorted((r["order_id"], r["amount"], r["coupon"]) for r in _topic_log(lake, "orders")) == [
        ("o1", 10.0, None),
        ("o2", 2.5, "X"),
    ]
    customers = sorted(_topic_log(lake, "customers"), key=lambda r: r["customer_id"])
    assert [(r["op"], r["customer_id"], r["tier"], r["ts"]) for r in customers] == [
        ("upsert", "c1", "gold", t0),
        ("delete", "c2", None, t0 + 1),
        ("upsert", "c3", "silver", t0 + 2),  # the Debezium event: `after`, at the commit time
    ]
    unknown = _installed("ingest", "tweets", str(tmp_path / "orders.jsonl"), env=env)
    assert unknown.returncode == 1 and unknown.stderr.splitlines() == [
        "mview: unknown topic 'tweets': choose one of the topics of shop.yml: orders, payments, customers, open_orders"
    ]

    text = SHOP.read_text()
    grown = tmp_path / "grown.yml"  # orders gain an optional field
    grown.write_text(
        text.replace("coupon: string,", "coupon: string, gift: boolean,").replace(
            "optional: [coupon, customer_version]", "optional: [coupon, customer_version, gift]"
        )
    )
    more = write_jsonl(
        tmp_path / "more.jsonl",
        [{"order_id": "o4", "customer_id": "c1", "amount": 1, "currency": "EUR", "gift": True, "ts": t0 + 9}],
    )
    done = _installed("ingest", "orders", more, "--json", env={**env, "MVIEW_PIPELINE": str(grown)})
    assert done.returncode == 0 and json.loads(done.stdout.splitlines()[-1])["accepted"] == 1, done.stderr
    assert sorted((r["order_id"], r["gift"]) for r in _topic_log(lake, "orders")) == [
        ("o1", None), ("o2", None), ("o4", True)
    ]  # fmt: skip
    # the amount of an order becomes a long: the stored doubles do not follow
    retyped = tmp_path / "retyped.yml"
    retyped.write_text(
        text.replace("amount: double, currency: string, coupon", "amount: long, currency: string, coupon")
    )
    line = next(n for n, x in enumerate(text.splitlines(), 1) if x.strip().startswith("orders:"))
    # every command refuses it, those that only read Redis or the lake's status too (issue #41); the optional
    # field `gift` the log gained and `retyped` lacks is no change
    for args in (
        ("ingest", "orders", more),
        ("check",),
        ("query", "order_status", "o1"),
        ("export", "order_status"),
        ("status", "--json"),
        ("stop", "paid"),
    ):
        refused = _installed(*args, env={**env, "MVIEW_PIPELINE": str(retyped)})
        err = refused.stderr.splitlines()
        assert refused.returncode == 1 and len(err) == 1 and "Traceback" not in refused.stderr, (args, err)
        assert f"{retyped}:{line + 1}: topics.orders.fields: the declaration changed (" in err[0]
        assert "field 'amount' is declared long, the log holds double" in err[0] and "gift" not in err[0]
        assert "declare the new fields as a new topic" in err[0] and refused.stdout == ""
    assert len(_topic_log(lake, "orders")) == 3  # nothing written


def test_query_of_a_list_view_of_a_users_own_pipeline_says_each_entry(redis_server, tmp_path):
    """Issue #41 through the installed command, on the bike-sharing pipeline (a list whose fields do not name the
    entry) and on the shop's list (whose fields do): `query --json` gives the export line's entries array and each
    item with its entry; a key with no entry prints `{}`, the plain output nothing; `export` is unchanged. The
    views' Redis keys are filled as their sinks write them (no Spark)."""
    from tests.views.list.test_join import BIKES
    from views.keys import entry_key, list_key
    from views.redis_io import set_generation

    url = redis_server["url"].rsplit("/", 1)[0] + "/6"
    client = redis.Redis.from_url(url)
    client.flushdb()
    set_generation(client, "membership", 1)
    client.zadd(list_key("station_members", 1, "s01"), {"r1": 5, "r2": 7})
    client.set(entry_key("station_members", 1, "r1"), '{"plan":"student","fee":9.5}')
    client.set(entry_key("station_members", 1, "r2"), '{"plan":"day","fee":9.5}')
    (tmp_path / "bikes.yml").write_text(BIKES)
    env = {
        "REDIS_URL": url,
        "LAKE_DIR": str(tmp_path / "lake"),
        "MVIEW_PIPELINE": str(tmp_path / "bikes.yml"),
    }

    def out(*args):
        proc = _installed(*args, env=env)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        return proc.stdout

    assert json.loads(out("query", "station_members", "s01", "--json")) == {
        "station_id": "s01",
        "generation": 1,
        "members": [
            {"rider_id": "r2", "plan": "day", "fee": 9.5},
            {"rider_id": "r1", "plan": "student", "fee": 9.5},
        ],
    }
    assert out("query", "station_members", "s41", "--json").strip() == "{}"
    assert out("query", "station_members", "s41") == ""
    assert [json.loads(x)["rider_id"] for x in out("query", "station_members", "s01").splitlines()] == [
        "r2",
        "r1",
    ]
    assert json.loads(out("export", "station_members")) == {"station_id": "s01", "riders": ["r2", "r1"]}

    set_generation(client, "customer_orders", 1)
    client.zadd(list_key("newest_orders", 1, "c1"), {"o1": 5})
    client.set(entry_key("newest_orders", 1, "o1"), '{"order_id":"o1","amount":12.5,"ts":5}')
    env["MVIEW_PIPELINE"] = str(SHOP)
    got = json.loads(out("query", "newest_orders", "c1", "--json"))
    assert got == {
        "customer_id": "c1",
        "generation": 1,
        "orders": [{"order_id": "o1", "amount": 12.5, "ts": 5}],
    }
