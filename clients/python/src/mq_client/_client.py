"""``Client``: one connection to a broker, queue administration, and handles to queues."""

from __future__ import annotations

import base64
import os
import threading
import uuid
from collections import OrderedDict
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type, TypeVar, Union
from urllib.parse import urlsplit

import grpc

from . import _wire
from ._errors import (
    ConnectError,
    IncompatibleBroker,
    IncompatibleCall,
    InternalError,
    MqError,
    NotFound,
    QueueExists,
    QueueNotFound,
    Timeout,
    TransactionInDoubt,
    Unavailable,
    from_rpc_error,
)
from ._message import (
    BrokerInfo,
    OutgoingQueue,
    QueueInfo,
    TransactionStatus,
    id_bytes,
    to_uuid,
)

T = TypeVar("T")

#: Queues whose send streams a client keeps for :meth:`Queue.send` at most.
_MAX_KEPT = 8

#: Queues :meth:`Client.list_queues` asks for per page.
_LIST_PAGE = 5000
#: Queues :meth:`Client.list_queues` takes in all, at most (a broker holds far fewer); a list
#: that goes on is a broken or hostile broker's.
_MAX_LISTED_QUEUES = 5_000_000
#: Pages :meth:`Client.list_queues` asks for, at most.
_MAX_LIST_PAGES = 10_000

#: The broker URL used when none is given and ``MQ_BROKER`` is not set.
DEFAULT_BROKER_URL = "http://127.0.0.1:1801"

PemSource = Union[bytes, str, "os.PathLike[str]"]


def _pem(source: PemSource) -> bytes:
    """PEM bytes, PEM text, or the path of a PEM file."""
    if isinstance(source, bytes):
        return source
    if isinstance(source, str) and source.lstrip().startswith("-----BEGIN"):
        return source.encode()
    with open(source, "rb") as f:
        return f.read()


class Client:
    """A connection to one broker.

    ``url`` is ``http://host:port`` (plaintext), ``https://host:port`` (TLS) or ``unix:PATH``
    (the broker's Unix socket, ``mqd --unix-socket``); default ``$MQ_BROKER`` or
    ``http://127.0.0.1:1801``. With TLS, ``ca`` is the CA that signed the
    broker's certificate (PEM bytes or text, or a file path; default: the system's roots),
    ``cert``/``key`` a client certificate for mTLS, ``domain`` the name to expect in the
    broker's certificate if not the URL's host. ``user``/``password`` authenticate with Basic
    credentials, ``token`` with a bearer token; they go on every call (as the Rust client does).

    Connecting waits up to ``connect_timeout`` seconds for the broker, then asks its protocol
    revision (``GetBrokerInfo``) and raises :class:`IncompatibleBroker` if it is too old for
    this client (``check_version=False`` skips that). Unary calls wait at most
    ``call_timeout`` seconds (plus what the call itself waits for).

    A client is thread-safe; close it with :meth:`close` or use it as a context manager.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        *,
        ca: Optional[PemSource] = None,
        cert: Optional[PemSource] = None,
        key: Optional[PemSource] = None,
        domain: Optional[str] = None,
        user: Optional[str] = None,
        password: Optional[str] = None,
        token: Optional[str] = None,
        connect_timeout: float = 5.0,
        call_timeout: float = 30.0,
        check_version: bool = True,
        min_protocol_version: int = _wire.MIN_BROKER_PROTOCOL_VERSION,
    ) -> None:
        self.url = url or os.environ.get("MQ_BROKER") or DEFAULT_BROKER_URL
        self.call_timeout = call_timeout
        self._metadata = self._credentials(user, password, token)
        self._channel = self._open_channel(ca, cert, key, domain)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            tls = (
                " and is its certificate signed by the CA given (ca=...) for this host name"
                " (domain=...)?"
                if self.url.startswith("https://")
                else "?"
            )
            raise ConnectError(
                f"cannot reach the broker at {self.url}: no connection within "
                f"{connect_timeout:g} s; is mqd running there (set MQ_BROKER or the url){tls}"
            ) from None
        self._stubs = _wire.Stubs(self._channel)
        self._broker_info: Optional[BrokerInfo] = None
        # Queue.send's kept senders, most recently used last (see _send_one).
        self._kept_lock = threading.Lock()
        self._kept: "OrderedDict[Tuple[str, bool], Any]" = OrderedDict()
        self._one_shot_opened = 0
        if check_version:
            try:
                self._check_version(min_protocol_version)
            except BaseException:
                self._channel.close()
                raise

    # -- connection ---------------------------------------------------------------------------

    def _credentials(
        self, user: Optional[str], password: Optional[str], token: Optional[str]
    ) -> "tuple[tuple[str, str], ...]":
        if token is not None and user is not None:
            raise ConnectError("give a user and password or a token, not both")
        if token is not None:
            t = token.strip()
            if not t or not all(0x21 <= ord(c) <= 0x7E for c in t):
                raise ConnectError("the bearer token is not valid header text (visible ASCII only)")
            return (("authorization", f"Bearer {t}"),)
        if user is not None:
            raw = base64.b64encode(f"{user}:{password or ''}".encode()).decode()
            return (("authorization", f"Basic {raw}"),)
        return ()

    def _open_channel(
        self,
        ca: Optional[PemSource],
        cert: Optional[PemSource],
        key: Optional[PemSource],
        domain: Optional[str],
    ) -> grpc.Channel:
        options: List["tuple[str, Any]"] = [
            # The broker sends messages up to 64 MiB (a Peek page, a Receive batch with big
            # bodies); gRPC's default limit is 4 MiB.
            ("grpc.max_receive_message_length", _wire.MAX_GRPC_MESSAGE),
            ("grpc.max_send_message_length", _wire.MAX_GRPC_MESSAGE),
            ("grpc.keepalive_time_ms", 10_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
            # One channel per Client: streams of one client share one connection, as in Rust.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if self.url.startswith("unix:"):
            # The broker's Unix socket (mqd --unix-socket): gRPC's own unix:PATH target.
            if not self.url[len("unix:") :].lstrip("/"):
                raise ConnectError("a unix: URL needs the socket's path (unix:/run/mqd/mqd.sock)")
            if ca is not None or cert is not None or key is not None:
                raise ConnectError(
                    "a CA or client certificate was given but a unix: socket does not use TLS"
                )
            # gRPC's C core sends the socket's path as the HTTP/2 :authority, which mqd's HTTP/2
            # server refuses as malformed (RST_STREAM, PROTOCOL_ERROR): name localhost instead.
            options.append(("grpc.default_authority", "localhost"))
            return grpc.insecure_channel(self.url, options=options)
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConnectError(
                f"{self.url[:200]!r} is not a broker URL (http://host:port, https://host:port "
                "or unix:PATH)"
            )
        host = parts.hostname
        if ":" in host:
            host = f"[{host}]"
        target = f"{host}:{parts.port or (443 if parts.scheme == 'https' else 80)}"
        if parts.scheme == "http":
            if ca is not None or cert is not None or key is not None:
                raise ConnectError(
                    "a CA or client certificate was given but the URL is not https://"
                )
            return grpc.insecure_channel(target, options=options)
        if (cert is None) != (key is None):
            raise ConnectError("a client certificate needs both cert and key")
        creds = grpc.ssl_channel_credentials(
            root_certificates=_pem(ca) if ca is not None else None,
            private_key=_pem(key) if key is not None else None,
            certificate_chain=_pem(cert) if cert is not None else None,
        )
        if domain:
            options.append(("grpc.ssl_target_name_override", domain))
        return grpc.secure_channel(target, creds, options=options)

    def _check_version(self, minimum: int) -> None:
        try:
            info = self.broker_info()
        except IncompatibleCall:
            # Revision 2 moved every call to new services: an older broker answers none.
            raise IncompatibleBroker(
                f"the broker at {self.url} does not answer GetBrokerInfo on "
                f"mq.v1.MessageQueueService: it speaks an mq.v1 revision older than {minimum}; "
                f"this client (mq-client, revision {_wire.PROTOCOL_VERSION}) needs revision "
                f"{minimum} or newer: upgrade mqd, or use an older mq-client",
                broker_revision=0,
                client_revision=_wire.PROTOCOL_VERSION,
            ) from None
        if info.protocol_version < minimum:
            raise IncompatibleBroker(
                f"the broker at {self.url} (mqd {info.version}) speaks mq.v1 revision "
                f"{info.protocol_version}; this client (mq-client, revision "
                f"{_wire.PROTOCOL_VERSION}) needs revision {minimum} or newer: upgrade mqd, "
                f"or use an older mq-client",
                broker_revision=info.protocol_version,
                client_revision=_wire.PROTOCOL_VERSION,
            )

    def close(self) -> None:
        """Closes the connection; streams still open on it end."""
        with self._kept_lock:
            kept = list(self._kept.values())
            self._kept.clear()
        for s in kept:
            s._retire()
        self._channel.close()

    @property
    def one_shot_senders_opened(self) -> int:
        """Send streams :meth:`Queue.send` has opened on this client. It keeps one per queue
        (and per ``transactional``), for the 8 queues sent to most recently, and opens another
        only for a new queue or when the broker ended the kept one."""
        with self._kept_lock:
            return self._one_shot_opened

    def _send_one(self, destination: str, transactional: bool, m: Any) -> uuid.UUID:
        """Sends the wire message ``m`` on the kept sender for ``destination`` (opening one if
        there is none, or if the kept one had ended before ``m`` was offered) and waits for its
        answer."""
        from ._sender import NotSent, Sender

        key = (destination, transactional)
        why: Optional[MqError] = None
        for _ in range(3):
            with self._kept_lock:
                kept = self._kept.get(key)
                if kept is not None:
                    self._kept.move_to_end(key)
            if kept is None:
                new = Sender(self, destination, transactional=transactional)
                retired = []
                with self._kept_lock:
                    self._one_shot_opened += 1
                    other = self._kept.get(key)
                    if other is not None and not other._ended:
                        # Another thread kept one meanwhile: use it.
                        kept = other
                        retired.append(new)
                    else:
                        kept = new
                        self._kept[key] = new
                        self._kept.move_to_end(key)
                        while len(self._kept) > _MAX_KEPT:
                            retired.append(self._kept.popitem(last=False)[1])
                for r in retired:
                    r._retire()
            try:
                return kept._send_one(m)
            except (Timeout, TransactionInDoubt):
                # No answer within call_timeout: this stream is not trusted to answer the next
                # send either; the next one opens another.
                with self._kept_lock:
                    if self._kept.get(key) is kept:
                        del self._kept[key]
                kept._after_timeout()
                raise
            except NotSent as e:
                why = e.args[0] if e.args else None
                with self._kept_lock:
                    if self._kept.get(key) is kept:
                        del self._kept[key]
        if why is not None:
            raise why
        raise Unavailable(f"the send stream to {destination} ended before it took the message")

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: Callable[..., T],
        request: Any,
        *,
        wait: float = 0.0,
        what: str = "",
        not_found: Type[MqError] = NotFound,
        already_exists: Optional[Type[MqError]] = None,
    ) -> T:
        """A unary call with the call deadline plus ``wait`` (what the call itself waits for)."""
        try:
            return method(request, metadata=self._metadata, timeout=self.call_timeout + wait)
        except grpc.RpcError as e:
            kw = {"already_exists": already_exists} if already_exists else {}
            raise from_rpc_error(e, not_found=not_found, what=what, **kw) from None

    # -- broker -------------------------------------------------------------------------------

    def broker_info(self) -> BrokerInfo:
        """What the broker is: name, version, protocol revision, limits (``GetBrokerInfo``)."""
        info = BrokerInfo.from_wire(
            self._call(self._stubs.broker.GetBrokerInfo, _wire.empty(), what="to GetBrokerInfo")
        )
        self._broker_info = info
        return info

    @property
    def protocol_version(self) -> int:
        """The revision of mq.v1 this client speaks."""
        return _wire.PROTOCOL_VERSION

    # -- queues -------------------------------------------------------------------------------

    def queue(self, name: str) -> "Queue":
        """A handle to queue ``name`` (a path name such as ``.\\private$\\orders`` or a format
        name); nothing is checked until it is used."""
        from ._queue import Queue

        return Queue(self, name)

    def create_queue(
        self,
        name: str,
        transactional: bool = False,
        *,
        label: str = "",
        quota_bytes: Optional[int] = None,
        max_aborts: int = 0,
        exist_ok: bool = False,
    ) -> QueueInfo:
        """Creates a queue. Raises :class:`QueueExists` if it exists (unless ``exist_ok``:
        then returns the existing queue's info)."""
        req = _wire.CreateQueueRequest(
            name=name, transactional=transactional, label=label, max_aborts=max_aborts
        )
        if quota_bytes is not None:
            req.quota_bytes = quota_bytes
        try:
            return QueueInfo.from_wire(
                self._call(self._stubs.admin.CreateQueue, req, already_exists=QueueExists)
            )
        except QueueExists:
            if exist_ok:
                return self.queue_info(name)
            raise

    def delete_queue(self, name: str) -> None:
        """Deletes a queue and every message in it."""
        self._call(
            self._stubs.admin.DeleteQueue,
            _wire.DeleteQueueRequest(name=name),
            not_found=QueueNotFound,
        )

    def queue_info(self, name: str) -> QueueInfo:
        """A queue's description and counters."""
        return QueueInfo.from_wire(
            self._call(
                self._stubs.admin.GetQueueInfo,
                _wire.GetQueueInfoRequest(name=name),
                not_found=QueueNotFound,
            )
        )

    def list_queues(self) -> List[QueueInfo]:
        """Every queue the caller may see, in name order. Asks for 5,000 at a time and follows
        the broker's page tokens; a list that does not end (a page larger than asked for, a
        token not past the one before, more than 5,000,000 queues or 10,000 pages) is
        :class:`InternalError`."""
        out: List[QueueInfo] = []
        token = ""
        for _ in range(_MAX_LIST_PAGES):
            r = self._call(
                self._stubs.admin.ListQueues,
                _wire.ListQueuesRequest(page_size=_LIST_PAGE, page_token=token),
            )
            nxt = r.next_page_token
            if (
                len(r.queues) > _LIST_PAGE
                or (nxt and nxt <= token)
                or len(out) + len(r.queues) > _MAX_LISTED_QUEUES
            ):
                raise InternalError(
                    f"the broker's queue list does not end: a page of {len(r.queues)} queues "
                    f"(asked for {_LIST_PAGE}), next token {nxt[:100]!r} after "
                    f"{token[:100]!r}, {len(out)} queues so far (at most "
                    f"{_MAX_LISTED_QUEUES})"
                )
            out.extend(QueueInfo.from_wire(q) for q in r.queues)
            if not nxt:
                return out
            token = nxt
        raise InternalError(
            f"the broker's queue list does not end: {_MAX_LIST_PAGES} pages ({len(out)} queues)"
        )

    def purge(self, name: str) -> int:
        """Removes every waiting message of a queue; returns how many."""
        r = self._call(
            self._stubs.admin.Purge, _wire.PurgeRequest(name=name), not_found=QueueNotFound
        )
        return int(r.purged)

    def set_queue_properties(
        self,
        name: str,
        *,
        label: Optional[str] = None,
        quota_bytes: Optional[int] = None,
        remove_quota: bool = False,
    ) -> QueueInfo:
        """Changes a queue's label or quota; what is not given stays as it is."""
        req = _wire.SetQueuePropertiesRequest(name=name, remove_quota=remove_quota)
        if label is not None:
            req.label = label
        if quota_bytes is not None:
            req.quota_bytes = quota_bytes
        return QueueInfo.from_wire(
            self._call(self._stubs.admin.SetQueueProperties, req, not_found=QueueNotFound)
        )

    def grant(self, name: str, principal: str, rights: Sequence[str]) -> "dict[str, List[str]]":
        """Grants rights (send, receive, peek, admin, all) on a queue to a principal (a user,
        ``group:NAME``, ``everyone``, ``anonymous``); returns the queue's ACL."""
        return self._change_acl(name, principal, rights, True)

    def revoke(self, name: str, principal: str, rights: Sequence[str]) -> "dict[str, List[str]]":
        """Revokes rights on a queue; returns the queue's ACL."""
        return self._change_acl(name, principal, rights, False)

    def acl(self, name: str) -> "dict[str, List[str]]":
        """A queue's ACL: principal -> rights."""
        r = self._call(
            self._stubs.admin.GetAcl, _wire.GetAclRequest(name=name), not_found=QueueNotFound
        )
        return {e.principal: list(e.rights) for e in r.entries}

    def _change_acl(
        self, name: str, principal: str, rights: Sequence[str], grant: bool
    ) -> "dict[str, List[str]]":
        req = _wire.ChangeAclRequest(
            queue=name, principal=principal, rights=list(rights), grant=grant
        )
        r = self._call(self._stubs.admin.ChangeAcl, req, not_found=QueueNotFound)
        return {e.principal: list(e.rights) for e in r.entries}

    def move_message(
        self, queue: str, id: Union[uuid.UUID, bytes, str], destination: str = ""
    ) -> "Message":
        """Moves one waiting message between a queue and its subqueues, or out of a dead-letter
        queue (see the proto's MoveMessage); returns it as it is now (body omitted)."""
        from ._message import Message

        r = self._call(
            self._stubs.queue.MoveMessage,
            _wire.MoveMessageRequest(queue=queue, id=id_bytes(id), destination=destination),
        )
        return Message.from_wire(r.message)

    # -- outgoing queues (store-and-forward) ---------------------------------------------------

    def outgoing(self) -> List[OutgoingQueue]:
        """The outgoing queues: one per destination broker this broker forwards to."""
        r = self._call(self._stubs.admin.ListOutgoing, _wire.ListOutgoingRequest())
        return [OutgoingQueue.from_wire(o) for o in r.queues]

    def pause_outgoing(self, destination: str) -> OutgoingQueue:
        """Stops forwarding to ``destination`` (``host:port`` as :meth:`outgoing` shows it, or
        the format name of any queue there) until :meth:`resume_outgoing`."""
        return OutgoingQueue.from_wire(
            self._call(
                self._stubs.admin.PauseOutgoing,
                _wire.PauseOutgoingRequest(destination=destination),
            )
        )

    def resume_outgoing(self, destination: str) -> OutgoingQueue:
        """Forwards to ``destination`` again."""
        return OutgoingQueue.from_wire(
            self._call(
                self._stubs.admin.ResumeOutgoing,
                _wire.ResumeOutgoingRequest(destination=destination),
            )
        )

    def delete_outgoing(self, destination: str) -> None:
        """Deletes an empty outgoing queue (refused while it holds messages)."""
        self._call(
            self._stubs.admin.DeleteOutgoing, _wire.DeleteOutgoingRequest(destination=destination)
        )

    def purge_outgoing(self, destination: str) -> int:
        """Removes every message waiting to be forwarded to ``destination`` (a broker that will
        never come back) and returns how many; those in flight to it stay (pause it first)."""
        reply = self._call(
            self._stubs.admin.PurgeOutgoing, _wire.PurgeOutgoingRequest(destination=destination)
        )
        return int(reply.purged)

    # -- sending, transactions ----------------------------------------------------------------

    def sender(
        self,
        destination: str,
        *,
        transactional: bool = False,
        window: int = 8192,
        max_batch: int = 512,
        max_batch_bytes: int = 1024 * 1024,
    ) -> "Sender":
        """A pipelining sender to ``destination`` (see :class:`Sender`)."""
        from ._sender import Sender

        return Sender(
            self,
            destination,
            transactional=transactional,
            window=window,
            max_batch=max_batch,
            max_batch_bytes=max_batch_bytes,
        )

    def transaction(
        self,
        id: Optional[Union[uuid.UUID, bytes, str]] = None,
        *,
        commit_timeout: Optional[float] = None,
    ) -> "Transaction":
        """A transaction across transactional queues; use it with ``with``: commits when the
        block ends, aborts when it raises. ``id``: the transaction's id (default a new UUID v7);
        a transaction whose id already committed raises :class:`AlreadyCommitted` and does
        nothing, so running an in-doubt transaction again with its id commits at most once."""
        from ._transaction import Transaction

        return Transaction(
            self,
            to_uuid(id_bytes(id)) if id is not None else None,
            commit_timeout=commit_timeout if commit_timeout is not None else self.call_timeout,
        )

    def transaction_outcome(self, id: Union[uuid.UUID, bytes, str]) -> TransactionStatus:
        """Whether a transaction committed (for one whose commit answer was lost)."""
        r = self._call(
            self._stubs.queue.TransactionOutcome,
            _wire.TransactionOutcomeRequest(id=id_bytes(id)),
        )
        names = {
            _wire.TX_OUTCOME_COMMITTED: "committed",
            _wire.TX_OUTCOME_ABORTED: "aborted",
            _wire.TX_OUTCOME_IN_PROGRESS: "in_progress",
        }
        return TransactionStatus(
            outcome=names.get(r.outcome, "unknown"),
            time_ms=r.time_ms or None,
            detail=r.detail,
            retention_ms=r.retention_ms,
        )


# For type hints only (imported lazily above to keep import order simple).
from ._message import Message  # noqa: E402
from ._queue import Queue  # noqa: E402
from ._sender import Sender  # noqa: E402
from ._transaction import Transaction  # noqa: E402
