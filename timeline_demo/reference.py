"""Brute-force reference of the timeline's definition, evaluated in plain Python over the *set* of records.

This is the contract's SQL, `SELECT follows.follower_id, tweets ... FROM tweets JOIN follows ON followee_id =
user_id ORDER BY ts DESC`, over the current tables, newest `cap` per follower, ties by tweet_id descending.
"""

from __future__ import annotations

from collections import defaultdict

from changelog.records import validate
from views.pipeline import builtin_pipeline

__all__ = ["current_tables", "expected_timelines"]

_BUILTIN = builtin_pipeline().topics  # records are judged by the built-in topics' declarations


def current_tables(tweets: list[dict], follows: list[dict]):
    """(live tweets {tweet_id: (user_id, ts)}, current pairs {(follower, followee)})."""
    posts: dict[str, tuple] = {}
    deleted: set[str] = set()
    for raw in tweets:
        r = validate(_BUILTIN["tweets"], raw)
        if r["op"] == "post":
            cand = (r["ts"], r["user_id"], r["text"])
            if r["tweet_id"] not in posts or cand > posts[r["tweet_id"]]:
                posts[r["tweet_id"]] = cand
        else:
            deleted.add(r["tweet_id"])
    live = {tid: (p[1], p[0]) for tid, p in posts.items() if tid not in deleted}
    last: dict[tuple[str, str], tuple] = {}
    for raw in follows:
        r = validate(_BUILTIN["follows"], raw)
        key = (r["follower_id"], r["followee_id"])
        cand = (r["ts"], 1 if r["op"] == "unfollow" else 0)
        if key not in last or cand > last[key]:
            last[key] = cand
    pairs = {k for k, v in last.items() if v[1] == 0}
    return live, pairs


def expected_timelines(tweets: list[dict], follows: list[dict], cap: int) -> dict[str, list[str]]:
    """{follower: [tweet_id newest first]} for every follower with a non-empty timeline."""
    live, pairs = current_tables(tweets, follows)
    by_author: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for tid, (uid, ts) in live.items():
        by_author[uid].append((ts, tid))
    out: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for follower, followee in pairs:
        out[follower].extend(by_author.get(followee, []))
    return {
        f: [tid for _, tid in sorted(entries, reverse=True)[:cap]]
        for f, entries in sorted(out.items())
        if entries
    }
