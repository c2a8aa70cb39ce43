"""``Transaction``: sends and receives across transactional queues, committed or aborted as one;
what a commit whose answer was lost means (:class:`TransactionInDoubt`)."""

from __future__ import annotations

import os
import time
import uuid
from typing import TYPE_CHECKING, Any, List, Optional, Union

from . import _wire
from ._errors import (
    AlreadyCommitted,
    InternalError,
    MessageNotFound,
    MqError,
    QueueNotFound,
    Timeout,
    TransactionAborted,
    TransactionInDoubt,
    Unavailable,
    from_rpc_error,
    has_trailer,
)
from ._message import BODY_TYPE_RAW, Body, Message, id_bytes, out_message, timeout_ms, to_uuid
from ._stream import BidiStream, StreamEnded

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client


def uuid7() -> uuid.UUID:
    """A UUID version 7: Unix ms in the top 48 bits, then random bits."""
    ms = int(time.time() * 1000) & 0xFFFF_FFFF_FFFF
    r = int.from_bytes(os.urandom(10), "big")
    value = (
        (ms << 80) | (0x7 << 76) | ((r >> 62) & 0xFFF) << 64 | (0b10 << 62) | (r & ((1 << 62) - 1))
    )
    return uuid.UUID(int=value)


class Transaction:
    """From :meth:`Client.transaction`; best used as a context manager::

        with client.transaction() as tx:
            order = tx.receive(r".\\private$\\orders", timeout=1.0)
            tx.send(r".\\private$\\billing", b"invoice 7")
        # committed here (tx.ids: the ids of the messages sent); aborted if the block raised

    Messages sent in it appear all at once at the commit, in send order; messages received in
    it are hidden from other receivers until the commit (then gone) or an abort (then back at
    the head of their queue). Sends get no answer: one the broker cannot stage makes the commit
    fail, and then nothing of the transaction happens. ``commit`` returns once the commit
    record is on disk. If its answer is lost, :class:`TransactionInDoubt` carries the id.

    A receive that gets no answer within the client's ``call_timeout`` (plus its own
    ``timeout``) raises :class:`Timeout` and breaks the transaction: its stream is cancelled, so
    the broker aborts it (nothing of it happens; what it received goes back), and every later
    call raises :class:`TransactionAborted`. A commit whose answer does not come, or does not
    name the messages sent (one 16-byte id each) and the transaction's id, is
    :class:`TransactionInDoubt`.
    """

    def __init__(self, client: "Client", id: Optional[uuid.UUID], *, commit_timeout: float) -> None:
        self.id: uuid.UUID = id if id is not None else uuid7()
        self.ids: List[uuid.UUID] = []
        self._call_timeout = client.call_timeout
        self._commit_timeout = commit_timeout
        self._done = False
        self._broken: Optional[str] = None  # why the stream was given up before a commit
        self._sends = 0  # messages staged: the commit answer must name one id each
        self._stream: BidiStream[Any, Any] = BidiStream(
            client._stubs.queue.Transact, client._metadata
        )
        # The id goes first; the broker answers nothing to it (an id that already committed
        # ends the stream with ALREADY_EXISTS, and the next answer says so).
        self._stream.send(_wire.TransactRequest(begin=_wire.TxBegin(id=self.id.bytes)))

    def send(
        self,
        destination: str,
        body: Body,
        *,
        label: str = "",
        correlation_id: str = "",
        app_specific: int = 0,
        body_type: int = BODY_TYPE_RAW,
        response_queue: str = "",
        time_to_reach_queue: Optional[float] = None,
        time_to_be_received: Optional[float] = None,
        admin_queue: str = "",
        acknowledge: int = 0,
    ) -> None:
        """Stages a message for ``destination`` (a transactional queue). Does not wait. (In a
        transaction every message is recoverable and has priority 0.)"""
        self._check_open()
        m = out_message(
            body,
            label=label,
            recoverable=True,
            correlation_id=correlation_id,
            app_specific=app_specific,
            body_type=body_type,
            response_queue=response_queue,
            time_to_reach_queue=time_to_reach_queue,
            time_to_be_received=time_to_be_received,
            admin_queue=admin_queue,
            acknowledge=acknowledge,
        )
        self._stream.send(
            _wire.TransactRequest(send=_wire.TxSend(destination=destination, messages=[m]))
        )
        self._sends += 1

    def receive(self, queue: str, timeout: float = 0.0) -> Optional[Message]:
        """Receives one message from a transactional queue, waiting up to ``timeout`` seconds;
        ``None`` if none came."""
        return self._receive(queue, timeout)

    def receive_by_id(
        self, queue: str, id: Union[uuid.UUID, bytes, str], timeout: float = 0.0
    ) -> Optional[Message]:
        """Receives the message with this id. With ``timeout`` 0 and no such message:
        :class:`MessageNotFound` (the transaction stays open)."""
        return self._receive(queue, timeout, id=id_bytes(id))

    def receive_by_correlation_id(
        self, queue: str, correlation_id: str, timeout: float = 0.0
    ) -> Optional[Message]:
        """Receives the first message with this correlation id (as :meth:`receive_by_id`)."""
        return self._receive(queue, timeout, correlation_id=correlation_id)

    def _receive(
        self, queue: str, timeout: float, *, id: bytes = b"", correlation_id: str = ""
    ) -> Optional[Message]:
        self._check_open()
        wait_ms = timeout_ms(timeout)
        self._stream.send(
            _wire.TransactRequest(
                receive=_wire.TxReceive(
                    queue=queue,
                    timeout_ms=wait_ms,
                    id=id,
                    correlation_id=correlation_id,
                )
            )
        )
        limit = self._call_timeout + timeout
        r = self._next(limit, "to a transactional receive")
        if r is None:
            self._break(f"a receive got no answer within {limit:g} s")
            raise Timeout(
                f"no answer to a transactional receive within {limit:g} s; transaction "
                f"{self.id} is given up: its stream is cancelled, so the broker aborts it "
                f"(nothing of it happens; a message it received goes back to its queue). "
                f"Start a new transaction"
            )
        kind = r.WhichOneof("result")
        if kind == "received":
            try:
                return Message.from_wire(r.received)
            except InternalError as e:
                self._break(f"the broker's answer to a receive was not understood: {e}")
                raise
        if kind == "receive_timeout":
            if (id or correlation_id) and timeout == 0:
                what = f"id {to_uuid(id)}" if id else f"correlation id {correlation_id[:128]!r}"
                raise MessageNotFound(
                    f"no message with {what} is waiting in queue {queue[:200]!r} "
                    f"(MQ_ERROR_MESSAGE_NOT_FOUND)"
                )
            return None
        self._break(f"the broker answered a receive with {kind}")
        raise InternalError(
            f"unexpected answer to a transactional receive from the broker: {kind}; "
            f"transaction {self.id} is given up (the broker aborts it)"
        )

    def receive_and_commit(self, queue: str, timeout: float = 0.0) -> Optional[Message]:
        """Receives one message and commits the transaction (with everything staged before it)
        in one round trip: returns the message once the commit record is on disk (``tx.ids``:
        the ids of the messages sent), or ``None`` if none came within ``timeout`` seconds, and
        then the whole transaction is aborted. The transaction is over either way. What it gives
        up against ``receive`` then ``commit``: the message is not in hand before the commit, so
        if the answer is lost after the commit (:class:`TransactionInDoubt`) the message is
        gone. A broker that predates it answers with the message; the commit then follows."""
        self._check_open()
        wait_ms = timeout_ms(timeout)
        self._stream.send(
            _wire.TransactRequest(
                receive=_wire.TxReceive(queue=queue, timeout_ms=wait_ms, commit=True)
            )
        )
        self._done = True
        try:
            r = self._stream.recv(self._commit_timeout + timeout)
        except StreamEnded as end:
            self._stream.finish()
            raise self._classify(end, committing=True) from None
        if r is None:
            self._stream.cancel()
            raise TransactionInDoubt(
                f"no answer to the receive-and-commit of transaction {self.id} within "
                f"{self._commit_timeout + timeout:g} s; it may or may not have committed: ask "
                f"with client.transaction_outcome(id)",
                transaction_id=self.id,
            )
        kind = r.WhichOneof("result")
        if kind == "committed":
            self._stream.finish()
            self.ids = self._committed_ids(r.committed)
            if not r.committed.HasField("message"):
                raise InternalError(
                    f"transaction {self.id} committed (the broker said so), but its answer to "
                    f"the receive-and-commit carries no message: whatever it received is "
                    f"removed and was not handed over"
                )
            try:
                return Message.from_wire(r.committed.message)
            except InternalError as e:
                raise InternalError(
                    f"transaction {self.id} committed (the broker said so), but the message it "
                    f"received is not understood: {e}"
                ) from None
        if kind == "aborted":
            self._stream.finish()
            return None
        # An older broker: a plain receive; the transaction is still open.
        if kind == "received":
            self._done = False
            try:
                m = Message.from_wire(r.received)
            except InternalError as e:
                self._break(f"the broker's answer to a receive was not understood: {e}")
                raise
            self.commit()
            return m
        if kind == "receive_timeout":
            self._done = False
            self.abort()
            return None
        self._stream.cancel()
        raise TransactionInDoubt(
            f"unexpected answer to the receive-and-commit of transaction {self.id} from the "
            f"broker ({kind}); it may or may not have committed: ask with "
            f"client.transaction_outcome(id)",
            transaction_id=self.id,
        )

    def commit(self) -> List[uuid.UUID]:
        """Commits; returns the ids of the messages sent, in send order, once the commit record
        is on disk. Raises :class:`TransactionInDoubt` if the answer is lost after the commit
        left (or is not one the client can trust: not one 16-byte id per message sent, another
        transaction's id), :class:`AlreadyCommitted` if this id committed before,
        :class:`TransactionAborted` if the transaction was given up before (a receive timed
        out), or the reason the broker aborted the transaction (then nothing of it
        happened)."""
        self._check_open()
        self._done = True
        self._stream.send(_wire.tx_commit())
        try:
            r = self._stream.recv(self._commit_timeout)
        except StreamEnded as end:
            raise self._classify(end, committing=True) from None
        finally:
            self._stream.finish()
        if r is None:
            self._stream.cancel()
            raise TransactionInDoubt(
                f"no answer to the commit of transaction {self.id} within "
                f"{self._commit_timeout:g} s; it may or may not have committed: ask with "
                f"client.transaction_outcome(id), or run it again with "
                f"client.transaction(id=...) (commits at most once)",
                transaction_id=self.id,
            )
        kind = r.WhichOneof("result")
        if kind == "committed":
            self.ids = self._committed_ids(r.committed)
            return self.ids
        if kind == "aborted":
            raise TransactionAborted(
                f"the broker answered the commit of transaction {self.id}: aborted; nothing of "
                f"it happened"
            )
        self._stream.cancel()
        raise TransactionInDoubt(
            f"unexpected answer to the commit of transaction {self.id} from the broker "
            f"({kind}); it may or may not have committed: ask with "
            f"client.transaction_outcome(id)",
            transaction_id=self.id,
        )

    def _committed_ids(self, c: Any) -> List[uuid.UUID]:
        """The ids of a commit answer, trusted only if they are one 16-byte id per message
        staged and the answer names this transaction (when it names one)."""
        raw = _wire.committed_ids(c)
        bad = ""
        if len(raw) != self._sends or any(len(b) != 16 for b in raw):
            bad = (
                f"names {len(raw)} ids for the {self._sends} messages sent, not one 16-byte "
                f"id each"
            )
        elif len(c.id) and bytes(c.id) != self.id.bytes:
            other = uuid.UUID(bytes=bytes(c.id)) if len(c.id) == 16 else f"{len(c.id)} bytes"
            bad = f"names transaction {other}"
        if bad:
            raise TransactionInDoubt(
                f"the broker's answer to the commit of transaction {self.id} {bad}: it is not "
                f"trusted; the transaction may or may not have committed: ask with "
                f"client.transaction_outcome(id)",
                transaction_id=self.id,
            )
        return [uuid.UUID(bytes=bytes(b)) for b in raw]

    def abort(self) -> None:
        """Aborts: nothing sent in the transaction is stored; received messages go back."""
        if self._done:
            return
        self._done = True
        self._stream.send(_wire.tx_abort())
        try:
            r = self._stream.recv(self._call_timeout)
            if r is not None and r.WhichOneof("result") != "aborted":
                raise InternalError(
                    f"unexpected answer to an abort from the broker: {r.WhichOneof('result')}"
                )
        except StreamEnded:
            pass  # the broker ended it: it did not commit either way
        finally:
            self._stream.finish()

    def _check_open(self) -> None:
        if self._broken is not None:
            raise TransactionAborted(
                f"transaction {self.id} was given up ({self._broken}): its stream was "
                f"cancelled before any commit, so the broker aborted it and nothing of it "
                f"happened; start a new transaction"
            )
        if self._done:
            raise TransactionAborted(f"transaction {self.id} is over (committed or aborted)")

    def _break(self, why: str) -> None:
        """Gives the transaction up before its commit: a later answer could no longer be told
        from the answer to the next request. Cancelling the stream makes the broker abort it."""
        self._broken = why
        self._done = True
        self._stream.cancel()

    def _next(self, timeout: float, what: str) -> Any:
        """The next answer, ``None`` if none came within ``timeout``."""
        try:
            return self._stream.recv(timeout)
        except StreamEnded as end:
            self._done = True
            raise self._classify(end, committing=False) from None

    def _classify(self, end: StreamEnded, *, committing: bool) -> MqError:
        """What an error ending the transaction's stream means for its outcome: the broker said
        so itself (it did not commit), or, after the commit left, the outcome is unknown."""
        if end.error is None:
            e: MqError = Unavailable("the broker ended the transaction's stream without an answer")
            definite = False
        else:
            e = from_rpc_error(end.error, not_found=QueueNotFound)
            definite = has_trailer(end.error, _wire.TX_ENDED_METADATA)
        if (
            e.code is not None
            and e.code.name == "ALREADY_EXISTS"
            or e.reason
            in (
                "TRANSACTION_ALREADY_COMMITTED",
                "ALREADY_COMMITTED",
            )
        ):
            return AlreadyCommitted(
                f"transaction {self.id} was already committed; nothing was done this time",
                transaction_id=self.id,
                code=e.code,
                reason=e.reason,
            )
        if committing and not definite:
            return TransactionInDoubt(
                f"the outcome of transaction {self.id} is unknown ({e}); it may or may not "
                f"have committed: ask with client.transaction_outcome(id), or run it again "
                f"with client.transaction(id=...) (commits at most once)",
                transaction_id=self.id,
                code=e.code,
                reason=e.reason,
            )
        return e

    def __enter__(self) -> "Transaction":
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None and self._broken is not None:
            self._check_open()  # given up before the commit: say it did not commit
        if self._done:
            return
        if exc_type is None:
            self.commit()
        else:
            try:
                self.abort()
            except MqError:
                pass  # the exception already on its way matters more

    def __del__(self) -> None:
        try:
            if not self._done:
                self._stream.finish()  # the broker aborts a transaction whose stream ends
        except Exception:  # noqa: BLE001
            pass
