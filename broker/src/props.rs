//! Queue properties that change after creation (`SetQueueProperties`, `mq queue set`):
//! checked, journaled with the queue's definition, then applied.

use std::sync::Arc;

use mq_proto::v1;

use crate::broker::Broker;
use crate::error::BrokerError;
use crate::queue::Queue;

impl Broker {
    /// Applies the properties `req` sets (absent ones stay); returns once the new definition
    /// is on disk.
    pub(crate) async fn set_queue_properties(
        &self,
        q: &Arc<Queue>,
        req: &v1::SetQueuePropertiesRequest,
    ) -> Result<(), BrokerError> {
        if !q.def().role.is_normal() {
            return Err(BrokerError::FailedPrecondition(format!(
                "\"{}\" is a system queue; its properties cannot be changed",
                q.def().name
            )));
        }
        if req.remove_quota && req.quota_bytes.is_some() {
            return Err(BrokerError::InvalidArgument(
                "set a quota or remove it, not both".into(),
            ));
        }
        if let Some(n) = req.max_aborts {
            if n > 0 && !q.def().transactional {
                return Err(BrokerError::InvalidArgument(
                    "max_aborts (poison messages) needs a transactional queue: only a transaction's receive can be aborted".into(),
                ));
            }
            if n > crate::subqueue::MAX_MAX_ABORTS {
                return Err(BrokerError::InvalidArgument(format!(
                    "max_aborts is {n}; the limit is {}",
                    crate::subqueue::MAX_MAX_ABORTS
                )));
            }
        }
        if let Some(label) = &req.label {
            let n = label.chars().count();
            if n > crate::config::MAX_LABEL_CHARS {
                return Err(BrokerError::InvalidArgument(format!(
                    "queue label is {n} characters; the limit is {}",
                    crate::config::MAX_LABEL_CHARS
                )));
            }
        }
        // One redefinition at a time (ACL changes too), so none journals a definition another
        // has just replaced; in force only once journaled.
        let _one = self.redefinitions.lock().await;
        let commit = {
            let acl = q.acl_lock();
            let mut def = q.current_def();
            def.acl = (**acl).clone();
            if let Some(label) = &req.label {
                def.label = label.clone();
            }
            if let Some(n) = req.quota_bytes {
                def.quota_bytes = Some(n);
            }
            if req.remove_quota {
                def.quota_bytes = None;
            }
            if let Some(on) = req.journal {
                def.journal.enabled = on;
            }
            if let Some(n) = req.journal_quota_bytes {
                def.journal.quota_bytes = n;
            }
            if let Some(n) = req.max_aborts {
                def.poison.max_aborts = n;
            }
            (self.redefine_queue(q, &def)?, def)
        };
        let (commit, def) = commit;
        commit.await.map_err(crate::broker::journal_failed)?;
        q.journaling.set(&def);
        q.set_properties(def.label, def.quota_bytes);
        Ok(())
    }
}
