"""The generated stubs, behind the few names the rest of the package uses: the one module to
change when the proto changes."""

from __future__ import annotations

from typing import Any

from google.protobuf import empty_pb2

from mq_client._pb.mq.v1 import mq_pb2 as pb
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


def _first(*names: str) -> Any:
    """The first of ``names`` the generated module has: the same code runs on the stubs of the
    first mq.v1 layout (one MessageQueue service, unprefixed enums) and of the current one."""
    for n in names:
        if hasattr(pb, n):
            return getattr(pb, n)
    raise ImportError(f"the generated mq.v1 stubs have none of {names}")


SendRequest = _first("SendRequest", "SendBatch")
ReceiveRequest = pb.ReceiveRequest
ReceiveOneRequest = pb.ReceiveOneRequest
PeekRequest = pb.PeekRequest
TransactRequest = _first("TransactRequest", "TxRequest")
TxBegin = pb.TxBegin
TxSend = pb.TxSend
TxReceive = pb.TxReceive
OutMessage = pb.OutMessage
CreateQueueRequest = pb.CreateQueueRequest
DeleteQueueRequest = _first("DeleteQueueRequest", "QueueRequest")
GetQueueInfoRequest = _first("GetQueueInfoRequest", "QueueRequest")
PurgeRequest = _first("PurgeRequest", "QueueRequest")
GetAclRequest = _first("GetAclRequest", "QueueRequest")
ChangeAclRequest = _first("ChangeAclRequest", "AclChange")
ListQueuesRequest = pb.ListQueuesRequest
SetQueuePropertiesRequest = pb.SetQueuePropertiesRequest
MoveMessageRequest = _first("MoveMessageRequest", "MoveRequest")
TransactionOutcomeRequest = pb.TransactionOutcomeRequest

DELIVERY_EXPRESS = _first("DELIVERY_EXPRESS", "EXPRESS")
DELIVERY_RECOVERABLE = _first("DELIVERY_RECOVERABLE", "RECOVERABLE")
TX_OUTCOME_COMMITTED = pb.TX_OUTCOME_COMMITTED
TX_OUTCOME_ABORTED = pb.TX_OUTCOME_ABORTED
TX_OUTCOME_IN_PROGRESS = pb.TX_OUTCOME_IN_PROGRESS

# google.protobuf.Empty where the proto uses it, else the proto's own Empty.
_Empty = getattr(pb, "Empty", None) or empty_pb2.Empty
_TX_FLAGS_ARE_EMPTY = TransactRequest.DESCRIPTOR.fields_by_name["commit"].message_type is not None


class Stubs:
    """The service stubs on one channel: applications' calls, administration, broker info."""

    def __init__(self, channel: Any) -> None:
        if hasattr(pb_grpc, "MessageQueueServiceStub"):
            self.queue = pb_grpc.MessageQueueServiceStub(channel)
            self.admin = pb_grpc.AdminServiceStub(channel)  # type: ignore[attr-defined]
        else:
            self.queue = pb_grpc.MessageQueueStub(channel)
            self.admin = self.queue
        self.broker = self.queue


def empty() -> Any:
    return _Empty()


def tx_commit() -> Any:
    return TransactRequest(commit=_Empty()) if _TX_FLAGS_ARE_EMPTY else TransactRequest(commit=True)


def tx_abort() -> Any:
    return TransactRequest(abort=_Empty()) if _TX_FLAGS_ARE_EMPTY else TransactRequest(abort=True)


def _split_ids(ids: Any) -> "list[bytes]":
    if isinstance(ids, (bytes, bytearray)):  # first layout: 16 bytes per message, concatenated
        raw = bytes(ids)
        return [raw[i : i + 16] for i in range(0, len(raw), 16)]
    return [bytes(i) for i in ids]  # repeated bytes


def ack_ids(ack: Any) -> "list[bytes]":
    """The ids of a SendResponse, one per message of the batch (empty or zeros where it
    failed)."""
    return _split_ids(ack.ids)


def committed_ids(committed: Any) -> "list[bytes]":
    return _split_ids(committed.ids)


def send_failure_error(f: Any) -> "MqError":
    """The typed exception for one refused message of a SendResponse: by its reason, else its
    code (a gRPC status code; in the first layout an mq.v1.ErrorCode)."""
    from . import _errors as e

    import grpc

    S = grpc.StatusCode
    if not hasattr(pb, "ErrorCode"):
        code = next((c for c in S if c.value[0] == f.code), S.UNKNOWN)
        return e.from_status(code, f.message, getattr(f, "reason", ""), not_found=e.QueueNotFound)
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
