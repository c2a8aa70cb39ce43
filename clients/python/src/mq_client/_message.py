"""Messages as received, queue and broker descriptions, and the wire form of a message to send."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Union

from . import _wire
from ._errors import InternalError, InvalidArgument

Body = Union[bytes, bytearray, memoryview, str]

#: Body type tags the Rust client's formatters use (Message.body_type): 0 raw bytes, 1 binary
#: (postcard), 2 XML, 3 JSON, 4 hand-written encoding. A str body is sent as UTF-8 with type 0.
BODY_TYPE_RAW = 0
BODY_TYPE_BINARY = 1
BODY_TYPE_XML = 2
BODY_TYPE_JSON = 3
BODY_TYPE_MANUAL = 4

DEFAULT_PRIORITY = 3


def body_bytes(body: Body) -> bytes:
    if isinstance(body, str):
        return body.encode("utf-8")
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise TypeError(f"a message body is bytes or str, not {type(body).__name__}")


def timeout_ms(timeout: Optional[float], what: str = "timeout") -> int:
    """A wait in whole ms for the wire (0: answer at once). A negative or NaN wait is
    :class:`InvalidArgument` (an :class:`MqError`), not a bare ``ValueError``."""
    if timeout is None:
        return 0
    try:
        bad = not timeout >= 0  # also NaN
    except TypeError:
        raise InvalidArgument(f"{what} is a number of seconds (got {timeout!r})") from None
    if bad:
        raise InvalidArgument(f"{what} must not be negative (got {timeout})")
    if timeout == float("inf"):
        raise InvalidArgument(f"{what} must be finite (got {timeout})")
    return int(timeout * 1000)


def _ms(seconds: Optional[float], what: str) -> int:
    """A time limit in whole ms, rounded up (0 on the wire means no limit)."""
    if seconds is None:
        return 0
    if seconds < 0:
        raise InvalidArgument(f"{what} must not be negative (got {seconds})")
    return max(1, int(-(-seconds * 1000 // 1)))


def out_message(
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
) -> Any:
    """The wire form of a message to send (``mq.v1.OutMessage``)."""
    if priority is not None and not 0 <= priority <= 7:
        raise InvalidArgument(f"priority must be 0..=7 (got {priority})")
    # Only the fields that are set: each keyword costs time in the protobuf constructor, and
    # this runs once per message sent.
    m = _wire.OutMessage(
        body=body if type(body) is bytes else body_bytes(body),
        delivery=_wire.DELIVERY_RECOVERABLE if recoverable else _wire.DELIVERY_EXPRESS,
        sent_time_ms=int(time.time() * 1000),
    )
    if label:
        m.label = label
    if priority is not None:
        m.priority = priority
    if correlation_id:
        m.correlation_id = correlation_id
    if app_specific:
        m.app_specific = app_specific
    if body_type:
        m.body_type = body_type
    if response_queue:
        m.response_queue = response_queue
    if time_to_reach_queue is not None:
        m.time_to_reach_queue_ms = _ms(time_to_reach_queue, "time_to_reach_queue")
    if time_to_be_received is not None:
        m.time_to_be_received_ms = _ms(time_to_be_received, "time_to_be_received")
    if admin_queue:
        m.admin_queue = admin_queue
    if acknowledge:
        m.acknowledge = acknowledge
    return m


def to_uuid(raw: bytes, what: str = "an id") -> uuid.UUID:
    """The UUID of 16 bytes from the broker; anything else is :class:`InternalError` (the
    broker is not trusted to send well-formed ids)."""
    if len(raw) != 16:
        raise InternalError(
            f"the broker sent {what} of {len(raw)} bytes (a message or transaction id is 16)"
        )
    return uuid.UUID(bytes=bytes(raw))


def id_bytes(id: Union[uuid.UUID, bytes, str]) -> bytes:
    """16 bytes from a UUID, its 16 bytes or its text form."""
    if isinstance(id, uuid.UUID):
        return id.bytes
    if isinstance(id, (bytes, bytearray)) and len(id) == 16:
        return bytes(id)
    if isinstance(id, str):
        try:
            return uuid.UUID(id.strip()).bytes
        except ValueError:
            pass
    raise InvalidArgument(f"{str(id)[:64]!r} is not a message or transaction id (a UUID)")


@dataclass
class DeadLetter:
    """Why a message is in a dead-letter queue."""

    dead_letter_class: int
    reason: str
    destination: str
    time_ms: int
    broker: str


class Message:
    """A message as received or peeked (read-only; the fields are read from the wire message
    when first asked for).

    ``id`` is the broker's UUID v7; ``body`` the bytes (``text`` decodes them as UTF-8);
    times are Unix milliseconds. A message from :meth:`Queue.receive` stays reserved for its
    receiver until :meth:`ack`; every other kind (``receive_one``, peek, a transaction's
    receive) needs no ack.
    """

    __slots__ = ("_m", "_ack_fn", "_id")

    def __init__(self, wire: Any, ack: Optional[Callable[[], None]] = None) -> None:
        self._m = wire
        self._ack_fn = ack
        self._id: Optional[uuid.UUID] = None

    @classmethod
    def from_wire(cls, m: Any, ack: Optional[Callable[[], None]] = None) -> "Message":
        """The message as the broker sent it; :class:`InternalError` if its id is not 16
        bytes."""
        msg = cls(m, ack)
        msg._id = to_uuid(m.id, "a message id")
        return msg

    @property
    def id(self) -> uuid.UUID:
        if self._id is None:
            self._id = to_uuid(self._m.id)
        return self._id

    @property
    def body(self) -> bytes:
        return self._m.body  # type: ignore[no-any-return]

    @property
    def text(self) -> str:
        """The body as UTF-8 text."""
        return self.body.decode("utf-8")

    @property
    def label(self) -> str:
        return self._m.label  # type: ignore[no-any-return]

    @property
    def priority(self) -> int:
        """0..=7 (7 first)."""
        return self._m.priority  # type: ignore[no-any-return]

    @property
    def correlation_id(self) -> str:
        return self._m.correlation_id  # type: ignore[no-any-return]

    @property
    def app_specific(self) -> int:
        return self._m.app_specific  # type: ignore[no-any-return]

    @property
    def body_type(self) -> int:
        """How the body is encoded (``BODY_TYPE_*``; 0 raw bytes)."""
        return self._m.body_type  # type: ignore[no-any-return]

    @property
    def recoverable(self) -> bool:
        """Stored on disk (else express: in memory)."""
        return bool(self._m.delivery == _wire.DELIVERY_RECOVERABLE)

    @property
    def sent_time_ms(self) -> int:
        return self._m.sent_time_ms  # type: ignore[no-any-return]

    @property
    def arrived_time_ms(self) -> int:
        return self._m.arrived_time_ms  # type: ignore[no-any-return]

    @property
    def response_queue(self) -> str:
        return self._m.response_queue  # type: ignore[no-any-return]

    @property
    def destination(self) -> str:
        """The queue's format name."""
        return self._m.destination  # type: ignore[no-any-return]

    @property
    def abort_count(self) -> int:
        """Times a transaction that received it was aborted."""
        return self._m.abort_count  # type: ignore[no-any-return]

    @property
    def move_count(self) -> int:
        return self._m.move_count  # type: ignore[no-any-return]

    @property
    def transactional(self) -> bool:
        return bool(self._m.transactional)

    @property
    def sender(self) -> str:
        """The identity that sent it (set by the broker)."""
        return self._m.sender  # type: ignore[no-any-return]

    @property
    def reach_queue_by_ms(self) -> int:
        return self._m.reach_queue_by_ms  # type: ignore[no-any-return]

    @property
    def receive_by_ms(self) -> int:
        return self._m.receive_by_ms  # type: ignore[no-any-return]

    @property
    def admin_queue(self) -> str:
        """Where its acknowledgements go (empty: none)."""
        return self._m.admin_queue  # type: ignore[no-any-return]

    @property
    def acknowledge(self) -> int:
        """Which acknowledgements it asked for (bits: 1 positive arrival, 2 positive receive,
        4 negative arrival, 8 negative receive; 0 none)."""
        return self._m.acknowledge  # type: ignore[no-any-return]

    @property
    def message_class(self) -> int:
        """MSMQ's message class: 0 for a normal message; for an acknowledgement the broker
        posted, its ``MQMSG_CLASS_*`` code (0x0002 reached the queue, 0x4000
        received, 0x8000 and up did not reach it, 0xC000 and up was not received); its
        ``correlation_id`` is then the original message's id."""
        return self._m.message_class  # type: ignore[no-any-return]

    @property
    def dead_letter(self) -> Optional[DeadLetter]:
        """Why and where it was going, in a dead-letter queue; else ``None``."""
        if not self._m.HasField("dead_letter"):
            return None
        d = self._m.dead_letter
        # `dead_letter_class` (named `class` before the proto's phase 2; same field number).
        cls = getattr(d, "dead_letter_class", None)
        if cls is None:
            cls = getattr(d, "class")
        return DeadLetter(cls, d.reason, d.destination, d.time_ms, d.broker)

    def ack(self) -> None:
        """Acknowledges this message (streaming receive only): the broker removes it for good
        once it and every message delivered before it on the same receiver are acknowledged
        (acknowledgements are cumulative on the wire). Unacknowledged messages go back to the
        head of the queue when the receiver closes. A no-op for messages that need no ack.

        If the receive stream has ended before this acknowledgement was told to the broker (the
        broker ended it, e.g. after ``mqd --ack-timeout``, or the connection broke), the broker
        has taken the message back: this raises the error that ended the stream
        (:class:`Timeout` for the ack timeout). After :meth:`Receiver.close`:
        :class:`FailedPrecondition`."""
        if self._ack_fn is not None:
            self._ack_fn()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Message) and self._m == other._m

    def __hash__(self) -> int:
        return hash(self.id)

    def __repr__(self) -> str:
        body = self.body
        shown = body[:32] + (b"..." if len(body) > 32 else b"")
        return (
            f"Message(id={self.id}, label={self.label!r}, priority={self.priority}, "
            f"correlation_id={self.correlation_id!r}, body={shown!r} ({len(body)} B))"
        )


@dataclass
class QueueInfo:
    """A queue's description and counters."""

    name: str
    format_name: str
    transactional: bool
    messages: int
    bytes: int
    in_flight: int
    quota_bytes: Optional[int]
    label: str
    created_ms: int
    max_aborts: int
    poisoned: int
    sent: int
    received: int

    @classmethod
    def from_wire(cls, q: Any) -> "QueueInfo":
        return cls(
            name=q.name,
            format_name=q.format_name,
            transactional=q.transactional,
            messages=q.messages,
            bytes=q.bytes,
            in_flight=q.in_flight,
            quota_bytes=q.quota_bytes if q.HasField("quota_bytes") else None,
            label=q.label,
            created_ms=q.created_ms,
            max_aborts=q.max_aborts,
            poisoned=q.poisoned,
            sent=q.sent,
            received=q.received,
        )


@dataclass
class BrokerInfo:
    """What the broker is (``GetBrokerInfo``)."""

    name: str
    version: str
    protocol_version: int
    started_ms: int
    uptime_ms: int
    listen: List[str]
    ready: bool
    queues: int
    messages: int
    limits: Dict[str, int]

    @classmethod
    def from_wire(cls, i: Any) -> "BrokerInfo":
        return cls(
            name=i.name,
            version=i.version,
            protocol_version=i.protocol_version,
            started_ms=i.started_ms,
            uptime_ms=i.uptime_ms,
            listen=list(i.listen),
            ready=i.ready,
            queues=i.queues,
            messages=i.messages,
            limits=dict(i.limits),
        )


@dataclass
class TransactionStatus:
    """What the broker knows about a transaction id: ``outcome`` is one of ``"committed"``,
    ``"aborted"``, ``"in_progress"``, ``"unknown"``."""

    outcome: str
    time_ms: Optional[int]
    detail: str
    retention_ms: int


@dataclass
class OutgoingQueue:
    """An outgoing queue (store-and-forward: messages waiting for another broker). ``state`` is
    one of ``"inactive"``, ``"connecting"``, ``"connected"``, ``"waiting"`` (the last attempt
    failed; retrying at ``next_retry_ms``), ``"onhold"`` (paused), or ``"unknown_<n>"`` for a
    state number this client does not know (a newer broker)."""

    destination: str
    state: str
    messages: int
    bytes: int
    in_flight: int
    last_error: str
    next_retry_ms: int
    forwarded: int
    dead_lettered: int

    @classmethod
    def from_wire(cls, o: Any) -> "OutgoingQueue":
        try:
            name = _wire.pb.OutgoingState.Name(o.state)
        except ValueError:
            # A state newer than this client: shown as "unknown_<n>", not an error.
            name = f"UNKNOWN_{o.state}"
        return cls(
            destination=o.destination,
            state=name.replace("OUTGOING_STATE_", "").lower(),
            messages=o.messages,
            bytes=o.bytes,
            in_flight=o.in_flight,
            last_error=o.last_error,
            next_retry_ms=o.next_retry_ms,
            forwarded=o.forwarded,
            dead_lettered=o.dead_lettered,
        )
