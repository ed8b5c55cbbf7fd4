"""`jobs.core.replay.caught_up`: a `--once` run with nothing to do is told without Spark (so `mview run JOB --once`
starts no JVM), and anything a run would act on makes it false: new log versions, a lost serving copy, a changed
definition, a job that never ran."""

from __future__ import annotations

from jobs.core.replay import caught_up
from jobs.kinds.select import run
from tests.conftest import make_settings
from tests.shophelp import shop_file, write_chunk

PIPELINE = """
topics:
  visits:
    fields: {visit_id: id, page: string, ts: timestamp}
    id: visit_id
    time: ts
jobs:
  pages:
    select: {from: visits}
    views:
      per_page: {count: {page: page}, values: {visits: 1}}
"""


def _visits(n: int, start: int = 0) -> list[dict]:
    return [
        {"visit_id": f"v{i}", "page": f"p{i % 3}", "ts": 1_700_000_000_000 + i}
        for i in range(start, start + n)
    ]


def test_only_a_job_with_nothing_new_is_caught_up(spark, tmp_path, redis_url, rclient):
    p = shop_file(tmp_path, PIPELINE)
    settings = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=p.file)
    topic = p.topics["visits"]
    write_chunk(spark, settings.lake_dir, topic, _visits(5))
    assert not caught_up(settings, "pages")  # never ran
    run(spark, settings, p, "pages", once=True)
    assert caught_up(settings, "pages")
    write_chunk(spark, settings.lake_dir, topic, _visits(2, 5))
    assert not caught_up(settings, "pages")  # a new log version
    run(spark, settings, p, "pages", once=True)
    assert caught_up(settings, "pages")
    changed = shop_file(tmp_path, PIPELINE.replace("visits: 1}", "visits: 1, twice: 2}"))
    other = make_settings(tmp_path / "lake", redis_url, METRICS_PORT="off", MVIEW_PIPELINE=changed.file)
    assert not caught_up(other, "pages")  # the definition changed
    shop_file(tmp_path, PIPELINE)
    assert caught_up(settings, "pages")
    rclient.flushall()
    assert not caught_up(settings, "pages")  # Redis lost the serving copy
