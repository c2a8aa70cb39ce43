//! [`Client`]: a connection to one broker, queue administration, and handles to queues.

use std::time::Duration;

use crate::builder::{AdminRpc, ClientBuilder, Rpc};
use mq_proto::format_name::FormatName;
use mq_proto::v1;

use crate::deadline::{self, ClientOptions};
use crate::error::{Error, Result};
use crate::message::Message;
use crate::outgoing::OutgoingQueue;
use crate::queue::Queue;
use crate::sender::{Sender, SenderOptions};
use crate::transaction::{CommitOnce, Transaction, TxId, TxOutcome, TxStatus};

/// The broker URL used when none is given.
pub const DEFAULT_BROKER_URL: &str = "http://127.0.0.1:1801";

/// A connection to a broker. Cheap to clone; clones share the connection.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) rpc: Rpc,
    pub(crate) admin: AdminRpc,
    url: String,
    pub(crate) options: ClientOptions,
    /// Idle `Transact` streams for the next transaction.
    pub(crate) tx_pool: crate::tx_pool::TxPool,
    /// The send streams `Queue::send` keeps, one per queue.
    pub(crate) send_pool: crate::send_pool::SendPool,
    /// Which queues `Queue::receive` found transactional.
    pub(crate) queue_kinds: crate::queue_kinds::QueueKinds,
}

/// Properties of a new queue.
#[derive(Debug, Clone, Default)]
pub struct QueueOptions {
    /// Transactional queues accept only transactional sends (fixed at creation).
    pub transactional: bool,
    /// Most bytes the queue may hold; absent = only the broker-wide quota applies.
    pub quota_bytes: Option<u64>,
    /// A free-text label.
    pub label: String,
    /// Transactional queues: a message whose receive was aborted this many times is moved to
    /// the subqueue `Q;poison` instead of being handed out again (0 = never).
    pub max_aborts: u32,
    /// Target journaling: a copy of every message received from the queue is kept in
    /// `Q;JOURNAL`.
    pub journal: bool,
    /// Most bytes `Q;JOURNAL` may hold; past it copies are not kept (and counted). `None`: the
    /// broker's default (1 GiB).
    pub journal_quota_bytes: Option<u64>,
}

/// Properties [`Client::set_queue_properties`] changes; `None` leaves one as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueProperties {
    pub label: Option<String>,
    /// `Some(None)` removes the queue quota; `Some(Some(n))` sets it.
    pub quota_bytes: Option<Option<u64>>,
    /// Target journaling on or off.
    pub journal: Option<bool>,
    /// The journal quota (bytes).
    pub journal_quota_bytes: Option<u64>,
    /// Transactional queues: the poison threshold (0 = never).
    pub max_aborts: Option<u32>,
}

/// A queue's description and counters.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QueueInfo {
    pub name: String,
    pub format_name: String,
    pub transactional: bool,
    pub messages: u64,
    pub bytes: u64,
    pub in_flight: u64,
    pub quota_bytes: Option<u64>,
    pub label: String,
    pub created_ms: u64,
    /// Messages that entered the queue (kept across restarts).
    pub sent: u64,
    /// Messages received (acknowledged) from the queue (kept across restarts).
    pub received: u64,
    /// Poison-message threshold (0 = none).
    pub max_aborts: u32,
    /// Messages moved to `Q;poison` (kept across restarts).
    pub poisoned: u64,
    /// Target journaling: received messages are copied to `Q;JOURNAL`.
    pub journal: bool,
    /// Most bytes `Q;JOURNAL` may hold.
    pub journal_quota_bytes: u64,
    /// Journal copies not kept (journal quota, broker quota or disk full) since the broker
    /// started.
    pub journal_not_kept: u64,
    /// Messages moved from the queue to a dead-letter queue. This total, `sent`,
    /// `received`, `purged`, `receive_aborts` and `poisoned` are kept across restarts of the
    /// broker (as of its last snapshot, at most about a second old after a crash).
    pub dead_lettered: u64,
    /// Transactional receives of its messages undone by an abort.
    pub receive_aborts: u64,
    /// Messages removed by purges.
    pub purged: u64,
}

impl From<v1::QueueInfo> for QueueInfo {
    fn from(q: v1::QueueInfo) -> Self {
        QueueInfo {
            name: q.name,
            format_name: q.format_name,
            transactional: q.transactional,
            messages: q.messages,
            bytes: q.bytes,
            in_flight: q.in_flight,
            quota_bytes: q.quota_bytes,
            label: q.label,
            created_ms: q.created_ms,
            sent: q.sent,
            received: q.received,
            max_aborts: q.max_aborts,
            poisoned: q.poisoned,
            journal: q.journal,
            journal_quota_bytes: q.journal_quota_bytes,
            journal_not_kept: q.journal_not_kept,
            dead_lettered: q.dead_lettered,
            receive_aborts: q.receive_aborts,
            purged: q.purged,
        }
    }
}

/// A queue's access control list: principal -> rights.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QueueAcl {
    pub queue: String,
    /// (principal, rights), sorted by principal.
    pub entries: Vec<(String, Vec<String>)>,
}

impl From<v1::QueueAcl> for QueueAcl {
    fn from(a: v1::QueueAcl) -> Self {
        QueueAcl {
            queue: a.queue,
            entries: a
                .entries
                .into_iter()
                .map(|e| (e.principal, e.rights))
                .collect(),
        }
    }
}

impl Client {
    /// Connects to the broker at `url` (e.g. `http://127.0.0.1:1801`) without credentials,
    /// with the default [`ClientOptions`] (deadlines: connect 5 s, calls 30 s). For TLS and
    /// credentials use [`Client::builder`].
    pub async fn connect(url: impl Into<String>) -> Result<Client> {
        ClientBuilder::new(url).connect().await
    }

    /// Connects to the broker at `url` with the given deadlines and keepalive.
    pub async fn connect_with(url: impl Into<String>, options: ClientOptions) -> Result<Client> {
        ClientBuilder::new(url).options(options).connect().await
    }

    /// Settings for a connection: TLS CA, client certificate, user or token.
    pub fn builder(url: impl Into<String>) -> ClientBuilder {
        ClientBuilder::new(url)
    }

    pub(crate) fn from_parts(
        rpc: Rpc,
        admin: AdminRpc,
        url: String,
        options: ClientOptions,
    ) -> Client {
        Client {
            rpc,
            admin,
            url,
            options,
            tx_pool: Default::default(),
            send_pool: Default::default(),
            queue_kinds: Default::default(),
        }
    }

    /// Grants `rights` (send, receive, peek, admin, or all) on queue `name` to `principal`
    /// (a user, `group:NAME`, `everyone` or `anonymous`); returns the queue's ACL.
    pub async fn grant(&self, name: &str, principal: &str, rights: &[&str]) -> Result<QueueAcl> {
        self.change_acl(name, principal, rights, true).await
    }

    /// Revokes `rights` on queue `name` from `principal`; returns the queue's ACL.
    pub async fn revoke(&self, name: &str, principal: &str, rights: &[&str]) -> Result<QueueAcl> {
        self.change_acl(name, principal, rights, false).await
    }

    async fn change_acl(
        &self,
        name: &str,
        principal: &str,
        rights: &[&str],
        grant: bool,
    ) -> Result<QueueAcl> {
        FormatName::parse(name)?;
        let mut grpc = self.admin.clone();
        let rpc = grpc.change_acl(v1::ChangeAclRequest {
            queue: name.to_string(),
            principal: principal.to_string(),
            rights: rights.iter().map(|r| r.to_string()).collect(),
            grant,
        });
        Ok(self
            .call("changing the queue's rights", Duration::ZERO, rpc)
            .await?
            .into())
    }

    /// Who may do what with queue `name` (needs `admin` on it).
    pub async fn acl(&self, name: &str) -> Result<QueueAcl> {
        FormatName::parse(name)?;
        let mut grpc = self.admin.clone();
        let rpc = grpc.get_acl(v1::GetAclRequest {
            name: name.to_string(),
        });
        Ok(self
            .call("reading the queue's rights", Duration::ZERO, rpc)
            .await?
            .into())
    }

    /// The deadlines this client works with.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// Runs a unary call with the call deadline plus `extra` (a wait the call asks for).
    pub(crate) async fn call<T>(
        &self,
        what: &str,
        extra: Duration,
        fut: impl std::future::Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        let limit = self.options.call_timeout.saturating_add(extra);
        Ok(deadline::within(limit, what, fut).await?.into_inner())
    }

    /// The URL this client connected to.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A handle to the queue (or multiple-element format name) `name`. The name is checked here;
    /// whether the queue exists is checked by each call.
    pub fn queue(&self, name: &str) -> Result<Queue> {
        let parsed = FormatName::parse(name)?;
        Ok(Queue::new(self.clone(), name.to_string(), parsed))
    }

    /// Creates a queue.
    pub async fn create_queue(&self, name: &str, options: QueueOptions) -> Result<QueueInfo> {
        FormatName::parse(name)?;
        let req = v1::CreateQueueRequest {
            name: name.to_string(),
            transactional: options.transactional,
            quota_bytes: options.quota_bytes,
            label: options.label,
            max_aborts: options.max_aborts,
            journal: options.journal,
            journal_quota_bytes: options.journal_quota_bytes,
        };
        let mut grpc = self.admin.clone();
        let rpc = grpc.create_queue(req);
        Ok(self
            .call("creating the queue", Duration::ZERO, rpc)
            .await?
            .into())
    }

    /// Changes a queue's properties (needs `admin` on it); returns once the change is on disk.
    pub async fn set_queue_properties(
        &self,
        name: &str,
        props: QueueProperties,
    ) -> Result<QueueInfo> {
        FormatName::parse(name)?;
        let req = v1::SetQueuePropertiesRequest {
            name: name.to_string(),
            label: props.label,
            quota_bytes: props.quota_bytes.flatten(),
            remove_quota: matches!(props.quota_bytes, Some(None)),
            journal: props.journal,
            journal_quota_bytes: props.journal_quota_bytes,
            max_aborts: props.max_aborts,
        };
        let mut grpc = self.admin.clone();
        let rpc = grpc.set_queue_properties(req);
        Ok(self
            .call("changing the queue", Duration::ZERO, rpc)
            .await?
            .into())
    }

    /// Deletes a queue and every message in it.
    pub async fn delete_queue(&self, name: &str) -> Result<()> {
        FormatName::parse(name)?;
        let mut grpc = self.admin.clone();
        let rpc = grpc.delete_queue(v1::DeleteQueueRequest {
            name: name.to_string(),
        });
        self.call("deleting the queue", Duration::ZERO, rpc).await?;
        Ok(())
    }

    /// A queue's description and counters.
    pub async fn queue_info(&self, name: &str) -> Result<QueueInfo> {
        FormatName::parse(name)?;
        let mut grpc = self.admin.clone();
        let rpc = grpc.get_queue_info(v1::GetQueueInfoRequest {
            name: name.to_string(),
        });
        Ok(self
            .call("about the queue", Duration::ZERO, rpc)
            .await?
            .into())
    }

    /// Every queue on the broker, sorted by name.
    /// Asks for 5,000 at a time (a broker may hold hundreds of thousands).
    pub async fn list_queues(&self) -> Result<Vec<QueueInfo>> {
        let mut all = Vec::new();
        let mut page_token = String::new();
        for _ in 0..MAX_LIST_PAGES {
            let mut grpc = self.admin.clone();
            let rpc = grpc.list_queues(v1::ListQueuesRequest {
                page_size: LIST_PAGE,
                page_token: page_token.clone(),
            });
            let r = self.call("listing queues", Duration::ZERO, rpc).await?;
            // The broker is not trusted to end the list: each page at most as asked, a token other
            // than the one before (tokens are opaque), and bounds on pages and queues.
            if r.queues.len() > LIST_PAGE as usize
                || (!r.next_page_token.is_empty() && r.next_page_token == page_token)
                || all.len() + r.queues.len() > MAX_LISTED_QUEUES
            {
                return Err(Error::Internal(format!(
                    "the broker's queue list does not end: a page of {} queues (asked for {LIST_PAGE}), next token \"{}\" after \"{}\", {} queues so far (at most {MAX_LISTED_QUEUES})",
                    r.queues.len(),
                    mq_proto::limits::quote(&r.next_page_token),
                    mq_proto::limits::quote(&page_token),
                    all.len()
                )));
            }
            all.extend(r.queues.into_iter().map(Into::into));
            if r.next_page_token.is_empty() {
                return Ok(all);
            }
            page_token = r.next_page_token;
        }
        Err(Error::Internal(format!(
            "the broker's queue list does not end: {MAX_LIST_PAGES} pages ({} queues)",
            all.len()
        )))
    }

    /// Removes every message waiting in a queue; returns how many.
    pub async fn purge(&self, name: &str) -> Result<u64> {
        FormatName::parse(name)?;
        let mut grpc = self.admin.clone();
        let rpc = grpc.purge(v1::PurgeRequest {
            name: name.to_string(),
        });
        Ok(self.call("purging", Duration::ZERO, rpc).await?.purged)
    }

    /// Moves the waiting message `id` out of `queue` (MSMQ's MoveMessage): from a queue or
    /// subqueue to the subqueue `destination` of the same queue (`""`: the main queue), or
    /// out of a dead-letter queue to the format name `destination` (`""`: where it was going),
    /// keeping its id and properties. Returns the message as it is now, without its body.
    pub async fn move_message(
        &self,
        queue: &str,
        id: crate::MessageId,
        destination: &str,
    ) -> Result<crate::ReceivedMessage> {
        FormatName::parse(queue)?;
        let mut grpc = self.rpc.clone();
        let rpc = grpc.move_message(v1::MoveMessageRequest {
            queue: queue.to_string(),
            id: bytes::Bytes::copy_from_slice(id.as_bytes()),
            destination: destination.to_string(),
        });
        let m = self
            .call("moving the message", Duration::ZERO, rpc)
            .await?
            .message
            .ok_or_else(|| {
                crate::Error::Internal("the broker answered a move without the message".into())
            })?;
        crate::ReceivedMessage::from_wire(m)
    }

    /// The broker's outgoing queues (store-and-forward: one per destination broker that this
    /// broker has messages for, or had since it started), with their state and counters.
    pub async fn outgoing(&self) -> Result<Vec<OutgoingQueue>> {
        let mut grpc = self.admin.clone();
        let rpc = grpc.list_outgoing(v1::ListOutgoingRequest {});
        let r = self
            .call("listing outgoing queues", Duration::ZERO, rpc)
            .await?;
        Ok(r.queues.into_iter().map(Into::into).collect())
    }

    /// Pauses forwarding to a destination broker (state [`OnHold`](crate::OutgoingState::OnHold)):
    /// messages for it wait in its outgoing queue until [`Client::resume_outgoing`]. Time limits
    /// keep running while it is paused. `destination` is `host:port` as [`Client::outgoing`]
    /// shows it, or the format name of any queue on that broker. Returns the queue's new state.
    pub async fn pause_outgoing(&self, destination: &str) -> Result<OutgoingQueue> {
        let req = v1::PauseOutgoingRequest {
            destination: outgoing_destination(destination)?,
        };
        let mut grpc = self.admin.clone();
        let rpc = grpc.pause_outgoing(req);
        Ok(self
            .call("pausing the outgoing queue", Duration::ZERO, rpc)
            .await?
            .into())
    }

    /// Resumes forwarding to a destination broker paused by [`Client::pause_outgoing`]; the
    /// broker connects at once. `destination` as for [`Client::pause_outgoing`]. Returns the
    /// queue's new state.
    pub async fn resume_outgoing(&self, destination: &str) -> Result<OutgoingQueue> {
        let req = v1::ResumeOutgoingRequest {
            destination: outgoing_destination(destination)?,
        };
        let mut grpc = self.admin.clone();
        let rpc = grpc.resume_outgoing(req);
        Ok(self
            .call("resuming the outgoing queue", Duration::ZERO, rpc)
            .await?
            .into())
    }

    /// Deletes the outgoing queue for a destination broker; refused (`FailedPrecondition`)
    /// while it holds messages. The next send to that broker creates a new one (empty ones
    /// also expire after `mqd --outgoing-idle-expiry`). `destination` as for
    /// [`Client::pause_outgoing`].
    pub async fn delete_outgoing(&self, destination: &str) -> Result<()> {
        let req = v1::DeleteOutgoingRequest {
            destination: outgoing_destination(destination)?,
        };
        let mut grpc = self.admin.clone();
        let rpc = grpc.delete_outgoing(req);
        self.call("deleting the outgoing queue", Duration::ZERO, rpc)
            .await?;
        Ok(())
    }

    /// Removes every message waiting in the outgoing queue for a destination broker (one that
    /// will never come back), and returns how many; messages in flight to it are not removed
    /// (pause it first to have none). `destination` as for [`Client::pause_outgoing`]. Needs the
    /// broker-wide `outgoing` right.
    pub async fn purge_outgoing(&self, destination: &str) -> Result<u64> {
        let req = v1::PurgeOutgoingRequest {
            destination: outgoing_destination(destination)?,
        };
        let mut grpc = self.admin.clone();
        let rpc = grpc.purge_outgoing(req);
        Ok(self
            .call("purging the outgoing queue", Duration::ZERO, rpc)
            .await?
            .purged)
    }

    /// Begins a transaction (see [`Transaction`]) with a new id (a UUID v7 chosen here).
    pub async fn begin(&self) -> Result<Transaction> {
        Transaction::begin(self, TxId::new()).await
    }

    /// Begins a transaction with the id `id`: to retry one whose commit was in doubt
    /// ([`Error::InDoubt`]). The broker refuses an id that already committed
    /// ([`Error::AlreadyCommitted`]), so the retry commits at most once; [`Client::commit_once`]
    /// does all of it.
    pub async fn begin_with_id(&self, id: TxId) -> Result<Transaction> {
        Transaction::begin(self, id).await
    }

    /// How many batches of requests this client's transactions (and its clones') have written
    /// to their `Transact` streams: one for each answer a transaction waits for (a receive, a
    /// commit, an abort; its begin and sends go with it) and one per 64 KiB of sends staged
    /// ahead of it. A one-at-a-time transaction of sends and a commit, or of a
    /// [`Transaction::receive_and_commit`], costs one; to check what transactions cost.
    pub fn transaction_batches(&self) -> u64 {
        self.tx_pool.batches()
    }

    /// Whether the transaction `id` committed, as far as the broker knows (it remembers commits
    /// for a retention window, `mqd --tx-outcome-retention`, default 24 h).
    pub async fn transaction_outcome(&self, id: TxId) -> Result<TxStatus> {
        let mut grpc = self.rpc.clone();
        let rpc = grpc.transaction_outcome(v1::TransactionOutcomeRequest {
            id: id.0.as_bytes().to_vec().into(),
        });
        let r = self
            .call("about the transaction", Duration::ZERO, rpc)
            .await?;
        Ok(TxStatus::from_wire(r))
    }

    /// What the broker is: name, version, protocol version, uptime, addresses, data directory
    /// use and limits (`mq info`).
    pub async fn broker_info(&self) -> Result<crate::BrokerInfo> {
        let mut grpc = self.rpc.clone();
        let rpc = grpc.get_broker_info(());
        self.call("about the broker", Duration::ZERO, rpc).await
    }

    /// Runs a transaction with id `id` until it is known to have committed, at most once:
    /// asks the broker whether `id` committed; if not, begins a transaction with that id, lets
    /// `build` stage its sends and receives, and commits. An in-doubt commit is asked about and
    /// retried (up to `attempts` times in all). The broker refuses an id that committed, so
    /// `build`'s work is committed at most once. Returns whether this call committed it or it
    /// had committed before.
    pub async fn commit_once<F, Fut>(
        &self,
        id: TxId,
        attempts: u32,
        mut build: F,
    ) -> Result<CommitOnce>
    where
        F: FnMut(Transaction) -> Fut,
        Fut: std::future::Future<Output = Result<Transaction>>,
    {
        let mut last = None;
        for attempt in 0..attempts.max(1) {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt.min(5))).await;
            }
            match self.transaction_outcome(id).await {
                Ok(s) if s.outcome == TxOutcome::Committed => {
                    return Ok(CommitOnce::AlreadyCommitted)
                }
                Ok(s) if s.outcome == TxOutcome::InProgress => {
                    last = Some(Error::InDoubt {
                        id,
                        reason: s.detail,
                    });
                    continue;
                }
                Ok(_) => {}
                Err(e @ (Error::Unavailable(_) | Error::Timeout(_) | Error::Connect { .. })) => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            }
            let tx = match self.begin_with_id(id).await {
                Ok(tx) => tx,
                Err(e @ (Error::Unavailable(_) | Error::Timeout(_))) => {
                    last = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            let tx = build(tx).await?;
            match tx.commit().await {
                Ok(ids) => return Ok(CommitOnce::Committed(ids)),
                Err(Error::AlreadyCommitted { .. }) => return Ok(CommitOnce::AlreadyCommitted),
                Err(e @ (Error::InDoubt { .. } | Error::Unavailable(_) | Error::Timeout(_))) => {
                    last = Some(e)
                }
                Err(Error::FailedPrecondition(m)) if m.contains("open on another connection") => {
                    last = Some(Error::InDoubt { id, reason: m })
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::InDoubt {
            id,
            reason: "no attempt was made".into(),
        }))
    }

    /// Sends `message` to `destination` as the transaction `id`, at most once: the retry of a
    /// single-message transactional send whose outcome was unknown ([`Error::InDoubt`] from a
    /// [`Sender`] with `SenderOptions::transactional`, or [`Sender::in_doubt_ids`]). Asks the
    /// broker whether `id` committed; if not, sends and commits it in a transaction with that
    /// id ([`Client::commit_once`], up to `attempts` tries).
    pub async fn send_once(
        &self,
        id: TxId,
        destination: &str,
        message: Message,
        attempts: u32,
    ) -> Result<CommitOnce> {
        FormatName::parse(destination)?;
        self.commit_once(id, attempts, |mut tx| {
            let m = message.clone();
            async move {
                tx.send(destination, m)?;
                Ok(tx)
            }
        })
        .await
    }

    /// Send streams [`Queue::send`] has opened on this connection (shared by the client's
    /// clones). It keeps one per queue (for the 8 queues sent to most recently) and opens
    /// another only for a new queue or when the broker ended the kept one, so a loop of
    /// one-message sends to one queue opens one.
    pub fn one_shot_senders_opened(&self) -> u64 {
        self.send_pool.opened()
    }

    /// A pipelining sender to `destination` (a queue or a multiple-element format name).
    pub async fn sender(&self, destination: &str, options: SenderOptions) -> Result<Sender> {
        FormatName::parse(destination)?;
        Sender::open(self.clone(), destination.to_string(), options).await
    }
}

/// Queues [`Client::list_queues`] asks for per call.
const LIST_PAGE: u32 = 5000;
/// Queues [`Client::list_queues`] takes in all, at most (a broker holds far fewer: its
/// `--max-queues`, 200,000 by default); a list that goes on is a broken or hostile broker's.
const MAX_LISTED_QUEUES: usize = 5_000_000;
/// Pages [`Client::list_queues`] asks for, at most (a page may hold none of the caller's
/// queues, so this allows far more queues than [`MAX_LISTED_QUEUES`] to be walked).
const MAX_LIST_PAGES: usize = 10_000;

/// Whether a broker of protocol revision `broker` (mqd `version`) at `url` can serve this
/// client: at least [`mq_proto::MIN_PROTOCOL_VERSION`].
pub(crate) fn protocol_compatible(url: &str, broker: u32, version: &str) -> Result<()> {
    if broker < mq_proto::MIN_PROTOCOL_VERSION {
        return Err(Error::Incompatible(format!(
            "the broker at {url} (mqd {version}) speaks mq.v1 protocol revision {broker}; this client (mq-client {}) needs revision {} or newer: upgrade mqd, or use an mq-client as old as the broker",
            env!("CARGO_PKG_VERSION"),
            mq_proto::MIN_PROTOCOL_VERSION
        )));
    }
    if broker > mq_proto::PROTOCOL_VERSION {
        tracing::debug!(
            broker,
            client = mq_proto::PROTOCOL_VERSION,
            "the broker is newer than this client; mq.v1 only grows, so everything here works"
        );
    }
    Ok(())
}

/// The request naming an outgoing queue: `host:port`, or a queue name (checked here, like every
/// other queue name, before anything is sent).
fn outgoing_destination(destination: &str) -> Result<String> {
    let destination = destination.trim();
    if destination.is_empty() {
        return Err(Error::InvalidArgument(
            "no destination given: name the destination broker as host:port (as `mq outgoing \
             list` shows it) or give the format name of a queue on it"
                .to_string(),
        ));
    }
    if destination.contains(['\\', '/', '=']) {
        FormatName::parse(destination)?;
    }
    Ok(destination.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 18 point 4: a broker older than the client's minimum revision is refused with a
    /// message that names both revisions and says what to upgrade; a newer one is fine.
    #[test]
    fn an_older_broker_is_refused_clearly_and_a_newer_one_accepted() {
        let url = "http://127.0.0.1:1801";
        let e = protocol_compatible(url, mq_proto::MIN_PROTOCOL_VERSION - 1, "0.0.1").unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Incompatible(_)), "{e:?}");
        assert!(
            text.contains("upgrade mqd") && text.contains(url) && text.contains("revision 1"),
            "{text}"
        );
        protocol_compatible(url, mq_proto::MIN_PROTOCOL_VERSION, "x").unwrap();
        protocol_compatible(url, mq_proto::PROTOCOL_VERSION + 5, "x").unwrap();
    }

    #[test]
    fn outgoing_request_accepts_host_port_and_format_names() {
        assert_eq!(
            outgoing_destination(" 10.0.0.5:1802 ").unwrap(),
            "10.0.0.5:1802"
        );
        let name = r"DIRECT=TCP:10.0.0.5:1802\private$\orders";
        assert_eq!(outgoing_destination(name).unwrap(), name);
    }

    #[test]
    fn outgoing_request_refuses_empty_and_bad_names() {
        assert!(matches!(
            outgoing_destination("  "),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            outgoing_destination(r"DIRECT=BOGUS:host\private$\q"),
            Err(Error::InvalidName(_))
        ));
    }
}
