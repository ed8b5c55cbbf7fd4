"""The development and scratch Redis servers: a real three-master cluster that serves every hash slot."""

from __future__ import annotations

import redis
from redis.cluster import RedisCluster

from jobs.dev.redis import CLUSTER_MASTERS


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
