"""The development and scratch Redis servers: a real three-master cluster that serves every hash slot, on ports no
server started on a free port (port 0) can take before its nodes bind them; a port where something that is not a
Redis listens is not waited on for long."""

from __future__ import annotations

import socket
import time

import redis
from redis.cluster import RedisCluster

from jobs.dev.redis import CLUSTER_MASTERS, _cluster_ports, _ephemeral_low, _wait_answer


def test_the_scratch_cluster_has_three_masters_that_serve_every_slot_and_spread_keys(redis_cluster):
    client = RedisCluster.from_url(redis_cluster["url"])
    masters = client.get_primaries()
    assert len(masters) == CLUSTER_MASTERS
    slots = redis.Redis(port=redis_cluster["ports"][0]).execute_command("CLUSTER", "SLOTS")
    assert sum(int(end) - int(start) + 1 for start, end, *_ in slots) == 16384
    before = [
        redis.Redis(port=p).dbsize() for p in redis_cluster["ports"]
    ]  # the session's cluster: others' keys
    for i in range(60):
        client.set(f"mv:test:{{k{i}}}", i)
    per_node = [redis.Redis(port=p).dbsize() - n for p, n in zip(redis_cluster["ports"], before, strict=True)]
    assert sum(per_node) == 60 and all(n > 0 for n in per_node)
    assert len(list(client.scan_iter(match="mv:test:*"))) == 60  # a scan visits every master
    client.delete(*[f"mv:test:{{k{i}}}" for i in range(60)])


def test_cluster_ports_and_their_bus_ports_lie_below_the_ephemeral_range():
    low = _ephemeral_low()
    for _ in range(50):
        ports = _cluster_ports()
        assert len(set(ports)) == CLUSTER_MASTERS
        assert all(1024 <= p and p + 10000 < low for p in ports), (ports, low)


def test_a_listener_that_never_answers_is_not_a_redis():
    with socket.socket() as listener:  # accepts connections (the backlog) and never replies
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        start = time.monotonic()
        assert not _wait_answer(listener.getsockname()[1])
        assert time.monotonic() - start < 10
