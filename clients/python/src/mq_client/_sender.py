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
from ._message import BODY_TYPE_RAW, Body, out_message

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

    Nothing waits without end: ``send`` waits for room in the window, and ``close`` (and
    ``flush`` without a timeout) for answers, at most the client's ``call_timeout`` without any
    answer from the broker, then raise :class:`Timeout` (messages not answered may or may not
    be stored; for a transactional sender each is :class:`TransactionInDoubt`). The broker's
    acknowledgements are checked against the batch they answer (first seq, count, one 16-byte
    id per stored message, failures inside the batch in ascending order): a bad one ends the
    stream with :class:`InternalError`, the batch's messages in doubt.
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
        self._call_timeout = float(client.call_timeout)
        self._waiters = 0  # threads in _send_one
        self._abandoned: "set[int]" = set()  # seqs whose _send_one gave up waiting
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
        except BaseException as e:  # noqa: BLE001 - never leave waiters without an answer
            end = InternalError(f"the sender's acknowledgement thread failed: {e!r}")
            try:
                self._call.cancel()
            except Exception:  # noqa: BLE001
                pass
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
            first, count = self._in_flight[0]
            # Checked whole before anything is settled: a bad answer leaves the batch unanswered,
            # and the stream's end puts its messages in doubt.
            results = self._check_ack(first, count, ack)
            self._in_flight.popleft()
            for i, r in enumerate(results):
                seq = first + i
                if seq in self._abandoned:
                    self._abandoned.discard(seq)  # its _send_one gave up waiting
                else:
                    self._results[seq] = r
            self._answered = first + count - 1
            self._cond.notify_all()

    @staticmethod
    def _check_ack(first: int, count: int, ack: Any) -> "List[Union[uuid.UUID, MqError]]":
        """The result of each message of batch ``first`` (``count`` messages) from its
        acknowledgement: the same first seq and count, one id per message (16 bytes where no
        failure names the message), failures in ascending seq inside the batch. Anything else
        is :class:`InternalError`."""
        doubt = f"the {count} messages of batch {first} may or may not be stored"
        if ack.first_seq != first or ack.count != count:
            raise InternalError(
                f"the broker acknowledged batch {ack.first_seq} ({ack.count} messages), "
                f"expected {first} ({count}); {doubt}"
            )
        ids = _wire.ack_ids(ack)
        if len(ids) != count:
            raise InternalError(
                f"the broker answered batch {first} of {count} messages with {len(ids)} ids; "
                f"{doubt}"
            )
        failed: Dict[int, MqError] = {}
        last = 0
        for f in ack.failures:
            if not first <= f.seq < first + count or f.seq <= last:
                raise InternalError(
                    f"the broker refused seq {f.seq} in its answer to batch {first} ({count} "
                    f"messages): not in the batch, or not in ascending order; {doubt}"
                )
            last = f.seq
            failed[f.seq - first] = _wire.send_failure_error(f)
        out: "List[Union[uuid.UUID, MqError]]" = []
        for i, raw in enumerate(ids):
            err = failed.get(i)
            if err is not None:
                out.append(err)
            elif len(raw) != 16:
                raise InternalError(
                    f"the broker acknowledged message {first + i} with an id of {len(raw)} "
                    f"bytes (16 expected); {doubt}"
                )
            else:
                out.append(uuid.UUID(bytes=bytes(raw)))
        return out

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
        flush). Waits only while ``window`` messages are unanswered, at most the client's
        ``call_timeout``: then raises :class:`Timeout` (this message was not sent; those in
        flight may or may not be stored). Raises the error that ended the stream, if it has
        ended."""
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
            self._wait_window(time.monotonic() + self._call_timeout)
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

    def _wait_window(self, deadline: float) -> None:
        """Waits (holding ``_cond``) for room in the window; :class:`Timeout` at ``deadline``."""
        while self._dead is None and self._submitted - self._answered >= self._window:
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(
                    f"the broker answered none of the {self._submitted - self._answered} "
                    f"messages in flight to {self.destination[:200]!r} within "
                    f"{self._call_timeout:g} s (the client's call_timeout); this message was "
                    f"not sent; those in flight may or may not be stored"
                )
            self._cond.wait(left)

    def _send_one(self, m: Any) -> uuid.UUID:
        """Sends the wire message ``m`` and waits for its own answer (what :meth:`Queue.send`
        does on a kept sender; several threads may wait at once, each for its message), at
        most the client's ``call_timeout``: then :class:`Timeout` (transactional:
        :class:`TransactionInDoubt`). Raises :class:`NotSent` if the stream had ended before
        ``m`` was queued; the refusal of ``m`` or, if the stream ends before ``m`` is answered,
        the error that ended it."""
        deadline = time.monotonic() + self._call_timeout
        with self._cond:
            self._waiters += 1
            try:
                self._wait_window(deadline)
                if self._dead is not None or self._closing:
                    raise NotSent(self._dead)
                self._pending.append(m)
                self._submitted += 1
                seq = self._submitted
                if self._batcher_waiting:
                    self._cond.notify_all()
                while self._answered < seq and self._dead is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        self._abandoned.add(seq)  # its answer, if it comes, is dropped
                        raise self._timed_out(seq)
                    self._cond.wait(left)
            finally:
                self._waiters -= 1
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

    def _timed_out(self, seq: int) -> MqError:
        why = (
            f"no answer from the broker to message {seq} to {self.destination[:200]!r} within "
            f"{self._call_timeout:g} s (the client's call_timeout)"
        )
        if self._transactional:
            return self._tx_in_doubt(seq, why, ": ask with client.transaction_outcome(id)")
        return Timeout(f"{why}; it may or may not be stored")

    def _after_timeout(self) -> None:
        """A :meth:`Queue.send` on this kept sender timed out: the client no longer keeps it.
        Ends the stream now if nobody else waits on it, else once they are done."""
        with self._cond:
            idle = self._waiters == 0
        if idle:
            self.cancel()
        else:
            self._retire()

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
        Raises :class:`Timeout` after ``timeout`` seconds or, without one, once the broker
        answered nothing for the client's ``call_timeout`` (the messages stay in flight and
        may or may not be stored)."""
        with self._cond:
            target = self._submitted
            if not self._wait_answered(target, timeout):
                limit = timeout if timeout is not None else self._call_timeout
                raise Timeout(
                    f"the broker answered {self._answered - self._flushed} of "
                    f"{target - self._flushed} messages within {limit:g} s"
                    + ("" if timeout is not None else " without answering any more")
                    + "; the others stay in flight and may or may not be stored"
                )
            first, ids, failures = self._collect(target)
        return self._report(first, ids, failures)

    def _wait_answered(self, target: int, timeout: Optional[float]) -> bool:
        """Waits (holding ``_cond``) until every seq <= ``target`` is answered or the stream
        ended: ``True``; ``False`` once ``timeout`` passed or, without one, once no answer came
        for ``call_timeout``."""
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        idle_deadline = now + self._call_timeout
        seen = self._answered
        while self._answered < target and self._dead is None:
            now = time.monotonic()
            if self._answered != seen:
                seen = self._answered
                idle_deadline = now + self._call_timeout
            until = deadline if deadline is not None else idle_deadline
            if until - now <= 0:
                return False
            self._cond.wait(until - now)
        return True

    def _collect(
        self, target: int
    ) -> "Tuple[int, List[Optional[uuid.UUID]], List[Tuple[int, MqError]]]":
        """Takes the results of seqs after the last flush through ``target`` (holding
        ``_cond``)."""
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
        return first, ids, failures

    def _report(
        self,
        first: int,
        ids: "List[Optional[uuid.UUID]]",
        failures: "List[Tuple[int, MqError]]",
    ) -> List[uuid.UUID]:
        if failures:
            dead = self._dead
            if len(failures) == len(ids) and dead is not None and self._answered < first:
                if self._transactional and isinstance(dead, Timeout):
                    # Each message is its own transaction, in doubt with its own id.
                    if len(failures) == 1:
                        raise failures[0][1]
                else:
                    raise dead
            raise SendFailed(
                f"{len(failures)} of {len(ids)} messages were not stored (or, unanswered, "
                f"may or may not be): {failures[0][1]}",
                failures=failures,
                ids=ids,
            )
        return [i for i in ids if i is not None]

    def _tx_in_doubt(self, seq: int, why: str, hint: str) -> TransactionInDoubt:
        """Message ``seq``'s single-message transaction is in doubt: ``why``, then ``hint``."""
        tx = uuid.UUID(int=self._tx_stream | seq)
        return TransactionInDoubt(
            f"{why}; its transaction {tx} may or may not have committed{hint}",
            transaction_id=tx,
        )

    def _unanswered(self, seq: int) -> MqError:
        why = str(self._dead) if self._dead is not None else "no answer"
        if self._transactional:
            return self._tx_in_doubt(
                seq, f"the send stream ended before message {seq} was answered ({why})", ""
            )
        cls = Timeout if isinstance(self._dead, Timeout) else Unavailable
        return cls(
            f"the send stream ended before message {seq} was answered ({why}); it may or "
            f"may not be stored"
        )

    def close(self) -> List[uuid.UUID]:
        """Flushes (see :meth:`flush`: returns the ids since the last flush), then ends the
        stream. If the broker answers nothing for the client's ``call_timeout``, gives up:
        ends the stream and raises :class:`Timeout` (for a transactional sender
        :class:`TransactionInDoubt`, or :class:`SendFailed` listing one per message); the
        messages not answered may or may not be stored."""
        gave_up = False
        try:
            with self._cond:
                target = self._submitted
                if not self._wait_answered(target, None):
                    gave_up = True
                    if self._dead is None:
                        self._dead = Timeout(
                            f"the broker answered none of the last "
                            f"{target - self._answered} messages to "
                            f"{self.destination[:200]!r} for {self._call_timeout:g} s (the "
                            f"client's call_timeout); the sender gave up: they may or may not "
                            f"be stored"
                        )
                    self._closing = True
                    self._cond.notify_all()
                first, ids, failures = self._collect(target)
            if gave_up:
                self._call.cancel()
            return self._report(first, ids, failures)
        finally:
            with self._cond:
                self._closing = True
                self._cond.notify_all()
            self._acker.join(timeout=min(10.0, max(self._call_timeout, 0.1)))
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
