"""The exceptions of mq_client, and the one place that maps the broker's errors to them.

The broker answers a failed call with a gRPC status; from protocol revision 2 on it also puts a
``google.rpc.Status`` with a ``google.rpc.ErrorInfo`` (domain ``mq``, a ``reason`` such as
``QUEUE_NOT_FOUND``) in the ``grpc-status-details-bin`` trailer. The reason picks the most
precise exception; without one, the status code does.
"""

from __future__ import annotations

import uuid
from typing import Any, Mapping, Optional, Sequence, Type

import grpc


class MqError(Exception):
    """Base of every error this package raises.

    ``code`` is the gRPC status code (``None`` for errors found by the client itself),
    ``reason`` the broker's ``ErrorInfo`` reason (``""`` if it sent none), ``metadata`` the
    ``ErrorInfo`` metadata.
    """

    def __init__(
        self,
        message: str,
        *,
        code: Optional[grpc.StatusCode] = None,
        reason: str = "",
        metadata: Optional[Mapping[str, str]] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.reason = reason
        self.metadata: Mapping[str, str] = dict(metadata or {})


class ConnectError(MqError):
    """No broker answered at the URL, or the connection settings are wrong."""


class IncompatibleBroker(MqError):
    """The broker speaks a protocol revision this client does not work with (too old, or a
    newer broker that no longer serves clients of this revision)."""

    def __init__(self, message: str, *, broker_revision: int, client_revision: int) -> None:
        super().__init__(message, code=grpc.StatusCode.FAILED_PRECONDITION)
        self.broker_revision = broker_revision
        self.client_revision = client_revision


class InvalidArgument(MqError):
    """The broker refused the input (bad name, label too long, priority 8, body too large...)."""


class NotFound(MqError):
    """Something does not exist (see the subclasses)."""


class QueueNotFound(NotFound):
    """No such queue."""


class MessageNotFound(NotFound):
    """No message with that id or correlation id is waiting (MQ_ERROR_MESSAGE_NOT_FOUND)."""


class AlreadyExists(MqError):
    """Something exists already."""


class QueueExists(AlreadyExists):
    """A queue with that name exists already."""


class QuotaExceeded(MqError):
    """A queue's or the broker's quota (or another limit) is full; nothing was stored."""


class LimitExceeded(QuotaExceeded):
    """A per-connection or per-stream bound (open transactions, cursors, connections, a batch
    over the broker's limit, failed logins per minute, a gRPC message over the size limit); the
    message names the mqd flag."""


class FailedPrecondition(MqError):
    """The operation does not apply (transactional mismatch, read-only queue, remote queue...)."""


class Unauthenticated(MqError):
    """No or bad credentials."""


class PermissionDenied(MqError):
    """The identity lacks a right; the text names the identity, the right and the queue."""


class Unavailable(MqError):
    """The broker is shutting down, cannot store right now, or the connection was lost."""


class Timeout(MqError):
    """A deadline passed: what was asked may or may not have happened."""


class InternalError(MqError):
    """The broker failed internally, or answered something this client does not understand."""


class TransactionAborted(MqError):
    """The transaction did not commit: the broker aborted it (timeout, a send it could not
    stage, shutdown) or it was aborted on purpose. Nothing of it happened."""


class TransactionInDoubt(MqError):
    """The commit was sent but its answer was lost: the transaction may or may not have
    committed. Ask with ``Client.transaction_outcome(e.transaction_id)``, or run the
    transaction again with ``client.transaction(id=e.transaction_id)``, which commits at most
    once (it raises :class:`AlreadyCommitted` if the first attempt did)."""

    def __init__(self, message: str, *, transaction_id: uuid.UUID, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.transaction_id = transaction_id


class AlreadyCommitted(AlreadyExists):
    """A transaction with this id committed before (an earlier attempt whose answer was lost);
    nothing was done this time."""

    def __init__(self, message: str, *, transaction_id: uuid.UUID, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.transaction_id = transaction_id


class SendFailed(MqError):
    """Some messages of a pipelined send were refused. ``failures`` lists ``(index, error)``
    (index in the flushed messages, error the typed exception for that message); ``ids`` holds
    the id of every message in order, ``None`` where it failed. The exception's own class is
    not more precise: look at ``failures`` (the first one is also ``__cause__``)."""

    def __init__(
        self,
        message: str,
        *,
        failures: Sequence["tuple[int, MqError]"],
        ids: "Sequence[Optional[uuid.UUID]]",
    ) -> None:
        first = failures[0][1] if failures else None
        super().__init__(
            message,
            code=first.code if first else None,
            reason=first.reason if first else "",
        )
        self.failures = list(failures)
        self.ids = list(ids)
        self.__cause__ = first


# ErrorInfo reasons (mq.v1's error table) -> exception. Unknown reasons fall back to the code.
# NOT_FOUND and ALREADY_EXISTS (something other than a queue) are left to the call, which knows
# what it asked for (a message id: MessageNotFound; a transaction id: AlreadyCommitted).
_BY_REASON: dict[str, Type[MqError]] = {
    "QUEUE_NOT_FOUND": QueueNotFound,
    "MESSAGE_NOT_FOUND": MessageNotFound,
    "QUEUE_EXISTS": QueueExists,
    "INVALID_ARGUMENT": InvalidArgument,
    "QUOTA_EXCEEDED": QuotaExceeded,
    "FAILED_PRECONDITION": FailedPrecondition,
    "PERMISSION_DENIED": PermissionDenied,
    "UNAUTHENTICATED": Unauthenticated,
    "STORAGE_UNAVAILABLE": Unavailable,
    "SHUTTING_DOWN": Unavailable,
    "STREAM_BUSY": Unavailable,
    "INTERNAL": InternalError,
    "LIMIT_EXCEEDED": LimitExceeded,
    "TX_TIMEOUT": TransactionAborted,
    "IDLE_TIMEOUT": Timeout,
}

_BY_CODE: dict[grpc.StatusCode, Type[MqError]] = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.OUT_OF_RANGE: InvalidArgument,
    grpc.StatusCode.NOT_FOUND: NotFound,
    grpc.StatusCode.ALREADY_EXISTS: AlreadyExists,
    grpc.StatusCode.RESOURCE_EXHAUSTED: QuotaExceeded,
    grpc.StatusCode.FAILED_PRECONDITION: FailedPrecondition,
    grpc.StatusCode.UNAUTHENTICATED: Unauthenticated,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDenied,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.CANCELLED: Unavailable,
    grpc.StatusCode.UNKNOWN: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: Timeout,
    grpc.StatusCode.ABORTED: TransactionAborted,
}


def _error_info(call: Any) -> "tuple[str, dict[str, str]]":
    """The ErrorInfo reason and metadata from a failed call's trailers, if any."""
    try:
        trailers = call.trailing_metadata() or ()
    except Exception:  # noqa: BLE001 - not every RpcError carries trailers
        return "", {}
    for key, value in trailers:
        if key != "grpc-status-details-bin":
            continue
        try:
            from google.rpc import error_details_pb2, status_pb2

            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    return info.reason, dict(info.metadata)
        except Exception:  # noqa: BLE001 - undecodable details: fall back to the code
            return "", {}
    return "", {}


def has_trailer(call: Any, key: str) -> bool:
    try:
        return any(k == key for k, _ in (call.trailing_metadata() or ()))
    except Exception:  # noqa: BLE001
        return False


def from_rpc_error(
    err: grpc.RpcError,
    *,
    not_found: Type[MqError] = NotFound,
    already_exists: Type[MqError] = AlreadyExists,
    what: str = "",
) -> MqError:
    """The typed exception for a failed call. ``not_found`` / ``already_exists`` say what those
    codes mean for this call when the broker sent no more precise reason (e.g.
    ``QueueNotFound``)."""
    code: Optional[grpc.StatusCode] = getattr(err, "code", lambda: None)()
    details: str = getattr(err, "details", lambda: "")() or ""
    reason, meta = _error_info(err)
    return from_status(
        code, details, reason, meta, not_found=not_found, already_exists=already_exists, what=what
    )


def from_status(
    code: Optional[grpc.StatusCode],
    details: str,
    reason: str = "",
    meta: Optional[Mapping[str, str]] = None,
    *,
    not_found: Type[MqError] = NotFound,
    already_exists: Type[MqError] = AlreadyExists,
    what: str = "",
) -> MqError:
    """The typed exception for a status code, message and ErrorInfo reason (of a failed call,
    or of one refused message of a send)."""
    cls: Type[MqError]
    if reason in _BY_REASON:
        cls = _BY_REASON[reason]
    elif code == grpc.StatusCode.NOT_FOUND:
        cls = not_found
    elif code == grpc.StatusCode.ALREADY_EXISTS:
        cls = already_exists
    elif code == grpc.StatusCode.UNIMPLEMENTED:
        cls = IncompatibleCall
    else:
        cls = _BY_CODE.get(code, InternalError) if code is not None else InternalError
    if cls is Unavailable and code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.CANCELLED):
        details = f"the connection to the broker was lost: {details}".rstrip(": ")
    if cls is IncompatibleCall:
        details = (
            "the broker does not support this call (is it older than this client?): " + details
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and what:
        details = f"no answer {what} in time: {details}"
    if not details:
        details = str(code.name if code else "error")
    return cls(details, code=code, reason=reason, metadata=meta)


class IncompatibleCall(InternalError):
    """The broker does not implement this call (UNIMPLEMENTED): it is older than this client."""
