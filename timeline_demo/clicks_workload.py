"""Seeded workload for the `clicks` job and its brute-force reference.

`generate_clicks(...)` makes sessions with several searches each and clicks inside the hour after a search, on
its bounds (exactly `ts` and `ts + 1 hour`), after it, and before the search; duplicate deliveries of searches
and clicks; both `ts` forms. Records come back in *arrival* order: event time plus a random delay of at most
`disorder_ms` (keep it <= ALLOWED_LATENESS so that no record is late, whatever the chunking), so a click often
arrives before its search, and the two topics interleave.

`expected_clicks(searches, clicks, lateness_ms)` evaluates the contract's definition in plain Python over the
*set* of records: every search joined with every click of its session with `ts` in `[s.ts, s.ts + 1 hour]`;
the watermark is the max event time minus the lateness; a search is published when its window has closed under
the watermark (final) or when it has at least one click; `ctr` counts the closed searches only.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass

from changelog.records import validate
from changelog.storage import Lake
from spec.model import Pipeline, Topic
from timeline_demo.workload import T0, to_iso
from views.pipeline import builtin_pipeline

__all__ = [
    "ClicksWorkload",
    "generate_clicks",
    "expected_clicks",
    "chunk_arrivals",
    "write_clicks_topics",
    "WINDOW_MS",
]

_BUILTIN = builtin_pipeline().topics  # records are judged by the built-in topics' declarations

WINDOW_MS = 3_600_000
_QUERIES = [f"q{i}" for i in range(40)]


@dataclass
class ClicksWorkload:
    arrivals: list[tuple[str, dict]]  # (topic, record) in arrival order, both topics interleaved

    @property
    def searches(self) -> list[dict]:
        return [r for t, r in self.arrivals if t == "searches"]

    @property
    def clicks(self) -> list[dict]:
        return [r for t, r in self.arrivals if t == "clicks"]

    @property
    def events(self) -> int:
        return len(self.arrivals)


def _click_time(rng: random.Random, t: int) -> int:
    """The time of a click on the search at `t`: 60% inside its window, 10% on a bound (both inclusive), 15%
    after the window, 15% before the search."""
    kind = rng.random()
    if kind < 0.6:
        return t + rng.randrange(WINDOW_MS + 1)
    if kind < 0.7:
        return t + rng.choice((0, WINDOW_MS))
    if kind < 0.85:
        return t + WINDOW_MS + 1 + rng.randrange(WINDOW_MS)
    return t - 1 - rng.randrange(WINDOW_MS)


def generate_clicks(
    *,
    seed: int,
    sessions: int = 100,
    searches_per_session: tuple[int, int] = (1, 4),
    clicks_per_search: tuple[int, int] = (0, 3),
    duplicate_ratio: float = 0.03,
    disorder_ms: int = 9 * 60_000,
    span_ms: int = 8 * 3_600_000,
    iso_ratio: float = 0.3,
    session_len_ms: int = 2 * 3_600_000,
) -> ClicksWorkload:
    """A random workload (see the module docstring). Sizes scale with `sessions`: about
    sessions x 2.5 searches x 2.5 events each."""
    rng = random.Random(seed)
    out: list[tuple[int, str, dict]] = []  # (event ts, topic, record)

    def ts_value(ms: int):
        return to_iso(ms) if rng.random() < iso_ratio else ms

    n_search = n_click = 0
    for s in range(sessions):
        sid = f"sess{seed}_{s}"
        start = T0 + rng.randrange(span_ms)
        for _ in range(rng.randint(*searches_per_session)):
            t = start + rng.randrange(session_len_ms)
            n_search += 1
            q = rng.choice(_QUERIES[: 5 + s % len(_QUERIES)])
            out.append(
                (
                    t,
                    "searches",
                    {"search_id": f"s{seed}_{n_search}", "session_id": sid, "query": q, "ts": ts_value(t)},
                )
            )
            for _ in range(rng.randint(*clicks_per_search)):
                c = _click_time(rng, t)
                n_click += 1
                rec = {
                    "click_id": f"c{seed}_{n_click}",
                    "session_id": sid,
                    "url": f"https://x/{n_click}",
                    "ts": ts_value(c),
                }
                if rng.random() < 0.3:
                    rec["search_id"] = f"s{seed}_{n_search}"  # an optional hint, not used by the join
                out.append((c, "clicks", rec))
    for _ in range(int(len(out) * duplicate_ratio)):
        t, topic, rec = rng.choice(out)
        out.append((t, topic, dict(rec)))
    keyed = [(t + rng.randrange(disorder_ms + 1), i, topic, r) for i, (t, topic, r) in enumerate(out)]
    keyed.sort(key=lambda x: (x[0], x[1]))
    return ClicksWorkload(arrivals=[(topic, r) for _, _, topic, r in keyed])


def chunk_arrivals(
    arrivals: list[tuple[str, dict]], n: int, rng: random.Random
) -> list[dict[str, list[dict]]]:
    """Cut the arrival sequence into `n` consecutive pieces at random points: [{topic: records}]."""
    cuts = sorted(rng.sample(range(1, len(arrivals)), n - 1)) if n > 1 else []
    bounds = [0, *cuts, len(arrivals)]
    out = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        piece: dict[str, list[dict]] = {"searches": [], "clicks": []}
        for topic, r in arrivals[a:b]:
            piece[topic].append(r)
        out.append(piece)
    return out


def expected_clicks(searches: list[dict], clicks: list[dict], lateness_ms: int):
    """({search_id: export line of search_clicks}, {query: export line of ctr}) per the contract."""
    s_by_id: dict[str, dict] = {}
    for raw in searches:
        r = validate(_BUILTIN["searches"], raw)
        s_by_id.setdefault(r["search_id"], r)
    c_by_id: dict[str, dict] = {}
    for raw in clicks:
        r = validate(_BUILTIN["clicks"], raw)
        c_by_id.setdefault(r["click_id"], r)
    all_ts = [r["ts"] for r in s_by_id.values()] + [r["ts"] for r in c_by_id.values()]
    if not all_ts:
        return {}, {}
    watermark = max(all_ts) - lateness_ms
    by_session: dict[str, list[int]] = defaultdict(list)
    for c in c_by_id.values():
        by_session[c["session_id"]].append(c["ts"])
    sc: dict[str, dict] = {}
    ctr: dict[str, dict] = {}
    for sid, s in s_by_id.items():
        n = sum(1 for t in by_session.get(s["session_id"], ()) if s["ts"] <= t <= s["ts"] + WINDOW_MS)
        final = s["ts"] + WINDOW_MS < watermark
        if final or n > 0:
            sc[sid] = {
                "search_id": sid,
                "session_id": s["session_id"],
                "query": s["query"],
                "ts": s["ts"],
                "clicked": n > 0,
                "clicks": n,
            }
        if final:
            row = ctr.setdefault(s["query"], {"query": s["query"], "searches": 0, "clicked": 0})
            row["searches"] += 1
            row["clicked"] += n > 0
    return sc, ctr


def write_clicks_topics(
    spark,
    lake: Lake,
    pipeline: Pipeline,
    *,
    events: int,
    chunks: int = 4,
    seed: int = 42,
    disorder_ms: int = 9 * 60_000,
) -> dict:
    """Append about `events` records (searches, clicks, 3% duplicate deliveries) to the logs of `pipeline`'s
    topics `searches` and `clicks` in `lake`, in `chunks` Delta commits per topic cut by arrival time (event time + a delay of at most
    `disorder_ms`), so commit i of `searches` and of `clicks` together are the i-th piece of the arrival order.
    Same shape as `generate_clicks` (about 6.6 events per session; sessions spread over `sessions / 2000` hours).
    Returns `{"events", "searches", "clicks", "span_ms"}`.
    """
    sessions = max(1, int(events / 6.6))
    span = max(6, sessions // 2_000) * 3_600_000
    h = _hasher(seed)
    searches, clicks = _clicks_frames(spark, h, seed=seed, sessions=sessions, span=span)
    counts = {}
    for topic, df, id_col in (
        ("searches", searches.drop("s", "j"), "search_id"),
        ("clicks", clicks, "click_id"),
    ):
        rows = _with_arrival_chunk(df, h, id_col, chunks=chunks, span=span, disorder_ms=disorder_ms)
        counts[topic] = _append_in_chunks(spark, lake, pipeline.topics[topic], rows, chunks=chunks)
    return {
        "events": counts["searches"] + counts["clicks"],
        "searches": counts["searches"],
        "clicks": counts["clicks"],
        "span_ms": span,
    }


def _hasher(seed: int):
    """`h(*cols, k=, mod=)`: a column's deterministic draw in [0, mod) from `cols`, one stream per `k`."""
    from pyspark.sql import functions as F

    def h(*cols, k: int, mod: int):
        return F.pmod(F.xxhash64(F.lit(seed), F.lit(k), *cols), F.lit(mod))

    return h


def _clicks_frames(spark, h, *, seed: int, sessions: int, span: int):
    """(searches, clicks) DataFrames in the topics' fields, drawn by `h`: 1-4 searches per session (each keeps
    its session's `s` and its own `j`), 0-3 clicks per search placed as `generate_clicks` places them."""
    from pyspark.sql import functions as F

    sess = spark.range(sessions).select(
        F.col("id").alias("s"),
        (F.lit(T0) + h("id", k=1, mod=span)).alias("start"),
        (h("id", k=2, mod=4) + 1).alias("n_searches"),
    )
    searches = sess.select(
        "s", "start", F.explode(F.sequence(F.lit(1), F.col("n_searches").cast("int"))).alias("j")
    ).select(
        F.format_string("s%d_%d_%d", F.lit(seed), "s", "j").alias("search_id"),
        F.format_string("sess%d_%d", F.lit(seed), "s").alias("session_id"),
        F.concat(F.lit("q"), h("s", "j", k=3, mod=40).cast("string")).alias("query"),
        (F.col("start") + h("s", "j", k=4, mod=2 * WINDOW_MS)).alias("ts"),
        "s",
        "j",
    )
    kind = h("s", "j", "c", k=6, mod=100)
    off = h("s", "j", "c", k=7, mod=WINDOW_MS)
    click_ts = (
        F.when(kind < 60, F.col("t") + h("s", "j", "c", k=8, mod=WINDOW_MS + 1))  # inside
        .when(kind < 65, F.col("t"))  # on the lower bound
        .when(kind < 70, F.col("t") + WINDOW_MS)  # on the upper bound
        .when(kind < 85, F.col("t") + WINDOW_MS + 1 + off)  # after the window
        .otherwise(F.col("t") - 1 - off)  # before the search
    )
    clicks = (
        searches.select(
            "s", "j", "session_id", F.col("ts").alias("t"), h("s", "j", k=5, mod=4).cast("int").alias("n")
        )
        .where(F.col("n") > 0)
        .select("*", F.explode(F.sequence(F.lit(1), F.col("n"))).alias("c"))
        .select(
            F.format_string("c%d_%d_%d_%d", F.lit(seed), "s", "j", "c").alias("click_id"),
            "session_id",
            F.format_string("https://x/%d/%d/%d", "s", "j", "c").alias("url"),
            click_ts.alias("ts"),
            F.when(h("s", "j", "c", k=9, mod=10) < 3, F.format_string("s%d_%d_%d", F.lit(seed), "s", "j"))
            .otherwise(F.lit(None).cast("string"))
            .alias("search_id"),
        )
    )
    return searches, clicks


def _with_arrival_chunk(df, h, id_col: str, *, chunks: int, span: int, disorder_ms: int):
    """The rows of a topic's DataFrame, 3% delivered twice, each with `chunk`: the piece of the arrival order
    (event time + a delay of at most `disorder_ms`) it arrives in."""
    from pyspark.sql import functions as F

    copies = F.when(h(id_col, k=10, mod=100) < 3, F.array(F.lit(0), F.lit(1))).otherwise(F.array(F.lit(0)))
    rows = df.select("*", F.explode(copies).alias("copy"))
    arrival = F.col("ts") + h(id_col, "copy", k=11, mod=disorder_ms + 1)
    return rows.withColumn(
        "chunk",
        F.least(
            F.lit(chunks - 1),
            F.greatest(
                F.lit(0),
                F.floor((arrival - F.lit(T0)) * chunks / F.lit(span + 4 * WINDOW_MS + disorder_ms)),
            ),
        ).cast("int"),
    ).drop("copy")


def _append_in_chunks(spark, lake: Lake, topic: Topic, rows, *, chunks: int) -> int:
    """Append `rows` (without their `chunk`) to the log of `topic`, one Delta commit per chunk in order; how many
    rows."""
    from pyspark.sql import functions as F

    from changelog.topics import ensure_topic, topic_path

    ensure_topic(spark, lake, topic)
    # the declared columns: the log's stamp `_max_before` stays null (no lateness by log version)
    cols = [n for n, _ in topic.columns()]
    staged = rows.select(*cols, "chunk").repartition(chunks, "chunk").persist()
    count = staged.count()
    for i in range(chunks):
        staged.where(F.col("chunk") == i).drop("chunk").coalesce(1).write.format("delta").mode("append").save(
            str(topic_path(lake, topic))
        )
    staged.unpersist()
    return count
