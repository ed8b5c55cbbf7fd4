"""`joins.sides.dedupe_records`: one row per id, the smallest copy kept, and the log's stamp carried as the
earliest copy's, a copy with no stamp (the log's first version) the earliest of all: a record delivered again in a
later version is judged late or not as its first copy, in one batch as across batches."""

from __future__ import annotations

import pytest

from changelog.topics import MAX_BEFORE
from joins.sides import dedupe_records
from spec.model import Topic

TOPIC = Topic(
    name="plays",
    fields=(("play_id", "id"), ("score", "long"), ("ts", "timestamp")),
    time="ts",
    id=("play_id",),
)


@pytest.mark.parametrize(
    "stamps, carried",
    [
        ((None, 500), None),  # first copy in version 1 (nothing before it), again in a later version
        ((500, None), None),  # the same copies, read in the other order
        ((700, 500), 500),
        ((None, None), None),
        ((500,), 500),
    ],
)
def test_the_stamp_carried_is_the_earliest_copy_s(spark, stamps, carried):
    rows = [("p1", 5, 1_000, "p1", s) for s in stamps] + [("p2", 1, 2_000, "p2", 900)]
    df = spark.createDataFrame(
        rows, f"play_id string, score bigint, ts bigint, _id string, {MAX_BEFORE} bigint"
    )
    got = {r["_id"]: r[MAX_BEFORE] for r in dedupe_records(df, TOPIC, least=(MAX_BEFORE,)).collect()}
    assert got == {"p1": carried, "p2": 900}


def test_of_copies_with_different_content_the_smallest_is_kept(spark):
    rows = [("p1", 9, 1_000, "p1"), ("p1", 5, 1_000, "p1"), ("p1", 7, 3_000, "p1")]
    df = spark.createDataFrame(rows, "play_id string, score bigint, ts bigint, _id string")
    (row,) = dedupe_records(df, TOPIC).collect()
    assert (row["score"], row["ts"]) == (5, 1_000)
