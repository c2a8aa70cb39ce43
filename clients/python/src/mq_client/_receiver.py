"""``Receiver``: a streaming receive with a prefetch window and acknowledgements.

The Receive stream's protocol (mq.v1): the first request names the queue and grants credit;
the broker pushes up to that many messages, each with a delivery tag 1, 2, 3, ...; later
requests grant more credit and acknowledge cumulatively (``ack_through``). The request side
stays open for the stream's whole life: half-closing it makes the broker apply the last
acknowledgement and end the stream, giving every unacknowledged message back.

This receiver grants one credit per message handed to the application (so ``prefetch``
messages wait ahead of it), and acknowledges through the longest run of acknowledged tags:
a message acknowledged after an unacknowledged one is removed only once that one is too.

Once the stream has ended (the broker ended it: its ack timeout, a deleted queue, a shutdown, a
broken connection), the broker has taken back every message delivered on it whose
acknowledgement it did not have: messages still buffered here are not handed out (the
iteration raises the error that ended the stream, :class:`Timeout` for the ack timeout), and
:meth:`Message.ack` of a message delivered on it raises that error too, unless the
acknowledgement was told to the broker before the end; :meth:`close` raises it if
acknowledgements made before the end were not told. The end is known once the stream's
thread has read it: behind more than ``_stream.MAX_BUFFERED`` unread responses it is not yet,
so messages from those may still be handed out and acknowledged; acknowledgements told while
responses waited unread like that count as maybe not applied once the end is seen.

The broker is not trusted: every delivery's tag must be greater than the tag before it and
within the credit granted so far (so it never pushes more than asked for), and every message
id 16 bytes; anything else ends the stream with :class:`InternalError` (checked as responses
arrive, so a flooding broker is cut off; unread responses are bounded, see ``_stream``).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Deque, Iterator, NoReturn, Optional, Set

from . import _wire
from ._errors import (
    FailedPrecondition,
    InternalError,
    MqError,
    QueueNotFound,
    Timeout,
    from_rpc_error,
)
from ._message import Message
from ._stream import BidiStream, StreamEnded

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client

#: How long :meth:`Receiver.close` waits for the broker to confirm the acknowledgements.
CLOSE_TIMEOUT = 10.0


class Receiver:
    """From :meth:`Queue.receive`; iterate over it, ideally in a ``with`` block::

        with queue.receive(timeout=1.0) as messages:
            for msg in messages:
                handle(msg)
                msg.ack()

    The iteration ends once no message came for ``timeout`` seconds, or after
    ``max_messages``. The receiver then closes (in a ``with`` block: at the block's end, so
    messages can still be acknowledged after the loop): acknowledgements are applied,
    unacknowledged messages go back to the head of the queue.
    Errors (a missing queue: :class:`QueueNotFound`) are raised by the iteration.
    """

    def __init__(
        self,
        client: "Client",
        queue: str,
        *,
        timeout: Optional[float],
        prefetch: int,
        max_messages: Optional[int],
        auto_ack: bool,
    ) -> None:
        self.queue = queue
        self._timeout = timeout
        self._prefetch = max(1, min(prefetch, 65_535))
        self._max = max_messages
        self._auto_ack = auto_ack
        self._lock = threading.Lock()
        self._buffer: Deque[Any] = deque()
        self._acked: Set[int] = set()
        self._through = 0  # every tag <= this is acknowledged (locally)
        self._sent_through = 0  # ... and told to the broker
        # ... and told while this client would have seen the stream's end had it come: every
        # response before it was read (an end behind unread responses is not seen; acks told
        # then may have gone to a stream already ended, their fate is unknown).
        self._safe_through = 0
        self._credit_owed = 0  # messages handed out whose credit is not yet granted again
        first = self._prefetch if max_messages is None else min(self._prefetch, max_messages)
        self._requested = first  # credit granted in all: no tag may exceed it
        self._delivered = 0  # the last tag the broker delivered
        self._handed = 0
        self._last: Optional[Message] = None
        self._closed = False
        # How the stream ended, once this receiver noticed (it is then closed too), and whether
        # acknowledgements were not surely told to the broker then (maybe never applied).
        self._end: Optional[StreamEnded] = None
        self._unapplied = False
        self._managed = False  # in a `with` block: the block's end closes, not the iteration's
        self._stream: BidiStream[Any, Any] = BidiStream(
            client._stubs.queue.Receive, client._metadata, check=self._check_delivery
        )
        self._stream.send(_wire.ReceiveRequest(queue=queue, credit=first))

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        if self._auto_ack and self._last is not None:
            self._last.ack()
            self._last = None
        if self._end is not None:
            self._raise_end()
        if self._closed or (self._max is not None and self._handed >= self._max):
            self._end_iteration()
            raise StopIteration
        if not self._buffer:
            self._send_acks(force=True)
            deadline = None if self._timeout is None else time.monotonic() + self._timeout
            # A response without messages is waited past, within the same deadline.
            while not self._buffer:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    batch = self._stream.recv(left)
                except StreamEnded as end:
                    self._note_end(end)
                    self._raise_end()
                if batch is None:
                    self._end_iteration()
                    raise StopIteration
                self._buffer.extend(batch.messages)
        # Buffered messages belong to the stream: once it has ended the broker has taken them
        # back (they will be delivered again), so none is handed out.
        over = self._stream.over()
        if over is not None:
            self._note_end(over)
            self._raise_end()
        d = self._buffer.popleft()
        tag = d.tag
        msg = Message.from_wire(d.message, ack=lambda: self._ack(tag))
        with self._lock:
            self._handed += 1
            self._credit_owed += 1
        self._last = msg
        self._send_acks(force=False)
        return msg

    def _check_delivery(self, resp: Any) -> Optional[MqError]:
        """Run by the stream's thread on every response: tags go up and stay within the credit
        granted, ids are 16 bytes. A violation ends the stream with this error."""
        with self._lock:
            for d in resp.messages:
                if d.tag <= self._delivered or d.tag > self._requested:
                    return InternalError(
                        f"the broker delivered tag {d.tag} after tag {self._delivered} with "
                        f"credit for {self._requested} messages on queue {self.queue[:200]!r}: "
                        f"tags must go up and stay within the credit granted; the receive "
                        f"stream is ended (unacknowledged messages go back to the queue)"
                    )
                if len(d.message.id) != 16:
                    return InternalError(
                        f"the broker delivered tag {d.tag} with a message id of "
                        f"{len(d.message.id)} bytes (16 expected); the receive stream is ended"
                    )
                self._delivered = d.tag
        return None

    def _ack(self, tag: int) -> None:
        if self._end is None and not self._closed:
            end = self._stream.over()
            if end is not None:
                self._note_end(end)
        with self._lock:
            if self._end is not None and tag > self._safe_through:
                if tag > self._sent_through:
                    # Not told to the broker before the stream ended: never applied.
                    raise self._end_error(
                        "this acknowledgement was not applied: the receive stream had ended, and "
                        "the broker took the message back (it will be delivered again)"
                    )
                raise self._end_error(
                    "this acknowledgement may not have been applied: it was told to the broker "
                    "while the receive stream may have ended already (the message may be "
                    "delivered again)"
                )
            if tag <= self._through:
                return
            if self._closed:
                raise FailedPrecondition(
                    "the receiver is closed: this message was not acknowledged and went back "
                    "to the queue (it will be delivered again)"
                )
            self._acked.add(tag)
            while self._through + 1 in self._acked:
                self._through += 1
                self._acked.discard(self._through)

    def _send_acks(self, force: bool) -> None:
        """Tells the broker the acknowledgements and grants credit for what was handed out: in
        batches, or at once before waiting (``force``). Nothing once the stream is known to have
        ended: acknowledgements not told by then stay untold (never applied)."""
        if self._end is not None or self._stream.over() is not None:
            return
        with self._lock:
            acks = self._through - self._sent_through
            credit = self._credit_owed
            if self._max is not None:
                credit = min(credit, max(0, self._max - self._requested))
            if not force and acks + credit < max(1, self._prefetch // 2):
                return
            if acks == 0 and credit == 0:
                return
            self._credit_owed = 0
            self._requested += credit
            self._sent_through = self._through
            if self._stream.caught_up():
                self._safe_through = self._through
            req = _wire.ReceiveRequest(credit=credit, ack_through=self._through)
        self._stream.send(req)

    # -- closing ------------------------------------------------------------------------------

    def _end_iteration(self) -> None:
        if not self._managed:
            self.close()

    def _note_end(self, end: StreamEnded) -> None:
        """The stream has ended: the receiver is closed, what is buffered went back."""
        with self._lock:
            if self._end is None:
                self._end = end
                self._unapplied = self._through > self._safe_through
            self._closed = True
            self._buffer.clear()

    def _end_error(self, note: str = "") -> MqError:
        """The error that ended the stream (``note`` added to its message); for a stream that
        ended without one, :class:`FailedPrecondition`."""
        end = self._end
        assert end is not None
        if end.mq_error is not None:
            err: MqError = end.mq_error
        elif end.error is not None:
            err = from_rpc_error(end.error, not_found=QueueNotFound)
        else:
            return FailedPrecondition(
                "the broker ended the receive stream" + (f"; {note}" if note else "")
            )
        if not note:
            return err
        return type(err)(
            f"{err.message}; {note}", code=err.code, reason=err.reason, metadata=err.metadata
        )

    def _raise_end(self) -> NoReturn:
        """The iteration's answer once the stream has ended: its error, or the end of the
        iteration if it ended without one."""
        end = self._end
        assert end is not None
        if end.mq_error is None and end.error is None:
            raise StopIteration from None
        raise self._end_error() from None

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Applies the acknowledgements and ends the stream; unacknowledged messages go back to
        the queue. Waits up to ``timeout`` seconds for the broker to confirm (by ending the
        stream); raises :class:`Timeout` if it did not, or the error that ended the stream if
        acknowledgements may not have been applied."""
        with self._lock:
            if self._closed:
                if self._end is not None and self._unapplied:
                    # The stream ended with acknowledgements not surely told to the broker.
                    raise self._end_error(
                        "acknowledgements made before that was seen may not have been applied "
                        "(their messages may be delivered again)"
                    )
                return
            to_confirm = self._through > 0
            self._credit_owed = 0
        self._send_acks(force=True)
        with self._lock:
            self._closed = True
        self._stream.half_close()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._stream.cancel()
                if to_confirm:
                    raise Timeout(
                        f"the broker did not confirm within {timeout:g} s that it applied the "
                        f"acknowledgements; messages not applied will be delivered again"
                    )
                return
            try:
                self._stream.recv(left)  # prefetched, not handed out: the broker takes them back
            except StreamEnded as end:
                if end.mq_error is not None and to_confirm:
                    raise end.mq_error from None
                if end.error is not None and to_confirm:
                    raise from_rpc_error(end.error, not_found=QueueNotFound) from None
                return

    def __enter__(self) -> "Receiver":
        self._managed = True
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            try:
                self.close()
            except MqError:
                pass  # the exception already on its way matters more

    def __del__(self) -> None:
        # Half-close without waiting: the broker applies what was acknowledged and gives the
        # rest back; the stream's thread reads until it ends.
        try:
            if not self._closed:
                self._send_acks(force=True)
                self._stream.detach()  # nobody reads on: the stream's thread drops the rest
                self._stream.half_close()
        except Exception:  # noqa: BLE001
            pass
