//! Deleting outgoing queues: on request when empty (`DeleteOutgoing`, `mq outgoing delete`),
//! and by expiry once empty, unpaused and unused for `--outgoing-idle-expiry`.

use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::forward::{no_outgoing_queue, outgoing_key, Outgoing};
use crate::journal::Op;
use crate::message::now_ms;

impl Broker {
    /// Deletes the empty outgoing queue for `destination` (`host:port`, or the format name of a
    /// queue on that broker). Refused while it holds messages.
    pub async fn delete_outgoing(self: &Arc<Self>, destination: &str) -> Result<(), BrokerError> {
        let key = outgoing_key(|a| self.is_local(a), destination)?;
        // One redefinition at a time (a pause or resume of this queue waits), and in force only
        // once journaled: a refused deletion leaves the queue as it was.
        let _one = self.redefinitions.lock().await;
        self.check_writable("delete an outgoing queue")?;
        let o = self.remove_outgoing(&key, |_| true)?;
        let Some(o) = o else {
            return Err(match self.outgoing_by_key(&key) {
                None => no_outgoing_queue(&key),
                Some(o) => {
                    let st = o.queue().stats();
                    BrokerError::FailedPrecondition(format!(
                        "the outgoing queue for {key} holds {} messages ({} in flight); only an empty one can be deleted: wait until they are forwarded, or purge them (mq outgoing purge)",
                        st.messages, st.in_flight
                    ))
                }
            });
        };
        if let Err(e) = self
            .journal()
            .submit(vec![Op::DeleteQueue {
                queue_id: o.queue().def().id,
            }])
            .await
        {
            if e.may_be_stored() {
                // Maybe deleted (the journal is poisoned now): it stays out.
                return Err(BrokerError::Unavailable(format!(
                    "the journal failed while storing the deletion of the outgoing queue, which may or may not be on disk (a restart tells): {e}"
                )));
            }
            self.restore_outgoing(&key, &o);
            return Err(BrokerError::Unavailable(format!(
                "cannot store the deletion, the outgoing queue is kept: {e}"
            )));
        }
        tracing::info!(destination = %key, "outgoing queue deleted");
        Ok(())
    }

    /// Removes every message waiting in the outgoing queue for `destination` (`host:port`, or
    /// the format name of a queue on that broker): MSMQ's purge of an outgoing queue, for a
    /// destination that will never come back. Messages in flight to it stay (its answer
    /// settles them, or they come back to the queue if the connection fails). Each purged
    /// message that asked for negative acknowledgements gets `NACK_PURGED`.
    pub async fn purge_outgoing(self: &Arc<Self>, destination: &str) -> Result<u64, BrokerError> {
        let key = outgoing_key(|a| self.is_local(a), destination)?;
        let o = self
            .outgoing_by_key(&key)
            .ok_or_else(|| no_outgoing_queue(&key))?;
        let purged = self.purge_queue(o.queue()).await?;
        // Out of its back-off: an emptied queue is INACTIVE, not WAITING to retry nothing.
        o.wake();
        tracing::info!(destination = %key, purged, "outgoing queue purged");
        Ok(purged)
    }

    /// Puts back an outgoing queue whose deletion the journal refused before storing anything
    /// (it was empty: nothing was dropped), with its forwarder. If a send created a new outgoing
    /// queue for the destination meanwhile, that one serves it (its definition is journaled
    /// after the failed deletion, so the journal refuses it too and a restart finds the old one).
    fn restore_outgoing(self: &Arc<Self>, key: &str, o: &Arc<Outgoing>) {
        let mut map = self.outgoing.write().unwrap_or_else(|p| p.into_inner());
        if map.contains_key(key) {
            tracing::warn!(destination = %key, "the deletion of the outgoing queue was refused, and a new one was created meanwhile: the new one stays");
            return;
        }
        o.queue().unmark_deleted();
        self.reregister_queue(o.queue());
        map.insert(key.to_string(), o.clone());
        drop(map);
        self.start_forwarder(o);
    }

    /// Takes the outgoing queue for `key` out of the broker if it is empty and `also` agrees:
    /// `Ok(None)` if there is none or it is not empty. The caller journals the deletion.
    fn remove_outgoing(
        &self,
        key: &str,
        also: impl Fn(&Outgoing) -> bool,
    ) -> Result<Option<Arc<Outgoing>>, BrokerError> {
        // The table's write lock keeps a concurrent first send from using the queue we delete
        // (a send that looked it up before finds it deleted and looks again).
        let mut map = self.outgoing.write().unwrap_or_else(|p| p.into_inner());
        let Some(o) = map.get(key).cloned() else {
            return Ok(None);
        };
        if !also(&o) || !o.queue().mark_deleted_if_empty() {
            return Ok(None);
        }
        map.remove(key);
        drop(map);
        self.unregister_queue(&o.queue().def().key);
        o.wake();
        Ok(Some(o))
    }

    /// Deletes every empty, unpaused outgoing queue unused for `idle`. Returns how many.
    pub(crate) async fn expire_idle_outgoing(self: &Arc<Self>, idle: Duration) -> usize {
        let now = now_ms();
        let idle_ms = idle.as_millis() as u64;
        let keys: Vec<String> = self
            .outgoing
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, o)| {
                !o.is_paused()
                    && o.queue().stats().messages == 0
                    && now.saturating_sub(o.last_used_ms()) >= idle_ms
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut n = 0;
        for key in keys {
            let _one = self.redefinitions.lock().await;
            if self.check_writable("expire an outgoing queue").is_err() {
                break;
            }
            let removed = self.remove_outgoing(&key, |o| {
                !o.is_paused() && now_ms().saturating_sub(o.last_used_ms()) >= idle_ms
            });
            if let Ok(Some(o)) = removed {
                let r = self
                    .journal()
                    .submit(vec![Op::DeleteQueue {
                        queue_id: o.queue().def().id,
                    }])
                    .await;
                match r {
                    Ok(()) => {
                        n += 1;
                        tracing::info!(destination = %key, idle_ms, "empty outgoing queue expired");
                    }
                    Err(e) => {
                        tracing::warn!(destination = %key, error = %e, "cannot journal the expiry of an outgoing queue");
                        if !e.may_be_stored() {
                            self.restore_outgoing(&key, &o);
                        }
                    }
                }
            }
        }
        n
    }
}
