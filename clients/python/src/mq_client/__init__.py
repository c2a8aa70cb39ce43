"""mq_client: the Python client of mq, a durable MSMQ-like message broker (gRPC, ``mq.v1``).

>>> from mq_client import Client                                   # doctest: +SKIP
>>> client = Client("http://127.0.0.1:1801")
>>> client.create_queue(r".\\private$\\orders", exist_ok=True)
>>> orders = client.queue(r".\\private$\\orders")
>>> orders.send(b"order 1", label="new", priority=5, recoverable=True)
>>> for msg in orders.receive(timeout=1.0):
...     print(msg.id, msg.label, msg.body)
...     msg.ack()

Layout: ``Client`` (connection, administration, version check), ``Queue`` (send, receive,
peek), ``Sender`` (pipelined sends), ``Receiver`` (streaming receive with acks),
``Transaction``, ``Message``, and the exceptions (all subclasses of ``MqError``). The gRPC stubs
are generated at build time into ``mq_client._pb``.
"""

from ._client import DEFAULT_BROKER_URL, Client
from ._cursor import Cursor
from ._errors import (
    AlreadyCommitted,
    AlreadyExists,
    ConnectError,
    FailedPrecondition,
    IncompatibleBroker,
    IncompatibleCall,
    InternalError,
    InvalidArgument,
    LimitExceeded,
    MessageNotFound,
    MqError,
    NotFound,
    PermissionDenied,
    QueueExists,
    QueueNotFound,
    QuotaExceeded,
    SendFailed,
    Timeout,
    TransactionAborted,
    TransactionInDoubt,
    Unauthenticated,
    Unavailable,
)
from ._message import (
    BODY_TYPE_BINARY,
    BODY_TYPE_JSON,
    BODY_TYPE_MANUAL,
    BODY_TYPE_RAW,
    BODY_TYPE_XML,
    BrokerInfo,
    DeadLetter,
    Message,
    OutgoingQueue,
    QueueInfo,
    TransactionStatus,
)
from ._queue import Queue
from ._receiver import Receiver
from ._sender import Sender
from ._transaction import Transaction
from ._wire import MIN_BROKER_PROTOCOL_VERSION, PROTOCOL_VERSION

__version__ = "0.1.0"

__all__ = [
    "AlreadyCommitted",
    "AlreadyExists",
    "BODY_TYPE_BINARY",
    "BODY_TYPE_JSON",
    "BODY_TYPE_MANUAL",
    "BODY_TYPE_RAW",
    "BODY_TYPE_XML",
    "BrokerInfo",
    "Client",
    "ConnectError",
    "Cursor",
    "DEFAULT_BROKER_URL",
    "DeadLetter",
    "FailedPrecondition",
    "IncompatibleBroker",
    "IncompatibleCall",
    "InternalError",
    "InvalidArgument",
    "LimitExceeded",
    "MIN_BROKER_PROTOCOL_VERSION",
    "Message",
    "MessageNotFound",
    "MqError",
    "NotFound",
    "OutgoingQueue",
    "PROTOCOL_VERSION",
    "PermissionDenied",
    "Queue",
    "QueueExists",
    "QueueInfo",
    "QueueNotFound",
    "QuotaExceeded",
    "Receiver",
    "SendFailed",
    "Sender",
    "Timeout",
    "Transaction",
    "TransactionAborted",
    "TransactionInDoubt",
    "TransactionStatus",
    "Unauthenticated",
    "Unavailable",
]
