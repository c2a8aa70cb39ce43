//! The broker: its queues by name, the express memory quota, and name resolution
//! ("is this format name one of my queues?").

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use mq_proto::format_name::{FormatName, QueueAddress, QueueKind};
use mq_proto::v1;

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::message::StoredMessage;
use crate::queue::{Queue, QueueDef};

/// The broker's state, shared by every connection.
#[derive(Debug)]
pub struct Broker {
    config: BrokerConfig,
    local_addrs: Vec<SocketAddr>,
    queues: RwLock<HashMap<String, Arc<Queue>>>,
    express_used: AtomicU64,
    shutdown: tokio::sync::watch::Sender<bool>,
}

/// The outcome of one send batch: per message, its id or why it was refused.
#[derive(Debug)]
pub struct BatchOutcome {
    pub ids: Vec<Option<uuid::Uuid>>,
    pub failures: Vec<(usize, BrokerError)>,
}

impl Broker {
    /// A broker with no queues, answering to `config.name` and `local_addrs`.
    pub fn new(config: BrokerConfig, local_addrs: Vec<SocketAddr>) -> Self {
        Broker {
            config,
            local_addrs,
            queues: RwLock::new(HashMap::new()),
            express_used: AtomicU64::new(0),
            shutdown: tokio::sync::watch::channel(false).0,
        }
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    /// Tells every waiting receive and open stream to finish.
    pub fn begin_shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Resolves once [`Broker::begin_shutdown`] has been called.
    pub async fn shutting_down(&self) {
        let mut rx = self.shutdown.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn is_shutting_down(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Parses `name` and checks that it is one queue on this broker.
    pub fn resolve(&self, name: &str) -> Result<QueueAddress, BrokerError> {
        let parsed = FormatName::parse(name)?;
        let addr = parsed.single().cloned().ok_or_else(|| {
            BrokerError::InvalidArgument(format!(
                "\"{name}\" is a multiple-element format name; those can only be sent to, not received from, peeked at or administered"
            ))
        })?;
        self.check_local(name, &addr)?;
        Ok(addr)
    }

    fn check_local(&self, name: &str, addr: &QueueAddress) -> Result<(), BrokerError> {
        if addr.is_local_to(std::slice::from_ref(&self.config.name), &self.local_addrs) {
            Ok(())
        } else {
            Err(BrokerError::FailedPrecondition(format!(
                "\"{name}\" names a queue on another broker; this broker is \"{}\" at {:?}, and forwarding to remote queues (store-and-forward) is not implemented yet",
                self.config.name, self.local_addrs
            )))
        }
    }

    fn normal_queue_key(&self, name: &str, addr: &QueueAddress) -> Result<String, BrokerError> {
        match addr.kind {
            QueueKind::Normal => Ok(addr.key()),
            QueueKind::Journal => Err(BrokerError::FailedPrecondition(format!(
                "\"{name}\" is a queue journal; journal queues are not kept by this broker yet"
            ))),
            QueueKind::DeadLetter | QueueKind::DeadXact => Err(BrokerError::FailedPrecondition(format!(
                "\"{name}\" is a dead-letter queue; dead-letter queues are not kept by this broker yet"
            ))),
        }
    }

    /// Creates a queue.
    pub fn create_queue(&self, req: v1::CreateQueueRequest) -> Result<Arc<Queue>, BrokerError> {
        let addr = self.resolve(&req.name)?;
        let key = self.normal_queue_key(&req.name, &addr)?;
        let label_chars = req.label.chars().count();
        if label_chars > crate::config::MAX_LABEL_CHARS {
            return Err(BrokerError::InvalidArgument(format!(
                "queue label is {label_chars} characters; the limit is {}",
                crate::config::MAX_LABEL_CHARS
            )));
        }
        let mut queues = self.queues.write().unwrap_or_else(|p| p.into_inner());
        if queues.contains_key(&key) {
            return Err(BrokerError::QueueExists(local_path_name(&addr)));
        }
        let def = QueueDef::new(
            local_path_name(&addr),
            key.clone(),
            req.transactional,
            req.quota_bytes,
            req.label,
        );
        let q = Arc::new(Queue::new(def));
        queues.insert(key, q.clone());
        tracing::info!(queue = %q.def().name, transactional = req.transactional, "queue created");
        Ok(q)
    }

    /// Deletes a queue and every message in it.
    pub fn delete_queue(&self, name: &str) -> Result<(), BrokerError> {
        let addr = self.resolve(name)?;
        let key = self.normal_queue_key(name, &addr)?;
        let q = self
            .queues
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key)
            .ok_or_else(|| BrokerError::QueueNotFound(local_path_name(&addr)))?;
        let charged = q.mark_deleted();
        self.release_express(charged);
        tracing::info!(queue = %q.def().name, "queue deleted");
        Ok(())
    }

    /// The local queue `name` names.
    pub fn queue(&self, name: &str) -> Result<Arc<Queue>, BrokerError> {
        let addr = self.resolve(name)?;
        let key = self.normal_queue_key(name, &addr)?;
        self.queue_by_key(&key)
            .ok_or_else(|| BrokerError::QueueNotFound(local_path_name(&addr)))
    }

    fn queue_by_key(&self, key: &str) -> Option<Arc<Queue>> {
        self.queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .cloned()
    }

    /// Every queue, sorted by name.
    pub fn list(&self) -> Vec<Arc<Queue>> {
        let mut v: Vec<_> = self
            .queues
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.def().key.cmp(&b.def().key));
        v
    }

    /// Removes every ready message of a queue.
    pub fn purge(&self, name: &str) -> Result<u64, BrokerError> {
        let q = self.queue(name)?;
        let (n, charged) = q.purge();
        self.release_express(charged);
        Ok(n)
    }

    /// The queues a send destination names: one, or several for a multiple-element name.
    pub fn destinations(&self, name: &str) -> Result<Vec<Arc<Queue>>, BrokerError> {
        let parsed = FormatName::parse(name)?;
        let mut out: Vec<Arc<Queue>> = Vec::with_capacity(parsed.addresses().len());
        for addr in parsed.addresses() {
            self.check_local(name, addr)?;
            if addr.is_read_only() {
                return Err(BrokerError::FailedPrecondition(format!(
                    "\"{name}\" names a read-only queue ({}); journal and dead-letter queues cannot be sent to",
                    addr.path_name()
                )));
            }
            let key = self.normal_queue_key(name, addr)?;
            let q = self
                .queue_by_key(&key)
                .ok_or_else(|| BrokerError::QueueNotFound(local_path_name(addr)))?;
            if q.def().transactional {
                return Err(BrokerError::FailedPrecondition(format!(
                    "queue \"{}\" is transactional and accepts only transactional sends; this send is not transactional",
                    q.def().name
                )));
            }
            // The same queue twice in one multiple-element name gets one copy.
            if !out.iter().any(|o| Arc::ptr_eq(o, &q)) {
                out.push(q);
            }
        }
        Ok(out)
    }

    /// Stores one batch of messages in every destination queue: each message gets one id, shared
    /// by its copies. Express messages are acknowledged once in the queue.
    pub fn send_batch(&self, dests: &[Arc<Queue>], msgs: Vec<v1::OutMessage>) -> BatchOutcome {
        let mut ids = vec![None; msgs.len()];
        let mut failures = Vec::new();
        let mut accepted = Vec::with_capacity(msgs.len());
        let mut index = Vec::with_capacity(msgs.len());
        for (i, m) in msgs.into_iter().enumerate() {
            if self.is_shutting_down() {
                failures.push((i, BrokerError::ShuttingDown));
                continue;
            }
            match StoredMessage::accept(m, uuid::Uuid::now_v7(), &self.config) {
                Ok(sm) => {
                    let charge = sm.charged_bytes() * dests.len() as u64;
                    if let Err(e) = self.reserve_express(charge) {
                        failures.push((i, e));
                        continue;
                    }
                    accepted.push(Arc::new(sm));
                    index.push(i);
                }
                Err(e) => failures.push((i, e)),
            }
        }
        let mut refused = vec![false; accepted.len()];
        for q in dests {
            match q.push(&accepted) {
                Ok(results) => {
                    for (j, r) in results.into_iter().enumerate() {
                        if let Err(e) = r {
                            self.release_express(accepted[j].charged_bytes());
                            if !refused[j] {
                                refused[j] = true;
                                failures.push((index[j], e));
                            }
                        }
                    }
                }
                Err(e) => {
                    for (j, m) in accepted.iter().enumerate() {
                        self.release_express(m.charged_bytes());
                        if !refused[j] {
                            refused[j] = true;
                            failures.push((index[j], e.clone()));
                        }
                    }
                }
            }
        }
        for (j, m) in accepted.iter().enumerate() {
            if !refused[j] {
                ids[index[j]] = Some(m.id);
            }
        }
        failures.sort_by_key(|(i, _)| *i);
        BatchOutcome { ids, failures }
    }

    fn reserve_express(&self, bytes: u64) -> Result<(), BrokerError> {
        let quota = self.config.express_quota_bytes;
        let mut cur = self.express_used.load(Ordering::Relaxed);
        loop {
            if cur + bytes > quota {
                return Err(BrokerError::QuotaExceeded(format!(
                    "the broker's express memory quota is full: {cur} of {quota} bytes used, this message needs {bytes}; receive or purge messages, or raise mqd --express-quota-bytes"
                )));
            }
            match self.express_used.compare_exchange_weak(
                cur,
                cur + bytes,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Returns quota bytes of removed messages.
    pub fn release_express(&self, bytes: u64) {
        if bytes > 0 {
            self.express_used.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Express bytes currently held.
    pub fn express_used(&self) -> u64 {
        self.express_used.load(Ordering::Relaxed)
    }
}

/// `.\private$\name` or `.\name`: how a local queue is shown, with the name as written.
fn local_path_name(addr: &QueueAddress) -> String {
    if addr.private {
        format!(".\\private$\\{}", addr.name)
    } else {
        format!(".\\{}", addr.name)
    }
}
