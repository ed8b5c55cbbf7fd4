"""The as-of join's semantics table (the built-in pipeline's enrichment job: activity x profiles): each event, the
versions of its user, the watermark, and the result; its state between batches."""

from __future__ import annotations

import json

from changelog.storage import as_lake
from joins.asof import AsofSides, asof_join, dedupe_events, version_rows, with_identity
from joins.asof_state import AsofProgress, AsofState
from views.pipeline import builtin_pipeline

CHANGE_SCHEMA = "op string, user_id string, name string, country string, ts bigint"
EVENT_SCHEMA = "event_id string, user_id string, action string, ts bigint, profile_version string"


def _sides() -> AsofSides:
    return AsofSides.of(builtin_pipeline(), "enrichment")


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
    sides = _sides()
    changes = spark.createDataFrame(CHANGES, CHANGE_SCHEMA)
    rows = [(e, u, "view", ts, pv) for e, u, ts, pv, _ in TABLE]
    events = with_identity(spark.createDataFrame(rows + rows[:3], EVENT_SCHEMA), sides)
    versions = version_rows(changes, sides)
    result = asof_join(dedupe_events(events, sides), versions, sides, watermark_ms=WATERMARK)
    got = {
        r["event_id"]: (r["_version"], *((r["_s1"]["name"], r["_s1"]["country"]) if r["_s1"] else (None, None)),
                        r["_unknown"])
        if r["_emit"]
        else "held"
        for r in result.decided.collect()
    }  # fmt: skip
    assert got == {e: want for e, _, _, _, want in TABLE}
    held = {r["event_id"]: r["profile_version"] for r in result.held.collect()}
    assert held == {"e08": "u@999", "e10": None, "e14": "u@100"}  # held with their reference, to retry
    # the version used carries the table's own fields: its key and time too
    e05 = next(r for r in result.decided.collect() if r["event_id"] == "e05")
    assert e05["_s1"].asDict() == {"user_id": "u", "name": "D", "country": "JP", "ts": 400}


def test_nothing_is_emitted_before_any_change_is_seen(spark):
    sides = _sides()
    changes = spark.createDataFrame([], CHANGE_SCHEMA)
    events = spark.createDataFrame([("e1", "u", "view", 1, None), ("e2", "u", "view", 1, "x")], EVENT_SCHEMA)
    result = asof_join(with_identity(events, sides), version_rows(changes, sides), sides, watermark_ms=None)
    assert sorted(r["event_id"] for r in result.held.collect()) == ["e1", "e2"]


def test_state_restores_its_mark_and_tables_and_stages_a_batch_once(spark, tmp_path):
    """The layout (`mark.json`, Delta `versions` and `held`) restores; staging or advancing a batch id again (a
    replay) appends nothing twice; the held set is replaced only when given."""
    state_dir = tmp_path / "g1"
    state = AsofState(spark, as_lake(state_dir), "mview-enrichment-g1", _sides())
    before = state.restore(0)
    assert (before.max_ts, before.held, before.watermark(10)) == (None, 0, None)
    assert before.versions().count() == 0 and before.held_events().count() == 0
    changes = spark.createDataFrame(CHANGES[:3], CHANGE_SCHEMA)
    for _ in range(2):
        state.stage(0, changes)
    assert state.restore(1).versions().count() == 3
    assert sorted((r["_k"], r["_r"], r["name"]) for r in state.restore(1).versions().collect()) == [
        ("u", False, "A"), ("u", False, "B"), ("u", True, None)
    ]  # fmt: skip
    waiting = spark.createDataFrame([("e1", "u", "view", 900, None)], EVENT_SCHEMA)
    state.advance(0, AsofProgress(300, 1, waiting))
    state.advance(0, AsofProgress(300, 0, waiting.limit(0)))  # a replay's held set: batch 0 is replaced once
    assert json.loads((state_dir / "mark.json").read_text()) == {"held": 0, "max_ts": 300}
    state.advance(1, AsofProgress(400, 1))  # held unchanged: the table stays as it is
    after = state.restore(2)
    assert (after.max_ts, after.held, after.watermark(100)) == (400, 1, 300)
    assert [r["event_id"] for r in after.held_events().collect()] == ["e1"]
    # as the job wrote it before #17
    (state_dir / "mark.json").write_text(json.dumps({"max_ts": 7, "held": 0}))
    assert AsofState(spark, as_lake(state_dir), "mview-enrichment-g1", _sides()).restore(3).max_ts == 7
