"""The development Kafka broker's storage formatting (`jobs.dev.kafka.format_log_dir`), with the real StorageTool."""

from __future__ import annotations

import pytest

from jobs.dev.kafka import _properties, format_log_dir, new_cluster_id


@pytest.mark.parametrize("cluster_id", ["-dashFirst0123456789ab", "AbCdEfGhIjKlMnOpQrStUv"])
def test_a_cluster_id_is_one_argument_even_when_it_starts_with_a_dash(tmp_path, cluster_id):
    (tmp_path / "server.properties").write_text(_properties(tmp_path, 19092, 19093))
    format_log_dir(tmp_path, cluster_id)
    meta = (tmp_path / "logs" / "meta.properties").read_text()
    assert f"cluster.id={cluster_id}\n" in meta


def test_new_cluster_ids_are_22_urlsafe_characters():
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(
        len(i) == 22 and set(i) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        for i in ids
    )
