"""mqd --unix-socket: the Python client reaches the same broker on ``unix:PATH``."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from mq_client import Client, ConnectError

from conftest import Mqd


def test_a_client_on_the_unix_socket_sees_the_tcp_clients_queues(tmp_path: Path) -> None:
    sock = tmp_path / "mqd.sock"
    broker = Mqd(["--unix-socket", str(sock)])
    try:
        name = ".\\private$\\py-unix-" + uuid.uuid4().hex[:8]
        with Client(broker.url) as tcp, Client(f"unix:{sock}") as local:
            tcp.create_queue(name)
            local.queue(name).send(b"over the socket", label="local")
            got = []
            with tcp.queue(name).receive(timeout=30.0, max_messages=1) as messages:
                for msg in messages:
                    got.append((msg.body, msg.label))
                    msg.ack()
            assert got == [(b"over the socket", "local")]
            tcp.queue(name).send(b"over tcp")
            with local.queue(name).receive(timeout=30.0, max_messages=1) as messages:
                bodies = []
                for msg in messages:
                    bodies.append(msg.body)
                    msg.ack()
            assert bodies == [b"over tcp"]
    finally:
        broker.stop()
    assert not sock.exists(), "a clean stop removes the socket file"


def test_a_unix_url_without_a_path_or_with_a_ca_is_refused() -> None:
    with pytest.raises(ConnectError, match="needs the socket's path"):
        Client("unix:")
    with pytest.raises(ConnectError, match="does not use TLS"):
        Client("unix:/nonexistent/mqd.sock", ca=b"not used")
