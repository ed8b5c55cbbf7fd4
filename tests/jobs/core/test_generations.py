"""`jobs.core.generations.drop_generation`: a generation that is not served is removed whole, Redis and lake, and
nothing of another generation is touched."""

from __future__ import annotations

from pathlib import Path

from jobs.core.generations import drop_generation
from jobs.core.registry import job_spec
from jobs.core.runtime import checkpoint_dir, job_dir, state_dir
from tests.conftest import make_settings
from views.keys import meta_key
from views.log import log_path
from views.redis_io import connect


def test_dropping_a_generation_removes_its_keys_state_checkpoint_output_logs_and_late_records(
    tmp_path, redis_url
):
    settings = make_settings(tmp_path / "lake", redis_url)
    spec, client = job_spec(settings, "enrichment"), connect(redis_url)
    client.flushdb()
    dirs = {}
    for g in (1, 2):
        dirs[g] = [
            Path(checkpoint_dir(settings, spec.name, g)),
            Path(state_dir(settings, spec.name, g)),
            Path(job_dir(settings, spec.name)) / "late" / f"g{g}",
            *(Path(log_path(settings.lake, view, g)) for view in spec.views),
        ]
        for d in dirs[g]:
            d.mkdir(parents=True, exist_ok=True)
            (d / "part").write_text("x")
        client.hset(meta_key(spec.name, g), "last_batch_id", 0)
    drop_generation(settings, client, spec, 1)
    assert [d for d in dirs[1] if d.exists()] == []
    assert all((d / "part").exists() for d in dirs[2]) and client.exists(meta_key(spec.name, 2))
    assert not client.exists(meta_key(spec.name, 1))
