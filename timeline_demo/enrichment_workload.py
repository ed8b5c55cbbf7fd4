"""Seeded workload for the `enrichment` job and its brute-force reference.

`generate_enrichment(...)` makes users whose profiles change several times (upserts, deletes, re-creates), a few
users never seen in `profiles`, and activity events with and without `profile_version` (some pinned to stale
versions, to deletes, to versions that never exist, or to malformed references), with duplicates of both kinds
of record. Every record arrives within `disorder_ms` after its `ts` (keep it below ALLOWED_LATENESS), so arrival
is shuffled within and across the two topics. A final clock change (user `~clock`) far after the span moves the
profiles watermark past every event, so every event is emitted.

`expected_enriched(profiles, activity)` evaluates the contract over the *set* of records, in plain Python:
one row per `event_id`, enriched with the pinned version or the version in force at its `ts`.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import dataclass

from changelog.records import validate
from timeline_demo.workload import T0, to_iso
from views.pipeline import builtin_pipeline

__all__ = ["EnrichmentWorkload", "generate_enrichment", "expected_enriched", "expected_by_country"]

_BUILTIN = builtin_pipeline().topics  # records are judged by the built-in topics' declarations

COUNTRIES = ("DE", "FR", "US", "JP", "BR", "IN", "NG")
CLOCK_USER = "~clock"


@dataclass
class EnrichmentWorkload:
    records: list[tuple[str, dict]]  # (topic, record) in arrival order

    @property
    def profiles(self) -> list[dict]:
        return [r for t, r in self.records if t == "profiles"]

    @property
    def activity(self) -> list[dict]:
        return [r for t, r in self.records if t == "activity"]


def generate_enrichment(
    *,
    seed: int,
    users: int = 40,
    changes_per_user: int = 4,
    events: int = 400,
    ghost_users: int = 3,
    pinned_ratio: float = 0.25,
    unknown_ratio: float = 0.04,
    duplicate_ratio: float = 0.05,
    span_ms: int = 2 * 3_600_000,
    disorder_ms: int = 4 * 60_000,
    clock_after_ms: int = 24 * 3_600_000,
    iso_ratio: float = 0.3,
) -> EnrichmentWorkload:
    """A random workload (module docstring): `users` users with 1 to `changes_per_user` profile changes each,
    `events` activity events (by them and by `ghost_users` users never in `profiles`), `duplicate_ratio` of both
    delivered twice, shuffled by at most `disorder_ms`, then the clock change."""
    rng = random.Random(seed)

    def ts_value(ms: int):
        return to_iso(ms) if rng.random() < iso_ratio else ms

    uids = [f"u{i}" for i in range(users)]
    timed: list[tuple[int, str, dict]] = []  # (event time, topic, record)
    versions = _profile_changes(
        rng, uids, timed, ts_value, changes_per_user=changes_per_user, span_ms=span_ms
    )
    everyone = uids + [f"ghost{i}" for i in range(ghost_users)]
    for i in range(events):
        u = rng.choice(everyone)
        t = T0 + rng.randrange(span_ms)
        rec = {
            "event_id": f"e{i:06d}",
            "user_id": u,
            "action": rng.choice(("view", "click", "buy")),
            "ts": ts_value(t),
        }
        r = rng.random()
        if r < unknown_ratio:
            rec["profile_version"] = rng.choice((f"{u}@{t - 1}", "not-a-version"))
        elif r < pinned_ratio and versions.get(u):
            rec["profile_version"] = f"{u}@{rng.choice(versions[u])}"  # often stale, sometimes a delete
        timed.append((t, "activity", rec))
    for _ in range(int(len(timed) * duplicate_ratio)):
        timed.append(rng.choice(timed))
    keyed = [(t + rng.randrange(disorder_ms + 1), i, topic, r) for i, (t, topic, r) in enumerate(timed)]
    keyed.sort(key=lambda x: (x[0], x[1]))
    records = [(topic, r) for _, _, topic, r in keyed]
    clock = {"op": "upsert", "user_id": CLOCK_USER, "name": "clock", "country": "ZZ"}
    records.append(("profiles", {**clock, "ts": T0 + span_ms + clock_after_ms}))
    return EnrichmentWorkload(records=records)


def _profile_changes(
    rng: random.Random, uids: list[str], timed: list, ts_value, *, changes_per_user: int, span_ms: int
) -> dict[str, list[int]]:
    """Append each user's profile changes to `timed` as (event time, "profiles", record): the first an upsert,
    each later one a delete (25%) or an upsert (an update, or a re-create after a delete); {user: the times of
    its versions}."""
    versions: dict[str, list[int]] = defaultdict(list)
    for u in uids:
        n = rng.randint(1, changes_per_user)
        stamps = sorted(rng.sample(range(span_ms), n))
        for i, off in enumerate(stamps):
            t = T0 + off
            if i > 0 and rng.random() < 0.25:
                rec = {"op": "delete", "user_id": u, "ts": ts_value(t)}
            else:
                rec = {
                    "op": "upsert",
                    "user_id": u,
                    "name": f"{u}-v{i}",
                    "country": rng.choice(COUNTRIES),
                    "ts": ts_value(t),
                }
            versions[u].append(t)
            timed.append((t, "profiles", rec))
    return versions


_REF = re.compile(r"^(.*)@(-?\d{1,18})$")


def _versions(profiles: list[dict]) -> dict[str, list[tuple[int, bool, str | None, str | None]]]:
    """{user: [(ts, deleted, name, country)] sorted by ts}, one entry per (user, ts): a delete wins, then the
    greater (name, country)."""
    best: dict[tuple[str, int], tuple] = {}
    for raw in profiles:
        r = validate(_BUILTIN["profiles"], raw)
        deleted = r["op"] == "delete"
        value = (deleted, None if deleted else r["name"], None if deleted else r["country"])
        rank = (value[0], value[1] or "", value[2] or "")
        key = (r["user_id"], r["ts"])
        if key not in best or rank > best[key][0]:
            best[key] = (rank, value)
    out: dict[str, list] = defaultdict(list)
    for (u, t), (_, value) in best.items():
        out[u].append((t, *value))
    for v in out.values():
        v.sort()
    return out


def expected_enriched(profiles: list[dict], activity: list[dict]) -> dict[str, dict]:
    """{event_id: {"event_id","user_id","action","ts","profile_version","name","country"}} per the contract."""
    versions = _versions(profiles)
    by_id = {(u, t): (d, n, c) for u, vs in versions.items() for t, d, n, c in vs}
    events: dict[str, tuple] = {}
    for raw in activity:
        r = validate(_BUILTIN["activity"], raw)
        pv = r["profile_version"]
        key = (r["ts"], r["user_id"], r["action"], pv is not None, pv or "")
        if r["event_id"] not in events or key < events[r["event_id"]][0]:
            events[r["event_id"]] = (key, r)
    out = {}
    for eid, (_, r) in sorted(events.items()):
        pv, name, country = r["profile_version"], None, None
        if pv is not None:
            m = _REF.match(pv)
            hit = by_id.get((m.group(1), int(m.group(2)))) if m else None
            if hit is not None and not hit[0]:
                name, country = hit[1], hit[2]
        else:
            cur = None
            for t, d, n, c in versions.get(r["user_id"], []):
                if t <= r["ts"]:
                    cur = (t, d, n, c)
            if cur is not None and not cur[1]:
                pv, name, country = f"{r['user_id']}@{cur[0]}", cur[2], cur[3]
        out[eid] = {
            "event_id": eid,
            "user_id": r["user_id"],
            "action": r["action"],
            "ts": r["ts"],
            "profile_version": pv,
            "name": name,
            "country": country,
        }
    return out


def expected_by_country(enriched: dict[str, dict]) -> dict[str, int]:
    counts: dict[str, int] = defaultdict(int)
    for row in enriched.values():
        counts[row["country"] or "unknown"] += 1
    return dict(sorted(counts.items()))
