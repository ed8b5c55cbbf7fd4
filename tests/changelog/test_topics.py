"""The lake's Delta tables other than the topic logs (`changelog.topics.ensure_delta_table`)."""

from __future__ import annotations

from changelog.topics import ensure_delta_table, table_version


def test_a_table_whose_creator_died_before_its_first_commit_is_created_then_kept(spark, tmp_path):
    """A `_delta_log` directory without a commit (its creator killed in between) is no table: the next start
    creates it; a table that exists is left as it is."""
    path = tmp_path / "state" / "held"
    (path / "_delta_log").mkdir(parents=True)
    ensure_delta_table(spark, path, "k string, v bigint")
    assert table_version(path) == 0
    assert spark.read.format("delta").load(str(path)).schema.simpleString() == "struct<k:string,v:bigint>"
    spark.createDataFrame([("a", 1)], "k string, v bigint").write.format("delta").mode("append").save(
        str(path)
    )
    ensure_delta_table(spark, path, "k string, v bigint")
    assert table_version(path) == 1 and spark.read.format("delta").load(str(path)).count() == 1
