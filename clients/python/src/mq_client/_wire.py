"""The generated stubs, behind the few names the rest of the package uses: the one module to
change when the proto changes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, List

import grpc
from google.protobuf import empty_pb2

from mq_client._pb.mq.v1 import mq_pb2 as pb
from mq_client._pb.mq.v1 import mq_pb2_grpc as pb_grpc

if TYPE_CHECKING:  # pragma: no cover
    from ._errors import MqError

# The revision of mq.v1 this package speaks (mq_proto::PROTOCOL_VERSION; the broker reports its
# own in BrokerInfo.protocol_version).
PROTOCOL_VERSION = 2
# The oldest broker revision this package works with: revision 2 split the services
# (MessageQueueService, AdminService), so a revision-1 broker answers none of its calls.
MIN_BROKER_PROTOCOL_VERSION = 2

# Largest gRPC message the broker sends or accepts (mq_proto::MAX_GRPC_MESSAGE): the client's
# channel accepts this much, not gRPC's default 4 MiB.
MAX_GRPC_MESSAGE = 64 * 1024 * 1024

# Metadata the broker puts on an error that ends a Transact stream: the transaction did not
# commit (mq_proto::TX_ENDED_METADATA).
TX_ENDED_METADATA = "mq-tx-ended"

SendRequest = pb.SendRequest
ReceiveRequest = pb.ReceiveRequest
ReceiveOneRequest = pb.ReceiveOneRequest
PeekRequest = pb.PeekRequest
TransactRequest = pb.TransactRequest
TxBegin = pb.TxBegin
TxSend = pb.TxSend
TxReceive = pb.TxReceive
OutMessage = pb.OutMessage
CreateQueueRequest = pb.CreateQueueRequest
DeleteQueueRequest = pb.DeleteQueueRequest
GetQueueInfoRequest = pb.GetQueueInfoRequest
PurgeRequest = pb.PurgeRequest
GetAclRequest = pb.GetAclRequest
ChangeAclRequest = pb.ChangeAclRequest
ListQueuesRequest = pb.ListQueuesRequest
SetQueuePropertiesRequest = pb.SetQueuePropertiesRequest
MoveMessageRequest = pb.MoveMessageRequest
TransactionOutcomeRequest = pb.TransactionOutcomeRequest
BrowseRequest = pb.BrowseRequest
ListOutgoingRequest = pb.ListOutgoingRequest
PauseOutgoingRequest = pb.PauseOutgoingRequest
ResumeOutgoingRequest = pb.ResumeOutgoingRequest
DeleteOutgoingRequest = pb.DeleteOutgoingRequest
PurgeOutgoingRequest = pb.PurgeOutgoingRequest

DELIVERY_EXPRESS = pb.DELIVERY_EXPRESS
DELIVERY_RECOVERABLE = pb.DELIVERY_RECOVERABLE
TX_OUTCOME_COMMITTED = pb.TX_OUTCOME_COMMITTED
TX_OUTCOME_ABORTED = pb.TX_OUTCOME_ABORTED
TX_OUTCOME_IN_PROGRESS = pb.TX_OUTCOME_IN_PROGRESS
CURSOR_PEEK_CURRENT = pb.CURSOR_ACTION_PEEK_CURRENT
CURSOR_PEEK_NEXT = pb.CURSOR_ACTION_PEEK_NEXT
CURSOR_RECEIVE_CURRENT = pb.CURSOR_ACTION_RECEIVE_CURRENT
CURSOR_STATUS_OK = pb.CURSOR_STATUS_OK
CURSOR_STATUS_TIMEOUT = pb.CURSOR_STATUS_TIMEOUT
CURSOR_STATUS_ALREADY_RECEIVED = pb.CURSOR_STATUS_ALREADY_RECEIVED

_EMPTY = empty_pb2.Empty


class Stubs:
    """The service stubs on one channel: applications' calls (and broker info), administration."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.queue = pb_grpc.MessageQueueServiceStub(channel)  # type: ignore[no-untyped-call]
        self.admin = pb_grpc.AdminServiceStub(channel)  # type: ignore[no-untyped-call]
        self.broker = self.queue


def empty() -> Any:
    return _EMPTY()


def tx_commit() -> Any:
    return TransactRequest(commit=_EMPTY())


def tx_abort() -> Any:
    return TransactRequest(abort=_EMPTY())


def ack_ids(ack: Any) -> List[bytes]:
    """The ids of a SendResponse, one per message of the batch (empty where it failed)."""
    return list(ack.ids)


def committed_ids(committed: Any) -> List[bytes]:
    """The ids of the messages a transaction sent, in send order."""
    return list(committed.ids)


_CODES = {c.value[0]: c for c in grpc.StatusCode}


def send_failure_error(f: Any) -> "MqError":
    """The typed exception for one refused message of a SendResponse: by its reason (the
    ErrorInfo reasons of failed calls), else by its gRPC status code."""
    from . import _errors

    code = _CODES.get(f.code, grpc.StatusCode.UNKNOWN)
    return _errors.from_status(code, f.message, f.reason, not_found=_errors.QueueNotFound)
