"""The Flink side of the `peers` bench part: Apache Flink's own SQL of the Nexmark queries (nexmark/nexmark,
`nexmark-flink/src/main/resources/queries/`) on a local mini cluster, over the JSON-lines files that
`timeline_demo.nexmark.write_nexmark(directory, events=N, seed=S, iso_ratio=0.0)` writes.

Runs in the virtual environment of `make peers-setup` (`.venv-peers`, PyFlink of the `peers` extra), as a
subprocess of the bench, so it imports only PyFlink and the standard library:

    .venv-peers/bin/python bench/flink_side.py --data DIR --out FIGURES.json [--results ROWS_DIR]
        [--queries q0,q1,...] [--parallelism 2] [--no-timing]

Sources: one filesystem table per file (json format; ids are text in our files and cast to BIGINT; times epoch ms),
each with the rowtime `TO_TIMESTAMP_LTZ(dateTime, 3)` and Nexmark's watermark (4 s behind), and the views
`person`, `auction`, `bid` and `side_input` Nexmark's queries read, without the generator's clock records (the
auction `~clock`, the side input rows of key -1). The files are bounded: at their end each source emits the final
watermark, which closes every window. `table.local-time-zone` is UTC (Nexmark's DATE_FORMAT and HOUR read it).

The queries are Nexmark's SQL as it is, except:
- q13: Flink's is a processing-time lookup join of a side input file; here a regular join of the side input
  file's rows, the same result since that table never changes;
- q14: Nexmark's Java UDF `count_char(extra, 'c')` is the built-in expression
  `COALESCE(CHAR_LENGTH(extra) - CHAR_LENGTH(REPLACE(extra, 'c', '')), 0)` (no jar of Nexmark's here);
- q10: into a blackhole like the others (its file sink's partitioning is a detail of the sink).
q6 (an over window on an updating stream, which Flink itself does not run) and q12 (processing time) are not run.
The settings are those of Nexmark's `conf/config.yaml` that a local run has: mini-batches (2 s, 50,000 rows),
split distinct aggregates, the RocksDB state backend (no checkpoints: a run is shorter than its interval).

Each topic's file is first cut into `--parallelism` files (line n into file n % parallelism, not timed): Flink
reads a JSON file in one piece, so one file per topic would leave all but one source task idle.

Per query, first (with `--results`) the untimed run collecting the final contents: the query's changelog (+I, -U,
+U, -D) written by a filesystem sink in the debezium-json format and read back (PyFlink's
`execute().collect()` returns a few hundred rows per second, through Py4J one at a time), applied to a multiset,
each final row a dict named by the sink table's columns (timestamps epoch ms, DECIMAL a float). Then (unless
`--no-timing`) the timed run, in a JVM that has run the query once: `INSERT INTO` the query's blackhole sink,
Flink's own net runtime of the job (`net_seconds`: from the job's submission to the mini cluster to its end) and
the seconds `execute_sql(...)` takes until the job's result (`wall_seconds`: planning, the job's own mini
cluster's start and the job).

Writes `--out` as JSON: {"flink": version, "parallelism", "split_seconds", "gateway_seconds" (the JVM's start),
"config", "queries": {q: {"net_seconds", "wall_seconds", "changes", "rows", "collect_seconds"} or
{"error": ...}}}, and into the directory `--results` each query's rows, `<query>.json`: [row, ...].
"""

from __future__ import annotations

import argparse
import datetime
import decimal
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

__all__ = ["QUERIES", "SKIPPED", "materialize", "plain", "main"]

SKIPPED = {
    "q6": "an over window on an updating stream: Flink does not run it",
    "q12": "windows of processing time",
}

_TS = "TIMESTAMP(3)"
_BID_COLUMNS = "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, `dateTime` " + _TS
_RANKS = """
     count(*) AS total_bids,
     count(*) filter (where price < 10000) AS rank1_bids,
     count(*) filter (where price >= 10000 and price < 1000000) AS rank2_bids,
     count(*) filter (where price >= 1000000) AS rank3_bids"""
_DISTINCT = """
     count(distinct bidder) AS total_bidders,
     count(distinct bidder) filter (where price < 10000) AS rank1_bidders,
     count(distinct bidder) filter (where price >= 10000 and price < 1000000) AS rank2_bidders,
     count(distinct bidder) filter (where price >= 1000000) AS rank3_bidders,
     count(distinct auction) AS total_auctions,
     count(distinct auction) filter (where price < 10000) AS rank1_auctions,
     count(distinct auction) filter (where price >= 10000 and price < 1000000) AS rank2_auctions,
     count(distinct auction) filter (where price >= 1000000) AS rank3_auctions"""
_RANK_SINK = "total_bids BIGINT, rank1_bids BIGINT, rank2_bids BIGINT, rank3_bids BIGINT"
_DISTINCT_SINK = (
    "total_bidders BIGINT, rank1_bidders BIGINT, rank2_bidders BIGINT, rank3_bidders BIGINT, "
    "total_auctions BIGINT, rank1_auctions BIGINT, rank2_auctions BIGINT, rank3_auctions BIGINT"
)

# query -> (the sink table's columns, the SELECT inserted into it); Nexmark's text but for the changes above.
QUERIES: dict[str, tuple[str, str]] = {
    "q0": (
        f"auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` {_TS}, extra VARCHAR",
        "SELECT auction, bidder, price, `dateTime`, extra FROM bid",
    ),
    "q1": (
        f"auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), `dateTime` {_TS}, extra VARCHAR",
        "SELECT auction, bidder, 0.908 * price as price, `dateTime`, extra FROM bid",
    ),
    "q2": ("auction BIGINT, price BIGINT", "SELECT auction, price FROM bid WHERE MOD(auction, 123) = 0"),
    "q3": (
        "name VARCHAR, city VARCHAR, state VARCHAR, id BIGINT",
        """SELECT P.name, P.city, P.state, A.id
FROM auction AS A INNER JOIN person AS P on A.seller = P.id
WHERE A.category = 10 and (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    ),
    "q4": (
        "id BIGINT, final BIGINT",
        """SELECT Q.category, AVG(Q.final)
FROM (
    SELECT MAX(B.price) AS final, A.category
    FROM auction A, bid B
    WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
    GROUP BY A.id, A.category
) Q
GROUP BY Q.category""",
    ),
    "q5": (
        "auction BIGINT, num BIGINT",
        """SELECT AuctionBids.auction, AuctionBids.num
 FROM (
   SELECT auction, count(*) AS num, window_start AS starttime, window_end AS endtime
     FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
     GROUP BY auction, window_start, window_end
 ) AS AuctionBids
 JOIN (
   SELECT max(CountBids.num) AS maxn, CountBids.starttime, CountBids.endtime
   FROM (
     SELECT count(*) AS num, window_start AS starttime, window_end AS endtime
     FROM TABLE(HOP(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
     GROUP BY auction, window_start, window_end
     ) AS CountBids
   GROUP BY CountBids.starttime, CountBids.endtime
 ) AS MaxBids
 ON AuctionBids.starttime = MaxBids.starttime AND
    AuctionBids.endtime = MaxBids.endtime AND
    AuctionBids.num >= MaxBids.maxn""",
    ),
    "q7": (
        f"auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` {_TS}, extra VARCHAR",
        """SELECT B.auction, B.price, B.bidder, B.`dateTime`, B.extra
from bid B
JOIN (
  SELECT MAX(price) AS maxprice, window_end as `dateTime`
  FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY window_start, window_end
) B1
ON B.price = B1.maxprice
WHERE B.`dateTime` BETWEEN B1.`dateTime`  - INTERVAL '10' SECOND AND B1.`dateTime`""",
    ),
    "q8": (
        f"id BIGINT, name VARCHAR, stime {_TS}",
        """SELECT P.id, P.name, P.starttime
FROM (
  SELECT id, name, window_start AS starttime, window_end AS endtime
  FROM TABLE(TUMBLE(TABLE person, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY id, name, window_start, window_end
) P
JOIN (
  SELECT seller, window_start AS starttime, window_end AS endtime
  FROM TABLE(TUMBLE(TABLE auction, DESCRIPTOR(`dateTime`), INTERVAL '10' SECOND))
  GROUP BY seller, window_start, window_end
) A
ON P.id = A.seller AND P.starttime = A.starttime AND P.endtime = A.endtime""",
    ),
    "q9": (
        f"id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, `dateTime` {_TS}, "
        f"expires {_TS}, seller BIGINT, category BIGINT, extra VARCHAR, auction BIGINT, bidder BIGINT, "
        f"price BIGINT, bid_dateTime {_TS}, bid_extra VARCHAR",
        """SELECT
    id, itemName, description, initialBid, reserve, `dateTime`, expires, seller, category, extra,
    auction, bidder, price, bid_dateTime, bid_extra
FROM (
   SELECT A.*, B.auction, B.bidder, B.price, B.`dateTime` AS bid_dateTime, B.extra AS bid_extra,
     ROW_NUMBER() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.`dateTime` ASC) AS rownum
   FROM auction A, bid B
   WHERE A.id = B.auction AND B.`dateTime` BETWEEN A.`dateTime` AND A.expires
)
WHERE rownum <= 1""",
    ),
    "q10": (
        f"auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` {_TS}, extra VARCHAR, dt STRING, hm STRING",
        """SELECT auction, bidder, price, `dateTime`, extra, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd'),
  DATE_FORMAT(`dateTime`, 'HH:mm')
FROM bid""",
    ),
    "q11": (
        f"bidder BIGINT, bid_count BIGINT, starttime {_TS}, endtime {_TS}",
        """SELECT
    B.bidder,
    count(*) as bid_count,
    SESSION_START(B.`dateTime`, INTERVAL '10' SECOND) as starttime,
    SESSION_END(B.`dateTime`, INTERVAL '10' SECOND) as endtime
FROM bid B
GROUP BY B.bidder, SESSION(B.`dateTime`, INTERVAL '10' SECOND)""",
    ),
    "q13": (
        f"auction BIGINT, bidder BIGINT, price BIGINT, `dateTime` {_TS}, `value` VARCHAR",
        """SELECT B.auction, B.bidder, B.price, B.`dateTime`, S.`value`
FROM bid B
JOIN side_input AS S
ON mod(B.auction, 10000) = S.key""",
    ),
    "q14": (
        f"auction BIGINT, bidder BIGINT, price DECIMAL(23, 3), bidTimeType VARCHAR, `dateTime` {_TS}, "
        "extra VARCHAR, c_counts BIGINT",
        """SELECT
    auction,
    bidder,
    0.908 * price as price,
    CASE
        WHEN HOUR(`dateTime`) >= 8 AND HOUR(`dateTime`) <= 18 THEN 'dayTime'
        WHEN HOUR(`dateTime`) <= 6 OR HOUR(`dateTime`) >= 20 THEN 'nightTime'
        ELSE 'otherTime'
    END AS bidTimeType,
    `dateTime`,
    extra,
    CAST(COALESCE(CHAR_LENGTH(extra) - CHAR_LENGTH(REPLACE(extra, 'c', '')), 0) AS BIGINT) AS c_counts
FROM bid
WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000""",
    ),
    "q15": (
        f"`day` VARCHAR, {_RANK_SINK}, {_DISTINCT_SINK}",
        f"""SELECT
     DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`,{_RANKS},{_DISTINCT}
FROM bid
GROUP BY DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')""",
    ),
    "q16": (
        f"channel VARCHAR, `day` VARCHAR, `minute` VARCHAR, {_RANK_SINK}, {_DISTINCT_SINK}",
        f"""SELECT
    channel,
    DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`,
    max(DATE_FORMAT(`dateTime`, 'HH:mm')) as `minute`,{_RANKS},{_DISTINCT}
FROM bid
GROUP BY channel, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')""",
    ),
    "q17": (
        f"auction BIGINT, `day` VARCHAR, {_RANK_SINK}, min_price BIGINT, max_price BIGINT, avg_price BIGINT, "
        "sum_price BIGINT",
        f"""SELECT
     auction,
     DATE_FORMAT(`dateTime`, 'yyyy-MM-dd') as `day`,{_RANKS},
     min(price) AS min_price,
     max(price) AS max_price,
     avg(price) AS avg_price,
     sum(price) AS sum_price
FROM bid
GROUP BY auction, DATE_FORMAT(`dateTime`, 'yyyy-MM-dd')""",
    ),
    "q18": (
        f"{_BID_COLUMNS}, extra VARCHAR",
        """SELECT auction, bidder, price, channel, url, `dateTime`, extra
 FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY bidder, auction ORDER BY `dateTime` DESC) AS rank_number
       FROM bid)
 WHERE rank_number <= 1""",
    ),
    "q19": (
        f"{_BID_COLUMNS}, extra VARCHAR, rank_number BIGINT",
        """SELECT * FROM
(SELECT *, ROW_NUMBER() OVER (PARTITION BY auction ORDER BY price DESC) AS rank_number FROM bid)
WHERE rank_number <= 10""",
    ),
    "q20": (
        f"auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, bid_dateTime {_TS}, "
        f"bid_extra VARCHAR, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, "
        f"auction_dateTime {_TS}, expires {_TS}, seller BIGINT, category BIGINT, auction_extra VARCHAR",
        """SELECT
    auction, bidder, price, channel, url, B.`dateTime`, B.extra,
    itemName, description, initialBid, reserve, A.`dateTime`, expires, seller, category, A.extra
FROM
    bid AS B INNER JOIN auction AS A on B.auction = A.id
WHERE A.category = 10""",
    ),
    "q21": (
        "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, channel_id VARCHAR",
        """SELECT
    auction, bidder, price, channel,
    CASE
        WHEN lower(channel) = 'apple' THEN '0'
        WHEN lower(channel) = 'google' THEN '1'
        WHEN lower(channel) = 'facebook' THEN '2'
        WHEN lower(channel) = 'baidu' THEN '3'
        ELSE REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)
        END
    AS channel_id FROM bid
    where REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2) is not null or
          lower(channel) in ('apple', 'google', 'facebook', 'baidu')""",
    ),
    "q22": (
        "auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, dir1 VARCHAR, dir2 VARCHAR, dir3 VARCHAR",
        """SELECT
    auction, bidder, price, channel,
    SPLIT_INDEX(url, '/', 3) as dir1,
    SPLIT_INDEX(url, '/', 4) as dir2,
    SPLIT_INDEX(url, '/', 5) as dir3 FROM bid""",
    ),
}

# Nexmark's q7 inserts B.price into the sink's `bidder` and B.bidder into its `price` (an INSERT is positional):
# its rows are named here by what they hold.
_NAMES = {"q7": ("auction", "price", "bidder", "dateTime", "extra")}

_RAW = {
    "persons": "id STRING, name STRING, emailAddress STRING, creditCard STRING, city STRING, state STRING, "
    "`dateTime` BIGINT, extra STRING",
    "auctions": "id STRING, itemName STRING, description STRING, initialBid BIGINT, reserve BIGINT, "
    "`dateTime` BIGINT, expires BIGINT, seller STRING, category BIGINT, extra STRING",
    "bids": "bid_id STRING, auction STRING, bidder STRING, price BIGINT, channel STRING, url STRING, "
    "`dateTime` BIGINT, extra STRING",
    "side_input": "`key` BIGINT, `value` STRING, ts BIGINT",
}
# Nexmark's views (ddl_views.sql) over our topics: ids as BIGINT, the rowtime as `dateTime`, no clock records.
_VIEWS = {
    "person": """SELECT CAST(id AS BIGINT) AS id, name, emailAddress, creditCard, city, state, rt AS `dateTime`,
  extra FROM persons_src""",
    "auction": """SELECT CAST(id AS BIGINT) AS id, itemName, description, initialBid, reserve, rt AS `dateTime`,
  CAST(TO_TIMESTAMP_LTZ(expires, 3) AS TIMESTAMP(3)) AS expires, CAST(seller AS BIGINT) AS seller, category, extra
  FROM auctions_src WHERE id <> '~clock'""",
    "bid": """SELECT CAST(auction AS BIGINT) AS auction, CAST(bidder AS BIGINT) AS bidder, price, channel, url,
  rt AS `dateTime`, extra FROM bids_src""",
    "side_input": "SELECT `key`, `value` FROM side_input_src WHERE `key` >= 0",
}

# Nexmark's conf/config.yaml, the part a local mini cluster has (no checkpoints: a run is shorter than 3 min).
_CONFIG = {
    "table.exec.mini-batch.enabled": "true",
    "table.exec.mini-batch.allow-latency": "2s",
    "table.exec.mini-batch.size": "50000",
    "table.optimizer.distinct-agg.split.enabled": "true",
    "state.backend.type": "rocksdb",
    "table.local-time-zone": "UTC",
}


def plain(value):
    """A collected value as JSON: a timestamp as epoch ms (a naive one is UTC), a DECIMAL as a float."""
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.timezone.utc)
        return round(value.timestamp() * 1000)
    if isinstance(value, decimal.Decimal):
        return float(value)
    return value


def materialize(changes, names) -> list[dict]:
    """The final rows of a changelog: `changes` is (kind, values) pairs, kind one of "+I", "-U", "+U", "-D" (a
    retraction removes one equal row; the changes may come in any order, e.g. one file per sink task after
    another); each row a dict of `names`. Raises ValueError when more copies of a row are retracted than
    inserted."""
    rows: Counter = Counter()
    for kind, values in changes:
        if kind not in ("+I", "+U", "-U", "-D"):
            raise ValueError(f"unknown row kind {kind!r}")
        rows[tuple(values)] += 1 if kind[0] == "+" else -1
    negative = [key for key, n in rows.items() if n < 0]
    if negative:
        raise ValueError(
            f"{len(negative)} row(s) retracted more often than inserted, e.g. {list(negative[0])}"
        )
    return [dict(zip(names, key, strict=True)) for key, n in sorted(rows.items(), key=repr) for _ in range(n)]


def _names(query: str) -> tuple[str, ...]:
    if query in _NAMES:
        return _NAMES[query]
    return tuple(c.strip().split()[0].strip("`") for c in _columns(QUERIES[query][0]))


def _columns(ddl: str) -> list[str]:
    """The column definitions of a sink's DDL (commas inside DECIMAL(23, 3) are not separators)."""
    out, depth, cur = [], 0, ""
    for ch in ddl:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [*out, cur]


def _environment(parallelism: int):
    from pyflink.common import Configuration
    from pyflink.table import EnvironmentSettings, TableEnvironment

    conf = Configuration()
    conf.set_string("parallelism.default", str(parallelism))
    for k, v in _CONFIG.items():
        conf.set_string(k, v)
    settings = EnvironmentSettings.new_instance().in_streaming_mode().with_configuration(conf).build()
    return TableEnvironment.create(settings)


def split(data: Path, parts: int, work: Path) -> dict[str, Path]:
    """Each topic's file `data/<topic>.jsonl` cut into `parts` files `work/<topic>/<i>.jsonl`, line n into file
    n % parts (each keeps the arrival order), so that each of the `parts` source tasks reads one (Flink reads a JSON
    file in one piece). {topic: its directory}."""
    out = {}
    for topic in _RAW:
        directory = work / topic
        directory.mkdir(parents=True, exist_ok=True)
        files = [open(directory / f"{i}.jsonl", "w") for i in range(parts)]  # noqa: SIM115 - closed below
        try:
            with open(data / f"{topic}.jsonl") as f:
                for n, line in enumerate(f):
                    files[n % parts].write(line)
        finally:
            for fh in files:
                fh.close()
        out[topic] = directory
    return out


def _sources(t_env, paths: dict[str, Path]) -> None:
    """The source tables over the files and Nexmark's views over them."""
    for topic, columns in _RAW.items():
        time_column = "ts" if topic == "side_input" else "`dateTime`"
        t_env.execute_sql(
            f"""CREATE TEMPORARY TABLE {topic}_src ({columns},
  rt AS CAST(TO_TIMESTAMP_LTZ({time_column}, 3) AS TIMESTAMP(3)),
  WATERMARK FOR rt AS rt - INTERVAL '4' SECOND
) WITH ('connector' = 'filesystem', 'path' = 'file://{paths[topic].resolve()}', 'format' = 'json')"""
        )
    for view, select in _VIEWS.items():
        t_env.execute_sql(f"CREATE TEMPORARY VIEW {view} AS {select}")


def _timed(t_env, query: str) -> dict:
    """INSERT INTO the query's blackhole sink; its seconds."""
    columns, select = QUERIES[query]
    t_env.execute_sql(
        f"CREATE TEMPORARY TABLE IF NOT EXISTS nexmark_{query} ({columns}) WITH ('connector' = 'blackhole')"
    )
    started = time.monotonic()
    result = t_env.execute_sql(f"INSERT INTO nexmark_{query}\n{select}")
    job = result.get_job_client().get_job_execution_result().result()
    wall = time.monotonic() - started
    return {"wall_seconds": round(wall, 3), "net_seconds": round(job.get_net_runtime() / 1000, 3)}


def _collect(t_env, query: str, work: Path) -> tuple[list[dict], int]:
    """The query's final rows (`materialize`) and the number of changes: the query's changelog written by a
    filesystem sink in the debezium-json format (+I and +U as "c" with the row after, -U and -D as "d" with the
    row before), read back."""
    columns, select = QUERIES[query]
    path = work / query
    t_env.execute_sql(
        f"""CREATE TEMPORARY TABLE IF NOT EXISTS changes_{query} ({columns}) WITH ('connector' = 'filesystem',
  'path' = 'file://{path.resolve()}', 'format' = 'debezium-json',
  'debezium-json.encode.decimal-as-plain-number' = 'true')"""
    )
    t_env.execute_sql(f"INSERT INTO changes_{query}\n{select}").wait()
    names, sink = _names(query), [c.strip().split()[0].strip("`") for c in _columns(columns)]
    times = {i for i, c in enumerate(_columns(columns)) if "TIMESTAMP" in c.upper()}
    changes = []
    for f in sorted(p for p in path.rglob("*") if p.is_file() and not p.name.endswith(".crc")):
        for line in f.read_text().splitlines():
            change = json.loads(line)
            kind, row = ("+I", change["after"]) if change["op"] == "c" else ("-D", change["before"])
            changes.append(
                (kind, [_timestamp(row[c]) if i in times else plain(row[c]) for i, c in enumerate(sink)])
            )
    shutil.rmtree(path, ignore_errors=True)
    return materialize(changes, names), len(changes)


def _timestamp(text):
    """Epoch ms of the JSON format's `yyyy-MM-dd HH:mm:ss[.SSS]` (UTC: the session's time zone)."""
    return None if text is None else plain(datetime.datetime.fromisoformat(text))


def _error(e: Exception) -> str:
    """One line of an exception: for a Java one (Py4J), the line naming the Java exception when there is one."""
    lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()] or [""]
    java = next((x for x in lines[1:] if "Exception: " in x and not x.startswith("at ")), None)
    return f"{type(e).__name__}: {(java or lines[0])[:300]}"


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("apache-flink")
    except Exception:  # noqa: BLE001 - a figure, not a failure
        return "unknown"


def run(
    data: Path, queries: list[str], parallelism: int, timing: bool, results: Path | None, work: Path
) -> dict:
    """The figures of the queries over the files under `data`, each query's final rows written to
    `results/<query>.json` when `results` is given (module docstring)."""
    t0 = time.monotonic()
    paths = split(data, parallelism, work / "sources")
    split_s = time.monotonic() - t0
    t_env = _environment(parallelism)
    gateway = time.monotonic() - t0 - split_s
    _sources(t_env, paths)
    figures: dict = {
        "flink": _version(),
        "parallelism": parallelism,
        "split_seconds": round(split_s, 2),
        "gateway_seconds": round(gateway, 2),
        "config": dict(_CONFIG),
        "queries": {},
    }
    if results is not None:
        results.mkdir(parents=True, exist_ok=True)
    for q in queries:
        out: dict = {}
        try:  # the collecting run first: the timed one then runs in a JVM that has run the query once
            if results is not None:
                t1 = time.monotonic()
                rows, out["changes"] = _collect(t_env, q, work / "changes")
                (results / f"{q}.json").write_text(json.dumps(rows) + "\n")
                out["rows"], out["collect_seconds"] = len(rows), round(time.monotonic() - t1, 3)
            if timing:
                out.update(_timed(t_env, q))
        except Exception as e:  # noqa: BLE001 - one query's failure must not lose the others
            out["error"] = _error(e)
        figures["queries"][q] = out
        print(f"[flink] {q}: {json.dumps(out)}", file=sys.stderr, flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/flink_side.py", description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="the directory of write_nexmark's files")
    p.add_argument("--out", required=True, help="where the figures are written (JSON)")
    p.add_argument(
        "--results",
        default=None,
        help="the directory of the final rows, <query>.json each; none: not collected",
    )
    p.add_argument("--queries", default=",".join(QUERIES), help="comma-separated, of: " + " ".join(QUERIES))
    p.add_argument("--parallelism", type=int, default=2)
    p.add_argument("--no-timing", action="store_true", help="only the untimed runs collecting the results")
    a = p.parse_args(argv)
    queries = [q for q in a.queries.split(",") if q]
    unknown = [q for q in queries if q not in QUERIES]
    if unknown:
        p.error(f"unknown queries {unknown} (not run: {SKIPPED})")
    with tempfile.TemporaryDirectory(prefix="flink-side-") as work:
        results = Path(a.results) if a.results is not None else None
        figures = run(Path(a.data), queries, a.parallelism, not a.no_timing, results, Path(work))
    Path(a.out).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
