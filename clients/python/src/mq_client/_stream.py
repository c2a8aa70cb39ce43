"""A bidirectional gRPC stream driven from synchronous code.

Requests go through a queue that the request iterator handed to grpcio reads, so the request
side stays open until :meth:`BidiStream.half_close` (a half-closed Receive stream makes the
broker end it). Responses are pumped by a daemon thread into a bounded buffer, so reads can wait
with a timeout: once ``max_buffered`` responses wait unread the thread stops reading, and
gRPC's flow control holds the broker back (a broker that floods the stream cannot make the
client's memory grow without bound). An optional ``check`` sees every response in the pump
thread and can end the stream with an error (a broker that breaks the protocol).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Deque, Generic, Iterator, Optional, TypeVar

import grpc

if TYPE_CHECKING:  # pragma: no cover
    from ._errors import MqError

Req = TypeVar("Req")
Resp = TypeVar("Resp")

_END = object()

#: Responses buffered unread at most (per stream) before the pump thread stops reading.
MAX_BUFFERED = 16


class StreamEnded(Exception):
    """The stream is over: ``error`` is the ``grpc.RpcError`` that ended it (``None``: ended
    OK), ``mq_error`` the client's own reason when it ended the stream itself (a response that
    broke the protocol)."""

    def __init__(
        self, error: Optional[grpc.RpcError], mq_error: Optional["MqError"] = None
    ) -> None:
        super().__init__(
            str(mq_error)
            if mq_error is not None
            else str(error)
            if error is not None
            else "stream ended"
        )
        self.error = error
        self.mq_error = mq_error


class _Buffer:
    """A bounded FIFO whose ``put`` waits while it is full, unless the stream was given up
    (then ordinary items are dropped); the final :class:`StreamEnded` always gets in."""

    def __init__(self, maxsize: int) -> None:
        self._items: Deque[Any] = deque()
        self._max = max(1, maxsize)
        self._cond = threading.Condition(threading.Lock())
        self._discard = False

    def put(self, item: Any) -> None:
        with self._cond:
            if not isinstance(item, StreamEnded):
                while len(self._items) >= self._max and not self._discard:
                    self._cond.wait()
                if self._discard:
                    return
            self._items.append(item)
            self._cond.notify_all()

    def get(self, timeout: Optional[float]) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._items:
                if deadline is None:
                    self._cond.wait()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    raise queue.Empty
                self._cond.wait(left)
            item = self._items.popleft()
            self._cond.notify_all()
            return item

    def qsize(self) -> int:
        with self._cond:
            return len(self._items)

    def discard(self) -> None:
        """Nobody reads any more: drop what waits and every later response (not the end)."""
        with self._cond:
            self._discard = True
            self._items = deque(i for i in self._items if isinstance(i, StreamEnded))
            self._cond.notify_all()


class BidiStream(Generic[Req, Resp]):
    def __init__(
        self,
        method: Callable[..., Any],
        metadata: "tuple[tuple[str, str], ...]",
        requests: Optional[Callable[[], Iterator[Req]]] = None,
        *,
        check: Optional[Callable[[Any], Optional["MqError"]]] = None,
        max_buffered: int = MAX_BUFFERED,
    ) -> None:
        self._requests: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._responses = _Buffer(max_buffered)
        self._ended: Optional[StreamEnded] = None
        # The end as the pump thread saw it, before the reader has read up to it.
        self._end_seen: Optional[StreamEnded] = None
        # The pump thread waits for gRPC's next response: it has read all that came.
        self._waiting = False
        self._half_closed = False
        self._check = check
        source = requests() if requests is not None else self._request_iter()
        self.call = method(source, metadata=metadata)
        self._pump_thread = threading.Thread(target=self._pump, name="mq-stream", daemon=True)
        self._pump_thread.start()

    def _request_iter(self) -> Iterator[Req]:
        while True:
            r = self._requests.get()
            if r is _END:
                return
            yield r

    def _pump(self) -> None:
        try:
            responses = iter(self.call)
            while True:
                self._waiting = True
                try:
                    resp = next(responses)
                except StopIteration:
                    break
                finally:
                    self._waiting = False
                if self._check is not None:
                    bad = self._check(resp)
                    if bad is not None:
                        # The broker broke the protocol: end the stream here, with that reason.
                        self._end(StreamEnded(None, bad))
                        try:
                            self.call.cancel()
                        except Exception:  # noqa: BLE001
                            pass
                        return
                self._responses.put(resp)
            self._end(StreamEnded(None))
        except grpc.RpcError as e:
            self._end(StreamEnded(e))
        except Exception as e:  # noqa: BLE001 - surfaced to the reader, never lost
            self._end(StreamEnded(_LocalError(e)))
        finally:
            # The call is over: release grpcio's thread that waits in the request iterator.
            self._requests.put(_END)

    def _end(self, end: StreamEnded) -> None:
        self._end_seen = end
        self._responses.put(end)

    def send(self, request: Req) -> None:
        if not self._half_closed:
            self._requests.put(request)

    def half_close(self) -> None:
        if not self._half_closed:
            self._half_closed = True
            self._requests.put(_END)

    def detach(self) -> None:
        """Nobody will read the responses any more: the pump thread drops them (and reads on
        until the stream ends) instead of waiting for room in the buffer."""
        self._responses.discard()

    def finish(self) -> None:
        """Half-closes and reads no more: what the broker still sends is dropped."""
        self.half_close()
        self.detach()

    @property
    def ended(self) -> Optional[StreamEnded]:
        return self._ended

    def caught_up(self) -> bool:
        """Whether the pump thread has read every response that came and waits for the next:
        an end that came would have been seen (not so while it handles a response or waits for
        room in a full buffer: an end may then wait unseen behind responses)."""
        return self._waiting

    def over(self) -> Optional[StreamEnded]:
        """How the stream ended if it is known to be over, though responses before the end may
        still wait unread (``recv`` hands them out first); ``None`` while it may go on. Known
        once the pump thread has read the end, or once gRPC has the call's status (which it
        gives only after every response was read: a moment before the pump thread wakes)."""
        end = self._ended if self._ended is not None else self._end_seen
        if end is not None:
            return end
        try:
            done = self.call.done()
        except Exception:  # noqa: BLE001 - a call object without done(): the pump will tell
            return None
        if not done:
            return None
        end = self._end_seen  # the pump may have set it meanwhile, with a reason of its own
        if end is not None:
            return end
        return StreamEnded(None if self.call.code() == grpc.StatusCode.OK else self.call)

    def recv(self, timeout: Optional[float]) -> Optional[Resp]:
        """The next response; ``None`` if none came within ``timeout`` seconds (``None``: wait
        as long as it takes). Raises :class:`StreamEnded` once the stream is over (and on every
        later call)."""
        if self._ended is not None:
            raise self._ended
        try:
            item = self._responses.get(max(0.0, timeout) if timeout is not None else None)
        except queue.Empty:
            return None
        if isinstance(item, StreamEnded):
            self._ended = item
            raise item
        return item  # type: ignore[no-any-return]

    def cancel(self) -> None:
        self.half_close()
        self.detach()
        try:
            self.call.cancel()
        except Exception:  # noqa: BLE001
            pass


class _LocalError(grpc.RpcError):
    """An exception inside the client's own stream plumbing, shaped as an RpcError."""

    def __init__(self, e: BaseException) -> None:
        super().__init__(str(e))
        self._e = e

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INTERNAL

    def details(self) -> str:
        return f"client error in the stream: {self._e!r}"

    def trailing_metadata(self) -> "tuple[()]":
        return ()
