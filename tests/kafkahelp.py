"""Kafka fixtures: one real broker (Apache Kafka, KRaft, jars from Maven Central) per test session on free ports;
each test gets its own topic prefix (`kafka`), so tests never see each other's messages."""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import pytest

from jobs.dev.kafka import scratch_kafka, start_broker, wait_broker
from jobs.errors import JobsError
from tests.devhelp import servers_allowed

__all__ = ["kafka_broker", "kafka", "KafkaBroker"]

_SEQ = itertools.count(1)


class KafkaBroker:
    """The session's broker: `bootstrap`, and `stop()` / `start()` to take it down and bring it back on the same
    ports with the same data (a broker outage under a running job)."""

    def __init__(self, workdir: Path, proc: subprocess.Popen, bootstrap: str):
        self.workdir, self.proc, self.bootstrap = workdir, proc, bootstrap
        props = (workdir / "server.properties").read_text()
        self.controller = int(props.split("CONTROLLER://127.0.0.1:")[1].split()[0])

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)

    def start(self) -> None:
        port = int(self.bootstrap.rsplit(":", 1)[1])
        self.proc = start_broker(self.workdir, port, self.controller, detach=False)
        wait_broker(self.proc, self.bootstrap, self.workdir / "server.log")


@pytest.fixture(scope="session")
def kafka_broker(request, tmp_path_factory):
    servers_allowed(request, "the Kafka broker")
    workdir = tmp_path_factory.mktemp("kafka")
    try:
        proc, bootstrap = scratch_kafka(workdir)
    except JobsError as e:
        pytest.fail(f"cannot start the test Kafka broker: {e}")
    broker = KafkaBroker(workdir, proc, bootstrap)
    yield broker
    broker.stop()


@pytest.fixture
def kafka(kafka_broker) -> dict[str, str]:
    """Settings for a test: the session's broker and a topic prefix of its own."""
    return {"KAFKA_BOOTSTRAP": kafka_broker.bootstrap, "KAFKA_TOPIC_PREFIX": f"t{next(_SEQ)}."}
