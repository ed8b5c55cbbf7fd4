"""Every view test here runs twice: on the session's redis-server and on the session's three-master Redis Cluster
(`redis_url` is overridden, parametrized; each test gets an emptied Redis either way). A test may choose its
targets with `@pytest.mark.parametrize("redis_url", [...], indirect=True)`."""

from __future__ import annotations

import pytest
from redis.cluster import RedisCluster


@pytest.fixture(params=["server", "cluster"])
def redis_url(request):
    if request.param == "server":
        return request.getfixturevalue("redis_server_url")
    cluster = request.getfixturevalue("redis_cluster")
    RedisCluster.from_url(cluster["url"]).flushall()
    return cluster["url"]
