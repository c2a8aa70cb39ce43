"""Send, receive, acknowledge, redelivery, peek, by id, pipelining, large messages."""

from __future__ import annotations

import threading
import uuid
from typing import Iterator

import pytest

import mq_client
from mq_client import Client, MessageNotFound

from conftest import Mqd, wait_until


def test_send_receive_ack(client: Client, qname: str) -> None:
    q = client.queue(qname)
    id1 = q.send(b"first", label="one", priority=5, recoverable=True, correlation_id="c-1")
    id2 = q.send("second", label="two", app_specific=42)
    assert isinstance(id1, uuid.UUID) and id1 != id2
    got = []
    # Generous timeouts with a count: the iteration ends on the count, not on a slow machine.
    with q.receive(timeout=30.0, max_messages=2) as messages:
        for msg in messages:
            got.append(msg)
            msg.ack()
    # Priority 5 before priority 3 (the default).
    assert [m.id for m in got] == [id1, id2]
    first, second = got
    assert (first.body, first.label, first.priority, first.correlation_id) == (
        b"first",
        "one",
        5,
        "c-1",
    )
    assert first.recoverable and not second.recoverable
    assert second.text == "second" and second.app_specific == 42 and second.priority == 3
    assert first.sent_time_ms > 0 and first.arrived_time_ms >= first.sent_time_ms - 60_000
    # Acknowledged: gone for good.
    assert q.info().messages == 0
    assert q.receive_one(timeout=0.0) is None


def test_unacked_message_is_redelivered(client: Client, qname: str) -> None:
    q = client.queue(qname)
    ids = [q.send(f"m{i}") for i in range(3)]
    # Take the first two, acknowledge only the first; the receiver closes at the end.
    with q.receive(timeout=30.0, max_messages=2) as r:
        msgs = list(r)
        msgs[0].ack()
    assert [m.id for m in msgs] == ids[:2]
    # The unacknowledged one is back at the head, in order, before the third.
    again = [m.id for m in q.receive(timeout=30.0, max_messages=2, auto_ack=True)]
    assert again == ids[1:]
    assert q.info().messages == 0


def test_ack_after_close_is_refused(client: Client, qname: str) -> None:
    q = client.queue(qname)
    q.send(b"x")
    r = q.receive(timeout=30.0)
    msg = next(r)
    r.close()
    with pytest.raises(mq_client.FailedPrecondition):
        msg.ack()
    assert q.info().messages == 1


@pytest.fixture(scope="module")
def short_ack_mqd() -> Iterator[Mqd]:
    """A broker of its own that ends a receive stream holding a message unacknowledged for 1 s
    (``mqd --ack-timeout``)."""
    broker = Mqd(["--ack-timeout", "1s"])
    try:
        yield broker
    finally:
        broker.stop()


def test_receive_stream_ended_by_the_ack_timeout_hands_out_and_acks_nothing(
    short_ack_mqd: Mqd,
) -> None:
    """The broker ends the stream (IDLE_TIMEOUT) with messages prefetched into the receiver and
    gives them all back: the next call fails with Timeout (README), the prefetched messages are
    not handed out, and acknowledging one delivered before the end raises instead of
    returning while the broker never applies it."""
    with Client(short_ack_mqd.url) as c:
        qname = ".\\private$\\py-" + uuid.uuid4().hex[:12]
        c.create_queue(qname)
        q = c.queue(qname)
        for i in range(3):
            q.send(f"a{i + 1}", recoverable=True)
        r = q.receive(timeout=30.0)
        first = next(r)
        assert first.text == "a1"
        # Held unacknowledged past the ack timeout: the broker ends the stream.
        wait_until(lambda: r._stream.call.done(), timeout=15, what="the broker ending the stream")
        with pytest.raises(mq_client.Timeout, match="ack timeout"):
            next(r)  # not a2, prefetched before the end
        with pytest.raises(mq_client.Timeout, match="not applied"):
            first.ack()
        with pytest.raises(mq_client.Timeout):
            next(r)  # and on every later call
        r.close()  # nothing was acknowledged: nothing to report
        info = q.info()
        assert (info.messages, info.in_flight, info.received) == (3, 0, 0)
        # All three are still there, in order.
        again = [m.text for m in q.receive(timeout=30.0, max_messages=3, auto_ack=True)]
        assert again == ["a1", "a2", "a3"]


def test_peek_leaves_messages(client: Client, qname: str) -> None:
    q = client.queue(qname)
    assert q.peek() is None
    ids = [q.send(f"p{i}") for i in range(5)]
    first = q.peek()
    assert first is not None and first.id == ids[0]
    assert [m.id for m in q.peek_many(10)] == ids
    assert [m.id for m in q.peek_many(2)] == ids[:2]
    assert q.info().messages == 5
    assert q.peek_by_id(ids[3]).body == b"p3"  # type: ignore[union-attr]


def test_receive_by_id_and_correlation_id(client: Client, qname: str) -> None:
    q = client.queue(qname)
    a = q.send(b"a", correlation_id="order-1")
    b = q.send(b"b", correlation_id="order-2")
    c = q.send(b"c")
    got = q.receive_by_id(c)
    assert got is not None and got.id == c and got.body == b"c"
    got = q.receive_by_correlation_id("order-2")
    assert got is not None and got.id == b
    assert q.peek_by_correlation_id("order-1").id == a  # type: ignore[union-attr]
    with pytest.raises(MessageNotFound):
        q.receive_by_id(c)  # gone
    with pytest.raises(MessageNotFound):
        q.receive_by_correlation_id("no-such")
    # With a timeout, "not found" is None once it passes.
    assert q.receive_by_id(uuid.uuid4(), timeout=0.1) is None
    assert [m.id for m in q.receive(timeout=30.0, max_messages=1, auto_ack=True)] == [a]
    assert q.peek() is None


def test_pipelined_sender_returns_ids_in_order(client: Client, qname: str) -> None:
    q = client.queue(qname)
    n = 3000
    with q.sender(window=500, max_batch=64) as s:
        for i in range(n):
            assert s.send(f"{i}".encode()) == i + 1
        ids = s.flush()
        # A second round on the same stream: flush returns only the new ones.
        s.send(b"tail")
        tail = s.flush()
    assert len(ids) == n and len(set(ids)) == n and len(tail) == 1
    bodies = []
    ids_seen = []
    for m in q.receive(timeout=30.0, prefetch=512, max_messages=n + 1, auto_ack=True):
        bodies.append(m.body)
        ids_seen.append(m.id)
    assert bodies == [f"{i}".encode() for i in range(n)] + [b"tail"]
    assert ids_seen == ids + tail


def test_large_messages_over_grpc_default_limit(client: Client, qname: str) -> None:
    """Bodies and responses above gRPC's default 4 MiB: a 5 MiB message, and a Peek (and a
    Receive batch) of two 3 MiB messages in one response."""
    q = client.queue(qname)
    big = bytes(range(256)) * (5 * 1024 * 1024 // 256)
    three = b"x" * (3 * 1024 * 1024)
    id_big = q.send(big, recoverable=True)
    q.send(three)
    q.send(three)
    peeked = q.peek_many(3)
    assert [len(m.body) for m in peeked] == [len(big), len(three), len(three)]
    assert peeked[0].id == id_big and peeked[0].body == big
    got = [m for m in q.receive(timeout=30.0, prefetch=8, max_messages=3, auto_ack=True)]
    assert [len(m.body) for m in got] == [len(big), len(three), len(three)]
    assert got[0].body == big


def test_sender_is_thread_safe(client: Client, qname: str) -> None:
    q = client.queue(qname)
    per_thread, threads = 500, 4
    with q.sender(window=64) as s:

        def work(t: int) -> None:
            for i in range(per_thread):
                s.send(f"{t}:{i}")

        pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        ids = s.flush()
    assert len(set(ids)) == per_thread * threads
    n = per_thread * threads
    bodies = [m.text for m in q.receive(timeout=30.0, max_messages=n, auto_ack=True)]
    assert q.peek() is None
    assert len(bodies) == per_thread * threads
    # Each thread's messages arrive in the order that thread sent them.
    for t in range(threads):
        mine = [int(b.split(":")[1]) for b in bodies if b.startswith(f"{t}:")]
        assert mine == list(range(per_thread))


def test_streams_leave_no_threads_behind(client: Client, qname: str) -> None:
    """Every stream's threads end with it: receivers closed by the client, by the broker
    (a deleted queue), senders and transactions."""
    q = client.queue(qname)
    q.send(b"x")
    before = threading.active_count()
    for _ in range(5):
        with q.receive(timeout=30.0, max_messages=1) as r:
            for _m in r:
                pass  # not acked: back to the queue
        with q.sender() as s:
            s.send(b"y")
        with pytest.raises(mq_client.QueueNotFound):
            list(client.queue(qname + "-gone").receive(timeout=30.0))
    from conftest import wait_until

    wait_until(lambda: threading.active_count() <= before, what="the streams' threads ending")


def test_cursor_walks_and_removes(client: Client, qname: str) -> None:
    q = client.queue(qname)
    ids = [q.send(f"c{i}") for i in range(3)]
    with q.cursor() as c:
        assert c.peek_current().id == ids[0]  # type: ignore[union-attr]
        assert c.peek_next().id == ids[1]  # type: ignore[union-attr]
        removed = c.receive_current()
        assert removed is not None and removed.id == ids[1]
        assert c.peek_current().id == ids[2]  # type: ignore[union-attr]
        assert c.peek_next() is None  # the end: the cursor stays
    assert [m.id for m in q.peek_many(10)] == [ids[0], ids[2]]
    with pytest.raises(mq_client.QueueNotFound):
        client.queue(qname + "-gone").cursor().peek_current()


def test_expired_message_is_dead_lettered_with_its_class(client: Client, qname: str) -> None:
    body = uuid.uuid4().bytes
    client.queue(qname).send(body, time_to_be_received=0.001, recoverable=True)
    dlq = client.queue("DIRECT=OS:.\\SYSTEM$;DEADLETTER")
    from conftest import wait_until

    m = wait_until(
        lambda: next((m for m in dlq.peek_many(1000) if m.body == body), None),
        what="the expired message in the dead-letter queue",
    )
    dl = m.dead_letter
    assert dl is not None and "time-to-be-received" in dl.reason
    assert dl.dead_letter_class == mq_client._wire.pb.DEAD_LETTER_CLASS_RECEIVE_TIMEOUT
    assert dl.destination.endswith(qname.lstrip("."))


def test_acknowledgements_show_their_class(client: Client, qname: str) -> None:
    aq = qname + "-admin"
    client.create_queue(aq)
    q = client.queue(qname)
    # 1 | 2: positive arrival and positive receive.
    sent = q.send(b"tracked", label="t", admin_queue=aq, acknowledge=3)
    admin = client.queue(aq)
    arrival = admin.receive_one(timeout=30.0)
    assert arrival is not None
    assert arrival.message_class == 0x0002  # MQMSG_CLASS_ACK_REACH_QUEUE
    assert arrival.correlation_id == str(sent) and arrival.label == "t"
    original = q.receive_one(timeout=30.0)
    assert original is not None and original.message_class == 0
    assert (original.admin_queue, original.acknowledge) == (aq, 3)
    received = admin.receive_one(timeout=30.0)
    assert received is not None
    assert received.message_class == 0x4000  # MQMSG_CLASS_ACK_RECEIVE
    assert received.correlation_id == str(sent)
    client.delete_queue(aq)


def test_one_at_a_time_sends_keep_one_stream_per_queue(client: Client, qname: str) -> None:
    """Queue.send keeps the send stream it opened for the queue: 50 sends open one stream,
    threads share it, a refused message leaves it usable, and every message arrives in order."""
    q = client.queue(qname)
    opened = client.one_shot_senders_opened
    ids = [q.send(f"m{i}", recoverable=i % 2 == 0) for i in range(50)]
    assert len(set(ids)) == 50
    assert client.one_shot_senders_opened == opened + 1

    def work(t: int) -> None:
        for i in range(25):
            q.send(f"t{t}:{i}")

    pool = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert client.one_shot_senders_opened == opened + 1
    with pytest.raises(mq_client.MqError):
        q.send("x", label="l" * 100_000)  # over the label limit: refused
    q.send("after")
    assert client.one_shot_senders_opened == opened + 1
    bodies = [m.text for m in q.receive(timeout=30.0, max_messages=151, auto_ack=True)]
    assert bodies[:50] == [f"m{i}" for i in range(50)]
    assert bodies[-1] == "after" and len(bodies) == 151
    for t in range(4):
        assert [b for b in bodies if b.startswith(f"t{t}:")] == [f"t{t}:{i}" for i in range(25)]
    # Another queue gets its own stream.
    other = client.queue(qname + "-b")
    client.create_queue(other.name)
    try:
        other.send("b")
        assert client.one_shot_senders_opened == opened + 2
        assert [m.text for m in other.receive(timeout=30.0, max_messages=1, auto_ack=True)] == [
            "b"
        ]
    finally:
        client.delete_queue(other.name)


def test_first_sends_from_many_threads_at_once_all_arrive(client: Client, qname: str) -> None:
    """Threads that send the first message to a queue at the same moment may each open a
    stream; one is kept, the others are ended, and every message is stored once."""
    q = client.queue(qname)
    opened = client.one_shot_senders_opened
    barrier = threading.Barrier(8)
    errors: list = []

    def work(t: int) -> None:
        barrier.wait()
        try:
            for i in range(10):
                q.send(f"t{t}:{i}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    assert 1 <= client.one_shot_senders_opened - opened <= 8
    bodies = [m.text for m in q.receive(timeout=30.0, max_messages=80, auto_ack=True)]
    assert sorted(bodies) == sorted(f"t{t}:{i}" for t in range(8) for i in range(10))
    # One stream is kept: the next send opens none.
    before = client.one_shot_senders_opened
    q.send("after")
    assert client.one_shot_senders_opened == before
