"""The as-of join's semantics table: each event, the versions of its user, the watermark, and the result."""

from __future__ import annotations

from joins.asof import EVENT_COLUMNS, asof_join, dedupe_events, profile_versions

CHANGES = [  # op, user_id, name, country, ts
    ("upsert", "u", "A", "DE", 100),
    ("delete", "u", None, None, 200),
    ("upsert", "u", "B", "FR", 300),
    ("upsert", "u", "C", "US", 400),  # same version id as the next: the greater (name, country) wins
    ("upsert", "u", "D", "JP", 400),
    ("upsert", "v", "V", "BR", 50),
    ("upsert", "v", "V", "BR", 50),  # delivered twice
    ("upsert", "w", "W", "NG", 10),
    ("delete", "w", None, None, 10),  # a delete and an upsert with the same ts: the delete wins
]
WATERMARK = 500
# event_id, user_id, ts, profile_version -> expected (profile_version, name, country, unknown) or "held"
TABLE = [
    ("e01", "u", 50, None, (None, None, None, False)),  # before the first version
    ("e02", "u", 100, None, ("u@100", "A", "DE", False)),  # a version is in force from its own ts
    ("e03", "u", 250, None, (None, None, None, False)),  # deleted
    ("e04", "u", 350, None, ("u@300", "B", "FR", False)),  # re-created
    ("e05", "u", 450, None, ("u@400", "D", "JP", False)),
    ("e06", "u", 450, "u@100", ("u@100", "A", "DE", False)),  # pinned to a stale version
    ("e07", "u", 150, "u@200", ("u@200", None, None, False)),  # pinned to a delete
    ("e08", "u", 150, "u@999", "held"),  # unseen, the watermark has not passed its ts: it may still come
    ("e09", "u", 150, "u@120", ("u@120", None, None, True)),  # unseen and the watermark passed it: never
    ("e10", "u", 600, None, "held"),  # the watermark has not reached the event
    ("e11", "ghost", 100, None, (None, None, None, False)),  # never-seen user
    ("e12", "u", 150, "junk", ("junk", None, None, True)),  # not a version id: emitted with its reference
    ("e13", "v", 60, None, ("v@50", "V", "BR", False)),
    ("e14", "u", 600, "u@100", "held"),  # pinned and found, but the watermark has not reached the event
    ("e15", "w", 20, None, (None, None, None, False)),
    ("e16", "u", 500, None, ("u@400", "D", "JP", False)),  # ts == watermark: emitted
]


def test_asof_join_semantics_table(spark):
    changes = spark.createDataFrame(
        CHANGES, "op string, user_id string, name string, country string, ts bigint"
    )
    rows = [(e, u, "view", ts, pv) for e, u, ts, pv, _ in TABLE]
    events = spark.createDataFrame(
        rows + rows[:3], ", ".join(f"{c} {'bigint' if c == 'ts' else 'string'}" for c in EVENT_COLUMNS)
    )
    result = asof_join(dedupe_events(events), profile_versions(changes), watermark_ms=WATERMARK)
    got = {
        r["event_id"]: (r["profile_version"], r["name"], r["country"], r["unknown_version"])
        if r["emit"]
        else "held"
        for r in result.decided.collect()
    }
    assert got == {e: want for e, _, _, _, want in TABLE}
    held = {r["event_id"]: r["profile_version"] for r in result.held.collect()}
    assert held == {"e08": "u@999", "e10": None, "e14": "u@100"}  # held with their reference, to retry


def test_nothing_is_emitted_before_any_change_is_seen(spark):
    changes = spark.createDataFrame([], "op string, user_id string, name string, country string, ts bigint")
    events = spark.createDataFrame(
        [("e1", "u", "view", 1, None), ("e2", "u", "view", 1, "x")],
        "event_id string, user_id string, action string, ts bigint, profile_version string",
    )
    result = asof_join(events, profile_versions(changes), watermark_ms=None)
    assert sorted(r["event_id"] for r in result.held.collect()) == ["e1", "e2"]
