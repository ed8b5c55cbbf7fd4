"""The waiting Redis client every job and sink uses: a command issued while Redis is down blocks, says so, and
completes once Redis is back, with nothing lost; interactive reads (wait=False) fail at once with advice."""

from __future__ import annotations

import threading

import pytest

from tests.jobs.opshelp import OwnRedis
from views.errors import RedisUnavailable
from views.redis_io import connect


def test_commands_wait_for_redis_and_complete_when_it_returns(tmp_path, capfd):
    own = OwnRedis(tmp_path / "redis").start()
    try:
        client = connect(own.url())
        client.set("before", 1)
        own.stop()
        with pytest.raises(RedisUnavailable, match="make redis"):
            connect(own.url(), wait=False)
        restart = threading.Timer(1.5, own.start)
        restart.start()
        pipe = client.pipeline(transaction=False)
        pipe.set("during", 2)
        pipe.zadd("z", {"a": 1})
        assert pipe.execute() == [True, 1]
        restart.join()
        assert client.mget("before", "during") == [b"1", b"2"]  # the AOF kept the write before the outage
        assert f"waiting for Redis at {own.url()} (attempt 1)" in capfd.readouterr().err
    finally:
        own.stop()
