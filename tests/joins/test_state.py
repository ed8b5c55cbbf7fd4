"""`joins.state`'s small-file helpers through the lake: JSON replaced whole and read back by lake and key, and the
listing of the complete directories of a state."""

from __future__ import annotations

import stat

from changelog.storage import open_lake
from joins.state import complete_dirs, read_json, write_json


def test_json_by_lake_and_key_is_replaced_whole_and_owner_only(tmp_path):
    lake = open_lake(tmp_path / "lake")
    write_json(lake, {"b": 1, "a": [2]}, "state/j/g1/mark.json")
    assert (tmp_path / "lake/state/j/g1/mark.json").read_text() == '{"a": [2], "b": 1}'
    assert read_json(lake, None, "state/j/g1/mark.json") == {"a": [2], "b": 1}
    path = tmp_path / "lake" / "jobs" / "j" / "status.json"
    write_json(lake, {"state": "running"}, "jobs/j/status.json")
    write_json(lake, {"state": "stopped"}, "jobs/j/status.json")
    assert read_json(lake, {}, "jobs/j/status.json") == {"state": "stopped"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["status.json"]  # no temporary file is left
    assert read_json(lake, "x", "state/none") == "x"


def test_complete_dirs_are_those_with_a_success_marker_below_an_id_by_id(tmp_path):
    lake = open_lake(tmp_path)
    for name, done in (("b10", True), ("b2", True), ("b3", False), ("b11", True), ("s1", True), ("bx", True)):
        lake.write_bytes(b"", "t", name, "part-0")
        if done:
            lake.write_bytes(b"", "t", name, "_SUCCESS")
    known: set[str] = set()
    assert complete_dirs(lake, "t", "b", 11, known) == [(2, "t/b2"), (10, "t/b10")]
    assert known == {"b2", "b10"}
    lake.delete("t/b2/_SUCCESS")  # a directory known complete is not looked at again
    assert complete_dirs(lake, "t", "b", 12, known) == [(2, "t/b2"), (10, "t/b10"), (11, "t/b11")]
    assert complete_dirs(lake, "t", "b", 12) == [(10, "t/b10"), (11, "t/b11")]
    assert complete_dirs(lake, "none", "b", 5) == []
