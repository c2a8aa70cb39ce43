"""Transactions: commit, abort on exception, in doubt when the commit's answer is lost."""

from __future__ import annotations

import signal
import uuid

import pytest

import mq_client
from mq_client import Client

from conftest import Mqd, wait_until


def test_commit_makes_sends_and_receives_happen(client: Client, txqname: str) -> None:
    other = txqname + "-out"
    client.create_queue(other, transactional=True)
    try:
        q = client.queue(txqname)
        q.send(b"order 7", transactional=True)
        with client.transaction() as tx:
            order = tx.receive(txqname, timeout=30.0)
            assert order is not None and order.body == b"order 7"
            tx.send(other, b"invoice 7", label="invoice")
            tx.send(other, b"parcel 7")
            # Invisible until the commit.
            assert client.queue(other).peek() is None
        assert len(tx.ids) == 2
        got = [(m.id, m.body, m.label) for m in client.queue(other).peek_many(10)]
        assert got == [(tx.ids[0], b"invoice 7", "invoice"), (tx.ids[1], b"parcel 7", "")]
        assert q.info().messages == 0
        assert client.transaction_outcome(tx.id).outcome == "committed"
    finally:
        client.delete_queue(other)


def test_exception_aborts(client: Client, txqname: str) -> None:
    q = client.queue(txqname)
    sent = q.send(b"keep me", transactional=True)
    with pytest.raises(RuntimeError, match="boom"):
        with client.transaction() as tx:
            m = tx.receive(txqname, timeout=30.0)
            assert m is not None and m.id == sent
            tx.send(txqname, b"never stored")
            raise RuntimeError("boom")
    # The received message is back (abort count 1); the send never happened.
    msgs = q.peek_many(10)
    assert [m.id for m in msgs] == [sent]
    assert msgs[0].abort_count == 1
    assert client.transaction_outcome(tx.id).outcome in ("aborted", "unknown")


def test_receive_by_id_in_transaction(client: Client, txqname: str) -> None:
    q = client.queue(txqname)
    a = q.send(b"a", transactional=True)
    b = q.send(b"b", transactional=True, correlation_id="cb")
    with client.transaction() as tx:
        with pytest.raises(mq_client.MessageNotFound):
            tx.receive_by_id(txqname, uuid.uuid4())
        got = tx.receive_by_correlation_id(txqname, "cb")
        assert got is not None and got.id == b
    assert [m.id for m in q.peek_many(5)] == [a]


def test_bad_destination_fails_the_commit(client: Client, txqname: str) -> None:
    with pytest.raises(mq_client.NotFound):
        with client.transaction() as tx:
            tx.send(txqname + "-missing", b"lost")
    assert client.transaction_outcome(tx.id).outcome != "committed"


def test_same_id_commits_at_most_once(client: Client, txqname: str) -> None:
    tid = uuid.uuid4()
    with client.transaction(id=tid) as tx:
        tx.send(txqname, b"once")
    assert tx.id == tid
    with pytest.raises(mq_client.AlreadyCommitted) as e:
        with client.transaction(id=tid) as tx2:
            tx2.send(txqname, b"twice")
    assert e.value.transaction_id == tid
    assert [m.body for m in client.queue(txqname).peek_many(5)] == [b"once"]


def test_lost_commit_answer_is_in_doubt(txqname: str) -> None:
    """The broker stops (SIGSTOP) after the commit left: the answer does not come within the
    commit timeout, so the outcome is unknown; once it runs again the outcome is committed."""
    broker = Mqd()
    try:
        with Client(broker.url) as c:
            c.create_queue(txqname, transactional=True)
            tx = c.transaction(commit_timeout=1.0)
            tx.send(txqname, b"maybe")
            # The staged send must have reached the broker before it stops: a receive round
            # trip on the same stream orders it.
            assert tx.receive(txqname, timeout=0.0) is None
            broker.signal(signal.SIGSTOP)
            try:
                with pytest.raises(mq_client.TransactionInDoubt) as e:
                    tx.commit()
            finally:
                broker.signal(signal.SIGCONT)
            assert e.value.transaction_id == tx.id
            assert str(tx.id) in str(e.value)
            outcome = wait_until(
                lambda: (s := c.transaction_outcome(tx.id).outcome) != "in_progress" and s,
                what="the transaction's outcome",
            )
            assert outcome in ("committed", "aborted")
            stored = [m.body for m in c.queue(txqname).peek_many(5)]
            assert stored == ([b"maybe"] if outcome == "committed" else [])
    finally:
        broker.stop()


def test_receive_and_commit_in_one_round_trip(client: Client, txqname: str) -> None:
    other = txqname + "-out"
    client.create_queue(other, transactional=True)
    try:
        q = client.queue(txqname)
        first = q.send(b"one", transactional=True)
        q.send(b"two", transactional=True)
        with client.transaction() as tx:
            tx.send(other, b"staged with it")
            m = tx.receive_and_commit(txqname, timeout=30.0)
        assert m is not None and m.id == first and m.body == b"one"
        assert len(tx.ids) == 1, "the staged send committed with the receive"
        assert [x.body for x in client.queue(other).peek_many(5)] == [b"staged with it"]
        assert [x.body for x in q.peek_many(5)] == [b"two"], "the received one is gone"
        assert client.transaction_outcome(tx.id).outcome == "committed"
        # Nothing to receive: the whole transaction is aborted, its send too.
        assert client.queue(txqname).receive_one(timeout=30.0) is not None
        with client.transaction() as tx2:
            tx2.send(other, b"never stored")
            assert tx2.receive_and_commit(txqname, timeout=0.2) is None
        assert [x.body for x in client.queue(other).peek_many(5)] == [b"staged with it"]
        with pytest.raises(mq_client.TransactionAborted):
            tx2.send(other, b"over")
    finally:
        client.delete_queue(other)
