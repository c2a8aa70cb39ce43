//! Subqueues (`Q;name`, MSMQ 4.0), moving one message by id between a queue and its
//! subqueues or out of a dead-letter queue (replay), and poison messages (`--max-aborts`).
//!
//! - A subqueue is created (journaled) the first time it is opened or moved into, shares its
//!   main queue's ACL, quota and kind (transactional or not), and is deleted with it. It can be
//!   received from, peeked and purged, never sent to.
//! - A move is one journal record (`Put` where it goes, `Remove` where it was), so after a crash
//!   the message is in exactly one place. Moving within a queue changes no quota charge,
//!   increments the message's move count and resets its abort count.
//! - Replay takes a message out of `SYSTEM$;DEADLETTER` / `;DEADXACT` to its original
//!   destination (or another queue): same id and properties, no dead-letter record, and timers
//!   that already passed cleared (else it would be dead-lettered again at once).
//! - A transactional queue with `max_aborts` N moves a message whose receiving transaction
//!   aborted N times to `Q;poison` instead of putting it back.

use std::str::FromStr;
use std::sync::Arc;

use bytes::Bytes;
use mq_proto::format_name::QueueAddress;
use mq_proto::limits::quote;
use mq_proto::v1;

use crate::broker::{journal_failed, Broker};
use crate::error::BrokerError;
use crate::journal::Op;
use crate::message::{now_ms, Delivery, StoredMessage};
use crate::queue::{Entry, Queue, QueueDef, QueueRole};

/// Most subqueues one queue may have.
pub const MAX_SUBQUEUES: usize = 64;
/// The highest `max_aborts` a queue may have.
pub const MAX_MAX_ABORTS: u32 = 10_000;
/// The subqueue poison messages are moved to.
pub const POISON_SUBQUEUE: &str = "poison";

/// Checks that the caller may send to a local queue (`None`: another broker's queue).
pub(crate) type MaySend = dyn Fn(Option<&Arc<Queue>>) -> Result<(), BrokerError> + Sync;

/// Poison-message handling of a transactional queue, journaled with its definition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PoisonPolicy {
    /// A message whose receive was aborted this many times goes to `Q;poison` (0 = never).
    pub max_aborts: u32,
}

impl PoisonPolicy {
    /// The policy a create request asks for, checked.
    pub(crate) fn from_request(req: &v1::CreateQueueRequest) -> Result<Self, BrokerError> {
        if req.max_aborts == 0 {
            return Ok(PoisonPolicy::default());
        }
        if !req.transactional {
            return Err(BrokerError::InvalidArgument(
                "max_aborts (poison messages) needs a transactional queue: only a transaction's receive can be aborted".into(),
            ));
        }
        if req.max_aborts > MAX_MAX_ABORTS {
            return Err(BrokerError::InvalidArgument(format!(
                "max_aborts is {}; the limit is {MAX_MAX_ABORTS}",
                req.max_aborts
            )));
        }
        Ok(PoisonPolicy {
            max_aborts: req.max_aborts,
        })
    }

    pub(crate) fn is_default(&self) -> bool {
        *self == PoisonPolicy::default()
    }
}

/// The key of subqueue `sub` of the queue whose key is `main`.
fn subqueue_key(main: &str, sub: &str) -> String {
    format!("{main};{}", sub.to_lowercase())
}

/// Links every recovered subqueue to its main queue (its quota charge moves there). A subqueue
/// whose main queue is gone (it cannot be: they are deleted together) is left alone.
pub(crate) fn link_recovered(queues: &std::collections::HashMap<String, Arc<Queue>>) {
    for q in queues.values() {
        if q.def().role != QueueRole::Subqueue {
            continue;
        }
        let Some((main, _)) = q.def().key.rsplit_once(';') else {
            continue;
        };
        if let Some(parent) = queues.get(main) {
            q.set_parent(parent.clone());
        }
    }
}

impl Broker {
    /// The subqueue `addr` names, created (journaled) if its main queue exists and it does not.
    pub(crate) fn open_subqueue(
        &self,
        name: &str,
        addr: &QueueAddress,
    ) -> Result<Arc<Queue>, BrokerError> {
        let main = self.local_queue(name, &addr.main_queue())?;
        self.subqueue_of(&main, &addr.subqueue)
    }

    /// Subqueue `sub` of `main` (a normal queue), created if missing.
    fn subqueue_of(&self, main: &Arc<Queue>, sub: &str) -> Result<Arc<Queue>, BrokerError> {
        if !main.def().role.is_normal() {
            return Err(BrokerError::FailedPrecondition(format!(
                "\"{}\" has no subqueues: only application queues do",
                main.def().name
            )));
        }
        let key = subqueue_key(&main.def().key, sub);
        let prefix = format!("{};", main.def().key);
        let main2 = main.clone();
        let (q, created) = self.queue_or_define(
            &key,
            |registry| {
                let n = registry
                    .iter()
                    .filter(|(k, q)| k.starts_with(&prefix) && q.def().role == QueueRole::Subqueue)
                    .count();
                if n >= MAX_SUBQUEUES {
                    return Err(BrokerError::QuotaExceeded(format!(
                        "queue \"{}\" has {n} subqueues; the limit is {MAX_SUBQUEUES} (they are deleted with the queue)",
                        main2.def().name
                    )));
                }
                Ok(())
            },
            |id| {
                let mut def = QueueDef::new(
                    id,
                    format!("{};{sub}", main.def().name),
                    key.clone(),
                    main.def().transactional,
                    None,
                    String::new(),
                );
                def.role = QueueRole::Subqueue;
                def
            },
        )?;
        if created {
            q.set_parent(main.clone());
            tracing::info!(queue = %q.def().name, "subqueue created");
        }
        if q.def().role != QueueRole::Subqueue || q.parent().is_none_or(|p| !Arc::ptr_eq(p, main)) {
            return Err(BrokerError::QueueNotFound(q.def().name.clone()));
        }
        Ok(q)
    }

    /// Moves the waiting message `id` out of `src`: within a queue (`src` a queue or subqueue,
    /// `destination` a subqueue name or empty for the main queue), or out of a dead-letter queue
    /// (`destination` a format name, or empty for the message's original destination; a local
    /// destination is checked with `may_send`). Returns the message as it is now (no body).
    pub(crate) async fn move_message(
        self: &Arc<Self>,
        src: &Arc<Queue>,
        id: uuid::Uuid,
        destination: &str,
        may_send: &MaySend,
    ) -> Result<v1::Message, BrokerError> {
        let within = match src.def().role {
            QueueRole::Normal | QueueRole::Subqueue => Some(self.sibling(src, destination)?),
            QueueRole::DeadLetter | QueueRole::DeadXact => None,
            _ => {
                return Err(BrokerError::FailedPrecondition(format!(
                    "messages cannot be moved out of \"{}\"",
                    src.def().name
                )))
            }
        };
        if let Some(d) = &within {
            if Arc::ptr_eq(d, src) {
                return Err(BrokerError::InvalidArgument(format!(
                    "the message is in \"{}\" already; name another subqueue (or '' for the main queue)",
                    src.def().name
                )));
            }
        }
        let entry = src.take_id(id)?.ok_or_else(|| {
            BrokerError::NotFound(format!(
                "no message with id {id} is waiting in \"{}\" (it may be received, in flight to a receiver, or never have been there)",
                src.def().name
            ))
        })?;
        if entry.msg.delivery == Delivery::Recoverable {
            if let Err(e) = self.check_writable("move recoverable messages") {
                self.give_back(src, entry);
                return Err(e);
            }
        }
        // (destination, the message as it goes there, its dead-letter info's charge to give
        // back once there: a replay's).
        let same_queue = within.is_some();
        let (dest, moved, less) = match within {
            Some(dest) => {
                let moved = StoredMessage {
                    move_count: entry.msg.move_count.saturating_add(1),
                    ..(*entry.msg).clone()
                };
                (dest, moved, None)
            }
            None => match self.replay_to(&entry, destination, may_send) {
                Ok((dest, moved, less)) => (dest, moved, Some(less)),
                Err(e) => {
                    self.give_back(src, entry);
                    return Err(e);
                }
            },
        };
        // In a task of its own, to the end: a caller that went away (a deadline) while the
        // move's record was written left the message taken from `src`, in flight for good,
        // until a restart (helper-72; a replay's until stop 49).
        let (b, src) = (self.clone(), src.clone());
        let task = tokio::spawn(async move {
            let placed = b.place(&src, &entry, &dest, moved, same_queue).await;
            match placed {
                Ok(wire) => {
                    if let Some(less) = less {
                        b.release(entry.msg.delivery, less);
                        tracing::info!(id = %entry.msg.id, from = %src.def().name, to = %quote(&dest.def().name), "dead letter replayed");
                    }
                    src.complete_moved(&entry, within_keeps_charge(&src));
                    Ok(wire)
                }
                Err(e) => {
                    b.give_back(&src, entry);
                    Err(e)
                }
            }
        });
        task.await
            .map_err(|e| BrokerError::Internal(format!("the move's task failed: {e}")))?
    }

    fn give_back(&self, src: &Queue, entry: Entry) {
        let gone = src.restore(vec![entry]);
        self.forget_deleted(src, &gone);
    }

    /// Where a move within `src`'s queue goes: subqueue `name` of its main queue, or the main
    /// queue for an empty name.
    fn sibling(&self, src: &Arc<Queue>, name: &str) -> Result<Arc<Queue>, BrokerError> {
        let main = src.parent().cloned().unwrap_or_else(|| src.clone());
        if name.is_empty() {
            return Ok(main);
        }
        let addr = QueueAddress::from_str(&main.def().name)?;
        addr.with_subqueue(name).map_err(|reason| {
            BrokerError::InvalidArgument(format!(
                "invalid subqueue name \"{}\": {reason}",
                quote(name)
            ))
        })?;
        self.subqueue_of(&main, name)
    }

    /// Where a dead letter replayed to `destination` (its original destination for `""`) goes,
    /// the message as it goes there, and the charge of its dead-letter info (given back once it
    /// is there): its id and properties, without the dead-letter record and without timers
    /// that passed. Checks the caller's right to send there.
    fn replay_to(
        self: &Arc<Self>,
        entry: &Entry,
        destination: &str,
        may_send: &MaySend,
    ) -> Result<(Arc<Queue>, StoredMessage, u64), BrokerError> {
        let m = &entry.msg;
        let name = if destination.is_empty() {
            match &m.dead_letter {
                Some(d) if !d.destination.is_empty() => d.destination.clone(),
                _ => {
                    return Err(BrokerError::FailedPrecondition(format!(
                        "message {} names no original destination; name the queue to move it to",
                        m.id
                    )))
                }
            }
        } else {
            destination.to_string()
        };
        let plan = self.destinations(&name, m.transactional)?;
        if plan.len() != 1 {
            return Err(BrokerError::InvalidArgument(format!(
                "\"{}\" names {} queues; a message is moved to one",
                quote(&name),
                plan.len()
            )));
        }
        for q in plan.local_queues() {
            may_send(q)?;
        }
        let target = self.targets(&plan)?.remove(0);
        let now = now_ms();
        let moved = StoredMessage {
            dead_letter: None,
            route: target.route.clone(),
            reach_queue_by_ms: if m.reach_expired(now) {
                0
            } else {
                m.reach_queue_by_ms
            },
            receive_by_ms: if m.receive_expired(now) {
                0
            } else {
                m.receive_by_ms
            },
            ..(**m).clone()
        };
        // The broker-wide quota counted the dead letter with its info (`charged_bytes`); the
        // copy that goes on has none.
        let less = m.charged_bytes().saturating_sub(moved.charged_bytes());
        Ok((target.queue, moved, less))
    }

    /// Stores `moved` (the message of `entry`, taken from `src`) in `dest`: one journal record
    /// with its removal from `src` for a recoverable one. `same_queue`: `dest` shares `src`'s
    /// main queue (no quota is charged). The caller completes or gives back `entry`.
    async fn place(
        &self,
        src: &Queue,
        entry: &Entry,
        dest: &Arc<Queue>,
        moved: StoredMessage,
        same_queue: bool,
    ) -> Result<v1::Message, BrokerError> {
        let charge = if same_queue { 0 } else { moved.charged_bytes() };
        let seq = if same_queue {
            dest.admit_reserved()?
        } else {
            match dest
                .admit(std::slice::from_ref(&Arc::new(moved.clone())))?
                .pop()
            {
                Some(r) => r?,
                None => return Err(BrokerError::Internal("admit returned nothing".into())),
            }
        };
        // Given back on every way out but an insert, a cancelled task's too.
        let admitted = dest.unadmit_on_drop(seq, charge);
        let wire = moved.to_wire(&dest.info().format_name, Bytes::new(), 0);
        match moved.delivery {
            Delivery::Express => {
                admitted.disarm();
                self.insert_or_forget(dest, vec![Entry::new(seq, Arc::new(moved))]);
            }
            Delivery::Recoverable => {
                let body = self.body(src, entry)?;
                let moved = StoredMessage {
                    body: Some(body),
                    ..moved
                };
                let ops = vec![
                    moved.put_op(dest.def().id, seq),
                    Op::Remove {
                        queue_id: src.def().id,
                        seqs: vec![entry.seq],
                    },
                ];
                self.journal().submit(ops).await.map_err(journal_failed)?;
                admitted.disarm();
                self.insert_or_forget(dest, vec![Entry::new(seq, Arc::new(moved.without_body()))]);
            }
        }
        Ok(wire)
    }

    /// Moves entries whose receiving transaction aborted (taken from `q`, counted in flight)
    /// to `Q;poison`, in a task of its own; what cannot be moved goes back to `q`.
    pub(crate) fn poison_later(self: &Arc<Self>, q: Arc<Queue>, entries: Vec<Entry>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            let gone = q.restore(entries);
            self.forget_deleted(&q, &gone);
            return;
        };
        let broker = self.clone();
        rt.spawn(async move {
            for entry in entries {
                let poison = match broker.sibling(&q, POISON_SUBQUEUE) {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::error!(queue = %q.def().name, error = %e, "cannot open the poison subqueue; the message goes back");
                        broker.give_back(&q, entry);
                        continue;
                    }
                };
                let moved = StoredMessage {
                    move_count: entry.msg.move_count.saturating_add(1),
                    ..(*entry.msg).clone()
                };
                match broker.place(&q, &entry, &poison, moved, true).await {
                    Ok(_) => {
                        q.complete_moved(&entry, true);
                        q.count_poisoned();
                        tracing::warn!(id = %entry.msg.id, queue = %q.def().name, aborts = entry.aborts, "poison message moved to the poison subqueue");
                    }
                    Err(e) => {
                        tracing::error!(id = %entry.msg.id, queue = %q.def().name, error = %e, "cannot move a poison message; it goes back");
                        broker.give_back(&q, entry);
                    }
                }
            }
        });
    }
}

/// Moves within a queue keep the main queue's quota charge; a dead letter gives its
/// dead-letter queue's charge back (the destination charged its own).
fn within_keeps_charge(src: &Queue) -> bool {
    matches!(src.def().role, QueueRole::Normal | QueueRole::Subqueue)
}
