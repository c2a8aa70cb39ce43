"""The client against a broken or hostile broker: an in-process grpcio fake (127.0.0.1:0, one
per test) that implements only the RPCs a test needs and answers what the test scripts.

Nothing here needs mqd. Every wait is bounded (``call_timeout`` of a fraction of a second, a
watchdog on calls that used to wait for ever), and every fake is stopped in teardown: handlers
that hold a stream open wait on the fake's stop event, which teardown sets.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent import futures
from typing import Any, Callable, Dict, Iterator, List, Optional

import grpc
import pytest
from google.protobuf import empty_pb2

import mq_client
from mq_client import Client
from mq_client._pb.mq.v1 import mq_pb2 as pb
from mq_client._pb.mq.v1 import mq_pb2_grpc as rpc

Q = ".\\private$\\q"
CALL_TIMEOUT = 0.3


def wire_msg(body: bytes = b"x", id: Optional[bytes] = None) -> Any:
    return pb.Message(
        id=uuid.uuid4().bytes if id is None else id,
        body=body,
        destination="DIRECT=OS:.\\private$\\q",
    )


class Fake:
    """One fake broker: ``handlers`` maps an RPC name to ``fn(request_or_iterator, ctx)``."""

    def __init__(self) -> None:
        self.handlers: Dict[str, Callable[..., Any]] = {}
        self.stop = threading.Event()
        self.log: List[Any] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        rpc.add_MessageQueueServiceServicer_to_server(_MQ(self), self.server)
        rpc.add_AdminServiceServicer_to_server(_Admin(self), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.clients: List[Client] = []

    def record(self, item: Any) -> None:
        with self._lock:
            self.log.append(item)

    def logged(self) -> List[Any]:
        with self._lock:
            return list(self.log)

    def hold(self, seconds: float = 30.0) -> None:
        """Keeps a stream open until teardown (bounded)."""
        self.stop.wait(seconds)

    def client(self, call_timeout: float = CALL_TIMEOUT) -> Client:
        c = Client(
            f"http://127.0.0.1:{self.port}",
            call_timeout=call_timeout,
            connect_timeout=5,
            check_version=False,
        )
        self.clients.append(c)
        return c

    def drain(self, it: Iterator[Any]) -> None:
        """Reads a stream's requests in the background, recording them."""

        def run() -> None:
            try:
                for r in it:
                    self.record(r)
            except Exception:  # noqa: BLE001 - cancelled
                self.record("cancelled")
                return
            self.record("half-closed")

        threading.Thread(target=run, daemon=True).start()

    def until_half_closed(self, it: Iterator[Any]) -> None:
        """Reads a stream's requests until the client half-closes it (as mqd ends a Receive
        stream then), recording them."""
        try:
            for r in it:
                self.record(r)
        except Exception:  # noqa: BLE001 - cancelled
            self.record("cancelled")

    def close(self) -> None:
        for c in self.clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass
        self.stop.set()
        self.server.stop(0).wait(5)


def _dispatch(fake: Fake, name: str) -> Callable[..., Any]:
    def call(self: Any, request: Any, ctx: Any) -> Any:
        h = fake.handlers.get(name)
        if h is None:
            ctx.abort(grpc.StatusCode.UNIMPLEMENTED, f"{name} is not scripted")
        return h(request, ctx)

    return call


class _MQ(rpc.MessageQueueServiceServicer):
    def __init__(self, fake: Fake) -> None:
        self.fake = fake

    def Send(self, it: Any, ctx: Any) -> Any:  # noqa: N802
        return _dispatch(self.fake, "Send")(self, it, ctx)

    def Receive(self, it: Any, ctx: Any) -> Any:  # noqa: N802
        return _dispatch(self.fake, "Receive")(self, it, ctx)

    def Transact(self, it: Any, ctx: Any) -> Any:  # noqa: N802
        return _dispatch(self.fake, "Transact")(self, it, ctx)

    def Browse(self, it: Any, ctx: Any) -> Any:  # noqa: N802
        return _dispatch(self.fake, "Browse")(self, it, ctx)

    def ReceiveOne(self, req: Any, ctx: Any) -> Any:  # noqa: N802
        return _dispatch(self.fake, "ReceiveOne")(self, req, ctx)

    def Peek(self, req: Any, ctx: Any) -> Any:  # noqa: N802
        return _dispatch(self.fake, "Peek")(self, req, ctx)


class _Admin(rpc.AdminServiceServicer):
    def __init__(self, fake: Fake) -> None:
        self.fake = fake

    def ListQueues(self, req: Any, ctx: Any) -> Any:  # noqa: N802
        return _dispatch(self.fake, "ListQueues")(self, req, ctx)

    def ListOutgoing(self, req: Any, ctx: Any) -> Any:  # noqa: N802
        return _dispatch(self.fake, "ListOutgoing")(self, req, ctx)


@pytest.fixture
def fake() -> Iterator[Fake]:
    f = Fake()
    try:
        yield f
    finally:
        f.close()


def bounded(fn: Callable[[], Any], limit: float = 5.0) -> Any:
    """Runs ``fn`` in a thread; fails the test if it is still waiting after ``limit`` seconds
    (the call would wait for ever); re-raises what it raised."""
    out: Dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        pytest.fail(f"still waiting after {limit} s")
    if "error" in out:
        raise out["error"]
    return out.get("value")


# -- 1. send acknowledgements ----------------------------------------------------------------


def _send_answering(fake: Fake, answer: Callable[[Any], Any]) -> None:
    def send(it: Any, ctx: Any) -> Iterator[Any]:
        for r in it:
            fake.record(r)
            yield answer(r)
        fake.hold()

    fake.handlers["Send"] = send


def _good_id() -> bytes:
    return uuid.uuid4().bytes


def _failure(seq: int) -> Any:
    return pb.SendFailure(seq=seq, code=8, message="quota full", reason="QUOTA_EXCEEDED")


BAD_ACKS: Dict[str, Callable[[Any], Any]] = {
    "short-id": lambda r: pb.SendResponse(
        first_seq=r.first_seq, count=len(r.messages), ids=[b"abc"] * len(r.messages)
    ),
    "no-ids": lambda r: pb.SendResponse(first_seq=r.first_seq, count=len(r.messages)),
    "too-many-ids": lambda r: pb.SendResponse(
        first_seq=r.first_seq,
        count=len(r.messages),
        ids=[_good_id() for _ in range(len(r.messages) + 1)],
    ),
    "failure-outside-batch": lambda r: pb.SendResponse(
        first_seq=r.first_seq,
        count=len(r.messages),
        ids=[b""] * len(r.messages),
        failures=[_failure(r.first_seq + 1000 + i) for i in range(len(r.messages))],
    ),
    "failures-descending": lambda r: pb.SendResponse(
        first_seq=r.first_seq,
        count=len(r.messages),
        ids=[b""] * len(r.messages),
        # Descending whatever the batch's size (a batch of one is refused for the second seq).
        failures=[_failure(r.first_seq + 1), _failure(r.first_seq)],
    ),
    "failure-repeated": lambda r: pb.SendResponse(
        first_seq=r.first_seq,
        count=len(r.messages),
        ids=[b""] * len(r.messages),
        failures=[_failure(r.first_seq), _failure(r.first_seq)],
    ),
    "wrong-count": lambda r: pb.SendResponse(
        first_seq=r.first_seq,
        count=len(r.messages) + 1,
        ids=[_good_id() for _ in range(len(r.messages) + 1)],
    ),
}


@pytest.mark.parametrize("kind", sorted(BAD_ACKS))
def test_bad_send_ack_ends_stream_with_internal_error(fake: Fake, kind: str) -> None:
    _send_answering(fake, BAD_ACKS[kind])
    c = fake.client()
    s = c.queue(Q).sender(max_batch=2)

    def go() -> Any:
        s.send(b"a")
        s.send(b"b")
        return s.flush()

    with pytest.raises(mq_client.InternalError, match="may or may not be stored"):
        bounded(go)
    s.cancel()


def test_bad_send_ack_one_shot_is_internal_error_not_nil_id(fake: Fake) -> None:
    _send_answering(fake, BAD_ACKS["short-id"])
    q = fake.client().queue(Q)
    with pytest.raises(mq_client.InternalError):
        bounded(lambda: q.send(b"hello"))


def test_bad_send_ack_transactional_is_in_doubt(fake: Fake) -> None:
    _send_answering(fake, BAD_ACKS["short-id"])
    q = fake.client().queue(Q)
    with pytest.raises(mq_client.TransactionInDoubt) as e:
        bounded(lambda: q.send(b"hello", transactional=True))
    assert e.value.transaction_id.version == 8


def test_good_send_ack_with_a_failure_still_works(fake: Fake) -> None:
    ids: List[bytes] = []

    # The stream's first message fails, whatever batches the sender makes of the three.
    def answer(r: Any) -> Any:
        n = len(r.messages)
        batch = [_good_id() for _ in range(n)]
        failures = []
        if r.first_seq == 1:
            batch[0] = b""
            failures = [_failure(1)]
        ids.extend(batch)
        return pb.SendResponse(first_seq=r.first_seq, count=n, ids=batch, failures=failures)

    _send_answering(fake, answer)
    s = fake.client().queue(Q).sender(max_batch=8)

    def go() -> Any:
        for b in (b"a", b"b", b"c"):
            s.send(b)
        return s.flush()

    with pytest.raises(mq_client.SendFailed) as e:
        bounded(go)
    assert [i for i, _ in e.value.failures] == [0]
    assert isinstance(e.value.failures[0][1], mq_client.QuotaExceeded)
    assert e.value.ids[1:] == [uuid.UUID(bytes=b) for b in ids[1:3]]
    s.cancel()


def test_ack_thread_failure_wakes_waiters(fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    _send_answering(
        fake,
        lambda r: pb.SendResponse(
            first_seq=r.first_seq, count=len(r.messages), ids=[_good_id()] * len(r.messages)
        ),
    )

    def broken(*a: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(mq_client.Sender, "_check_ack", staticmethod(broken))
    s = fake.client(call_timeout=5.0).queue(Q).sender()

    def go() -> Any:
        s.send(b"a")
        return s.flush()

    with pytest.raises(mq_client.InternalError, match="boom"):
        bounded(go, limit=3.0)
    s.cancel()


# -- 2. send deadlines -----------------------------------------------------------------------


def _silent_send(fake: Fake) -> None:
    def send(it: Any, ctx: Any) -> Iterator[Any]:
        for r in it:
            fake.record(r)
        fake.hold()
        yield from ()

    fake.handlers["Send"] = send


def test_queue_send_times_out(fake: Fake) -> None:
    _silent_send(fake)
    c = fake.client()
    q = c.queue(Q)
    t0 = time.monotonic()
    with pytest.raises(mq_client.Timeout, match="may or may not be stored"):
        bounded(lambda: q.send(b"x"))
    assert time.monotonic() - t0 < 3
    # The silent stream is no longer kept: the next send opens another.
    opened = c.one_shot_senders_opened
    with pytest.raises(mq_client.Timeout):
        bounded(lambda: q.send(b"y"))
    assert c.one_shot_senders_opened == opened + 1


def test_queue_send_transactional_times_out_in_doubt(fake: Fake) -> None:
    _silent_send(fake)
    q = fake.client().queue(Q)
    with pytest.raises(mq_client.TransactionInDoubt, match="may or may not have committed"):
        bounded(lambda: q.send(b"x", transactional=True))


def test_sender_send_window_full_times_out(fake: Fake) -> None:
    _silent_send(fake)
    s = fake.client().queue(Q).sender(window=1)
    s.send(b"a")
    with pytest.raises(mq_client.Timeout, match="not sent"):
        bounded(lambda: s.send(b"b"))
    s.cancel()


def test_sender_close_times_out(fake: Fake) -> None:
    _silent_send(fake)
    s = fake.client().queue(Q).sender()
    s.send(b"a")
    with pytest.raises(mq_client.Timeout, match="may or may not be stored"):
        bounded(s.close)


def test_sender_exit_times_out(fake: Fake) -> None:
    _silent_send(fake)
    q = fake.client().queue(Q)

    def go() -> None:
        with q.sender() as s:
            s.send(b"a")

    with pytest.raises(mq_client.Timeout):
        bounded(go)


def test_transactional_sender_close_times_out_in_doubt(fake: Fake) -> None:
    _silent_send(fake)
    s = fake.client().queue(Q).sender(transactional=True)
    s.send(b"a")
    with pytest.raises(mq_client.TransactionInDoubt):
        bounded(s.close)


# -- 3-5. streaming receive: credit, tags, empty deliveries ----------------------------------


def _receive_script(fake: Fake, responses: List[List[int]], *, after: float = 0.0) -> None:
    """Answers a Receive stream with one response per list of tags (then holds it open)."""

    def receive(it: Any, ctx: Any) -> Iterator[Any]:
        fake.record(next(it))
        for tags in responses:
            yield pb.ReceiveResponse(
                messages=[pb.Delivered(tag=t, message=wire_msg(b"tag%d" % t)) for t in tags]
            )
            if after:
                fake.stop.wait(after)
        fake.until_half_closed(it)

    fake.handlers["Receive"] = receive


def test_receive_beyond_credit_is_internal_error(fake: Fake) -> None:
    def flood(it: Any, ctx: Any) -> Iterator[Any]:
        next(it)
        fake.drain(it)
        tag = 0
        while not fake.stop.is_set() and ctx.is_active():
            ms = []
            for _ in range(256):
                tag += 1
                ms.append(pb.Delivered(tag=tag, message=wire_msg(b"z" * 1024)))
            yield pb.ReceiveResponse(messages=ms)

    fake.handlers["Receive"] = flood
    q = fake.client().queue(Q)
    with q.receive(timeout=2.0, prefetch=1) as r:
        with pytest.raises(mq_client.InternalError, match="credit"):
            bounded(lambda: next(r))


def test_response_buffer_is_bounded(fake: Fake) -> None:
    """A broker pushing answers nobody asked for fills at most MAX_BUFFERED responses; then the
    client stops reading and gRPC's flow control holds the broker back."""
    from mq_client import _stream

    sent = [0]

    def browse(it: Any, ctx: Any) -> Iterator[Any]:
        fake.drain(it)
        while not fake.stop.is_set() and ctx.is_active():
            sent[0] += 1
            yield pb.BrowseResponse(status=pb.CURSOR_STATUS_OK, message=wire_msg(b"z" * 4096))

    fake.handlers["Browse"] = browse
    cur = fake.client().queue(Q).cursor()
    deadline = time.monotonic() + 5
    # Wait until the broker is held back: what it sent stops growing.
    last = -1
    while time.monotonic() < deadline:
        time.sleep(0.2)
        if sent[0] == last and sent[0] > 0:
            break
        last = sent[0]
    assert cur._stream._responses.qsize() <= _stream.MAX_BUFFERED
    assert sent[0] == last, "the broker was never held back"
    cur._stream.cancel()


@pytest.mark.parametrize(
    "script,prefetch",
    [
        ([[1], [1]], 4),  # a repeated tag
        ([[0]], 4),  # tag 0
        ([[2], [1]], 4),  # a tag going back
        ([[1, 2, 3]], 2),  # beyond the credit granted
    ],
    ids=["repeated", "zero", "backwards", "beyond-credit"],
)
def test_bad_tags_are_internal_error(fake: Fake, script: List[List[int]], prefetch: int) -> None:
    _receive_script(fake, script)
    q = fake.client().queue(Q)
    got = []
    with pytest.raises(mq_client.InternalError, match="tag"):
        with q.receive(timeout=2.0, prefetch=prefetch) as r:
            for m in r:
                got.append(m.body)
                m.ack()
    # Only well-formed deliveries before the bad one were handed out.
    assert len(got) < sum(len(s) for s in script)


def test_good_tags_are_accepted(fake: Fake) -> None:
    _receive_script(fake, [[1, 2], [3]])
    q = fake.client().queue(Q)
    with q.receive(timeout=0.5, prefetch=4, max_messages=3) as r:
        got = [m.body for m in r]
    assert got == [b"tag1", b"tag2", b"tag3"]


def test_empty_delivery_is_waited_past(fake: Fake) -> None:
    def receive(it: Any, ctx: Any) -> Iterator[Any]:
        next(it)
        yield pb.ReceiveResponse()
        yield pb.ReceiveResponse(messages=[pb.Delivered(tag=1, message=wire_msg(b"one"))])
        yield pb.ReceiveResponse()
        fake.until_half_closed(it)

    fake.handlers["Receive"] = receive
    q = fake.client().queue(Q)
    t0 = time.monotonic()
    with q.receive(timeout=0.5, prefetch=4) as r:
        got = [m.body for m in r]
    assert got == [b"one"]
    # The trailing empty response did not restart the 0.5 s wait for ever.
    assert time.monotonic() - t0 < 3


def test_receive_bad_message_id_is_internal_error(fake: Fake) -> None:
    def receive(it: Any, ctx: Any) -> Iterator[Any]:
        next(it)
        yield pb.ReceiveResponse(
            messages=[pb.Delivered(tag=1, message=wire_msg(b"bad", id=b"short"))]
        )
        fake.until_half_closed(it)

    fake.handlers["Receive"] = receive
    q = fake.client().queue(Q)
    with pytest.raises(mq_client.InternalError, match="16"):
        with q.receive(timeout=2.0) as r:
            next(r)


def _receive_then_end(fake: Fake, responses: List[List[int]], end: threading.Event) -> None:
    """Answers a Receive stream with one response per list of tags, then, once ``end`` is set,
    ends it as mqd does past its ack timeout (DEADLINE_EXCEEDED: the messages went back)."""

    def receive(it: Any, ctx: Any) -> Iterator[Any]:
        fake.record(next(it))
        fake.drain(it)
        for tags in responses:
            yield pb.ReceiveResponse(
                messages=[pb.Delivered(tag=t, message=wire_msg(b"tag%d" % t)) for t in tags]
            )
        end.wait(30)
        ctx.abort(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            "no acknowledgement within the broker's ack timeout: the receive stream was ended "
            "and its unacknowledged messages went back to the queue",
        )

    fake.handlers["Receive"] = receive


def _acked_through(fake: Fake) -> int:
    return max((r.ack_through for r in fake.logged() if not isinstance(r, str)), default=0)


def _wait(cond: Callable[[], Any], what: str) -> None:
    deadline = time.monotonic() + 5
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"{what} did not happen within 5 s")
        time.sleep(0.01)


@pytest.mark.parametrize("auto_ack", [False, True], ids=["ack", "auto-ack"])
def test_receive_ended_by_the_broker_hands_out_no_prefetched_message(
    fake: Fake, auto_ack: bool
) -> None:
    """Messages prefetched before the broker ended the stream went back with it: the next call
    raises the end's error (Timeout) instead of handing them out, and acknowledging the message
    handed out before the end raises too (the broker never gets that acknowledgement)."""
    end = threading.Event()
    _receive_then_end(fake, [[1, 2, 3]], end)
    q = fake.client().queue(Q)
    r = q.receive(timeout=2.0, prefetch=4, auto_ack=auto_ack)
    first = bounded(lambda: next(r))
    assert first.body == b"tag1"
    end.set()
    _wait(lambda: r._stream.call.done(), "the end of the stream")
    with pytest.raises(mq_client.Timeout, match="ack timeout"):
        bounded(lambda: next(r))  # not tag2 (with auto_ack: tag1's acknowledgement)
    with pytest.raises(mq_client.Timeout, match="not applied"):
        first.ack()
    with pytest.raises(mq_client.Timeout):
        bounded(lambda: next(r))  # and on every later call
    r.close()  # nothing was acknowledged: nothing to report
    assert _acked_through(fake) == 0


def test_acks_told_before_the_broker_ended_the_stream_stay_and_untold_ones_raise(
    fake: Fake,
) -> None:
    """An acknowledgement told to the broker before the end stays fine (ack() again returns);
    one made but not yet told when the stream ended raises on ack() and on close()."""
    end = threading.Event()
    _receive_then_end(fake, [[1, 2, 3]], end)
    q = fake.client().queue(Q)
    r = q.receive(timeout=2.0, prefetch=4)
    m1 = bounded(lambda: next(r))
    m1.ack()
    # The stream's thread has read all that came (so an end would have been seen) ...
    _wait(lambda: r._stream.caught_up(), "the stream's thread catching up")
    m2 = bounded(lambda: next(r))  # ... when this tells the broker ack_through=1
    _wait(lambda: _acked_through(fake) == 1, "the acknowledgement of tag 1")
    m2.ack()  # not told yet (batched)
    end.set()
    _wait(lambda: r._stream.call.done(), "the end of the stream")
    m1.ack()  # told before the end: fine
    with pytest.raises(mq_client.Timeout, match="not applied"):
        m2.ack()
    with pytest.raises(mq_client.Timeout, match="ack timeout"):
        bounded(lambda: next(r))  # not tag3
    with pytest.raises(mq_client.Timeout, match="not have been applied"):
        r.close()
    assert _acked_through(fake) == 1


def test_acks_told_while_responses_waited_unread_may_not_be_applied(
    fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An acknowledgement told while the stream's thread had not read all that came (its buffer
    full: an end may wait unseen behind the responses) may have gone to a stream already ended:
    once the end is seen, ack() of its message and close() raise instead of returning as if it
    was applied."""
    end = threading.Event()
    _receive_then_end(fake, [[1, 2, 3]], end)
    q = fake.client().queue(Q)
    r = q.receive(timeout=2.0, prefetch=4)
    monkeypatch.setattr(r._stream, "caught_up", lambda: False)  # as if held back
    m1 = bounded(lambda: next(r))
    m1.ack()
    bounded(lambda: next(r))  # tells the broker ack_through=1
    _wait(lambda: _acked_through(fake) == 1, "the acknowledgement of tag 1")
    end.set()
    _wait(lambda: r._stream.call.done(), "the end of the stream")
    with pytest.raises(mq_client.Timeout, match="may not have been applied"):
        m1.ack()
    with pytest.raises(mq_client.Timeout, match="ack timeout"):
        bounded(lambda: next(r))
    with pytest.raises(mq_client.Timeout, match="not have been applied"):
        r.close()


def test_stream_is_caught_up_only_while_it_has_read_all_that_came(fake: Fake) -> None:
    """The stream's thread is caught up while it waits for the broker, not while responses wait
    for room in its full buffer (then an end behind them would not be seen)."""
    from mq_client import _stream

    n = _stream.MAX_BUFFERED + 4
    end = threading.Event()
    _receive_then_end(fake, [[t] for t in range(1, n + 1)], end)
    q = fake.client().queue(Q)
    r = q.receive(timeout=2.0, prefetch=n)
    _wait(
        lambda: r._stream._responses.qsize() >= _stream.MAX_BUFFERED
        and not r._stream.caught_up(),
        "the stream's buffer filling",
    )
    time.sleep(0.1)
    assert not r._stream.caught_up()  # held back for as long as nothing is read
    got = [bounded(lambda: next(r)).body for _ in range(n)]
    assert got == [b"tag%d" % t for t in range(1, n + 1)]
    _wait(lambda: r._stream.caught_up(), "the stream's thread catching up")
    end.set()
    with pytest.raises(mq_client.Timeout, match="ack timeout"):
        bounded(lambda: next(r))


# -- 6. receives that remove before answering ------------------------------------------------


def test_receive_one_timeout_says_message_may_be_removed(fake: Fake) -> None:
    def slow(req: Any, ctx: Any) -> Any:
        fake.stop.wait(2.0)
        return pb.ReceiveOneResponse(message=wire_msg())

    fake.handlers["ReceiveOne"] = slow
    q = fake.client().queue(Q)
    with pytest.raises(mq_client.Timeout, match="may have removed"):
        bounded(lambda: q.receive_one())
    with pytest.raises(mq_client.Timeout, match="may have removed"):
        bounded(lambda: q.receive_by_id(uuid.uuid4()))
    with pytest.raises(mq_client.Timeout, match="may have removed"):
        bounded(lambda: q.receive_by_correlation_id("c"))
    with pytest.raises(mq_client.Timeout) as e:
        bounded(lambda: q.peek())
    assert "removed" not in str(e.value)


def test_removing_receives_document_the_loss_window() -> None:
    for f in (
        mq_client.Queue.receive_one,
        mq_client.Queue.receive_by_id,
        mq_client.Queue.receive_by_correlation_id,
        mq_client.Cursor.receive_current,
    ):
        assert f.__doc__ is not None and "at most once" in f.__doc__.lower(), f.__name__


# -- 7, 9, 10. transactions ------------------------------------------------------------------


def _transact(fake: Fake, on: Callable[[str, Any, Dict[str, int]], Any]) -> None:
    """Answers each Transact request with ``on(op, request, counts)`` (``None``: no answer;
    the string "end": end the stream)."""

    def transact(it: Any, ctx: Any) -> Iterator[Any]:
        ctx.add_callback(lambda: fake.record("rpc-ended"))
        counts: Dict[str, int] = {"send": 0, "receive": 0}
        try:
            for r in it:
                op = r.WhichOneof("op")
                fake.record(op)
                if op == "send":
                    counts["send"] += len(r.send.messages)
                if op == "receive":
                    counts["receive"] += 1
                a = on(op, r, counts)
                if a == "end":
                    return
                if a is not None:
                    yield a
        except Exception:  # noqa: BLE001
            fake.record("cancelled")
            return
        fake.record("half-closed")

    fake.handlers["Transact"] = transact


def test_transaction_is_broken_after_a_receive_timeout(fake: Fake) -> None:
    def on(op: str, r: Any, counts: Dict[str, int]) -> Any:
        if op == "receive":
            if counts["receive"] == 1:
                fake.stop.wait(1.0)  # answers the first receive too late
            return pb.TransactResponse(received=wire_msg(b"r%d" % counts["receive"]))
        if op == "commit":
            return pb.TransactResponse(committed=pb.TxCommitted(received=2))
        return None

    _transact(fake, on)
    tx = fake.client().transaction()
    with pytest.raises(mq_client.Timeout, match="aborts it"):
        tx.receive(Q)
    with pytest.raises(mq_client.TransactionAborted, match="given up"):
        tx.receive(Q)
    with pytest.raises(mq_client.TransactionAborted):
        tx.commit()
    with pytest.raises(mq_client.TransactionAborted):
        tx.send(Q, b"x")
    # The stream was cancelled: the broker never saw a second receive or a commit.
    wait_for(lambda: "rpc-ended" in fake.logged())
    assert "commit" not in fake.logged()
    assert fake.logged().count("receive") == 1


def wait_for(cond: Callable[[], Any], limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail("condition not met")
        time.sleep(0.02)


def test_transaction_with_block_after_timeout_does_not_commit(fake: Fake) -> None:
    def on(op: str, r: Any, counts: Dict[str, int]) -> Any:
        if op == "receive":
            fake.stop.wait(1.0)
            return pb.TransactResponse(received=wire_msg())
        if op == "commit":
            return pb.TransactResponse(committed=pb.TxCommitted())
        return None

    _transact(fake, on)
    c = fake.client()
    with pytest.raises(mq_client.TransactionAborted):
        with c.transaction() as tx:
            try:
                tx.receive(Q)
            except mq_client.Timeout:
                pass
    assert "commit" not in fake.logged()


def _committing(committed: Callable[[Dict[str, int]], Any]) -> Callable[..., Any]:
    def on(op: str, r: Any, counts: Dict[str, int]) -> Any:
        if op == "commit":
            return committed(counts)
        return None

    return on


@pytest.mark.parametrize(
    "answer",
    [
        lambda tx, n: pb.TxCommitted(ids=[]),
        lambda tx, n: pb.TxCommitted(ids=[b"x"] * n),
        lambda tx, n: pb.TxCommitted(ids=[uuid.uuid4().bytes] * (n + 1)),
        lambda tx, n: pb.TxCommitted(ids=[uuid.uuid4().bytes] * n, id=uuid.uuid4().bytes),
        lambda tx, n: pb.TxCommitted(ids=[uuid.uuid4().bytes] * n, id=b"short"),
    ],
    ids=["no-ids", "short-ids", "too-many-ids", "other-tx-id", "bad-tx-id"],
)
def test_commit_answer_not_naming_the_sends_is_in_doubt(
    fake: Fake, answer: Callable[[uuid.UUID, int], Any]
) -> None:
    c = fake.client()
    box: Dict[str, Any] = {}
    _transact(
        fake,
        _committing(
            lambda counts: pb.TransactResponse(committed=answer(box["tx"].id, counts["send"]))
        ),
    )
    tx = box["tx"] = c.transaction()
    tx.send(Q, b"a")
    tx.send(Q, b"b")
    with pytest.raises(mq_client.TransactionInDoubt) as e:
        tx.commit()
    assert e.value.transaction_id == tx.id


def test_commit_answer_naming_the_sends_is_trusted(fake: Fake) -> None:
    c = fake.client()
    box: Dict[str, Any] = {}
    ids = [uuid.uuid4() for _ in range(2)]
    _transact(
        fake,
        _committing(
            lambda counts: pb.TransactResponse(
                committed=pb.TxCommitted(ids=[i.bytes for i in ids], id=box["tx"].id.bytes)
            )
        ),
    )
    tx = box["tx"] = c.transaction()
    tx.send(Q, b"a")
    tx.send(Q, b"b")
    assert tx.commit() == ids
    # Without the transaction's id (an older broker) the ids alone are enough.
    _transact(fake, _committing(lambda counts: pb.TransactResponse(committed=pb.TxCommitted())))
    assert c.transaction().commit() == []


def test_commit_answered_aborted_or_other(fake: Fake) -> None:
    c = fake.client()
    _transact(
        fake,
        _committing(lambda counts: pb.TransactResponse(aborted=empty_pb2.Empty())),
    )
    with pytest.raises(mq_client.TransactionAborted):
        c.transaction().commit()
    _transact(fake, _committing(lambda counts: pb.TransactResponse(received=wire_msg())))
    with pytest.raises(mq_client.TransactionInDoubt):
        c.transaction().commit()
    _transact(fake, _committing(lambda counts: pb.TransactResponse()))
    with pytest.raises(mq_client.TransactionInDoubt):
        c.transaction().commit()


def test_receive_and_commit_committed_without_message(fake: Fake) -> None:
    def on(op: str, r: Any, counts: Dict[str, int]) -> Any:
        if op == "receive" and r.receive.commit:
            return pb.TransactResponse(committed=pb.TxCommitted())
        return None

    _transact(fake, on)
    tx = fake.client().transaction()
    with pytest.raises(mq_client.InternalError, match="committed"):
        tx.receive_and_commit(Q, timeout=0.1)


def test_receive_and_commit_ids_checked(fake: Fake) -> None:
    def on(op: str, r: Any, counts: Dict[str, int]) -> Any:
        if op == "receive" and r.receive.commit:
            return pb.TransactResponse(committed=pb.TxCommitted(message=wire_msg()))
        return None

    _transact(fake, on)
    tx = fake.client().transaction()
    tx.send(Q, b"a")
    with pytest.raises(mq_client.TransactionInDoubt):
        tx.receive_and_commit(Q)


# -- 8. cursors ------------------------------------------------------------------------------


def _browse(fake: Fake, answer: Callable[[int, Any], Any]) -> None:
    def browse(it: Any, ctx: Any) -> Iterator[Any]:
        n = 0
        try:
            for r in it:
                n += 1
                fake.record(r.action)
                yield answer(n, r)
        except Exception:  # noqa: BLE001
            fake.record("cancelled")

    fake.handlers["Browse"] = browse


def test_cursor_is_broken_after_a_timeout(fake: Fake) -> None:
    def answer(n: int, r: Any) -> Any:
        if n == 1:
            fake.stop.wait(1.0)
        return pb.BrowseResponse(status=pb.CURSOR_STATUS_OK, message=wire_msg(b"a%d" % n))

    _browse(fake, answer)
    cur = fake.client().queue(Q).cursor()
    with pytest.raises(mq_client.Timeout, match="removed"):
        cur.receive_current()
    with pytest.raises(mq_client.FailedPrecondition, match="broken"):
        cur.peek_current()
    assert fake.logged().count(pb.CURSOR_ACTION_PEEK_CURRENT) == 0


def test_cursor_ok_without_message_is_internal_error(fake: Fake) -> None:
    _browse(fake, lambda n, r: pb.BrowseResponse(status=pb.CURSOR_STATUS_OK))
    cur = fake.client().queue(Q).cursor()
    with pytest.raises(mq_client.InternalError, match="without a message"):
        cur.peek_current()


# -- 11 and the rest -------------------------------------------------------------------------


def test_unknown_outgoing_state(fake: Fake) -> None:
    fake.handlers["ListOutgoing"] = lambda req, ctx: pb.ListOutgoingResponse(
        queues=[pb.OutgoingQueueInfo(destination="h:1", state=99)]
    )
    (o,) = fake.client().outgoing()
    assert o.state == "unknown_99"


def test_peek_many_more_than_asked_is_internal_error(fake: Fake) -> None:
    fake.handlers["Peek"] = lambda req, ctx: pb.PeekResponse(
        messages=[wire_msg(b"p%d" % i) for i in range(50)]
    )
    with pytest.raises(mq_client.InternalError, match="at most 1"):
        fake.client().queue(Q).peek_many(1)


def test_bad_message_ids_are_internal_error(fake: Fake) -> None:
    fake.handlers["ReceiveOne"] = lambda req, ctx: pb.ReceiveOneResponse(
        message=wire_msg(id=b"\x01\x02")
    )
    fake.handlers["Peek"] = lambda req, ctx: pb.PeekResponse(messages=[wire_msg(id=b"")])
    q = fake.client().queue(Q)
    with pytest.raises(mq_client.InternalError):
        q.receive_one()
    with pytest.raises(mq_client.InternalError):
        q.peek_many(5)


def test_negative_timeouts_are_invalid_argument(fake: Fake) -> None:
    c = fake.client()
    q = c.queue(Q)
    for call in (
        lambda: q.receive_one(timeout=-1),
        lambda: q.peek(timeout=-0.5),
        lambda: q.peek_many(3, timeout=-1),
        lambda: q.receive_by_id(uuid.uuid4(), timeout=-1),
        lambda: c.transaction().receive(Q, timeout=-1),
        lambda: q.cursor().peek_current(timeout=-1),
    ):
        with pytest.raises(mq_client.InvalidArgument, match="negative"):
            call()


def _pages(fake: Fake, page: Callable[[Any], Any]) -> None:
    def list_queues(req: Any, ctx: Any) -> Any:
        fake.record((req.page_size, req.page_token))
        return page(req)

    fake.handlers["ListQueues"] = list_queues


def test_list_queues_follows_page_tokens(fake: Fake) -> None:
    def page(req: Any) -> Any:
        n = int(req.page_token[1:] or 0) if req.page_token else 0
        qs = [pb.QueueInfo(name=".\\private$\\q%d_%d" % (n, i)) for i in range(3)]
        return pb.ListQueuesResponse(queues=qs, next_page_token="A%d" % (n + 1) if n < 2 else "")

    _pages(fake, page)
    got = fake.client().list_queues()
    assert len(got) == 9
    assert [t for _, t in fake.logged()] == ["", "A1", "A2"]
    assert all(size == 5000 for size, _ in fake.logged())


@pytest.mark.parametrize("kind", ["same-token", "token-going-back", "page-too-big"])
def test_list_queues_that_does_not_end_is_internal_error(fake: Fake, kind: str) -> None:
    def page(req: Any) -> Any:
        if kind == "page-too-big":
            return pb.ListQueuesResponse(
                queues=[pb.QueueInfo(name="q%d" % i) for i in range(5001)],
                next_page_token="",
            )
        tok = "again" if kind == "same-token" else ("B" if req.page_token != "B" else "A")
        return pb.ListQueuesResponse(queues=[pb.QueueInfo(name="q")], next_page_token=tok)

    _pages(fake, page)
    with pytest.raises(mq_client.InternalError, match="does not end"):
        bounded(lambda: fake.client().list_queues(), limit=10)
    assert len(fake.logged()) <= 3
