"""The mapping of the broker's errors to exceptions, without a broker: rich error details
(google.rpc.Status with an ErrorInfo reason in the grpc-status-details-bin trailer), the status
code when there is no reason, and per-message send failures."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2

import mq_client
from mq_client import _errors, _wire


class FakeRpcError(grpc.RpcError):
    def __init__(
        self, code: grpc.StatusCode, details: str, trailers: Sequence[Tuple[str, Any]] = ()
    ) -> None:
        self._code, self._details, self._trailers = code, details, tuple(trailers)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> Tuple[Tuple[str, Any], ...]:
        return self._trailers


def rich(code: grpc.StatusCode, reason: str, meta: Optional[dict] = None) -> FakeRpcError:
    info = error_details_pb2.ErrorInfo(reason=reason, domain="mq", metadata=meta or {})
    status = status_pb2.Status(code=code.value[0], message="m")
    status.details.add().Pack(info)
    return FakeRpcError(code, "m", [("grpc-status-details-bin", status.SerializeToString())])


@pytest.mark.parametrize(
    "code,reason,cls",
    [
        (grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND", mq_client.QueueNotFound),
        (grpc.StatusCode.ALREADY_EXISTS, "QUEUE_EXISTS", mq_client.QueueExists),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "QUOTA_EXCEEDED", mq_client.QuotaExceeded),
        (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT", mq_client.InvalidArgument),
        (grpc.StatusCode.FAILED_PRECONDITION, "FAILED_PRECONDITION", mq_client.FailedPrecondition),
        (grpc.StatusCode.UNAVAILABLE, "STORAGE_UNAVAILABLE", mq_client.Unavailable),
        (grpc.StatusCode.UNAVAILABLE, "SHUTTING_DOWN", mq_client.Unavailable),
        (grpc.StatusCode.PERMISSION_DENIED, "PERMISSION_DENIED", mq_client.PermissionDenied),
        (grpc.StatusCode.INTERNAL, "INTERNAL", mq_client.InternalError),
        (grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED", mq_client.Unauthenticated),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "LIMIT_EXCEEDED", mq_client.LimitExceeded),
        (grpc.StatusCode.OUT_OF_RANGE, "LIMIT_EXCEEDED", mq_client.LimitExceeded),
        (grpc.StatusCode.ABORTED, "TX_TIMEOUT", mq_client.TransactionAborted),
        (grpc.StatusCode.DEADLINE_EXCEEDED, "IDLE_TIMEOUT", mq_client.Timeout),
        (grpc.StatusCode.UNAVAILABLE, "STREAM_BUSY", mq_client.Unavailable),
        # Reasons the table leaves to the call, and reasons this client does not know yet:
        # the status code decides.
        (grpc.StatusCode.NOT_FOUND, "NOT_FOUND", mq_client.NotFound),
        (grpc.StatusCode.FAILED_PRECONDITION, "SOMETHING_NEW", mq_client.FailedPrecondition),
    ],
)
def test_reason_picks_the_exception(code: grpc.StatusCode, reason: str, cls: type) -> None:
    e = _errors.from_rpc_error(rich(code, reason, {"queue": "q"}))
    assert type(e) is cls
    assert e.reason == reason and e.code == code and e.metadata == {"queue": "q"}


def test_without_details_the_code_and_the_call_decide() -> None:
    e = _errors.from_rpc_error(FakeRpcError(grpc.StatusCode.NOT_FOUND, "no such queue"))
    assert type(e) is mq_client.NotFound and e.reason == ""
    e = _errors.from_rpc_error(
        FakeRpcError(grpc.StatusCode.NOT_FOUND, "x"), not_found=mq_client.MessageNotFound
    )
    assert type(e) is mq_client.MessageNotFound
    # The reason wins over the call's guess.
    e = _errors.from_rpc_error(
        rich(grpc.StatusCode.NOT_FOUND, "QUEUE_NOT_FOUND"), not_found=mq_client.MessageNotFound
    )
    assert type(e) is mq_client.QueueNotFound
    e = _errors.from_rpc_error(FakeRpcError(grpc.StatusCode.UNIMPLEMENTED, "x"))
    assert isinstance(e, mq_client.IncompatibleCall) and "older" in str(e)
    e = _errors.from_rpc_error(FakeRpcError(grpc.StatusCode.UNKNOWN, "reset"))
    assert isinstance(e, mq_client.Unavailable) and "lost" in str(e)
    # Undecodable details fall back to the code.
    bad = FakeRpcError(grpc.StatusCode.ABORTED, "x", [("grpc-status-details-bin", b"\xff\xff")])
    assert type(_errors.from_rpc_error(bad)) is mq_client.TransactionAborted


def test_send_failures_map_by_reason_then_code() -> None:
    f = _wire.pb.SendFailure(
        seq=3, code=code_pb2.NOT_FOUND, message="queue q does not exist", reason="QUEUE_NOT_FOUND"
    )
    e = _wire.send_failure_error(f)
    assert type(e) is mq_client.QueueNotFound and e.code == grpc.StatusCode.NOT_FOUND
    f = _wire.pb.SendFailure(seq=4, code=code_pb2.RESOURCE_EXHAUSTED, message="full")
    assert type(_wire.send_failure_error(f)) is mq_client.QuotaExceeded
