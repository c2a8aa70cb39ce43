//! The `mq.v1` gRPC services (`MessageQueueService`, `AdminService`, `ForwardService`): converts wire requests, calls the [`Broker`], streams.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use futures::Stream;
use mq_proto::v1::{
    self, admin_service_server::AdminService, forward_service_server::ForwardService,
    message_queue_service_server::MessageQueueService,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Acl, Auth, Identity, Right};
use crate::broker::Broker;
use crate::error::BrokerError;
use crate::flow::{Connection, Connections};
use crate::queue::{Entry, PeekCursor, Queue, Select};
use crate::transaction::Transaction;

/// Most messages pushed to a receiver in one stream item.
const MAX_DELIVERY_BATCH: usize = 256;
/// Most body bytes taken for one delivery.
const MAX_DELIVERY_BATCH_BYTES: usize = 4 * 1024 * 1024;

/// What one delivery batch is counted at most against its stream's and connection's budgets
/// of deliveries not yet written (`crate::unsent`): [`MAX_DELIVERY_BATCH_BYTES`], or the
/// largest message a client may send with its overhead, so that any one fits alone.
pub(crate) fn delivery_batch_bytes(config: &crate::config::BrokerConfig) -> usize {
    MAX_DELIVERY_BATCH_BYTES.max(
        config
            .max_body_bytes
            .saturating_add(crate::unsent::DELIVERY_OVERHEAD_BYTES),
    )
}

/// A delivery and the count it holds against its budgets until it is written.
pub(crate) type Delivery = (v1::ReceiveResponse, Arc<crate::unsent::Reserved>);
/// A delivery's stream item is cut once its bodies reach this size (a big body goes alone).
///
/// Each item is one gRPC message, gathered whole into one buffer on each side to be encoded
/// or decoded: an item of 256 messages of 1000 B grew a fresh 256 KB buffer (above malloc's
/// mmap threshold) for every new stream, and with 1,000 consumers each opening its stream for
/// a few hundred messages that was every delivery. Items of this size keep those buffers small;
/// the receiver decodes the first part while the rest is on the way. What it changed:
/// docs/benchmarks.md, "1,000 consumers and 200 senders".
const MAX_DELIVERY_ITEM_BYTES: usize = 64 * 1024;
/// Send batches whose acknowledgements may be pending at once on one stream.
const SEND_ACK_WINDOW: usize = 64;
/// Bytes of acknowledgements (ids and failures, in memory) a send stream may hold before its
/// client has taken them: past it the stream reads no further batch. A client that sent
/// batches of 10,000 messages that each fail and never read the answers held ~290 MB per
/// stream (129 answers of 10,000 failures each), 256 streams a connection.
const SEND_ANSWER_BYTES: usize = 8 << 20;
/// The most a batch's answer reserves before it is built: a quarter of the stream's budget, so
/// batches of a raised --max-batch-messages still overlap.
const MAX_ANSWER_RESERVE: u32 = (SEND_ANSWER_BYTES / 4) as u32;
/// Bytes reserved for a batch's acknowledgement per message before it is built (an id, or a
/// failure with its texts; a failure with longer texts takes more once it is built).
const SEND_ANSWER_BYTES_PER_MESSAGE: usize = 256;
/// Metadata on a commit's error whose outcome is unknown (the journal failed after the record
/// was issued): the stream's end then carries no `mq-tx-ended` mark, so the client says in doubt.
const TX_IN_DOUBT_METADATA: &str = "mq-tx-in-doubt";

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The service, one per broker.
#[derive(Debug, Clone)]
pub struct Service {
    broker: Arc<Broker>,
    connections: Arc<Connections>,
    auth: Arc<Auth>,
    /// Start time and addresses for `GetBrokerInfo` (absent in the fuzzing harness).
    ready: Option<Arc<crate::ready::Readiness>>,
}

impl Service {
    /// The Send call on any source of requests: tonic's `Streaming`, or the frame decoder
    /// that keeps large bodies uncopied (`large_bodies`).
    pub(crate) async fn send_from<I: crate::large_bodies::Inbound>(
        &self,
        req: Request<I>,
    ) -> Result<Response<BoxStream<v1::SendResponse>>, Status> {
        let who = Identity::of(&req);
        // Anonymous may send only to a local queue whose ACL grants it: none, no stream.
        if who.anonymous
            && self.auth.has_users()
            && !self
                .broker
                .list()
                .iter()
                .any(|q| self.auth.allowed(&who, Right::Send, Some(q)))
        {
            return Err(Status::permission_denied(
                "identity \"anonymous\" lacks the right \"send\" on every queue of this broker (no queue grants it to anonymous; give credentials)",
            ));
        }
        let budget = crate::unsent::Unsent::answers(
            self.connection(&req).unsent_budget(),
            SEND_ANSWER_BYTES,
        );
        let (broker, auth, inbound) = (self.broker.clone(), self.auth.clone(), req.into_inner());
        // Each answer carries its share of the stream's answer budget and of its connection's
        // budget of bytes built for a client that has not taken them (`crate::unsent`), given
        // back once tonic takes it from the channel to write it (SEND_ANSWER_BYTES).
        let (tx, rx) = mpsc::channel::<Answer>(SEND_ACK_WINDOW);
        tokio::spawn(send_stream(broker, auth, who, inbound, tx, budget));
        let answers = futures::StreamExt::map(ReceiverStream::new(rx), |(answer, _budget)| answer);
        Ok(Response::new(Box::pin(answers)))
    }

    pub(crate) fn new(broker: Arc<Broker>, connections: Arc<Connections>, auth: Arc<Auth>) -> Self {
        Service {
            broker,
            connections,
            auth,
            ready: None,
        }
    }

    pub(crate) fn with_readiness(mut self, ready: Arc<crate::ready::Readiness>) -> Self {
        self.ready = Some(ready);
        self
    }

    /// The Receive call, each delivery with its count against the stream's and connection's
    /// budgets of deliveries not yet written (`crate::unsent`), to be held until it is.
    pub(crate) async fn receive_counted(
        &self,
        req: Request<Streaming<v1::ReceiveRequest>>,
    ) -> Result<Response<BoxStream<Delivery>>, Status> {
        let who = Identity::of(&req);
        let conn = self.connection(&req);
        let mut inbound = req.into_inner();
        let first = first_request(&self.broker, &mut inbound, "a receive stream")
            .await?
            .ok_or_else(|| {
                Status::invalid_argument(
                    "a receive stream must start with a request naming the queue",
                )
            })?;
        let queue = self.queue_for(&who, Right::Receive, &first.queue)?;
        let broker = self.broker.clone();
        // The receiving end is shared with the stream's task, which drops what is still queued
        // when the stream ends (see `consume`).
        let (tx, rx) = mpsc::channel(4);
        let rx = Queued(Arc::new(std::sync::Mutex::new(rx)));
        let queued = rx.clone();
        tokio::spawn(consume(
            broker,
            queue,
            conn,
            inbound,
            first.credit as u64,
            Deliveries { tx, queued },
            crate::auth::Standing::new(&self.auth, &who),
        ));
        // Dropped with the response (the client reset the stream or is gone): closed, so the
        // stream's task sees its sends fail at once and puts its messages back, as it did
        // when the receiver was the response's alone (not at the ack timeout).
        let rx = CloseOnDrop(rx);
        let stream = futures::stream::poll_fn(move |cx| rx.0.lock().poll_recv(cx));
        Ok(Response::new(Box::pin(stream)))
    }

    /// The connection a request came on.
    fn connection<T>(&self, req: &Request<T>) -> Arc<Connection> {
        self.connections.get(crate::flow::peer_of(req))
    }

    /// The local queue `name` names, if `who` holds `right` on it.
    #[allow(clippy::result_large_err)]
    fn queue_for(&self, who: &Identity, right: Right, name: &str) -> Result<Arc<Queue>, Status> {
        self.broker
            .queue_allowed(name, |q| self.auth.authorize(who, right, Some(q)))
    }
}

#[tonic::async_trait]
impl MessageQueueService for Service {
    type SendStream = BoxStream<v1::SendResponse>;

    async fn send(
        &self,
        req: Request<Streaming<v1::SendRequest>>,
    ) -> Result<Response<Self::SendStream>, Status> {
        self.send_from(req).await
    }

    type ReceiveStream = BoxStream<v1::ReceiveResponse>;

    async fn receive(
        &self,
        req: Request<Streaming<v1::ReceiveRequest>>,
    ) -> Result<Response<Self::ReceiveStream>, Status> {
        // tonic encodes these (a compressed Receive): each delivery's count is given back once
        // tonic takes it to encode it.
        let (metadata, stream, extensions) = self.receive_counted(req).await?.into_parts();
        let stream: Self::ReceiveStream = Box::pin(futures::StreamExt::map(stream, |r| {
            r.map(|(delivery, _count)| delivery)
        }));
        Ok(Response::from_parts(metadata, stream, extensions))
    }

    async fn receive_one(
        &self,
        req: Request<v1::ReceiveOneRequest>,
    ) -> Result<Response<v1::ReceiveOneResponse>, Status> {
        let who = Identity::of(&req);
        let budget = self.connection(&req).unsent_budget();
        let req = req.into_inner();
        let right = if req.peek {
            Right::Peek
        } else {
            Right::Receive
        };
        let queue = self.queue_for(&who, right, &req.queue)?;
        let peek = req.peek;
        let select = crate::cursor::select_of(&req.id, &req.correlation_id)?;
        let mut hold = None;
        // A peeked message removed by someone else before its body was read is looked for
        // again, a few times (it answered INTERNAL, helper-71).
        let mut looks = 0;
        // One wait in all, whatever the looks (helper-72: each look waited the whole timeout
        // again).
        let until = tokio::time::Instant::now() + Duration::from_millis(req.timeout_ms);
        let (message, taken) = loop {
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let found = wait_for(&self.broker, &queue, left.as_millis() as u64, |q| {
                match (&select, peek) {
                    (Select::Head, true) => q.peek(1),
                    (Select::Head, false) => q.take(1),
                    (s, true) => Ok(q.peek_by(s)?.into_iter().collect()),
                    (s, false) => Ok(q.take_by(s)?.into_iter().collect()),
                }
            })
            .await?;
            let gone = || crate::cursor::not_found(&queue, &select);
            if found.is_empty() && req.timeout_ms == 0 && select != Select::Head {
                return Err(gone().into());
            }
            // Counted once a message is found, before its body is read: its answer waits for
            // its client (unsent.rs). Not while the call waits for a message: a long poll held
            // a batch of the budget, and 63 on one connection were all it could wait for
            // (helper-76). A connection whose unread answers fill its budget waits here, its
            // message taken (a receive) or not (a peek).
            let size = (hold.is_none() && !found.is_empty()).then(|| found_bytes(&found, &queue));
            if !peek {
                // Taken until HTTP/2 has taken the whole answer; this call dropped before
                // (its client reset it, or went) gives the message back (taken.rs).
                let taken = crate::taken::Taken::new(&self.broker, &queue, found);
                if let Some(size) = size {
                    hold = Some(crate::unsent::reserve_answer(budget.clone(), size).await);
                }
                break hand_out(taken).await?;
            }
            if let Some(size) = size {
                hold = Some(crate::unsent::reserve_answer(budget.clone(), size).await);
            }
            let Some(e) = found.first() else {
                break (None, None);
            };
            if let Some(body) = self.broker.peeked_body(&queue, e)? {
                let wire = e.msg.to_wire(&queue.info().format_name, body, e.aborts);
                break (Some(wire), None);
            }
            looks += 1;
            if looks == 8 {
                if select != Select::Head {
                    return Err(gone().into());
                }
                break (None, None);
            }
        };
        Ok(held(v1::ReceiveOneResponse { message }, hold, taken))
    }

    type TransactStream = BoxStream<v1::TransactResponse>;

    async fn transact(
        &self,
        req: Request<Streaming<v1::TransactRequest>>,
    ) -> Result<Response<Self::TransactStream>, Status> {
        let who = Identity::of(&req);
        let max = self.broker.config().flow.max_tx_per_connection;
        let slot = self.connection(&req).open_transaction(max).ok_or_else(|| {
            Status::resource_exhausted(format!(
                "this connection has {max} open transactions (mqd --max-tx-per-connection); commit or abort one first"
            ))
        })?;
        let (broker, auth, inbound) = (self.broker.clone(), self.auth.clone(), req.into_inner());
        let (tx, rx) = mpsc::channel(4);
        // The status the stream ends with when the replies' channel had no room for it (a
        // client that does not read): it comes after what the channel holds.
        let (last_tx, last_rx) = tokio::sync::oneshot::channel::<Status>();
        tokio::spawn(async move {
            transact(broker, auth, who, inbound, tx, last_tx).await;
            drop(slot);
        });
        let last = futures::StreamExt::filter_map(futures::stream::once(last_rx), |r| {
            std::future::ready(r.ok().map(Err))
        });
        // Every error the broker ends a transaction with means it did not commit, but a commit
        // whose journal write failed after it was issued (in doubt, like a broken connection);
        // the client tells them apart by this mark.
        let replies = futures::StreamExt::chain(ReceiverStream::new(rx), last);
        let stream = tokio_stream::StreamExt::map(replies, |r| {
            r.map_err(|mut s: Status| {
                if s.metadata().get(TX_IN_DOUBT_METADATA).is_none() {
                    s.metadata_mut().insert(
                        mq_proto::TX_ENDED_METADATA,
                        "aborted".parse().expect("ascii"),
                    );
                }
                s
            })
        });
        let mut response = Response::new(Box::pin(stream) as Self::TransactStream);
        crate::tx_reuse::announce(&mut response, self.broker.config().flow.tx_stream_idle);
        Ok(response)
    }

    async fn transaction_outcome(
        &self,
        req: Request<v1::TransactionOutcomeRequest>,
    ) -> Result<Response<v1::TransactionOutcomeResponse>, Status> {
        // With a users file, only authenticated callers learn what became of a transaction.
        let who = Identity::of(&req);
        if who.anonymous && self.auth.has_users() {
            return Err(Status::permission_denied(
                "identity \"anonymous\" may not ask for a transaction's outcome; give credentials",
            ));
        }
        let raw = req.into_inner().id;
        let id = uuid::Uuid::from_slice(&raw).map_err(|_| {
            Status::invalid_argument(format!("a transaction id is 16 bytes; got {}", raw.len()))
        })?;
        let outcomes = self.broker.outcomes();
        let a = outcomes.outcome(id);
        Ok(Response::new(v1::TransactionOutcomeResponse {
            outcome: a.outcome as i32,
            time_ms: a.time_ms,
            detail: a.detail,
            retention_ms: outcomes.retention_ms(),
        }))
    }

    async fn peek(
        &self,
        req: Request<v1::PeekRequest>,
    ) -> Result<Response<v1::PeekResponse>, Status> {
        let who = Identity::of(&req);
        let budget = self.connection(&req).unsent_budget();
        let req = req.into_inner();
        let queue = self.queue_for(&who, Right::Peek, &req.queue)?;
        // One page: the client asks for the next with `next_cursor`.
        let max = (req.max.max(1) as usize).min(crate::config::PEEK_PAGE_MESSAGES);
        let mut after = PeekCursor::decode(&req.cursor)?;
        if !req.from_id.is_empty() {
            // Start at that message (inclusive): just after the position before it.
            let select = crate::cursor::select_of(&req.from_id, "")?;
            if after.is_some() {
                return Err(Status::invalid_argument(
                    "give a cursor or from_id, not both",
                ));
            }
            let e = queue
                .peek_by(&select)?
                .ok_or_else(|| crate::cursor::not_found(&queue, &select))?;
            let p = queue.position(&e);
            after = Some(PeekCursor {
                lane: p.lane,
                seq: p.seq - 1,
            });
        }
        let mut next = None;
        let found = wait_for(&self.broker, &queue, req.timeout_ms, |q| {
            let (page, cursor) = q.peek_page(after, max, crate::config::PEEK_PAGE_BYTES)?;
            next = cursor;
            Ok(page)
        })
        .await?;
        // Counted once the page is found, before its bodies are read (not while it waits for
        // messages: helper-76).
        let hold = crate::unsent::reserve_answer(budget, found_bytes(&found, &queue)).await;
        let dest = queue.info().format_name;
        let mut messages = Vec::with_capacity(found.len());
        for e in &found {
            // One removed since the page was taken is left out.
            if let Some(body) = self.broker.peeked_body(&queue, e)? {
                messages.push(e.msg.to_wire(&dest, body, e.aborts));
            }
        }
        Ok(held(
            v1::PeekResponse {
                messages,
                next_cursor: next.map(|c| c.encode()).unwrap_or_default(),
            },
            Some(hold),
            None,
        ))
    }

    type BrowseStream = BoxStream<v1::BrowseResponse>;

    async fn browse(
        &self,
        req: Request<Streaming<v1::BrowseRequest>>,
    ) -> Result<Response<Self::BrowseStream>, Status> {
        let who = Identity::of(&req);
        let max = self.broker.config().flow.max_cursors_per_connection;
        let slot = self.connection(&req).open_cursor(max).ok_or_else(|| {
            Status::resource_exhausted(format!(
                "this connection has {max} open cursors (mqd --max-cursors-per-connection); close one first"
            ))
        })?;
        let mut inbound = req.into_inner();
        let first = first_request(&self.broker, &mut inbound, "a browse stream")
            .await?
            .ok_or_else(|| {
                Status::invalid_argument(
                    "a browse stream must start with a request naming the queue",
                )
            })?;
        let queue = self.queue_for(&who, Right::Peek, &first.queue)?;
        let (broker, auth) = (self.broker.clone(), self.auth.clone());
        // One answer waits in the channel at most (crate::cursor::run).
        Ok(spawn_stream(1, move |tx| {
            crate::cursor::run(broker, auth, who, queue, first, inbound, tx, slot)
        }))
    }

    async fn move_message(
        &self,
        req: Request<v1::MoveMessageRequest>,
    ) -> Result<Response<v1::MoveMessageResponse>, Status> {
        let who = Identity::of(&req);
        let req = req.into_inner();
        // Taking a message out of a queue (or a dead-letter queue) is a receive there; a
        // replay to another queue is a send there.
        let src = self.queue_for(&who, Right::Receive, &req.queue)?;
        let id = uuid::Uuid::from_slice(&req.id).map_err(|_| {
            Status::invalid_argument(format!("a message id is 16 bytes; got {}", req.id.len()))
        })?;
        let auth = self.auth.clone();
        let may_send = move |q: Option<&Arc<Queue>>| {
            auth.authorize(&who, Right::Send, q.map(|q| &**q))
                .map_err(|s| BrokerError::PermissionDenied(s.message().to_string()))
        };
        let message = self
            .broker
            .move_message(&src, id, &req.destination, &may_send)
            .await?;
        Ok(Response::new(v1::MoveMessageResponse {
            message: Some(message),
        }))
    }

    async fn get_broker_info(&self, req: Request<()>) -> Result<Response<v1::BrokerInfo>, Status> {
        let who = Identity::of(&req);
        let info = if who.anonymous && self.auth.has_users() {
            crate::info::public_broker_info(&self.broker, self.ready.as_deref())
        } else {
            crate::info::broker_info(&self.broker, self.ready.as_deref())
        };
        Ok(Response::new(info))
    }
}

#[tonic::async_trait]
impl AdminService for Service {
    async fn create_queue(
        &self,
        req: Request<v1::CreateQueueRequest>,
    ) -> Result<Response<v1::QueueInfo>, Status> {
        let who = Identity::of(&req);
        self.auth.authorize(&who, Right::CreateQueue, None)?;
        let q = self
            .broker
            .create_queue_with_acl(req.into_inner(), Acl::for_creator(&who))
            .await?;
        Ok(Response::new(q.info()))
    }

    async fn delete_queue(
        &self,
        req: Request<v1::DeleteQueueRequest>,
    ) -> Result<Response<()>, Status> {
        let who = Identity::of(&req);
        let name = req.into_inner().name;
        self.queue_for(&who, Right::Admin, &name)?;
        self.broker.delete_queue(&name).await?;
        Ok(Response::new(()))
    }

    async fn get_queue_info(
        &self,
        req: Request<v1::GetQueueInfoRequest>,
    ) -> Result<Response<v1::QueueInfo>, Status> {
        let who = Identity::of(&req);
        let q = self.broker.queue_seen(
            &req.into_inner().name,
            |q| {
                if self.auth.sees(&who, q) {
                    return Ok(());
                }
                self.auth.authorize(&who, Right::Peek, Some(q))
            },
            |q| self.auth.may_read(&who, q),
        )?;
        Ok(Response::new(q.info()))
    }

    async fn list_queues(
        &self,
        req: Request<v1::ListQueuesRequest>,
    ) -> Result<Response<v1::ListQueuesResponse>, Status> {
        let who = Identity::of(&req);
        let r = req.into_inner();
        // A token is a queue key this call returned, so no longer than a queue name.
        let limit = mq_proto::limits::MAX_FORMAT_NAME_ELEMENT_BYTES;
        if r.page_token.len() > limit {
            return Err(BrokerError::InvalidArgument(format!(
                "page_token is {} bytes; a token is a queue name of at most {limit} bytes (from next_page_token)",
                r.page_token.len()
            ))
            .into());
        }
        // At most MAX_QUEUE_PAGE a page, 0 ("all") included: 100,000 queues in one answer
        // took ~58 MB of mqd's memory per call until it was written (128 such calls at once on
        // one connection: +1.1 GB). More come with next_page_token.
        let max = match r.page_size {
            0 => crate::config::MAX_QUEUE_PAGE,
            n => (n as usize).min(crate::config::MAX_QUEUE_PAGE),
        };
        // The queues the caller sees are chosen before the page is cut, so a page token
        // names only a queue the caller sees: filtering after it told anonymous callers every
        // queue's name, one page of one at a time (helper-61).
        let (page, next) = self.broker.page_of_queues(&r.page_token, max, |q| {
            q.def().role.is_normal() && self.auth.sees(&who, q)
        });
        let queues = page.iter().map(|q| q.info()).collect();
        Ok(Response::new(v1::ListQueuesResponse {
            queues,
            next_page_token: next.unwrap_or_default(),
        }))
    }

    async fn purge(
        &self,
        req: Request<v1::PurgeRequest>,
    ) -> Result<Response<v1::PurgeResponse>, Status> {
        let who = Identity::of(&req);
        let name = req.into_inner().name;
        self.queue_for(&who, Right::Admin, &name)?;
        let purged = self.broker.purge(&name).await?;
        Ok(Response::new(v1::PurgeResponse { purged }))
    }

    async fn list_outgoing(
        &self,
        req: Request<v1::ListOutgoingRequest>,
    ) -> Result<Response<v1::ListOutgoingResponse>, Status> {
        self.auth.authorize_outgoing_list(&Identity::of(&req))?;
        Ok(Response::new(v1::ListOutgoingResponse {
            queues: self.broker.outgoing_list(),
        }))
    }

    async fn pause_outgoing(
        &self,
        req: Request<v1::PauseOutgoingRequest>,
    ) -> Result<Response<v1::OutgoingQueueInfo>, Status> {
        self.auth
            .authorize(&Identity::of(&req), Right::Outgoing, None)?;
        let dest = req.into_inner().destination;
        Ok(Response::new(
            self.broker.set_outgoing_paused(&dest, true).await?,
        ))
    }

    async fn resume_outgoing(
        &self,
        req: Request<v1::ResumeOutgoingRequest>,
    ) -> Result<Response<v1::OutgoingQueueInfo>, Status> {
        self.auth
            .authorize(&Identity::of(&req), Right::Outgoing, None)?;
        let dest = req.into_inner().destination;
        Ok(Response::new(
            self.broker.set_outgoing_paused(&dest, false).await?,
        ))
    }

    async fn delete_outgoing(
        &self,
        req: Request<v1::DeleteOutgoingRequest>,
    ) -> Result<Response<()>, Status> {
        self.auth
            .authorize(&Identity::of(&req), Right::Outgoing, None)?;
        let dest = req.into_inner().destination;
        self.broker.delete_outgoing(&dest).await?;
        Ok(Response::new(()))
    }

    async fn purge_outgoing(
        &self,
        req: Request<v1::PurgeOutgoingRequest>,
    ) -> Result<Response<v1::PurgeResponse>, Status> {
        let who = Identity::of(&req);
        self.auth.authorize(&who, Right::Outgoing, None)?;
        let dest = req.into_inner().destination;
        let purged = self.broker.purge_outgoing(&dest).await?;
        tracing::info!(destination = %crate::auth::quote(&dest), by = %who.name, purged, "outgoing queue purge asked");
        Ok(Response::new(v1::PurgeResponse { purged }))
    }

    async fn change_acl(
        &self,
        req: Request<v1::ChangeAclRequest>,
    ) -> Result<Response<v1::QueueAcl>, Status> {
        let who = Identity::of(&req);
        let req = req.into_inner();
        let q = self.queue_for(&who, Right::Admin, &req.queue)?;
        let rights = crate::auth::Rights::parse_list(&req.rights.join(","), true)
            .map_err(Status::invalid_argument)?;
        let acl = self
            .broker
            .change_acl(&q, &req.principal, rights, req.grant)
            .await?;
        tracing::info!(queue = %q.def().name, by = %who.name, principal = %crate::auth::quote(&req.principal), rights = ?rights.names(), grant = req.grant, "queue rights changed");
        Ok(Response::new(wire_acl(&q, &acl)))
    }

    async fn set_queue_properties(
        &self,
        req: Request<v1::SetQueuePropertiesRequest>,
    ) -> Result<Response<v1::QueueInfo>, Status> {
        let who = Identity::of(&req);
        let req = req.into_inner();
        let q = self.queue_for(&who, Right::Admin, &req.name)?;
        self.broker.set_queue_properties(&q, &req).await?;
        Ok(Response::new(q.info()))
    }

    async fn get_acl(
        &self,
        req: Request<v1::GetAclRequest>,
    ) -> Result<Response<v1::QueueAcl>, Status> {
        let who = Identity::of(&req);
        let q = self.queue_for(&who, Right::Admin, &req.into_inner().name)?;
        Ok(Response::new(wire_acl(&q, &q.acl())))
    }
}

#[tonic::async_trait]
impl ForwardService for Service {
    type ForwardStream = BoxStream<v1::ForwardResponse>;

    async fn forward(
        &self,
        req: Request<Streaming<v1::ForwardRequest>>,
    ) -> Result<Response<Self::ForwardStream>, Status> {
        let who = Identity::of(&req);
        self.auth.authorize(&who, Right::Forward, None)?;
        let peer = req.remote_addr();
        let (broker, auth, inbound) = (self.broker.clone(), self.auth.clone(), req.into_inner());
        Ok(spawn_stream(32, |tx| {
            crate::inbound::forward_stream(broker, peer, auth, who, inbound, tx)
        }))
    }
}

/// Message ids as the wire carries them: one 16-byte value per message, empty where there is
/// none (a failed send). One buffer for all, sliced.
fn wire_ids<'a>(ids: impl ExactSizeIterator<Item = Option<&'a uuid::Uuid>>) -> Vec<bytes::Bytes> {
    let mut buf = BytesMut::with_capacity(16 * ids.len());
    let mut ranges = Vec::with_capacity(ids.len());
    for id in ids {
        let at = buf.len();
        if let Some(id) = id {
            buf.put_slice(id.as_bytes());
        }
        ranges.push(at..buf.len());
    }
    let buf = buf.freeze();
    ranges.into_iter().map(|r| buf.slice(r)).collect()
}

fn wire_acl(q: &Queue, acl: &Acl) -> v1::QueueAcl {
    v1::QueueAcl {
        queue: q.def().name.clone(),
        entries: acl
            .0
            .iter()
            .map(|(p, r)| v1::AclEntry {
                principal: p.clone(),
                rights: r.names().into_iter().map(String::from).collect(),
            })
            .collect(),
    }
}

/// A response stream fed by a task that `run` starts with the stream's sender.
fn spawn_stream<T, F, Fut>(capacity: usize, run: F) -> Response<BoxStream<T>>
where
    T: Send + 'static,
    F: FnOnce(mpsc::Sender<Result<T, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(capacity);
    tokio::spawn(run(tx));
    Response::new(Box::pin(ReceiverStream::new(rx)))
}

/// The largest body a one-shot receive reads from the journal on its own worker thread
/// ([`hand_out`]); larger ones are read on a blocking thread.
const READ_HERE_MAX_BYTES: u64 = 64 << 10;

/// Hands out the message `taken` holds (at most one): its body read, and on a transactional
/// queue its removal committed (on disk) first. Non-transactional ones come back still taken
/// (in flight): the caller [keeps](crate::taken::Taken::keep) them once the answer is on its
/// way, and a caller dropped before that gives them back. Nothing to hand out: `(None, None)`.
pub(crate) async fn hand_out(
    taken: crate::taken::Taken,
) -> Result<(Option<v1::Message>, Option<crate::taken::Taken>), BrokerError> {
    let queue = taken.queue().clone();
    let broker = taken.broker().clone();
    let Some(e) = taken.entries().first() else {
        return Ok((None, None));
    };
    // Refused, `taken` is dropped and gives them back.
    broker.check_removable(taken.entries())?;
    let dest = queue.info().format_name;
    // A small body not in memory is read right here (one pread, mostly from the page cache),
    // not on a blocking thread: the hand-off would cost more than the read.
    let body = match broker.body_here(&queue, e, READ_HERE_MAX_BYTES) {
        Some(b) => b,
        None => broker
            .bodies(&queue, std::slice::from_ref(e))
            .await
            .map(|mut b| b.pop().unwrap_or_default()),
    };
    // A failed read gives the message back (`taken` dropped).
    let wire = e.msg.to_wire(&dest, body?, e.aborts);
    if !queue.def().transactional {
        return Ok((Some(wire), Some(taken)));
    }
    // A committed single-message transaction before the message is handed out: written on
    // this thread if the journal's writer is idle. Otherwise its outcome is awaited in a task
    // of its own, so a client that gives up meanwhile cannot leave the message taken but
    // neither removed nor given back.
    let found = taken.into_entries();
    let mut removal = broker.start_durable_removal(&queue, &found);
    match removal.commit.try_outcome() {
        Some(r) => {
            broker.finish_durable_removal(&queue, found, removal, r)?;
        }
        None => {
            let q = queue.clone();
            tokio::spawn(async move {
                let r = (&mut removal.commit).await;
                broker.finish_durable_removal(&q, found, removal, r)
            })
            .await
            .map_err(|e| BrokerError::Internal(format!("the removal task failed: {e}")))??;
        }
    }
    Ok((Some(wire), None))
}

/// Runs `attempt` until it finds something, the timeout passes, or the broker shuts down.
pub(crate) async fn wait_for(
    broker: &Broker,
    queue: &Queue,
    timeout_ms: u64,
    mut attempt: impl FnMut(&Queue) -> Result<Vec<Entry>, BrokerError>,
) -> Result<Vec<Entry>, BrokerError> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
    loop {
        let notified = queue.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let found = attempt(queue)?;
        if !found.is_empty() {
            return Ok(found);
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(deadline) => return Ok(Vec::new()),
            _ = broker.shutting_down() => return Err(BrokerError::ShuttingDown),
        }
    }
}

/// One send stream: checks and queues each batch as it comes (in order), and answers each batch,
/// in order, once it is stored. Batches pipeline: while earlier ones wait for their journal sync,
/// later ones are already being written. What the answers hold in memory until the client
/// takes them is bounded ([`SEND_ANSWER_BYTES`]): a client that does not read them stops the
/// stream's reading.
async fn send_stream<I: crate::large_bodies::Inbound>(
    broker: Arc<Broker>,
    auth: Arc<Auth>,
    who: Identity,
    mut inbound: I,
    tx: mpsc::Sender<Answer>,
    budget: crate::unsent::Unsent,
) {
    type Pending = Pin<Box<dyn std::future::Future<Output = v1::SendResponse> + Send>>;
    let (pending_tx, mut pending_rx) =
        mpsc::channel::<(Pending, crate::unsent::Reserved)>(SEND_ACK_WINDOW);
    let acker = tokio::spawn(async move {
        // Every accepted batch's future runs to the end, even once the client is gone: it is
        // what makes stored messages visible (or gives their positions and quota back).
        let mut client_gone = false;
        while let Some((ack, mut held)) = pending_rx.recv().await {
            let ack = ack.await;
            if client_gone {
                continue;
            }
            // An answer larger than its reservation (long failure texts) takes what it can of
            // the rest of its size, without waiting: later batches' reservations, which only
            // this task gives back, may hold the remainder (waiting could never end). The
            // stream's reading then waits for more of the budget to come back.
            // One smaller than its reservation (ids only) gives the rest back.
            held.resize_now(answer_bytes(&ack).min(SEND_ANSWER_BYTES));
            if tx.send((Ok(ack), Some(held))).await.is_err() {
                client_gone = true;
            }
        }
        tx
    });
    let mut refused = None;
    // The last destination's resolution, so a stream of batches to one queue parses it once.
    let mut cached: Option<(String, bool, crate::broker::Destinations)> = None;
    let mut tx_stream = crate::tx_stream::TxStream::new(broker.clone());
    let mut standing = crate::auth::Standing::new(&auth, &who);
    loop {
        // Once the broker is stopping, no new batch is taken even if one is waiting: express
        // messages accepted now would be answered and then lost with the process.
        // A batch is decoded only once the budgets hold the most its answer may need (the
        // decoded batch is about as large: 10,000 empty messages are ~40 KB on the wire and
        // megabytes decoded): a client that does not read its answers stops its streams before
        // they decode anything more. The batch is all read (its bytes, counted by
        // `partial_requests`) before the stream reserves: a stream that held its reservation
        // while its client was still sending stopped its connection's other streams, whose
        // unread bytes then filled the HTTP/2 window it waited on (helper-62: eleven streams
        // of 11 MiB batches stuck until the arrival timeout). An idle stream holds nothing.
        // tonic's decoder (a compressed Send) does not tell when a batch is whole: its streams
        // reserve once they have decoded it.
        let mut early = None;
        if I::TELLS_ARRIVAL {
            let arriving = tokio::select! {
                biased;
                _ = broker.shutting_down() => break,
                a = inbound.whole() => a,
            };
            if let Err(status) = arriving {
                refused = refused_input(status);
                break;
            }
            early = Some(match budget.try_reserve_bytes(MAX_ANSWER_RESERVE) {
                Some(r) => r,
                None => tokio::select! {
                    biased;
                    _ = broker.shutting_down() => break,
                    r = budget.reserve_bytes(MAX_ANSWER_RESERVE) => r,
                },
            });
        }
        let batch = tokio::select! {
            biased;
            _ = broker.shutting_down() => break,
            b = inbound.message() => b,
        };
        let batch = match batch {
            Ok(Some(b)) => b,
            Ok(None) => break,
            Err(status) => {
                refused = refused_input(status);
                if refused.is_none() {
                    tracing::debug!("send stream ended by the client");
                }
                break;
            }
        };
        if let Err(status) = check_batch(&broker, batch.messages.len(), "a send batch")
            .and_then(|()| check_seqs(batch.first_seq, batch.messages.len()))
        {
            refused = Some(status);
            break;
        }
        if let Some(lost) = standing.lost() {
            refused = Some(lost);
            break;
        }
        let n = batch.messages.len();
        // The answer's share of the budget, before the batch is taken: a client that does not
        // read its answers stops here.
        // At most a quarter of the budget, so batches of a raised --max-batch-messages still
        // overlap (an answer larger than its reservation takes more once built).
        let reserve = (n + 1)
            .saturating_mul(SEND_ANSWER_BYTES_PER_MESSAGE)
            .min(MAX_ANSWER_RESERVE as usize);
        let held = match early {
            Some(mut held) => {
                held.resize_now(reserve);
                held
            }
            None => tokio::select! {
                biased;
                _ = broker.shutting_down() => break,
                r = budget.reserve_bytes(reserve as u32) => r,
            },
        };
        let first_seq = batch.first_seq;
        let tx = batch.transactional;
        let stream = tx_stream.batch(&batch);
        let dests = match &cached {
            Some((name, t, d)) if *name == batch.destination && *t == tx && d.is_current() => {
                Ok(d.clone())
            }
            // Rights first: a refusal for the queue's kind would tell a caller without them
            // whether it is transactional.
            _ => broker
                .plan(&batch.destination)
                .and_then(|d| authorize_send(&auth, &who, &d).map(|()| d))
                .and_then(|d| d.check_kinds(tx).map(|()| d))
                .inspect(|d| {
                    cached = Some((batch.destination.clone(), tx, d.clone()));
                }),
        };
        // A batch of a transactional send stream refused as a whole still uses up its seqs.
        if let (Ok(Some(_)), Err(_)) = (&stream, &dests) {
            tx_stream.refused(first_seq, n);
        }
        let ack: Pending = match stream.and_then(|s| dests.map(|d| (d, s))) {
            Ok((dests, stream)) => {
                // Each message's sender is the stream's identity (whatever the client put there).
                let mut acks_to = AdminQueues::new(&broker, &auth, &who);
                let stored = broker.send_batch_on(
                    &dests,
                    batch.messages,
                    tx,
                    stream,
                    Some(&who.name),
                    &mut |q| acks_to.authorize(q),
                );
                Box::pin(async move {
                    let outcome = stored.await;
                    v1::SendResponse {
                        first_seq,
                        count: n as u32,
                        ids: wire_ids(outcome.ids.iter().map(Option::as_ref)),
                        failures: outcome
                            .failures
                            .into_iter()
                            .map(|(i, e)| failure(first_seq + i as u64, &e))
                            .collect(),
                    }
                })
            }
            Err(e) => {
                let ack = v1::SendResponse {
                    first_seq,
                    count: n as u32,
                    ids: vec![bytes::Bytes::new(); n],
                    failures: (0..n).map(|i| failure(first_seq + i as u64, &e)).collect(),
                };
                Box::pin(async move { ack })
            }
        };
        if pending_tx.send((ack, held)).await.is_err() {
            break;
        }
    }
    // Answer everything already accepted, then end the stream.
    drop(pending_tx);
    let acker = acker.await;
    drop(tx_stream);
    if let (Ok(tx), Some(status)) = (acker, refused) {
        let _ = tx.send((Err(status), None)).await;
    }
}

/// One answer of a send stream, with the share of the stream's answer budget it holds until
/// tonic takes it to write it.
type Answer = (
    Result<v1::SendResponse, Status>,
    Option<crate::unsent::Reserved>,
);

/// About what `ack` holds in memory: its ids and its failures with their texts.
fn answer_bytes(ack: &v1::SendResponse) -> usize {
    let ids = ack.ids.len() * (std::mem::size_of::<bytes::Bytes>() + 16);
    let failures: usize = ack
        .failures
        .iter()
        .map(|f| std::mem::size_of::<v1::SendFailure>() + f.message.len() + f.reason.len())
        .sum();
    64 + ids + failures
}

/// Refuses a batch of more than `mqd --max-batch-messages` messages: one status for the whole
/// batch (it ends the stream), not one failure per message.
#[allow(clippy::result_large_err)]
pub(crate) fn check_batch(broker: &Broker, n: usize, what: &str) -> Result<(), Status> {
    let max = broker.config().flow.max_batch_messages;
    if n > max {
        return Err(Status::out_of_range(format!(
            "{what} holds {n} messages; the limit is {max} (mqd --max-batch-messages)"
        )));
    }
    Ok(())
}

/// Refuses a send batch whose messages cannot all be numbered: `first_seq + count - 1` above
/// 2^64 - 1 (the answer names every message by its seq). One status for the whole batch, which
/// ends the stream, as for a batch above the size limit.
#[allow(clippy::result_large_err)]
pub(crate) fn check_seqs(first_seq: u64, n: usize) -> Result<(), Status> {
    if n > 0 && first_seq.checked_add(n as u64 - 1).is_none() {
        return Err(Status::out_of_range(format!(
            "a send batch of {n} messages from first_seq {first_seq} numbers them past 2^64 - 1; number a stream's messages from 1 (SendRequest.first_seq)"
        )));
    }
    Ok(())
}

/// A stream's first request (the one that names what the stream is for), which must come
/// within `mqd --message-arrival-timeout` of the stream's opening: a stream that never sends it
/// holds a stream slot (and for Browse a cursor slot) no longer.
pub(crate) async fn first_request<T: prost::Message + Default>(
    broker: &Broker,
    inbound: &mut Streaming<T>,
    what: &str,
) -> Result<Option<T>, Status> {
    let within = broker.config().flow.message_arrival_timeout;
    match tokio::time::timeout(within, inbound.message()).await {
        Ok(r) => r,
        Err(_) => Err(Status::deadline_exceeded(format!(
            "{what} sent no first request within {within:?} of its opening (mqd --message-arrival-timeout)"
        ))),
    }
}

/// A request stream's error as its client should hear it (`Some`): a message above the size
/// limit is refused naming the limit; one whose batch holds too many messages as the decoder
/// said (`mq_proto::entries`: it names its limit); an unfinished message over its limits
/// (bytes or time, `partial_requests`) as that layer said. Anything else means the client is
/// gone (`None`).
pub(crate) fn refused_input(status: Status) -> Option<Status> {
    match status.code() {
        tonic::Code::OutOfRange if !status.message().contains("message length too large") => {
            Some(status)
        }
        tonic::Code::OutOfRange => Some(Status::out_of_range(format!(
            "{}; one gRPC message may hold at most the body limit (mqd --max-body-bytes) plus 8 MiB",
            status.message()
        ))),
        tonic::Code::ResourceExhausted | tonic::Code::DeadlineExceeded => Some(status),
        _ => None,
    }
}

/// `send` on every local target; a remote one is checked by its broker (any authenticated
/// identity may send there).
fn authorize_send(
    auth: &Auth,
    who: &Identity,
    dests: &crate::broker::Destinations,
) -> Result<(), BrokerError> {
    for queue in dests.local_queues() {
        auth.authorize(who, Right::Send, queue.map(|q| &**q))
            .map_err(|s| BrokerError::PermissionDenied(s.message().to_string()))?;
    }
    Ok(())
}

/// The admin queues of one batch's messages, checked as the broker will use them: it posts
/// acknowledgements there in the sender's name, so the sender needs the right `send` there
/// (a local queue's ACL; another broker's queue needs an authenticated caller, as a send there
/// does). Before, the admin queue was checked for its syntax only, and anyone who could send
/// to one queue could have acknowledgements, with their label and (a negative one) their body,
/// written into any local queue, or an anonymous caller into another broker's (helper-61).
/// What is not checked: [`crate::acks::AckTarget::Unchecked`].
struct AdminQueues<'a> {
    broker: &'a Arc<Broker>,
    auth: &'a Auth,
    who: &'a Identity,
    last: crate::acks::LastAnswer<Result<(), BrokerError>>,
}

impl<'a> AdminQueues<'a> {
    fn new(broker: &'a Arc<Broker>, auth: &'a Auth, who: &'a Identity) -> Self {
        AdminQueues {
            broker,
            auth,
            who,
            last: crate::acks::LastAnswer::new(),
        }
    }

    fn authorize(&mut self, admin_queue: &str) -> Result<(), BrokerError> {
        let (broker, auth, who) = (self.broker, self.auth, self.who);
        self.last.get(admin_queue, || {
            let queue = match crate::acks::ack_target(broker, admin_queue)? {
                crate::acks::AckTarget::Unchecked => return Ok(()),
                crate::acks::AckTarget::Local(q) => Some(q),
                crate::acks::AckTarget::Remote => None,
            };
            auth.authorize(who, Right::Send, queue.as_deref())
                .map_err(|s| {
                    BrokerError::PermissionDenied(format!(
                        "admin queue \"{}\": {} (acknowledgements are posted there in the sender's name)",
                        crate::auth::quote(admin_queue),
                        s.message()
                    ))
                })
        })
    }
}

fn failure(seq: u64, e: &BrokerError) -> v1::SendFailure {
    v1::SendFailure {
        seq,
        code: e.code() as i32,
        message: e.to_string(),
        reason: e.reason().to_string(),
    }
}

/// One streaming receiver: pushes up to `credit` messages, removes them when acknowledged, and
/// gives back whatever is unacknowledged when the stream ends.
///
/// Whatever credit the client grants, a stream holds at most `max_unacked_per_stream`
/// delivered, unacknowledged messages, and its connection at most `max_unacked_per_connection`
/// over all its streams; a stream that holds a delivered message longer than the ack timeout
/// is ended and its messages go back.
async fn consume(
    broker: Arc<Broker>,
    queue: Arc<Queue>,
    conn: Arc<Connection>,
    mut inbound: Streaming<v1::ReceiveRequest>,
    mut credit: u64,
    deliveries: Deliveries,
    mut standing: crate::auth::Standing,
) {
    let tx = &deliveries.tx;
    let flow = broker.config().flow.clone();
    let dest = queue.info().format_name;
    // Bytes of deliveries built and not yet written: each batch reserves the most it may take
    // before it takes anything, and holds what it took until HTTP/2 has written it.
    let unsent = conn.unsent(delivery_batch_bytes(broker.config()));
    // Each delivered message counts its body and texts, its queue's name and 256 B.
    let overhead = crate::unsent::DELIVERY_OVERHEAD_BYTES + dest.len();
    // A batch's bytes that came while the stream waited for them.
    let mut reserved: Option<crate::unsent::Reserved> = None;
    // The wait for them, kept across turns of the loop: the stream keeps its place among
    // those waiting for the connection's budget.
    let mut waiting: Option<Pin<Box<dyn std::future::Future<Output = _> + Send + '_>>> = None;
    // Delivered, unacknowledged: tag, entry, and when it was delivered.
    let mut in_flight: VecDeque<(u64, Entry, tokio::time::Instant)> = VecDeque::new();
    let mut next_tag = 1u64;
    let ack_timed_out = |n: usize| {
        Status::deadline_exceeded(format!(
            "no acknowledgement within the broker's ack timeout ({}, mqd --ack-timeout): the receive stream was ended and its {n} unacknowledged messages went back to the queue",
            humantime::format_duration(flow.ack_timeout)
        ))
    };
    let end: Option<Status> = 'stream: loop {
        if let Some(lost) = standing.lost() {
            break Some(lost);
        }
        let notified = queue.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let oldest = in_flight.front().map(|(_, _, at)| *at + flow.ack_timeout);
        if oldest.is_some_and(|d| d <= tokio::time::Instant::now()) {
            break Some(ack_timed_out(in_flight.len()));
        }
        let stream_room = flow
            .max_unacked_per_stream
            .saturating_sub(in_flight.len() as u64);
        let want = credit.min(stream_room).min(MAX_DELIVERY_BATCH as u64);
        let mut granted = if want > 0 {
            conn.reserve_unacked(want, flow.max_unacked_per_connection)
        } else {
            0
        };
        // Registered only when the connection is short of room (then asked again: slots given
        // back meanwhile would wake no one).
        let mut room = None;
        if granted < want {
            room = Some(conn.wait_for_room());
            granted += conn.reserve_unacked(want - granted, flow.max_unacked_per_connection);
        }
        let mut blocked_by_connection = granted < want;
        // Out of bytes for deliveries not yet written: nothing is taken until some come back.
        let mut short_of_bytes = false;
        let budget = match reserved.take() {
            Some(r) if granted > 0 => Some(r),
            _ if granted > 0 => unsent.try_reserve(),
            _ => None,
        };
        if granted > 0 && budget.is_none() {
            conn.release_unacked(granted);
            (granted, blocked_by_connection, short_of_bytes) = (0, false, true);
        }
        if let Some(budget) = budget {
            let taken = match queue
                .take_within(granted as usize, budget.bytes(), overhead)
                .and_then(|t| broker.removable(&queue, t))
            {
                Ok(t) => t,
                Err(e) => {
                    conn.release_unacked(granted);
                    break Some(e.into());
                }
            };
            let used = taken.iter().fold(0usize, |n, e| {
                n.saturating_add((e.msg.delivered_bytes() as usize).saturating_add(overhead))
            });
            // A message over the batch's bytes (stored under a larger --max-body-bytes) is
            // taken alone and counted at the batch's.
            let count = Arc::new(budget.keep(used));
            if (taken.len() as u64) < granted {
                blocked_by_connection = false;
                conn.release_unacked(granted - taken.len() as u64);
            }
            if !taken.is_empty() {
                credit -= taken.len() as u64;
                let now = tokio::time::Instant::now();
                let mut messages = Vec::with_capacity(taken.len());
                // Read off this worker thread where not in memory; on failure the taken
                // messages go back with the rest of `in_flight` when the stream ends.
                let bodies = broker.bodies(&queue, &taken).await;
                let failed = bodies.as_ref().err().cloned();
                let mut bodies = bodies.unwrap_or_default().into_iter();
                // At once rather than by doubling (a fresh stream's first deliveries).
                in_flight.reserve(taken.len());
                for e in taken {
                    if let Some(body) = bodies.next() {
                        messages.push(v1::Delivered {
                            tag: next_tag,
                            message: Some(e.msg.to_wire(&dest, body, e.aborts)),
                        });
                    }
                    in_flight.push_back((next_tag, e, now));
                    next_tag += 1;
                }
                if let Some(err) = failed {
                    break Some(err.into());
                }
                for messages in delivery_items(messages) {
                    let item = (v1::ReceiveResponse { messages }, count.clone());
                    // A client that does not read holds its messages until the ack timeout.
                    let deadline =
                        in_flight.front().map_or(now, |(_, _, at)| *at) + flow.ack_timeout;
                    tokio::select! {
                        r = tx.send(Ok(item)) => if r.is_err() { break 'stream None },
                        _ = tokio::time::sleep_until(deadline) => {
                            break 'stream Some(ack_timed_out(in_flight.len()));
                        }
                    }
                }
                continue;
            }
        }
        if queue.is_deleted() {
            break Some(BrokerError::QueueDeleted(queue.def().name.clone()).into());
        }
        let ack_deadline = oldest.unwrap_or_else(tokio::time::Instant::now);
        if short_of_bytes {
            waiting.get_or_insert_with(|| Box::pin(unsent.reserve()));
        } else {
            waiting = None;
        }
        tokio::select! {
            // Wakes on deletion too, so a consumer without credit still notices it. Not while
            // the stream waits for bytes: more messages would not help it.
            _ = notified, if !short_of_bytes => continue,
            // Blocked by the connection implies registered for room.
            _ = async {
                match room.as_mut() {
                    Some(r) => r.await,
                    None => std::future::pending().await,
                }
            }, if blocked_by_connection => continue,
            _ = tokio::time::sleep_until(ack_deadline), if oldest.is_some() => continue,
            r = async { waiting.as_mut().expect("set while short of bytes").await },
                if short_of_bytes => {
                reserved = Some(r);
                // Done: not to be polled again.
                waiting = None;
            }
            r = inbound.message() => match r {
                Ok(Some(r)) => {
                    // Per-message acknowledgements waiting: one removal, one bigger delivery.
                    let (r, ended) = crate::receive_acks::coalesce(r, &mut inbound);
                    match apply(&broker, &queue, &conn, &mut in_flight, &r) {
                        Ok(c) => credit = credit.saturating_add(c),
                        Err(e) => break Some(e.into()),
                    }
                    if let Some(refused) = ended {
                        break refused;
                    }
                }
                Ok(None) => break None,
                // A request above the size limit is refused naming it; else the client is gone.
                Err(status) => break refused_input(status),
            },
            _ = broker.shutting_down() => {
                let r = drain_acks(&broker, &queue, &conn, &mut in_flight, &mut inbound).await;
                break Some(r.err().unwrap_or(BrokerError::ShuttingDown).into());
            }
        }
    };
    // Whatever was delivered and not acknowledged goes back, in order.
    conn.release_unacked(in_flight.len() as u64);
    let gone = queue.restore(in_flight.into_iter().map(|(_, e, _)| e).collect());
    broker.forget_deleted(&queue, &gone);
    // Deliveries still queued for HTTP/2 go: their messages just went back (the client could
    // not acknowledge them), and they give back what they count against the budgets of
    // deliveries not yet written. What h2 holds of the stream stays counted until written.
    deliveries.drop_queued();
    if let Some(status) = end {
        // Not waiting for a client that does not read (the ack timeout).
        let _ = tx.try_send(Err(status));
    }
}

/// A delivery cut into stream items of about [`MAX_DELIVERY_ITEM_BYTES`] of bodies each, so big
/// bodies stay under the gRPC message limit; one that fits in one item (the usual case for
/// small messages) stays as it is, its messages not moved again.
fn delivery_items(messages: Vec<v1::Delivered>) -> Vec<Vec<v1::Delivered>> {
    let body = |m: &v1::Delivered| m.message.as_ref().map_or(0, |m| m.body.len());
    let total: usize = messages.iter().map(body).sum();
    if messages.is_empty() || total < MAX_DELIVERY_ITEM_BYTES {
        return if messages.is_empty() {
            Vec::new()
        } else {
            vec![messages]
        };
    }
    // About this many messages an item (bodies of even size), so items seldom grow.
    let per_item = (messages.len() * MAX_DELIVERY_ITEM_BYTES / total + 1).min(messages.len());
    let mut items = Vec::new();
    let mut item = Vec::with_capacity(per_item);
    let mut bytes = 0;
    for m in messages {
        bytes += body(&m);
        item.push(m);
        if bytes >= MAX_DELIVERY_ITEM_BYTES {
            items.push(std::mem::replace(&mut item, Vec::with_capacity(per_item)));
            bytes = 0;
        }
    }
    if !item.is_empty() {
        items.push(item);
    }
    items
}

/// A receive stream's deliveries not yet taken by HTTP/2: read by the response's stream,
/// emptied by the stream's task when it ends.
#[derive(Clone)]
struct Queued(Arc<std::sync::Mutex<mpsc::Receiver<Result<Delivery, Status>>>>);

impl Queued {
    fn lock(&self) -> std::sync::MutexGuard<'_, mpsc::Receiver<Result<Delivery, Status>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The response's end of a receive stream's deliveries: closes them when dropped.
struct CloseOnDrop(Queued);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.lock().close();
    }
}

/// Where a receive stream's task puts its deliveries, and the queue of those not yet taken by
/// HTTP/2 (shared with the response's stream).
struct Deliveries {
    tx: mpsc::Sender<Result<Delivery, Status>>,
    queued: Queued,
}

impl Deliveries {
    fn drop_queued(&self) {
        let mut rx = self.queued.lock();
        while rx.try_recv().is_ok() {}
    }
}

/// Applies an acknowledgement and returns the credit granted.
fn apply(
    broker: &Arc<Broker>,
    queue: &Arc<Queue>,
    conn: &Connection,
    in_flight: &mut VecDeque<(u64, Entry, tokio::time::Instant)>,
    r: &v1::ReceiveRequest,
) -> Result<u64, BrokerError> {
    if r.ack_through > 0 {
        let n = in_flight.partition_point(|(tag, _, _)| *tag <= r.ack_through);
        // The removal of recoverable messages must be stored: not once the journal refuses
        // writes (they stay in flight and go back when the stream ends).
        if in_flight
            .iter()
            .take(n)
            .any(|(_, e, _)| e.msg.delivery == crate::message::Delivery::Recoverable)
        {
            broker.check_writable("store the acknowledgement of recoverable messages")?;
        }
        let done: Vec<Entry> = in_flight.drain(..n).map(|(_, e, _)| e).collect();
        queue.complete(&done);
        broker.forget_received_acked(queue, &done);
        conn.release_unacked(n as u64);
    }
    Ok(r.credit as u64)
}

/// How long a receive stream keeps reading acknowledgements at shutdown once the receiver is
/// quiet...
const ACK_DRAIN_IDLE: Duration = Duration::from_millis(200);
/// ...and at most in all.
const ACK_DRAIN_MAX: Duration = Duration::from_secs(2);

/// At shutdown, before anything is given back: applies the acknowledgements the receiver has
/// already sent (they may still be on the way, in the connection's buffers) and those it sends
/// while it finishes what it was handed, so their messages are removed (and the removals
/// journaled before the journal closes) rather than redelivered after the restart. Reads until
/// the receiver is quiet for [`ACK_DRAIN_IDLE`], ends its stream, or [`ACK_DRAIN_MAX`] passed.
async fn drain_acks(
    broker: &Arc<Broker>,
    queue: &Arc<Queue>,
    conn: &Connection,
    in_flight: &mut VecDeque<(u64, Entry, tokio::time::Instant)>,
    inbound: &mut Streaming<v1::ReceiveRequest>,
) -> Result<(), BrokerError> {
    let end = tokio::time::Instant::now() + ACK_DRAIN_MAX;
    while !in_flight.is_empty() {
        let until = end.min(tokio::time::Instant::now() + ACK_DRAIN_IDLE);
        match tokio::time::timeout_at(until, inbound.message()).await {
            Ok(Ok(Some(r))) => {
                apply(broker, queue, conn, in_flight, &r)?;
            }
            _ => break,
        }
    }
    Ok(())
}

/// The answer to a commit: `committed` (with `message`, the one a receive-and-commit got) or
/// the error that ended the transaction, marked in doubt if the journal may hold the record.
fn commit_reply(
    r: Result<crate::transaction::Committed, BrokerError>,
    message: Option<v1::Message>,
) -> Result<v1::TransactResponse, Status> {
    match r {
        Ok(c) => Ok(v1::TransactResponse {
            result: Some(v1::transact_response::Result::Committed(v1::TxCommitted {
                ids: wire_ids(c.ids.iter().map(Some)),
                received: c.received as u32,
                id: c.id.as_bytes().to_vec().into(),
                message,
            })),
        }),
        Err(e) => {
            let in_doubt = matches!(e, BrokerError::InDoubt(_));
            let mut s = Status::from(e);
            if in_doubt {
                s.metadata_mut()
                    .insert(TX_IN_DOUBT_METADATA, "1".parse().expect("ascii"));
            }
            Err(s)
        }
    }
}

/// Commits `tx` and answers (with `message`, the one a receive-and-commit got). True if the
/// stream goes on to the next transaction; false if the commit failed (its error was the
/// answer and ends the stream) or the client is gone.
async fn commit_and_answer(
    tx: Transaction,
    message: Option<v1::Message>,
    out: &mpsc::Sender<Result<v1::TransactResponse, Status>>,
) -> bool {
    let reply = commit_reply(tx.commit().await, message);
    let failed = reply.is_err();
    out.send(reply).await.is_ok() && !failed
}

/// Aborts `tx` and answers `aborted`; false if the client is gone.
async fn abort_and_answer(
    tx: Transaction,
    out: &mpsc::Sender<Result<v1::TransactResponse, Status>>,
) -> bool {
    tx.abort();
    let aborted = v1::TransactResponse {
        result: Some(v1::transact_response::Result::Aborted(())),
    };
    out.send(Ok(aborted)).await.is_ok()
}

/// One transaction stream: transactions one after another, each ended by a commit or an abort
/// answered on the stream. Every other way out of the loop aborts the open transaction (the
/// [`Transaction`] rolls back when dropped): client gone, timeout, shutdown, error; an error
/// ends the stream.
async fn transact(
    broker: Arc<Broker>,
    auth: Arc<Auth>,
    who: Identity,
    mut inbound: Streaming<v1::TransactRequest>,
    out: mpsc::Sender<Result<v1::TransactResponse, Status>>,
    last: tokio::sync::oneshot::Sender<Status>,
) {
    use v1::transact_request::Op as Req;
    use v1::transact_response::Result as Res;
    let timeout = broker.config().tx_timeout;
    // Transactions follow one another on the stream (see `crate::tx_reuse`); each has its own
    // deadline, from its first request. Between transactions the stream waits at most the idle
    // bound, from the end of the last one (or the stream's start).
    let mut tx_deadline: Option<tokio::time::Instant> = None;
    let idle = broker.config().flow.tx_stream_idle;
    let mut idle_since = tokio::time::Instant::now();
    // Created by a first `TxBegin` (the client's id), else by the first other request.
    let mut open: Option<Transaction> = None;
    let mut standing = crate::auth::Standing::new(&auth, &who);
    let timed_out = || {
        Status::aborted(format!(
            "the transaction was open longer than the broker's transaction timeout ({}s, mqd --tx-timeout-secs) and was aborted",
            timeout.as_secs()
        ))
    };
    loop {
        let req = tokio::select! {
            r = inbound.message() => r,
            expired = crate::tx_reuse::sleep_until(tx_deadline, idle_since + idle) => {
                // No transaction to abort: the stream just ends (the client opens a new one).
                if expired == crate::tx_reuse::Expired::Idle {
                    return;
                }
                // Aborted now (its received messages go back), not once the client has read
                // the answer: one that does not read kept them (helper-65).
                if let Some(mut t) = open.take() {
                    t.timed_out();
                }
                end_with(&out, last, timed_out());
                return;
            }
            _ = broker.shutting_down() => {
                drop(open.take());
                let _ = out.send(Err(BrokerError::ShuttingDown.into())).await;
                return;
            }
        };
        if let Some(lost) = standing.lost() {
            drop(open.take());
            let _ = out.send(Err(lost)).await;
            return;
        }
        let op = match req {
            Ok(Some(v1::TransactRequest { op: Some(op) })) => op,
            Ok(Some(_)) => {
                drop(open.take());
                let _ = out
                    .send(Err(Status::invalid_argument(
                        "a transaction request must carry an operation",
                    )))
                    .await;
                return;
            }
            Err(status) => {
                if let Some(status) = refused_input(status) {
                    drop(open.take());
                    let _ = out.send(Err(status)).await;
                }
                return;
            }
            // The client went away: abort.
            Ok(None) => return,
        };
        let deadline = *tx_deadline.get_or_insert_with(|| tokio::time::Instant::now() + timeout);
        if let Req::Begin(b) = &op {
            let begun = match (&open, uuid::Uuid::from_slice(&b.id)) {
                (Some(_), _) => Err(Status::invalid_argument(
                    "TxBegin must be the first request of a transaction",
                )),
                (None, Err(_)) => Err(Status::invalid_argument(format!(
                    "a transaction id is 16 bytes; got {}",
                    b.id.len()
                ))),
                (None, Ok(id)) => {
                    Transaction::begin_with_id(broker.clone(), id).map_err(Status::from)
                }
            };
            match begun {
                Ok(t) => {
                    open = Some(t);
                    continue;
                }
                Err(status) => {
                    drop(open.take());
                    let _ = out.send(Err(status)).await;
                    return;
                }
            }
        }
        let tx = open.get_or_insert_with(|| Transaction::begin(broker.clone()));
        let reply = match op {
            Req::Begin(_) => unreachable!("handled above"),
            Req::Send(mut s) => {
                // Through tonic's decoder: the send's own encoding stands for the buffer its
                // bodies are sliced from (a send with many unknown bytes was decoded again from
                // a compact copy: `mq_proto::codec::compacted`).
                let len = crate::large_bodies::tonic_buffer_len(prost::Message::encoded_len(&s));
                crate::large_bodies::own_small_bodies(&mut s.messages, len);
                if let Err(status) = check_batch(&broker, s.messages.len(), "a transactional send")
                {
                    drop(open.take());
                    let _ = out.send(Err(status)).await;
                    return;
                }
                // Refused for a missing right (on a destination or an admin queue): the
                // transaction ends now.
                let mut acks_to = AdminQueues::new(&broker, &auth, &who);
                let checked = broker
                    .plan(&s.destination)
                    .and_then(|d| authorize_send(&auth, &who, &d).map(|()| d))
                    .and_then(|d| {
                        s.messages
                            .iter()
                            .filter(|m| !m.admin_queue.is_empty())
                            .try_for_each(|m| acks_to.authorize(&m.admin_queue))
                            .map(|()| d)
                    })
                    .and_then(|d| d.check_kinds(true).map(|()| d));
                let plan = match checked {
                    Ok(plan) => plan,
                    Err(BrokerError::PermissionDenied(m)) => {
                        drop(open.take());
                        let _ = out.send(Err(Status::permission_denied(m))).await;
                        return;
                    }
                    // Any other refusal (no such queue, a bad name) makes the commit fail, and
                    // the send is not looked up again unchecked: a queue created meanwhile
                    // would have taken it without its rights checked (helper-61).
                    Err(e) => {
                        tx.refuse(e);
                        continue;
                    }
                };
                for m in &mut s.messages {
                    m.sender = who.name.to_string();
                }
                // A send refused by a limit (a quota, what a transaction may stage) ends the
                // transaction now, so nothing more is sent and held for it; other refusals make
                // the commit fail.
                if let Err(e @ BrokerError::QuotaExceeded(_)) = tx.send_planned(&plan, s.messages) {
                    drop(open.take());
                    let _ = out.send(Err(e.into())).await;
                    return;
                }
                continue;
            }
            Req::Receive(r) => {
                // Any refusal ends the stream here (as the receive's own would): the queue is not
                // looked up again unchecked, which a queue created meanwhile would have passed
                // without its rights checked (helper-61).
                if let Err(status) = broker
                    .queue_allowed(&r.queue, |q| auth.authorize(&who, Right::Receive, Some(q)))
                {
                    // Aborted before the answer waits for room (helper-68: a client that does
                    // not read held its received messages with one bad Receive).
                    drop(open.take());
                    let _ = out.send(Err(status)).await;
                    return;
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                let wait = Duration::from_millis(r.timeout_ms).min(left);
                let select = match crate::cursor::select_of(&r.id, &r.correlation_id) {
                    Ok(s) => s,
                    Err(e) => {
                        drop(open.take());
                        let _ = out.send(Err(e.into())).await;
                        return;
                    }
                };
                // The wait ends when the client goes (it reset the stream, or the connection
                // broke): a receive that commits took the next message for nobody and
                // committed it (stop 49: mqperf's consumers lost a message each time one
                // dropped a waiting receive), and a plain one held it until the next read.
                let received = tokio::select! {
                    r = tx.receive_selected(&r.queue, &select, wait) => r,
                    _ = out.closed() => return,
                };
                match received {
                    // Received and committed in one round trip (TxReceive.commit), unless the
                    // client has gone meanwhile: then it goes back (the drop aborts).
                    Ok(Some(_)) if r.commit && out.is_closed() => return,
                    Ok(Some(m)) if r.commit => {
                        let tx = open.take().expect("opened above");
                        if !commit_and_answer(tx, Some(m), &out).await {
                            return;
                        }
                        tx_deadline = None;
                        idle_since = tokio::time::Instant::now();
                        continue;
                    }
                    Ok(Some(m)) => Ok(Res::Received(m)),
                    Ok(None) if tokio::time::Instant::now() >= deadline => Err(timed_out()),
                    // Nothing to commit with: the whole transaction is aborted (all or nothing).
                    Ok(None) if r.commit => {
                        if !abort_and_answer(open.take().expect("opened above"), &out).await {
                            return;
                        }
                        tx_deadline = None;
                        idle_since = tokio::time::Instant::now();
                        continue;
                    }
                    Ok(None) => Ok(Res::ReceiveTimeout(())),
                    Err(e) => Err(e.into()),
                }
            }
            Req::Commit(_) => {
                if !commit_and_answer(open.take().expect("opened above"), None, &out).await {
                    return;
                }
                tx_deadline = None;
                idle_since = tokio::time::Instant::now();
                continue;
            }
            Req::Abort(_) => {
                if !abort_and_answer(open.take().expect("opened above"), &out).await {
                    return;
                }
                tx_deadline = None;
                idle_since = tokio::time::Instant::now();
                continue;
            }
        };
        let failed = reply.is_err();
        let reply = reply.map(|r| v1::TransactResponse { result: Some(r) });
        // A reply waits for room (a client that does not read) at most until the transaction's
        // deadline: waiting outside the deadline's `select!` kept the transaction, its received
        // messages and its staged bytes for as long as the connection lived (helper-65).
        let sent = match (tx_deadline, open.is_some()) {
            (Some(deadline), true) => tokio::select! {
                // The send first: with room it is ready at once and no timer is set.
                biased;
                r = out.send(reply) => r.is_ok(),
                _ = tokio::time::sleep_until(deadline) => {
                    if let Some(mut t) = open.take() {
                        t.timed_out();
                    }
                    end_with(&out, last, timed_out());
                    return;
                }
            },
            _ => out.send(reply).await.is_ok(),
        };
        if !sent || failed {
            return;
        }
    }
}

/// Ends a Transact stream with `status`: after the replies its channel holds, through the
/// channel if it has room, else through `last` (read once the channel is done).
fn end_with(
    out: &mpsc::Sender<Result<v1::TransactResponse, Status>>,
    last: tokio::sync::oneshot::Sender<Status>,
    status: Status,
) {
    if let Err(mpsc::error::TrySendError::Full(Err(status))) = out.try_send(Err(status)) {
        let _ = last.send(status);
    }
}

/// A unary answer holding `hold` (its connection's count) until HTTP/2 has written it
/// (`unsent::AnswerHold`, moved into the body by `large_bodies`).
fn held<M>(
    answer: M,
    hold: Option<crate::unsent::Reserved>,
    taken: Option<crate::taken::Taken>,
) -> Response<M> {
    let mut r = Response::new(answer);
    if let Some(hold) = hold {
        r.extensions_mut()
            .insert(crate::unsent::AnswerHold(Arc::new(hold)));
    }
    if let Some(taken) = taken {
        r.extensions_mut()
            .insert(crate::taken::AnswerTaken::new(taken));
    }
    r
}

/// What the answer carrying `found` (from `queue`) holds, counted as a receive stream counts
/// its deliveries (body and texts, the queue's name and 256 B a message), before their bodies
/// are read.
fn found_bytes(found: &[crate::queue::Entry], queue: &Queue) -> usize {
    let each = crate::unsent::DELIVERY_OVERHEAD_BYTES + queue.info().format_name.len();
    found
        .iter()
        .map(|e| e.msg.delivered_bytes() as usize + each)
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delivered(tag: u64, body: usize) -> v1::Delivered {
        v1::Delivered {
            tag,
            message: Some(v1::Message {
                body: bytes::Bytes::from(vec![b'x'; body]),
                ..Default::default()
            }),
        }
    }

    fn tags(items: &[Vec<v1::Delivered>]) -> Vec<Vec<u64>> {
        items
            .iter()
            .map(|i| i.iter().map(|d| d.tag).collect())
            .collect()
    }

    #[test]
    fn a_delivery_under_the_item_size_goes_as_one_item_and_nothing_goes_for_none() {
        assert!(delivery_items(Vec::new()).is_empty());
        let small: Vec<_> = (1..=60).map(|t| delivered(t, 1000)).collect();
        let at = small.as_ptr();
        let items = delivery_items(small);
        assert_eq!(tags(&items), vec![(1..=60).collect::<Vec<_>>()]);
        // The same list, not a copy of it.
        assert_eq!(items[0].as_ptr(), at);
    }

    #[test]
    fn a_larger_delivery_is_cut_at_the_item_size_in_order() {
        let big: Vec<_> = (1..=200).map(|t| delivered(t, 1000)).collect();
        let items = delivery_items(big);
        // 66 bodies of 1000 B reach 64 KiB.
        let want: Vec<Vec<u64>> = vec![
            (1..=66).collect(),
            (67..=132).collect(),
            (133..=198).collect(),
            (199..=200).collect(),
        ];
        assert_eq!(tags(&items), want);
        // The body that reaches the item size ends its item.
        let items = delivery_items(vec![
            delivered(1, 100),
            delivered(2, 70_000),
            delivered(3, 10),
        ]);
        assert_eq!(tags(&items), vec![vec![1, 2], vec![3]]);
    }
}
