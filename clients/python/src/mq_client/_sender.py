"""``Sender``: pipelined, batched sends on one Send stream.

:meth:`Sender.send` queues a message and returns at once (it waits only while ``window``
messages are unanswered); a thread of grpcio's gathers what is queued into batches while earlier
batches are in flight, and a thread of ours applies the broker's acknowledgements.
:meth:`Sender.flush` waits for every answer and returns the ids.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any, Deque, Dict, Iterator, List, Optional, Tuple, Union

import grpc

from . import _wire
from ._errors import (
    InternalError,
    MqError,
    SendFailed,
    Timeout,
    TransactionInDoubt,
    Unavailable,
    from_rpc_error,
)
from ._message import BODY_TYPE_RAW, Body, out_message, to_uuid

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client

_SEQ_BITS = 40
_MAX_SEQ = (1 << _SEQ_BITS) - 1


def _new_tx_stream() -> int:
    """A transactional send stream's id (mq_proto::txid): UUID version 8, Unix ms in the top
    48 bits, 34 random bits, the low 40 bits left for the message's seq."""
    ms = int(time.time() * 1000) & 0xFFFF_FFFF_FFFF
    r = int.from_bytes(os.urandom(8), "big")
    return (
        (ms << 80)
        | (0x8 << 76)
        | ((r & 0xFFF) << 64)
        | (0b10 << 62)
        | (((r >> 12) & 0x3F_FFFF) << _SEQ_BITS)
    )


class NotSent(Exception):
    """The stream had already ended when a message was offered to it: nothing was sent (the
    caller may send it on another stream). Internal to :meth:`Queue.send`."""


class Sender:
    """A pipelining sender, from :meth:`Client.sender` or :meth:`Queue.sender`.

    >>> with client.queue(r".\\private$\\orders").sender() as s:   # doctest: +SKIP
    ...     for i in range(10_000):
    ...         s.send(f"order {i}", recoverable=True)
    ...     ids = s.flush()          # waits for every acknowledgement

    ``window``: most unanswered messages (``send`` waits beyond it); ``max_batch`` /
    ``max_batch_bytes``: a batch is cut at this many messages / body bytes. With
    ``transactional`` every message is its own single-message transaction (required by
    transactional queues), acknowledged once committed.

    Thread-safe: several threads may send on one sender.
    """

    def __init__(
        self,
        client: "Client",
        destination: str,
        *,
        transactional: bool = False,
        window: int = 8192,
        max_batch: int = 512,
        max_batch_bytes: int = 1024 * 1024,
    ) -> None:
        self.destination = destination
        self._transactional = transactional
        self._window = max(1, window)
        self._max_batch = max(1, max_batch)
        self._max_batch_bytes = max(1, max_batch_bytes)
        self._tx_stream = _new_tx_stream() if transactional else 0
        self._cond = threading.Condition(threading.Lock())
        self._batcher_waiting = False
        self._pending: Deque[Any] = deque()
        self._in_flight: Deque[Tuple[int, int]] = deque()
        self._next_seq = 1  # the seq of the next batched message
        self._submitted = 0  # messages handed to send (the last one's seq)
        self._answered = 0  # every seq <= this is answered
        self._results: Dict[int, Union[uuid.UUID, MqError]] = {}
        self._flushed = 0  # seqs <= this were returned by flush
        self._closing = False
        self._dead: Optional[MqError] = None
        self._call = client._stubs.queue.Send(self._batches(), metadata=client._metadata)
        self._acker = threading.Thread(target=self._ack_loop, name="mq-sender-acks", daemon=True)
        self._acker.start()

    # -- the two threads ----------------------------------------------------------------------

    def _batches(self) -> Iterator[Any]:
        stream_bytes = self._tx_stream.to_bytes(16, "big") if self._transactional else b""
        while True:
            with self._cond:
                while not self._pending and not self._closing and self._dead is None:
                    self._batcher_waiting = True
                    self._cond.wait()
                    self._batcher_waiting = False
                if self._dead is not None or (not self._pending and self._closing):
                    return
                batch: List[Any] = []
                size = 0
                while self._pending and len(batch) < self._max_batch:
                    m = self._pending.popleft()
                    batch.append(m)
                    size += len(m.body)
                    if size >= self._max_batch_bytes:
                        break
                first = self._next_seq
                self._next_seq += len(batch)
                self._in_flight.append((first, len(batch)))
            yield _wire.SendRequest(
                first_seq=first,
                destination=self.destination,
                messages=batch,
                transactional=self._transactional,
                tx_stream=stream_bytes,
            )

    def _ack_loop(self) -> None:
        end: MqError
        try:
            for ack in self._call:
                self._apply(ack)
            end = Unavailable("the broker ended the send stream")
        except grpc.RpcError as e:
            end = from_rpc_error(e, what="to a send")
        except MqError as e:
            end = e
            self._call.cancel()
        with self._cond:
            if self._dead is None:
                self._dead = end
            self._cond.notify_all()

    def _apply(self, ack: Any) -> None:
        with self._cond:
            if not self._in_flight:
                raise InternalError(
                    f"the broker acknowledged batch {ack.first_seq} that was not sent"
                )
            first, count = self._in_flight.popleft()
            if ack.first_seq != first or ack.count != count:
                raise InternalError(
                    f"the broker acknowledged batch {ack.first_seq} ({ack.count} messages), "
                    f"expected {first} ({count})"
                )
            ids = _wire.ack_ids(ack)
            failed = {f.seq: _wire.send_failure_error(f) for f in ack.failures}
            for i in range(count):
                seq = first + i
                err = failed.get(seq)
                self._results[seq] = (
                    err if err is not None else to_uuid(ids[i] if i < len(ids) else b"")
                )
            self._answered = first + count - 1
            self._cond.notify_all()

    # -- the API ------------------------------------------------------------------------------

    def send(
        self,
        body: Body,
        *,
        label: str = "",
        priority: Optional[int] = None,
        recoverable: bool = False,
        correlation_id: str = "",
        app_specific: int = 0,
        body_type: int = BODY_TYPE_RAW,
        response_queue: str = "",
        time_to_reach_queue: Optional[float] = None,
        time_to_be_received: Optional[float] = None,
        admin_queue: str = "",
        acknowledge: int = 0,
    ) -> int:
        """Queues one message (arguments as :meth:`Queue.send`) and returns its number on this
        sender (1, 2, 3, ...; its index in what :meth:`flush` returns, counted from the last
        flush). Waits only while ``window`` messages are unanswered. Raises the error that ended
        the stream, if it has ended."""
        m = out_message(
            body,
            label=label,
            priority=priority,
            recoverable=recoverable,
            correlation_id=correlation_id,
            app_specific=app_specific,
            body_type=body_type,
            response_queue=response_queue,
            time_to_reach_queue=time_to_reach_queue,
            time_to_be_received=time_to_be_received,
            admin_queue=admin_queue,
            acknowledge=acknowledge,
        )
        with self._cond:
            while self._dead is None and self._submitted - self._answered >= self._window:
                self._cond.wait()
            if self._dead is not None:
                raise self._dead
            if self._closing:
                raise InternalError("the sender is closed")
            if self._transactional and self._submitted >= _MAX_SEQ:
                raise InternalError("this transactional sender has used every seq; open another")
            self._pending.append(m)
            self._submitted += 1
            if self._batcher_waiting:
                self._cond.notify_all()
            return self._submitted

    def _send_one(self, m: Any) -> uuid.UUID:
        """Sends the wire message ``m`` and waits for its own answer (what :meth:`Queue.send`
        does on a kept sender; several threads may wait at once, each for its message). Raises
        :class:`NotSent` if the stream had ended before ``m`` was queued; the refusal of ``m``
        or, if the stream ends before ``m`` is answered, the error that ended it."""
        with self._cond:
            while self._dead is None and self._submitted - self._answered >= self._window:
                self._cond.wait()
            if self._dead is not None or self._closing:
                raise NotSent(self._dead)
            self._pending.append(m)
            self._submitted += 1
            seq = self._submitted
            if self._batcher_waiting:
                self._cond.notify_all()
            while self._answered < seq and self._dead is None:
                self._cond.wait()
            r = self._results.pop(seq, None)
            if r is None:
                # Unanswered, the stream ended. A transactional message it had taken is in
                # doubt (with its transaction's id); otherwise what ended the stream says it
                # best (a refusal of the whole stream, a lost connection).
                if self._dead is None or (self._transactional and seq < self._next_seq):
                    raise self._unanswered(seq)
                raise self._dead
        if isinstance(r, MqError):
            raise r
        return r

    def _retire(self) -> None:
        """Ends the stream once what was queued is sent (a kept sender no longer kept); threads
        waiting for their answers still get them."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()

    @property
    def _ended(self) -> bool:
        with self._cond:
            return self._dead is not None or self._closing

    def flush(self, timeout: Optional[float] = None) -> List[uuid.UUID]:
        """Waits until the broker has answered every message sent so far and returns their ids,
        in send order, since the last flush. If any was refused raises :class:`SendFailed`
        (with every failure and the ids of the others); if the stream ended first, the error
        that ended it (messages without an answer may or may not be stored; for a
        transactional sender they are :class:`TransactionInDoubt` in ``SendFailed.failures``).
        Raises :class:`Timeout` after ``timeout`` seconds (the messages stay in flight)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._submitted
            while self._answered < target and self._dead is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise Timeout(
                        f"the broker answered {self._answered - self._flushed} of "
                        f"{target - self._flushed} messages within {timeout} s"
                    )
                self._cond.wait(left)
            first = self._flushed + 1
            ids: List[Optional[uuid.UUID]] = []
            failures: List[Tuple[int, MqError]] = []
            for seq in range(first, target + 1):
                r = self._results.pop(seq, None)
                if r is None:
                    r = self._unanswered(seq)
                if isinstance(r, MqError):
                    failures.append((seq - first, r))
                    ids.append(None)
                else:
                    ids.append(r)
            self._flushed = target
        if failures:
            if len(failures) == len(ids) and self._dead is not None and self._answered < first:
                raise self._dead
            raise SendFailed(
                f"{len(failures)} of {len(ids)} messages were not stored: {failures[0][1]}",
                failures=failures,
                ids=ids,
            )
        return [i for i in ids if i is not None]

    def _unanswered(self, seq: int) -> MqError:
        why = str(self._dead) if self._dead is not None else "no answer"
        if self._transactional:
            tx = uuid.UUID(int=self._tx_stream | seq)
            return TransactionInDoubt(
                f"the send stream ended before message {seq} was answered ({why}); its "
                f"transaction {tx} may or may not have committed",
                transaction_id=tx,
            )
        return Unavailable(
            f"the send stream ended before message {seq} was answered ({why}); it may or "
            f"may not be stored"
        )

    def close(self) -> List[uuid.UUID]:
        """Flushes (see :meth:`flush`: returns the ids since the last flush), then ends the
        stream."""
        try:
            return self.flush()
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._acker.join(timeout=10)
            if self._acker.is_alive():
                self._call.cancel()

    def cancel(self) -> None:
        """Ends the stream at once; messages without an answer may or may not be stored."""
        with self._cond:
            self._closing = True
            if self._dead is None:
                self._dead = Unavailable("the sender was cancelled")
            self._cond.notify_all()
        self._call.cancel()

    @property
    def in_flight(self) -> int:
        """Messages sent and not yet answered."""
        with self._cond:
            return self._submitted - self._answered

    def __enter__(self) -> "Sender":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.cancel()
