"""The lake's format (`changelog.lakeformat`): recorded with the lake's first topic log; every command refuses a lake
of another format, or one whose topic logs exist without the record (an earlier version's), in one line that says
what to run, before it reads or writes anything else. The one check that stands for every earlier layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from changelog.lakeformat import LAKE_FORMAT, format_problem
from changelog.storage import as_lake, open_lake
from changelog.topics import ensure_topic
from tests.lakehelp import as_topic

MVIEW = str(Path(sys.executable).with_name("mview"))


def test_a_lake_records_its_format_with_its_first_topic_log(tmp_path):
    lake = open_lake(tmp_path / "lake")
    assert format_problem(lake) is None  # a new lake: nothing to refuse
    ensure_topic(None, as_lake(lake), as_topic("tweets"))
    assert json.loads((tmp_path / "lake" / "format.json").read_text()) == {"format": LAKE_FORMAT}
    ensure_topic(None, as_lake(lake), as_topic("follows"))
    assert format_problem(lake) is None


@pytest.mark.parametrize("recorded", [None, {"format": LAKE_FORMAT + 1}, {"format": 0}])
def test_a_lake_of_another_format_is_refused_by_every_command_in_one_line(tmp_path, recorded):
    """A lake with a topic log and no `format.json` (written before it was recorded) or another format: `mview
    ingest` (a command that writes), `mview status` (one that reads) and `mview check` stop with one line that says
    what to run, and nothing is written."""
    lake = tmp_path / "lake"
    ensure_topic(None, open_lake(lake), as_topic("tweets"))
    if recorded is None:
        (lake / "format.json").unlink()
    else:
        (lake / "format.json").write_text(json.dumps(recorded))
    what = "records no lake format" if recorded is None else f"has lake format {recorded['format']}"
    problem = format_problem(open_lake(lake))
    assert what in problem and "`mview ingest`" in problem and "make clean" in problem
    before = sorted(p.relative_to(lake) for p in lake.rglob("*"))
    source = tmp_path / "t.jsonl"
    source.write_text('{"op": "post", "tweet_id": "t1", "user_id": "u1", "text": "x", "ts": 1}\n')
    env = {**os.environ, "LAKE_DIR": str(lake), "REDIS_URL": "redis://127.0.0.1:1/0"}
    env.pop("MVIEW_PIPELINE", None)
    for args in (("ingest", "tweets", str(source)), ("status",), ("check",)):
        done = subprocess.run([MVIEW, *args], env=env, capture_output=True, text=True, timeout=300)
        err = done.stderr.splitlines()
        assert done.returncode == 1 and len(err) == 1 and "Traceback" not in done.stderr, (args, done.stderr)
        assert f"LAKE_DIR {lake} was written by another version of mview (it {what}" in err[0], (args, err)
    assert sorted(p.relative_to(lake) for p in lake.rglob("*")) == before
