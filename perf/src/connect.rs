//! How mqperf connects to a running broker: the TLS CA and the credentials of `--ca`, `--user`
//! (password from `MQ_PASSWORD`) and `--token`, for every connection of the process.

use std::sync::OnceLock;

use mq_client::Client;

/// TLS and credentials for every connection mqperf opens.
#[derive(Debug, Clone, Default)]
pub struct ConnectSettings {
    /// The CA certificate (PEM) for `https://` brokers.
    pub ca: Option<Vec<u8>>,
    /// User and password.
    pub user: Option<(String, String)>,
    /// Bearer token.
    pub token: Option<String>,
}

static SETTINGS: OnceLock<ConnectSettings> = OnceLock::new();

/// Sets the settings of this process (once; later calls are ignored).
pub fn set_connect_settings(s: ConnectSettings) {
    let _ = SETTINGS.set(s);
}

/// Connects to `url` with the process's settings.
pub(crate) async fn client(url: &str) -> mq_client::Result<Client> {
    let mut b = Client::builder(url);
    if let Some(s) = SETTINGS.get() {
        if let Some(ca) = &s.ca {
            b = b.ca_pem(ca.clone());
        }
        if let Some((u, p)) = &s.user {
            b = b.user(u, p);
        } else if let Some(t) = &s.token {
            b = b.token(t);
        }
    }
    b.connect().await
}
