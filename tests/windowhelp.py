"""The pipeline file and the run of the windowed-view tests of the job kinds (`tests/jobs/kinds/test_*_windows.py`): arrivals cut into
pieces, each piece ingested as one file per topic (`mview ingest`'s code: one log version each, stamped) and the job
run once after it; the pieces are the brute force's batches."""

from __future__ import annotations

import json
import random

from changelog.ingest import ingest
from tests.conftest import make_settings
from views.pipeline import load_pipeline

__all__ = ["run_in_pieces", "pipeline_file"]


def pipeline_file(tmp_path_factory, name: str, text: str):
    """The pipeline `text`, written to `<name>.yml` in a fresh directory and loaded from there (a job finds its
    pipeline through `MVIEW_PIPELINE`, the file)."""
    path = tmp_path_factory.mktemp(name) / f"{name}.yml"
    path.write_text(text)
    return load_pipeline(path, {})


def run_in_pieces(spark, tmp_path, redis_url, pipeline, run, job: str, arrivals, rng: random.Random, *, pieces: int,
                  lateness_ms: int):  # fmt: skip
    """Ingest `arrivals` ([(topic, record)]) cut at random into `pieces` (`rng`), running `run(spark, settings,
    pipeline, job, once=True)` after each. Returns (the settings, the pieces as brute-force batches)."""
    cuts = sorted(rng.sample(range(1, len(arrivals)), pieces - 1))
    settings = make_settings(
        tmp_path / "lake",
        redis_url,
        ALLOWED_LATENESS=f"{lateness_ms} ms",
        METRICS_PORT="off",
        MVIEW_PIPELINE=pipeline.file,
    )
    batches = []
    for i, (a, b) in enumerate(zip([0, *cuts], [*cuts, len(arrivals)], strict=True)):
        batch: dict[str, list] = {}
        for topic, rec in arrivals[a:b]:
            batch.setdefault(topic, []).append(rec)
        for topic, records in batch.items():
            path = tmp_path / f"{topic}-{i}.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in records))
            ingest(None, settings.lake, pipeline.topic(topic), [str(path)])
        run(spark, settings, pipeline, job, once=True)
        batches.append(batch)
    return settings, batches
