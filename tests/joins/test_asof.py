"""The as-of join's semantics table: each event, the versions of its user, the watermark, and the result."""

from __future__ import annotations

import json

from joins.asof import EVENT_COLUMNS, asof_join, dedupe_events, profile_versions
from joins.asof_state import AsofProgress, AsofState

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


def test_state_restores_its_mark_and_tables_and_stages_a_batch_once(spark, tmp_path):
    """The layout an existing lake has (`mark.json`, Delta `versions` and `held`) restores; staging or advancing
    a batch id again (a replay) appends nothing twice; the held set is replaced only when given."""
    state_dir = tmp_path / "g1"
    state = AsofState(spark, state_dir, "mview-enrichment-g1")
    before = state.restore(0)
    assert (before.max_ts, before.held, before.watermark(10)) == (None, 0, None)
    assert before.versions().count() == 0 and before.held_events().count() == 0
    changes = spark.createDataFrame(
        CHANGES[:3], "op string, user_id string, name string, country string, ts bigint"
    )
    for _ in range(2):
        state.stage(0, changes)
    assert state.restore(1).versions().count() == 3
    waiting = spark.createDataFrame(
        [("e1", "u", "view", 900, None)],
        ", ".join(f"{c} {'bigint' if c == 'ts' else 'string'}" for c in EVENT_COLUMNS),
    )
    state.advance(0, AsofProgress(300, 1, waiting))
    state.advance(0, AsofProgress(300, 0, waiting.limit(0)))  # a replay's held set: batch 0 is replaced once
    assert json.loads((state_dir / "mark.json").read_text()) == {"held": 0, "max_ts": 300}
    state.advance(1, AsofProgress(400, 1))  # held unchanged: the table stays as it is
    after = state.restore(2)
    assert (after.max_ts, after.held, after.watermark(100)) == (400, 1, 300)
    assert [r["event_id"] for r in after.held_events().collect()] == ["e1"]
    # as the job wrote it before #17
    (state_dir / "mark.json").write_text(json.dumps({"max_ts": 7, "held": 0}))
    assert AsofState(spark, state_dir, "mview-enrichment-g1").restore(3).max_ts == 7
