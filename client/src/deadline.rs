//! Client-side deadlines and keepalive: how long a call may wait for the broker before it fails,
//! so a broker that stops answering (stopped process, dead network) is noticed, not waited for.

use std::future::Future;
use std::time::Duration;

use crate::error::{Error, Result};

/// How a [`crate::Client`] bounds its waits. Every call fails with [`Error::Timeout`] (a
/// commit: [`Error::InDoubt`]) once its deadline passes without an answer.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Connecting: TCP connect and the HTTP/2 handshake. Default 5 s.
    pub connect_timeout: Duration,
    /// A call's answer, beyond any wait the call itself asks for (a receive's timeout): queue
    /// administration, one-message receive and peek, opening a stream, a transaction's
    /// receive and commit. Default 30 s.
    pub call_timeout: Duration,
    /// HTTP/2 keepalive: a ping this often, also while idle, so a silent broker is noticed on
    /// long streams (sends waiting for acknowledgements, consumers). Default 10 s.
    pub keepalive_interval: Duration,
    /// A ping unanswered this long closes the connection: every call on it fails. Default 10 s.
    pub keepalive_timeout: Duration,
}

/// Default [`ClientOptions::connect_timeout`].
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default [`ClientOptions::call_timeout`].
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            call_timeout: DEFAULT_CALL_TIMEOUT,
            keepalive_interval: Duration::from_secs(10),
            keepalive_timeout: Duration::from_secs(10),
        }
    }
}

/// The error of a call whose deadline `limit` passed.
pub(crate) fn deadline_error(what: &str, limit: Duration) -> Error {
    Error::Timeout(format!(
        "no answer from the broker {what} within {} (the client's deadline, ClientOptions::call_timeout, mq --call-timeout); is the broker stopped or overloaded?",
        humantime::format_duration(limit)
    ))
}

/// Runs a gRPC call, failing with [`deadline_error`] if it has no answer within `limit`.
pub(crate) async fn within<T, F>(limit: Duration, what: &str, fut: F) -> Result<T>
where
    F: Future<Output = std::result::Result<T, tonic::Status>>,
{
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(Error::from),
        Err(_) => Err(deadline_error(what, limit)),
    }
}
