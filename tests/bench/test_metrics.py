"""The metrics bench's arithmetic: on/off appends paired by their neighbour in time, ABBA."""

from __future__ import annotations

from bench.metrics import _append_pairs, _order


def test_appends_pair_with_their_neighbour_and_compare_their_median_latencies():
    order = [mode for pair in _order(3) for mode in pair]
    assert order == ["on", "off", "off", "on", "on", "off"]
    per_append = [[1.1, 1.0, 1.3], [1.0, 1.0, 0.9], [2.0], [2.2], [1.0], [], [5.0]]
    lat, costs = _append_pairs(order, per_append)
    assert costs == [
        10.0,
        10.0,
    ]  # medians 1.1 on / 1.0 off, then 2.2 on / 2.0 off; the last pair has no "off"
    assert sorted(lat["on"]) == [
        1.0,
        1.0,
        1.1,
        1.3,
        2.2,
    ]  # the appends of every pair, the unpaired 7th left out
    assert sorted(lat["off"]) == [0.9, 1.0, 1.0, 2.0]
