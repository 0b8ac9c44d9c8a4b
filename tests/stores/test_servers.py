"""The test server helpers themselves: they start on loopback, answer, and leave no process
behind, whichever way they are stopped."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.servers import (
    CLUSTER_BUS_OFFSET,
    HOST,
    RedisCluster,
    RedisServer,
    _ephemeral_low,
    free_port,
    pid_alive,
    ping,
    port_range,
)


def test_free_ports_are_bindable_and_cluster_ports_leave_room_for_the_bus() -> None:
    port = free_port()
    assert 0 < port < 65536
    for _ in range(5):
        p = free_port(cluster=True)
        assert p + CLUSTER_BUS_OFFSET < 65536


def test_ports_come_from_this_workers_range_below_the_ephemeral_ones() -> None:
    ports = port_range()
    picked = [free_port() for _ in range(3)]
    assert all(p in ports for p in picked) and len(set(picked)) == 3  # none given twice
    if _ephemeral_low() >= 30000:  # the usual 32768 (Linux): below it, bus ports included
        assert ports.stop + CLUSTER_BUS_OFFSET <= _ephemeral_low()


def test_a_port_taken_meanwhile_by_another_process_moves_the_server(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    picked = server.port
    with socket.socket() as other:  # another process takes the port before the server starts
        other.bind((HOST, picked))
        other.listen()
        try:
            server.start()
            assert server.port != picked and ping(server.port)
            assert server.log.parent.name == f"redis-{server.port}"
        finally:
            server.stop()
    assert server.pid is not None and not pid_alive(server.pid)


def test_server_starts_answers_restarts_and_stops_by_pid(tmp_path: Path) -> None:
    server = RedisServer(tmp_path)
    try:
        server.start()
        pid = server.pid
        assert pid is not None and pid_alive(pid)
        assert server.cli("ping").strip() == "PONG"
        client = server.client()
        # Loopback only, no persistence unless asked.
        assert client.config_get("bind")["bind"] == "127.0.0.1"
        assert client.config_get("appendonly")["appendonly"] == "no"
        assert client.config_get("save")["save"] == ""
        client.set("k", "v")

        server.restart()
        assert not pid_alive(pid)
        assert server.pid != pid and ping(server.port)
        assert server.client().get("k") is None  # nothing persisted across the restart
        client.close()

        killed = server.pid
        server.kill()
        assert killed is not None and not pid_alive(killed)
        assert not ping(server.port)
        server.restart()  # restart after a crash works on the same port
        assert ping(server.port)
    finally:
        last = server.pid
        server.stop()
    assert last is not None and not pid_alive(last)
    assert not ping(server.port)


def test_extra_args_override_the_defaults(tmp_path: Path) -> None:
    with RedisServer(tmp_path, "--appendonly", "yes", "--appendfsync", "always") as server:
        config = server.client().config_get("append*")
        assert config["appendonly"] == "yes" and config["appendfsync"] == "always"


def test_password_server_needs_the_password(tmp_path: Path) -> None:
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    with RedisServer(tmp_path, password="s3cret") as server:
        assert server.client().ping() is True
        assert server.cli("ping").strip() == "PONG"  # redis-cli gets it from the environment
        wrong = redis.Redis(
            host="127.0.0.1", port=server.port, password="wrong", retry=Retry(NoBackoff(), 0)
        )
        with pytest.raises(redis.AuthenticationError):
            wrong.ping()


def test_a_server_that_cannot_start_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    server = RedisServer(tmp_path, "--no-such-option", "1")
    with pytest.raises(RuntimeError, match="exited"):
        server.start()
    assert server.pid is not None and not pid_alive(server.pid)


def test_cluster_of_three_primaries(tmp_path: Path) -> None:
    cluster = RedisCluster(tmp_path)
    try:
        cluster.start()
        assert len(cluster.pids) == 3 and all(pid_alive(p) for p in cluster.pids)
        assert cluster.states() == ["ok", "ok", "ok"]
        # Every slot is served, by three different nodes across the range.
        owners = {cluster.node_for_slot(s).port for s in (0, 8000, 16383)}
        assert owners == {n.port for n in cluster.nodes}
    finally:
        pids = cluster.pids
        cluster.stop()
    assert pids and not any(pid_alive(p) for p in pids)
