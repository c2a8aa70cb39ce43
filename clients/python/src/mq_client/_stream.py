"""A bidirectional gRPC stream driven from synchronous code.

Requests go through a queue that the request iterator handed to grpcio reads, so the request
side stays open until :meth:`BidiStream.half_close` (a half-closed Receive stream makes the
broker end it). Responses are pumped by a daemon thread into a queue, so reads can wait with a
timeout.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Generic, Iterator, Optional, TypeVar

import grpc

Req = TypeVar("Req")
Resp = TypeVar("Resp")

_END = object()


class StreamEnded(Exception):
    """The broker ended the stream: ``error`` is the ``grpc.RpcError`` (``None``: ended OK)."""

    def __init__(self, error: Optional[grpc.RpcError]) -> None:
        super().__init__(str(error) if error is not None else "stream ended")
        self.error = error


class BidiStream(Generic[Req, Resp]):
    def __init__(
        self,
        method: Callable[..., Any],
        metadata: "tuple[tuple[str, str], ...]",
        requests: Optional[Callable[[], Iterator[Req]]] = None,
    ) -> None:
        self._requests: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._responses: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._ended: Optional[StreamEnded] = None
        self._half_closed = False
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
            for resp in self.call:
                self._responses.put(resp)
            self._responses.put(StreamEnded(None))
        except grpc.RpcError as e:
            self._responses.put(StreamEnded(e))
        except Exception as e:  # noqa: BLE001 - surfaced to the reader, never lost
            self._responses.put(StreamEnded(_LocalError(e)))
        finally:
            # The call is over: release grpcio's thread that waits in the request iterator.
            self._requests.put(_END)

    def send(self, request: Req) -> None:
        if not self._half_closed:
            self._requests.put(request)

    def half_close(self) -> None:
        if not self._half_closed:
            self._half_closed = True
            self._requests.put(_END)

    @property
    def ended(self) -> Optional[StreamEnded]:
        return self._ended

    def recv(self, timeout: Optional[float]) -> Optional[Resp]:
        """The next response; ``None`` if none came within ``timeout`` seconds (``None``: wait
        as long as it takes). Raises :class:`StreamEnded` once the stream is over (and on every
        later call)."""
        if self._ended is not None:
            raise self._ended
        try:
            item = self._responses.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, StreamEnded):
            self._ended = item
            raise item
        return item  # type: ignore[no-any-return]

    def cancel(self) -> None:
        self.half_close()
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
