"""The generated stubs, behind the few names the rest of the package uses: the one module to
change when the proto changes."""

from __future__ import annotations

from mq_client._pb.mq.v1 import mq_pb2 as pb  # noqa: F401
from mq_client._pb.mq.v1 import mq_pb2_grpc as pb_grpc

# The revision of mq.v1 this package was written against (BrokerInfo.protocol_version).
PROTOCOL_VERSION = 1
# The oldest broker revision this package works with.
MIN_BROKER_PROTOCOL_VERSION = 1

# Largest gRPC message the broker sends or accepts (mq_proto::MAX_GRPC_MESSAGE): the client's
# channel accepts this much, not gRPC's default 4 MiB.
MAX_GRPC_MESSAGE = 64 * 1024 * 1024

# Metadata the broker puts on an error that ends a Transact stream: the transaction did not
# commit (mq_proto::TX_ENDED_METADATA).
TX_ENDED_METADATA = "mq-tx-ended"

DELIVERY_EXPRESS = pb.EXPRESS
DELIVERY_RECOVERABLE = pb.RECOVERABLE


class Stubs:
    """The service stubs on one channel."""

    def __init__(self, channel: object) -> None:
        self.queue = pb_grpc.MessageQueueStub(channel)
        self.admin = self.queue
        self.broker = self.queue


def empty() -> object:
    return pb.Empty()


def ack_ids(ack: object) -> "list[bytes]":
    """The 16-byte ids of a SendAck, one per message of the batch (zeros where it failed)."""
    raw = bytes(ack.ids)  # type: ignore[attr-defined]
    return [raw[i : i + 16] for i in range(0, len(raw), 16)]


def committed_ids(committed: object) -> "list[bytes]":
    raw = bytes(committed.ids)  # type: ignore[attr-defined]
    return [raw[i : i + 16] for i in range(0, len(raw), 16)]


def send_failure_error(f: object) -> "MqError":
    """The typed exception for one refused message of a SendAck."""
    from . import _errors as e

    import grpc

    S = grpc.StatusCode
    by_code = {
        pb.INVALID_ARGUMENT: (e.InvalidArgument, S.INVALID_ARGUMENT),
        pb.NOT_FOUND: (e.QueueNotFound, S.NOT_FOUND),
        pb.ALREADY_EXISTS: (e.AlreadyExists, S.ALREADY_EXISTS),
        pb.RESOURCE_EXHAUSTED: (e.QuotaExceeded, S.RESOURCE_EXHAUSTED),
        pb.FAILED_PRECONDITION: (e.FailedPrecondition, S.FAILED_PRECONDITION),
        pb.UNAVAILABLE: (e.Unavailable, S.UNAVAILABLE),
        pb.PERMISSION_DENIED: (e.PermissionDenied, S.PERMISSION_DENIED),
    }
    cls, code = by_code.get(f.code, (e.InternalError, S.INTERNAL))  # type: ignore[attr-defined]
    return cls(f.message, code=code)  # type: ignore[attr-defined]


from ._errors import MqError  # noqa: E402
