//! Where a running broker is in its life (recovering, serving, stopping): the one notion of
//! readiness that systemd's notifications and the health endpoints read.

use std::sync::Arc;

use tokio::sync::watch;

/// A broker's phase; each follows the one before, never back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    /// Opening the data directory and recovering the journal; no request is served yet.
    Starting,
    /// Recovery is done and requests are served.
    Serving,
    /// A shutdown began: no new connections; what is in flight finishes.
    Stopping,
    /// The journal is closed; `run` is returning (or failed to start).
    Stopped,
}

/// A shared handle on a broker's [`Phase`]: clone it into [`crate::BrokerConfig::readiness`]
/// before [`crate::run`], then read or watch it from anywhere.
#[derive(Debug, Clone)]
pub struct Readiness {
    tx: Arc<watch::Sender<Phase>>,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness {
            tx: Arc::new(watch::Sender::new(Phase::Starting)),
        }
    }
}

impl Readiness {
    /// The current phase.
    pub fn phase(&self) -> Phase {
        *self.tx.borrow()
    }

    /// Whether requests are served (recovery done, no shutdown begun).
    pub fn is_serving(&self) -> bool {
        self.phase() == Phase::Serving
    }

    /// A receiver that sees every later phase (`changed`, `wait_for`).
    pub fn subscribe(&self) -> watch::Receiver<Phase> {
        self.tx.subscribe()
    }

    /// Moves to `phase` if it is later than the current one (phases never go back).
    pub(crate) fn advance(&self, phase: Phase) {
        self.tx.send_if_modified(|p| {
            let later = phase > *p;
            if later {
                *p = phase;
            }
            later
        });
    }
}

/// Moves its [`Readiness`] to [`Phase::Stopped`] when dropped: `run` holds one, so every way
/// out of it (a failed start included) ends in `Stopped`.
#[derive(Debug)]
pub(crate) struct StoppedOnDrop(pub(crate) Readiness);

impl Drop for StoppedOnDrop {
    fn drop(&mut self) {
        self.0.advance(Phase::Stopped);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_only_move_forward_and_are_seen_by_subscribers() {
        let r = Readiness::default();
        let mut rx = r.subscribe();
        assert_eq!(r.phase(), Phase::Starting);
        r.advance(Phase::Serving);
        assert!(r.is_serving());
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), Phase::Serving);
        r.advance(Phase::Stopped);
        r.advance(Phase::Stopping);
        assert_eq!(r.phase(), Phase::Stopped);
        assert!(!r.is_serving());
    }
}
