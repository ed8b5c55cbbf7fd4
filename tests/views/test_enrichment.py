"""views.enrichment's export of the output log."""

from __future__ import annotations

from views.enrichment import enriched_path, export_enriched


def test_export_of_a_generation_whose_log_has_no_commit_yet_is_empty(spark, tmp_path):
    """Between Spark making the output log's `_delta_log` and its version 0, the generation has published nothing:
    its export is empty, not an error."""
    (enriched_path(tmp_path, 1) / "_delta_log").mkdir(parents=True)
    assert list(export_enriched(spark, tmp_path, 1)) == []
