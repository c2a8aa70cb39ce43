"""``Queue``: a handle to one queue: send, receive, peek."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, List, Optional, Union

from . import _wire
from ._errors import InternalError, MessageNotFound, QueueNotFound, Timeout
from ._message import (
    BODY_TYPE_RAW,
    Body,
    Message,
    QueueInfo,
    id_bytes,
    out_message,
    timeout_ms,
)

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client
    from ._cursor import Cursor
    from ._receiver import Receiver
    from ._sender import Sender

IdLike = Union[uuid.UUID, bytes, str]


class Queue:
    """A queue on the broker, from :meth:`Client.queue`."""

    def __init__(self, client: "Client", name: str) -> None:
        self.client = client
        self.name = name

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    # -- sending ------------------------------------------------------------------------------

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
        transactional: bool = False,
    ) -> uuid.UUID:
        """Sends one message and waits until the broker has stored it (on disk if
        ``recoverable``); returns its id. ``priority`` 0..=7 (default 3); times in seconds.
        ``transactional=True`` sends it as its own single-message transaction, as a
        transactional queue requires. For many messages use :meth:`sender`, which pipelines.
        ``admin_queue`` and ``acknowledge`` (bits: 1 positive arrival, 2 positive receive, 4
        negative arrival, 8 negative receive) ask the broker to post acknowledgements there;
        each has ``message_class`` set and the original's id as ``correlation_id``.

        The client keeps the send stream it opened for this queue (for the 8 queues sent to
        most recently; see :attr:`Client.one_shot_senders_opened`), so one message at a time
        costs one round trip; threads sending at once share it.

        Waits at most the client's ``call_timeout`` for the broker's answer: then raises
        :class:`Timeout` (with ``transactional=True``, :class:`TransactionInDoubt` carrying the
        message's transaction id): the message may or may not be stored."""
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
        return self.client._send_one(self.name, transactional, m)

    def sender(self, **options: object) -> "Sender":
        """A pipelining sender to this queue (options as :meth:`Client.sender`)."""
        return self.client.sender(self.name, **options)  # type: ignore[arg-type]

    # -- receiving ----------------------------------------------------------------------------

    def receive(
        self,
        timeout: Optional[float] = 1.0,
        *,
        prefetch: int = 256,
        max_messages: Optional[int] = None,
        auto_ack: bool = False,
    ) -> "Receiver":
        """A streaming receiver: iterate over it for messages; the iteration ends once no
        message arrived for ``timeout`` seconds (``None``: never) or after ``max_messages``.
        Each message stays reserved until :meth:`Message.ack` (or, with ``auto_ack``, until the
        next one is asked for); when the receiver closes (end of the iteration, ``with`` block,
        :meth:`Receiver.close`) unacknowledged messages go back to the head of the queue.
        The broker pushes up to ``prefetch`` messages ahead."""
        from ._receiver import Receiver

        return Receiver(
            self.client,
            self.name,
            timeout=timeout,
            prefetch=prefetch,
            max_messages=max_messages,
            auto_ack=auto_ack,
        )

    def receive_one(self, timeout: float = 0.0) -> Optional[Message]:
        """Removes and returns the first message, waiting up to ``timeout`` seconds; ``None`` if
        none came. Removed at once: no ack.

        At most once: the broker removes the message *before* the answer travels back, so if
        the answer is lost or comes too late (:class:`Timeout`, a lost connection) the message
        may be gone without reaching the caller. When every message matters, use
        ``receive(max_messages=1)`` and :meth:`Message.ack` once it is handled, or receive in a
        transaction (:meth:`Client.transaction`)."""
        return self._one(timeout, peek=False)

    def peek(self, timeout: float = 0.0) -> Optional[Message]:
        """The first message, left in the queue; ``None`` if none came within ``timeout``."""
        return self._one(timeout, peek=True)

    def peek_many(self, max: int, timeout: float = 0.0) -> List[Message]:
        """Up to ``max`` messages from the head of the queue, left in place (paged). A broker
        that answers a page with more messages than asked for is :class:`InternalError`."""
        wait_ms = timeout_ms(timeout)
        out: List[Message] = []
        cursor = b""
        while len(out) < max:
            asked = min(max - len(out), 1000)
            req = _wire.PeekRequest(
                queue=self.name,
                timeout_ms=wait_ms if not out else 0,
                max=asked,
                cursor=cursor,
            )
            r = self.client._call(
                self.client._stubs.queue.Peek,
                req,
                wait=timeout,
                what="to a peek",
                not_found=QueueNotFound,
            )
            if len(r.messages) > asked:
                raise InternalError(
                    f"the broker answered a peek of at most {asked} messages with "
                    f"{len(r.messages)}"
                )
            out.extend(Message.from_wire(m) for m in r.messages)
            cursor = r.next_cursor
            if not cursor or not r.messages:
                break
        return out

    def receive_by_id(self, id: IdLike, timeout: float = 0.0) -> Optional[Message]:
        """Removes the message with this id. With ``timeout`` 0 and no such message waiting:
        :class:`MessageNotFound`; with a timeout: ``None`` once it passes.

        At most once, as :meth:`receive_one`: if the answer is lost or too late
        (:class:`Timeout`) the message may have been removed without reaching the caller; for
        no loss, peek it (:meth:`peek_by_id`) and receive it in a transaction."""
        return self._one(timeout, peek=False, id=id_bytes(id))

    def peek_by_id(self, id: IdLike, timeout: float = 0.0) -> Optional[Message]:
        """The message with this id, left in place (as :meth:`receive_by_id`)."""
        return self._one(timeout, peek=True, id=id_bytes(id))

    def receive_by_correlation_id(
        self, correlation_id: str, timeout: float = 0.0
    ) -> Optional[Message]:
        """Removes the first message with this correlation id (as :meth:`receive_by_id`;
        at most once: a lost or late answer may mean the message is gone)."""
        return self._one(timeout, peek=False, correlation_id=correlation_id)

    def peek_by_correlation_id(
        self, correlation_id: str, timeout: float = 0.0
    ) -> Optional[Message]:
        """The first message with this correlation id, left in place."""
        return self._one(timeout, peek=True, correlation_id=correlation_id)

    def _one(
        self, timeout: float, *, peek: bool, id: bytes = b"", correlation_id: str = ""
    ) -> Optional[Message]:
        req = _wire.ReceiveOneRequest(
            queue=self.name,
            timeout_ms=timeout_ms(timeout),
            peek=peek,
            id=id,
            correlation_id=correlation_id,
        )
        selected = bool(id or correlation_id)
        try:
            r = self.client._call(
                self.client._stubs.queue.ReceiveOne,
                req,
                wait=timeout,
                what="to a receive",
                not_found=MessageNotFound if selected else QueueNotFound,
            )
        except MessageNotFound as e:
            # NOT_FOUND on a selected receive is the queue's too when there is no reason.
            if not e.reason and "queue" in e.message and "does not exist" in e.message:
                raise QueueNotFound(e.message, code=e.code) from None
            raise
        except Timeout as e:
            if peek:
                raise
            raise Timeout(
                f"{e.message}; the broker may have removed the message already (a receive "
                f"removes it before answering): it may be lost. For no loss use "
                f"receive(max_messages=1) with ack, or a transaction",
                code=e.code,
                reason=e.reason,
                metadata=e.metadata,
            ) from None
        return Message.from_wire(r.message) if r.HasField("message") else None

    def cursor(self) -> "Cursor":
        """A cursor on this queue: peek current / peek next / receive current (see
        :class:`Cursor`)."""
        from ._cursor import Cursor

        return Cursor(self.client, self.name)

    # -- administration -----------------------------------------------------------------------

    def info(self) -> QueueInfo:
        """The queue's description and counters."""
        return self.client.queue_info(self.name)

    def purge(self) -> int:
        """Removes every waiting message; returns how many."""
        return self.client.purge(self.name)
