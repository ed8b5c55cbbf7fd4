"""Nexmark's queries computed independently of the service: their SQL (Flink's Nexmark, nexmark/nexmark
`nexmark-flink/src/main/resources/queries/`) in DuckDB over the same events, and our views' export lines turned
into the same result rows, so the two can be compared (the tests; the `peers` bench compares Flink's too).

A *result row* is a dict named by the columns of the query's Flink sink table (`nexmark_q4 (id, final)`, ...):
ids and prices are integers (Nexmark's ids are numbers; ours are their text), times epoch ms, `0.908 * price` a
float rounded to 3 decimals, and an `AVG` of integers truncated to an integer (Flink's AVG of a BIGINT is a
BIGINT). Event-time windows are written out (`dateTime // 10000`, a hop's five starts, sessions as gaps and
islands), since DuckDB has no windowing table functions; `DATE_FORMAT` and `HOUR` are of UTC.

- `QUERIES`: per query, our jobs in chain order (`jobs`), the result columns, the columns compared (`compare`:
  all but those a tie may choose freely) and the DuckDB SQL.
- `NOT_EXPRESSED`: the queries `nexmark.yml` does not declare, and why.
- `connect(records)`: a DuckDB connection with Nexmark's tables `person`, `auction`, `bid` and `side_input` made
  from the records of our topics (a `Feed`'s, or the JSON-lines files' `read_records(directory)`), without the
  generator's clock records; a topic's second record of an id is left out (Nexmark has no changes).
- `nexmark_rows(con, query)`: the query's result rows.
- `result(query, exports, bids)`: our views' export lines (`{view: [line, ...]}`, what `mview export` prints) as
  result rows; `bids` (`{bid_id: record}`) gives the fields of a list view's entries.
- `differences(query, got, want)`: the differences of two results as multisets of the compared columns (floats
  within a relative 1e-9), empty when they are equal.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

import orjson

__all__ = [
    "QUERIES",
    "NOT_EXPRESSED",
    "Query",
    "connect",
    "read_records",
    "nexmark_rows",
    "result",
    "differences",
]

NOT_EXPRESSED = {
    "q6": "a window of rows (each seller's last 10 closed auctions): its average needs a window of the last N rows "
    "per key over an updating result, which no view keeps (Flink's Nexmark does not run q6 either)",
    "q12": "windows of processing time: the result depends on when records are processed, so no replay could "
    "reproduce it (q11 is its event-time counterpart)",
}


@dataclasses.dataclass(frozen=True)
class Query:
    jobs: tuple[str, ...]
    columns: tuple[str, ...]
    sql: str
    compare: tuple[str, ...] = ()

    @property
    def compared(self) -> tuple[str, ...]:
        return self.compare or self.columns


_DAY = "strftime(epoch_ms(dateTime), '%Y-%m-%d')"
_RANKS = """
    count(*) AS total_bids,
    count(*) FILTER (WHERE price < 10000) AS rank1_bids,
    count(*) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bids,
    count(*) FILTER (WHERE price >= 1000000) AS rank3_bids"""
_DISTINCT = """
    count(DISTINCT bidder) AS total_bidders,
    count(DISTINCT bidder) FILTER (WHERE price < 10000) AS rank1_bidders,
    count(DISTINCT bidder) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_bidders,
    count(DISTINCT bidder) FILTER (WHERE price >= 1000000) AS rank3_bidders,
    count(DISTINCT auction) AS total_auctions,
    count(DISTINCT auction) FILTER (WHERE price < 10000) AS rank1_auctions,
    count(DISTINCT auction) FILTER (WHERE price >= 10000 AND price < 1000000) AS rank2_auctions,
    count(DISTINCT auction) FILTER (WHERE price >= 1000000) AS rank3_auctions"""
_RANK_COLUMNS = ("total_bids", "rank1_bids", "rank2_bids", "rank3_bids")
_DISTINCT_COLUMNS = tuple(
    f"{rank}_{what}" for what in ("bidders", "auctions") for rank in ("total", "rank1", "rank2", "rank3")
)
_BID = ("auction", "bidder", "price", "channel", "url", "dateTime", "extra")

QUERIES: dict[str, Query] = {
    "q0": Query(
        ("q0",),
        ("auction", "bidder", "price", "dateTime", "extra"),
        "SELECT auction, bidder, price, dateTime, extra FROM bid",
    ),
    "q1": Query(
        ("q1",),
        ("auction", "bidder", "price", "dateTime", "extra"),
        "SELECT auction, bidder, round(0.908 * price, 3)::DOUBLE AS price, dateTime, extra FROM bid",
    ),
    "q2": Query(("q2",), ("auction", "price"), "SELECT auction, price FROM bid WHERE auction % 123 = 0"),
    "q3": Query(
        ("q3",),
        ("name", "city", "state", "id"),
        """SELECT P.name, P.city, P.state, A.id FROM auction A JOIN person P ON A.seller = P.id
           WHERE A.category = 10 AND (P.state = 'OR' OR P.state = 'ID' OR P.state = 'CA')""",
    ),
    "q4": Query(
        ("q4_final", "q4"),
        ("id", "final"),
        """SELECT Q.category AS id, trunc(avg(Q.final))::BIGINT AS final FROM (
             SELECT max(B.price) AS final, A.category FROM auction A, bid B
             WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires
             GROUP BY A.id, A.category) Q
           GROUP BY Q.category""",
    ),
    "q5": Query(
        ("q5_bids", "q5_max", "q5"),
        ("auction", "num"),
        """WITH hop AS (
             SELECT auction, unnest(range((dateTime // 2000) * 2000 - 8000, (dateTime // 2000) * 2000 + 1, 2000))
               AS starttime FROM bid),
           auction_bids AS (SELECT auction, starttime, count(*) AS num FROM hop GROUP BY auction, starttime),
           max_bids AS (SELECT starttime, max(num) AS maxn FROM auction_bids GROUP BY starttime)
           SELECT B.auction, B.num FROM auction_bids B JOIN max_bids M
             ON B.starttime = M.starttime AND B.num >= M.maxn""",
    ),
    "q7": Query(
        ("q7_max", "q7"),
        ("auction", "price", "bidder", "dateTime", "extra"),
        """SELECT B.auction, B.price, B.bidder, B.dateTime, B.extra FROM bid B JOIN (
             SELECT max(price) AS maxprice, (dateTime // 10000) * 10000 + 10000 AS window_end FROM bid
             GROUP BY dateTime // 10000) B1
           ON B.price = B1.maxprice WHERE B.dateTime BETWEEN B1.window_end - 10000 AND B1.window_end""",
    ),
    "q8": Query(
        ("q8",),
        ("id", "name", "stime"),
        """SELECT P.id, P.name, P.starttime AS stime
           FROM (SELECT DISTINCT id, name, (dateTime // 10000) * 10000 AS starttime FROM person) P
           JOIN (SELECT DISTINCT seller, (dateTime // 10000) * 10000 AS starttime FROM auction) A
           ON P.id = A.seller AND P.starttime = A.starttime""",
    ),
    "q9": Query(
        ("q9",),
        (
            "id",
            "itemName",
            "description",
            "initialBid",
            "reserve",
            "dateTime",
            "expires",
            "seller",
            "category",
            "extra",
            "auction",
            "bidder",
            "price",
            "bid_dateTime",
            "bid_extra",
        ),  # fmt: skip
        """SELECT * EXCLUDE (rownum) FROM (
             SELECT A.*, B.auction, B.bidder, B.price, B.dateTime AS bid_dateTime, B.extra AS bid_extra,
               row_number() OVER (PARTITION BY A.id ORDER BY B.price DESC, B.dateTime ASC,
                                  B.bidder::VARCHAR DESC, B.extra DESC NULLS LAST) AS rownum
             FROM auction A, bid B WHERE A.id = B.auction AND B.dateTime BETWEEN A.dateTime AND A.expires)
           WHERE rownum <= 1""",
        compare=("id", "price", "bid_dateTime"),
    ),
    "q10": Query(
        ("q10",),
        ("auction", "bidder", "price", "dateTime", "extra", "dt", "hm"),
        """SELECT auction, bidder, price, dateTime, extra, strftime(epoch_ms(dateTime), '%Y-%m-%d') AS dt,
             strftime(epoch_ms(dateTime), '%H:%M') AS hm FROM bid""",
    ),
    "q11": Query(
        ("q11",),
        ("bidder", "bid_count", "starttime", "endtime"),
        """SELECT bidder, count(*) AS bid_count, min(dateTime) AS starttime, max(dateTime) + 10000 AS endtime
           FROM (SELECT bidder, dateTime, sum(fresh) OVER (PARTITION BY bidder ORDER BY dateTime) AS session
                 FROM (SELECT bidder, dateTime, CASE WHEN dateTime - lag(dateTime) OVER (PARTITION BY bidder
                       ORDER BY dateTime) < 10000 THEN 0 ELSE 1 END AS fresh FROM bid))
           GROUP BY bidder, session""",
    ),
    "q13": Query(
        ("q13",),
        ("auction", "bidder", "price", "dateTime", "value"),
        """SELECT B.auction, B.bidder, B.price, B.dateTime, S.value FROM bid B
           JOIN side_input S ON B.auction % 10000 = S.key""",
    ),
    "q14": Query(
        ("q14",),
        ("auction", "bidder", "price", "bidTimeType", "dateTime", "extra", "c_counts"),
        """SELECT auction, bidder, round(0.908 * price, 3)::DOUBLE AS price,
             CASE WHEN hour(epoch_ms(dateTime)) >= 8 AND hour(epoch_ms(dateTime)) <= 18 THEN 'dayTime'
                  WHEN hour(epoch_ms(dateTime)) <= 6 OR hour(epoch_ms(dateTime)) >= 20 THEN 'nightTime'
                  ELSE 'otherTime' END AS bidTimeType,
             dateTime, extra, coalesce(length(regexp_replace(extra, '[^c]', '', 'g')), 0) AS c_counts
           FROM bid WHERE 0.908 * price > 1000000 AND 0.908 * price < 50000000""",
    ),
    "q15": Query(
        ("q15",),
        ("day", *_RANK_COLUMNS, *_DISTINCT_COLUMNS),
        f"SELECT {_DAY} AS day, {_RANKS}, {_DISTINCT} FROM bid GROUP BY {_DAY}",
    ),
    "q16": Query(
        ("q16",),
        ("channel", "day", "minute", *_RANK_COLUMNS, *_DISTINCT_COLUMNS),
        f"""SELECT channel, {_DAY} AS day, max(strftime(epoch_ms(dateTime), '%H:%M')) AS minute, {_RANKS},
              {_DISTINCT} FROM bid GROUP BY channel, {_DAY}""",
    ),
    "q17": Query(
        ("q17",),
        ("auction", "day", *_RANK_COLUMNS, "min_price", "max_price", "avg_price", "sum_price"),
        f"""SELECT auction, {_DAY} AS day, {_RANKS}, min(price) AS min_price, max(price) AS max_price,
              trunc(avg(price))::BIGINT AS avg_price, sum(price) AS sum_price
            FROM bid GROUP BY auction, {_DAY}""",
    ),
    "q18": Query(
        ("q18",),
        _BID,
        """SELECT auction, bidder, price, channel, url, dateTime, extra FROM (
             SELECT *, row_number() OVER (PARTITION BY bidder, auction ORDER BY dateTime DESC, bid_id DESC) AS rn
             FROM bid) WHERE rn <= 1""",
        compare=("auction", "bidder", "dateTime"),
    ),
    "q19": Query(
        ("q19",),
        (*_BID, "rank_number"),
        """SELECT auction, bidder, price, channel, url, dateTime, extra, rank_number FROM (
             SELECT *, row_number() OVER (PARTITION BY auction ORDER BY price DESC, bid_id DESC) AS rank_number
             FROM bid) WHERE rank_number <= 10""",
        compare=("auction", "price", "rank_number"),
    ),
    "q20": Query(
        ("q20",),
        (
            "auction",
            "bidder",
            "price",
            "channel",
            "url",
            "bid_dateTime",
            "bid_extra",
            "itemName",
            "description",
            "initialBid",
            "reserve",
            "auction_dateTime",
            "expires",
            "seller",
            "category",
            "auction_extra",
        ),  # fmt: skip
        """SELECT auction, bidder, price, channel, url, B.dateTime AS bid_dateTime, B.extra AS bid_extra, itemName,
             description, initialBid, reserve, A.dateTime AS auction_dateTime, expires, seller, category,
             A.extra AS auction_extra
           FROM bid B JOIN auction A ON B.auction = A.id WHERE A.category = 10""",
    ),
    "q21": Query(
        ("q21",),
        ("auction", "bidder", "price", "channel", "channel_id"),
        """SELECT auction, bidder, price, channel,
             CASE WHEN lower(channel) = 'apple' THEN '0' WHEN lower(channel) = 'google' THEN '1'
                  WHEN lower(channel) = 'facebook' THEN '2' WHEN lower(channel) = 'baidu' THEN '3'
                  ELSE regexp_extract(url, '(&|^)channel_id=([^&]*)', 2) END AS channel_id
           FROM bid WHERE regexp_matches(url, '(&|^)channel_id=')
             OR lower(channel) IN ('apple', 'google', 'facebook', 'baidu')""",
    ),
    "q22": Query(
        ("q22",),
        ("auction", "bidder", "price", "channel", "dir1", "dir2", "dir3"),
        """SELECT auction, bidder, price, channel, string_split(url, '/')[4] AS dir1,
             string_split(url, '/')[5] AS dir2, string_split(url, '/')[6] AS dir3 FROM bid""",
    ),
}

_SCHEMAS = {
    "person": (
        "persons",
        "id BIGINT, name VARCHAR, emailAddress VARCHAR, creditCard VARCHAR, city VARCHAR, state VARCHAR, "
        "dateTime BIGINT, extra VARCHAR",
    ),
    "auction": (
        "auctions",
        "id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, dateTime BIGINT, "
        "expires BIGINT, seller BIGINT, category BIGINT, extra VARCHAR",
    ),
    "bid": (
        "bids",
        "bid_id VARCHAR, auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, "
        "dateTime BIGINT, extra VARCHAR",
    ),
    "side_input": ("side_input", "key BIGINT, value VARCHAR"),
}
_IDS = {"persons": "id", "auctions": "id", "bids": "bid_id", "side_input": "key"}
_TIMES = ("dateTime", "expires")


def _ms(value) -> int:
    """Epoch ms of a record's time: epoch ms, or ISO-8601 text with a zone."""
    if isinstance(value, str):
        return round(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
    return int(value)


def read_records(directory: str | Path) -> dict[str, list[dict]]:
    """The records of the JSON-lines files `<topic>.jsonl` under `directory` (what `write_nexmark` writes)."""
    out = {}
    for path in sorted(Path(directory).glob("*.jsonl")):
        out[path.stem] = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return out


def connect(records: dict[str, Iterable[dict]]):
    """A DuckDB connection (in memory) holding Nexmark's tables made from our topics' records (module docstring)."""
    import duckdb

    con = duckdb.connect()
    for table, (topic, schema) in _SCHEMAS.items():
        columns = [c.split()[0] for c in schema.split(", ")]
        rows, seen = [], set()
        for rec in records.get(topic, ()):
            ident = rec.get(_IDS[topic])
            if ident in seen or ident == "~clock" or (topic == "side_input" and rec.get("key", 0) < 0):
                continue
            seen.add(ident)
            rows.append(tuple(_ms(rec[c]) if c in _TIMES else rec.get(c) for c in columns))
        con.execute(f"CREATE TABLE {table} ({schema})")
        if rows:
            con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(columns))})", rows)
    return con


def nexmark_rows(con, query: str) -> list[dict]:
    """The result rows of Nexmark's SQL of `query` over the connection's tables."""
    cursor = con.execute(QUERIES[query].sql)
    names = [d[0] for d in cursor.description]
    assert tuple(names) == QUERIES[query].columns, (query, names)
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _int(value):
    return None if value is None else int(value)


def _euros(value):
    return None if value is None else round(float(value), 3)


def _entries(exports: dict[str, list[dict]], view: str, entries: str, bids: dict[str, dict]):
    """(rank from 1, the bid record) of every entry of every key of a list view."""
    for line in exports[view]:
        for rank, bid_id in enumerate(line[entries], 1):
            yield rank, bids[bid_id]


def _bid_row(bid: dict) -> dict:
    return {
        "auction": int(bid["auction"]),
        "bidder": int(bid["bidder"]),
        "price": bid["price"],
        "channel": bid["channel"],
        "url": bid["url"],
        "dateTime": _ms(bid["dateTime"]),
        "extra": bid.get("extra"),
    }


_INTS = ("auction", "bidder", "id", "seller")


def _typed(line: dict, columns: Iterable[str], rename: dict[str, str] | None = None) -> dict:
    """A result row from an export line: the columns (each from `rename`'s name, or its own), ids as integers."""
    rename = rename or {}
    row = {}
    for c in columns:
        v = line.get(rename.get(c, c))
        row[c] = _int(v) if c in _INTS else v
    return row


def result(query: str, exports: dict[str, list[dict]], bids: dict[str, dict] | None = None) -> list[dict]:
    """Our views' export lines of `query` as its result rows (module docstring)."""
    cols = QUERIES[query].columns
    match query:
        case "q0" | "q2" | "q10" | "q13" | "q21" | "q22":
            return [_typed(x, cols) for x in exports[f"{query}_bids"]]
        case "q1" | "q14":
            return [{**_typed(x, cols), "price": _euros(x["price"])} for x in exports[f"{query}_bids"]]
        case "q3":
            return [_typed(x, cols) for x in exports["q3_auctions"]]
        case "q4":
            return [
                {"id": int(x["category"]), "final": math.trunc(x["final"])} for x in exports["q4_by_category"]
            ]
        case "q5":
            return [_typed(x, cols) for x in exports["q5_hot_items"]]
        case "q7":
            return [_typed(x, cols) for x in exports["q7_bids"]]
        case "q8":
            return [_typed(x, cols, {"stime": "starttime"}) for x in exports["q8_new_sellers"]]
        case "q9":
            return [_typed(x, cols) for x in exports["q9_winning_bids"]]
        case "q11":
            return [
                _typed(x, cols, {"starttime": "window_start", "endtime": "window_end"})
                for x in exports["q11_sessions"]
            ]
        case "q15" | "q16":
            return [_typed(x, cols) for x in exports["q15_days" if query == "q15" else "q16_channel_days"]]
        case "q17":
            return [
                {**_typed(x, cols), "avg_price": math.trunc(x["avg_price"])}
                for x in exports["q17_auction_days"]
            ]
        case "q18":
            return [_bid_row(b) for _, b in _entries(exports, "q18_last_bids", "entries", bids or {})]
        case "q19":
            return [
                {**_bid_row(b), "rank_number": r}
                for r, b in _entries(exports, "q19_top_bids", "entries", bids or {})
            ]
        case "q20":
            return [
                _typed(x, cols, {"bid_dateTime": "dateTime", "bid_extra": "extra"})
                for x in exports["q20_bids"]
            ]
    raise KeyError(query)


def _key(row: dict, columns: tuple[str, ...]) -> tuple:
    return tuple(round(row[c], 9) if isinstance(row.get(c), float) else row.get(c) for c in columns)


def differences(query: str, got: list[dict], want: list[dict]) -> list[str]:
    """The differences of two results of `query` as multisets of its compared columns (floats to 9 decimals):
    `missing ...` (in `want` only) and `extra ...` (in `got` only); empty when equal."""
    columns = QUERIES[query].compared
    g, w = Counter(_key(r, columns) for r in got), Counter(_key(r, columns) for r in want)
    out = [f"{query}: missing {dict(zip(columns, k, strict=True))} x{n}" for k, n in (w - g).items()]
    out += [f"{query}: extra {dict(zip(columns, k, strict=True))} x{n}" for k, n in (g - w).items()]
    return sorted(out)
