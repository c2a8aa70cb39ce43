"""Typed exceptions, queue administration, connection errors, the protocol version check."""

from __future__ import annotations

import socket

import pytest

import mq_client
from mq_client import Client

from conftest import Mqd


MISSING = ".\\private$\\py-no-such-queue"


def test_missing_queue_is_queue_not_found_everywhere(client: Client) -> None:
    q = client.queue(MISSING)
    with pytest.raises(mq_client.QueueNotFound):
        client.queue_info(MISSING)
    with pytest.raises(mq_client.QueueNotFound):
        q.receive_one()
    with pytest.raises(mq_client.QueueNotFound):
        q.peek()
    with pytest.raises(mq_client.QueueNotFound):
        list(q.receive(timeout=30.0))
    with pytest.raises(mq_client.QueueNotFound):
        client.delete_queue(MISSING)
    with pytest.raises(mq_client.QueueNotFound):
        client.purge(MISSING)
    with pytest.raises(mq_client.QueueNotFound) as e:
        q.send(b"lost")
    assert e.value.code is not None and MISSING in str(e.value)
    # The broker's reason for the refused message (SendFailure.reason).
    assert e.value.reason == "QUEUE_NOT_FOUND"
    # A pipelined sender reports each refused message of a flush.
    with q.sender() as s:
        s.send(b"a")
        s.send(b"b")
        with pytest.raises(mq_client.SendFailed) as e2:
            s.flush()
    assert [i for i, _ in e2.value.failures] == [0, 1] and e2.value.ids == [None, None]
    assert all(isinstance(f, mq_client.QueueNotFound) for _, f in e2.value.failures)


def test_queue_admin(client: Client) -> None:
    name = ".\\private$\\py-admin"
    info = client.create_queue(name, label="orders", quota_bytes=1 << 20)
    try:
        assert info.name == name and info.label == "orders" and info.quota_bytes == 1 << 20
        assert not info.transactional
        with pytest.raises(mq_client.QueueExists):
            client.create_queue(name)
        assert client.create_queue(name, exist_ok=True).name == name
        assert name in [q.name for q in client.list_queues()]
        changed = client.set_queue_properties(name, label="renamed", remove_quota=True)
        assert changed.label == "renamed" and changed.quota_bytes is None
        q = client.queue(name)
        for _ in range(3):
            q.send(b"x")
        assert q.purge() == 3
        assert q.info().messages == 0
    finally:
        client.delete_queue(name)
    with pytest.raises(mq_client.QueueNotFound):
        client.queue_info(name)


def test_refusals_are_typed(client: Client, qname: str, txqname: str) -> None:
    q = client.queue(qname)
    with pytest.raises(mq_client.InvalidArgument):
        q.send(b"x", priority=8)
    with pytest.raises(mq_client.InvalidArgument):
        client.create_queue("not a queue name \\\\ ::")
    # A non-transactional send to a transactional queue.
    with pytest.raises(mq_client.FailedPrecondition):
        client.queue(txqname).send(b"x")
    # A body over the broker's limit (--max-body-bytes).
    with pytest.raises(mq_client.InvalidArgument, match="16777216|body"):
        q.send(b"x" * (17 * 1024 * 1024))


def test_connect_error_names_the_url() -> None:
    # A bound socket that does not listen: connections are refused, and no other process can
    # take the port while the test runs.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        with pytest.raises(mq_client.ConnectError, match=f"127.0.0.1:{port}"):
            Client(url, connect_timeout=0.5)
    with pytest.raises(mq_client.ConnectError, match="not a broker URL"):
        Client("ftp://127.0.0.1:1801")
    with pytest.raises(mq_client.ConnectError, match="token"):
        Client(url, token="bad\ntoken")
    with pytest.raises(mq_client.ConnectError, match="https"):
        Client(url, ca=b"-----BEGIN CERTIFICATE-----")


def test_protocol_version_check(client: Client, mqd: Mqd) -> None:
    info = client.broker_info()
    # The client is generated from the same proto as this broker: same revision.
    assert info.protocol_version == mq_client.PROTOCOL_VERSION
    assert info.protocol_version >= mq_client.MIN_BROKER_PROTOCOL_VERSION
    assert info.limits  # the broker's limits, by flag name
    # A client that needs a newer broker says so clearly, and names both revisions.
    with pytest.raises(mq_client.IncompatibleBroker) as e:
        Client(mqd.url, min_protocol_version=info.protocol_version + 1)
    msg = str(e.value)
    assert "upgrade mqd" in msg and f"revision {info.protocol_version}" in msg
    assert e.value.broker_revision == info.protocol_version


def test_outgoing_queue_admin(client: Client) -> None:
    """A send to a queue on another broker (here: a port where none answers) waits in an
    outgoing queue, which can be listed, paused, resumed, not deleted while it holds it, and
    purged; then deleted."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dest = f"127.0.0.1:{port}"
    remote = f"DIRECT=TCP:{dest}\\private$\\far"
    client.queue(remote).send(b"for later", recoverable=True)
    [out] = [o for o in client.outgoing() if o.destination == dest]
    assert out.messages == 1 and out.state in ("connecting", "waiting", "inactive", "connected")
    assert client.pause_outgoing(dest).state == "onhold"
    assert client.resume_outgoing(dest).state != "onhold"
    with pytest.raises(mq_client.FailedPrecondition):
        client.delete_outgoing(dest)
    assert client.pause_outgoing(dest).state == "onhold"
    assert client.purge_outgoing(dest) == 1
    [out] = [o for o in client.outgoing() if o.destination == dest]
    assert out.messages == 0
    client.delete_outgoing(dest)
