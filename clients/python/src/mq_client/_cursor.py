"""``Cursor``: a position in one queue (MSMQ's MQCreateCursor, .NET MessageEnumerator) on a
Browse stream: each action is one request answered by one response, in order."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from . import _wire
from ._errors import (
    FailedPrecondition,
    InternalError,
    MessageNotFound,
    QueueNotFound,
    Timeout,
    from_rpc_error,
)
from ._message import Message, timeout_ms
from ._stream import BidiStream, StreamEnded

if TYPE_CHECKING:  # pragma: no cover
    from ._client import Client


class Cursor:
    """From :meth:`Queue.cursor`; use it with ``with`` (or :meth:`close`). It points at a
    position, not at a message: other receivers may take messages around it. The broker closes
    a cursor idle longer than ``mqd --cursor-idle-secs`` and refuses more than
    ``mqd --max-cursors-per-connection`` per connection.

    Each action waits at most the client's ``call_timeout`` (plus its own ``timeout``). If no
    answer comes in time the action raises :class:`Timeout` and the cursor is broken: its
    stream is cancelled (a late answer would otherwise be taken for the next action's) and
    every later action raises :class:`FailedPrecondition`; open a new cursor. A broker answer
    the cursor does not understand breaks it the same way."""

    def __init__(self, client: "Client", queue: str) -> None:
        self.queue = queue
        self._call_timeout = client.call_timeout
        self._first = True
        self._broken: Optional[str] = None
        self._stream: BidiStream[Any, Any] = BidiStream(
            client._stubs.queue.Browse, client._metadata
        )

    def peek_current(self, timeout: float = 0.0) -> Optional[Message]:
        """The message at the cursor (on a new cursor, or after :meth:`receive_current`: the
        next one), waiting up to ``timeout`` seconds for one; ``None`` if none came. Raises
        :class:`MessageNotFound` if another receiver took the message at the cursor
        (MQ_ERROR_MESSAGE_ALREADY_RECEIVED): :meth:`peek_next` moves on."""
        return self._act(_wire.CURSOR_PEEK_CURRENT, timeout)

    def peek_next(self, timeout: float = 0.0) -> Optional[Message]:
        """Moves to the next message and peeks it; ``None`` at the end of the queue (the cursor
        stays where it was)."""
        return self._act(_wire.CURSOR_PEEK_NEXT, timeout)

    def receive_current(self, timeout: float = 0.0) -> Optional[Message]:
        """Removes the message at the cursor and returns it; the cursor then points at the next
        one (read it with :meth:`peek_current`).

        At most once: the broker removes the message before its answer travels back, so if
        the answer is lost or too late (:class:`Timeout`) the message may be gone without
        reaching the caller. When every message matters, use ``Queue.receive(max_messages=1)``
        with :meth:`Message.ack`, or ``Transaction.receive_by_id`` on the id peeked here."""
        return self._act(_wire.CURSOR_RECEIVE_CURRENT, timeout)

    def _act(self, action: Any, timeout: float) -> Optional[Message]:
        if self._broken is not None:
            raise FailedPrecondition(
                f"the cursor on {self.queue[:200]!r} is broken ({self._broken}); open a new one"
            )
        wait_ms = timeout_ms(timeout)
        self._stream.send(
            _wire.BrowseRequest(
                queue=self.queue if self._first else "",
                action=action,
                timeout_ms=wait_ms,
            )
        )
        self._first = False
        limit = self._call_timeout + timeout
        try:
            r = self._stream.recv(limit)
        except StreamEnded as end:
            self._broken = "its stream ended"
            if end.error is None:
                raise InternalError("the broker ended the cursor's stream") from None
            raise from_rpc_error(end.error, not_found=QueueNotFound) from None
        if r is None:
            self._break(f"an action got no answer within {limit:g} s")
            removing = action == _wire.CURSOR_RECEIVE_CURRENT
            raise Timeout(
                f"no answer to a cursor action within {limit:g} s; the cursor is broken (open a "
                f"new one)"
                + (
                    "; the broker may have removed the message at the cursor already: it may "
                    "be lost"
                    if removing
                    else ""
                )
            )
        try:
            return self._answer(r)
        except InternalError as e:
            self._break(f"the broker's answer was not understood: {e}")
            raise

    def _answer(self, r: Any) -> Optional[Message]:
        if r.status == _wire.CURSOR_STATUS_OK:
            if not r.HasField("message"):
                raise InternalError("the broker answered a cursor action OK without a message")
            return Message.from_wire(r.message)
        if r.status == _wire.CURSOR_STATUS_TIMEOUT:
            return None
        if r.status == _wire.CURSOR_STATUS_ALREADY_RECEIVED:
            raise MessageNotFound(
                f"the message at the cursor in queue {self.queue[:200]!r} was taken by another "
                "receiver (MQ_ERROR_MESSAGE_ALREADY_RECEIVED); peek_next moves on"
            )
        raise InternalError(f"unexpected cursor status from the broker: {r.status}")

    def _break(self, why: str) -> None:
        """Gives the stream up: answers after this one could no longer be matched to actions."""
        self._broken = why
        self._stream.cancel()

    def close(self) -> None:
        """Closes the cursor (ends its stream)."""
        self._stream.finish()

    def __enter__(self) -> "Cursor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._stream.finish()
        except Exception:  # noqa: BLE001
            pass
