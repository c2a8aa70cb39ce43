//! Transport security settings: TLS (rustls) for the server, protected mode, and the
//! credentials this broker presents to the brokers it forwards to.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use mq_proto::v1::forward_service_client::ForwardServiceClient;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// What `mqd --users --tls-* --insecure --forward-credentials` set.
#[derive(Debug, Clone, Default)]
pub struct SecurityConfig {
    /// The users file (TOML, argon2id hashes); `None` = protected mode (loopback only,
    /// every caller has every right).
    pub users_file: Option<PathBuf>,
    /// The server certificate chain (PEM); with `tls_key`, gRPC is served over TLS.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Client certificates signed by this CA (PEM) are required (mTLS).
    pub tls_client_ca: Option<PathBuf>,
    /// Serve a non-loopback address without TLS and a users file.
    pub insecure: bool,
    /// Per destination broker (`host:port`): how to reach and authenticate to it.
    pub forward: Arc<HashMap<String, ForwardCredentials>>,
}

/// How this broker connects to one destination broker. `Debug` leaves out the password and
/// the token.
#[derive(Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForwardCredentials {
    /// User name and password (Basic), or a bearer token.
    pub user: Option<String>,
    pub password: Option<String>,
    pub token: Option<String>,
    /// CA certificate (PEM) that signed the destination's certificate: connect with TLS.
    pub ca: Option<PathBuf>,
    /// Client certificate and key (PEM) for mTLS.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name in the destination's certificate, if not its host.
    pub domain: Option<String>,
}

impl std::fmt::Debug for ForwardCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |o: &Option<String>| o.as_ref().map(|_| "<redacted>");
        f.debug_struct("ForwardCredentials")
            .field("user", &self.user)
            .field("password", &redacted(&self.password))
            .field("token", &redacted(&self.token))
            .field("ca", &self.ca)
            .field("cert", &self.cert)
            .field("key", &self.key)
            .field("domain", &self.domain)
            .finish()
    }
}

impl SecurityConfig {
    /// Reads the forwarding credentials file: a TOML table per destination `host:port`.
    pub fn load_forward_credentials(
        path: &Path,
    ) -> Result<HashMap<String, ForwardCredentials>, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "cannot read the forwarding credentials {}: {e}",
                path.display()
            )
        })?;
        let map: HashMap<String, ForwardCredentials> = toml::from_str(&text).map_err(|e| {
            format!(
                "the forwarding credentials {} are not valid: {e}",
                path.display()
            )
        })?;
        Ok(map
            .into_iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v))
            .collect())
    }

    pub fn tls_enabled(&self) -> bool {
        self.tls_cert.is_some()
    }

    /// The server's TLS configuration, if any.
    pub(crate) fn server_tls(&self) -> Result<Option<tonic::transport::ServerTlsConfig>, String> {
        let (cert, key) = match (&self.tls_cert, &self.tls_key) {
            (None, None) if self.tls_client_ca.is_none() => return Ok(None),
            (Some(c), Some(k)) => (c, k),
            _ => {
                return Err(
                    "TLS needs both --tls-cert and --tls-key (and --tls-client-ca needs both)"
                        .into(),
                )
            }
        };
        let mut tls = tonic::transport::ServerTlsConfig::new()
            .identity(Identity::from_pem(read(cert)?, read(key)?))
            // A handshake that does not end (half a ClientHello) held its connection, and its
            // place at --max-connections, for good (helper-67).
            .timeout(TLS_HANDSHAKE_TIMEOUT);
        if let Some(ca) = &self.tls_client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
        }
        Ok(Some(tls))
    }
}

/// Longest a TLS handshake on the gRPC port may take.
pub const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn read(p: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()))
}

/// Adds `authorization` to every call. A token that cannot be a header (not visible ASCII)
/// fails every call rather than calling as anonymous. `Debug` leaves the secret out.
#[derive(Clone, Default)]
pub struct Credentials(Option<Result<MetadataValue<tonic::metadata::Ascii>, ()>>);

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match &self.0 {
            None => "Credentials(none)",
            Some(Ok(_)) => "Credentials(<redacted>)",
            Some(Err(())) => "Credentials(<invalid>)",
        })
    }
}

impl Credentials {
    pub fn basic(user: &str, password: &str) -> Credentials {
        let raw = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{user}:{password}"),
        );
        Credentials(Some(format!("Basic {raw}").parse().map_err(|_| ())))
    }

    pub fn bearer(token: &str) -> Credentials {
        Credentials(Some(format!("Bearer {token}").parse().map_err(|_| ())))
    }

    fn is_set(&self) -> bool {
        self.0.is_some()
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        match &self.0 {
            Some(Ok(v)) => {
                req.metadata_mut().insert("authorization", v.clone());
            }
            Some(Err(())) => return Err(tonic::Status::unauthenticated(
                "the forwarding credentials' token is not valid header text (visible ASCII only)",
            )),
            None => {}
        }
        Ok(req)
    }
}

/// A client of another broker, with credentials.
pub(crate) type PeerClient = ForwardServiceClient<InterceptedService<Channel, Credentials>>;

/// The endpoint and credentials to reach `destination` (`host:port`) with.
pub(crate) fn peer_endpoint(
    destination: &str,
    creds: Option<&ForwardCredentials>,
) -> Result<(Endpoint, Credentials), String> {
    let tls = creds.is_some_and(|c| c.ca.is_some() || c.cert.is_some());
    let scheme = if tls { "https" } else { "http" };
    let mut endpoint = Endpoint::from_shared(format!("{scheme}://{destination}"))
        .map_err(|e| format!("bad destination address {destination}: {e}"))?;
    let mut credentials = Credentials::default();
    if let Some(c) = creds {
        if tls {
            let mut cfg = ClientTlsConfig::new();
            if let Some(ca) = &c.ca {
                cfg = cfg.ca_certificate(Certificate::from_pem(read(ca)?));
            }
            if let (Some(cert), Some(key)) = (&c.cert, &c.key) {
                cfg = cfg.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            if let Some(d) = &c.domain {
                cfg = cfg.domain_name(d.clone());
            }
            endpoint = endpoint
                .tls_config(cfg)
                .map_err(|e| format!("bad TLS settings for {destination}: {e}"))?;
        }
        credentials = match (&c.user, &c.password, &c.token) {
            (_, _, Some(t)) => Credentials::bearer(t),
            (Some(u), Some(p), None) => Credentials::basic(u, p),
            _ => Credentials::default(),
        };
        if !tls && credentials.is_set() && !is_loopback_destination(destination) {
            tracing::warn!(
                destination = %mq_proto::limits::quote(destination),
                "forwarding credentials are sent in plaintext: set `ca` (TLS) for this destination in the credentials file"
            );
        }
    }
    Ok((endpoint, credentials))
}

/// Whether `host:port` names this machine (credentials over plaintext are then not on a wire).
fn is_loopback_destination(destination: &str) -> bool {
    let host = destination
        .rsplit_once(':')
        .map_or(destination, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    /// Review m7: secrets are not printed by `Debug`; a token that cannot be a header fails
    /// the call instead of calling as anonymous; loopback destinations are told apart.
    #[test]
    fn credentials_keep_their_secrets() {
        let creds = ForwardCredentials {
            user: Some("broker-a".into()),
            password: Some("hunter2-secret".into()),
            token: Some("mqt_secret-token".into()),
            ..Default::default()
        };
        let shown = format!("{creds:?}");
        assert!(shown.contains("broker-a"), "{shown}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("mqt_secret"),
            "{shown}"
        );
        let basic = Credentials::basic("u", "hunter2-secret");
        let shown = format!("{basic:?}");
        assert!(
            !shown.contains("hunter2") && !shown.contains("dTpodW50ZXIy"),
            "{shown}"
        );
        let mut bad = Credentials::bearer("bad\ntoken");
        let e = bad.call(tonic::Request::new(())).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        let mut good = Credentials::bearer("mqt_ok");
        let req = good.call(tonic::Request::new(())).unwrap();
        assert!(req.metadata().get("authorization").is_some());
        assert!(is_loopback_destination("127.0.0.1:1801"));
        assert!(is_loopback_destination("[::1]:1801"));
        assert!(is_loopback_destination("localhost:1801"));
        assert!(!is_loopback_destination("broker-b.example.net:1801"));
        assert!(!is_loopback_destination("10.0.0.5:1801"));
    }
}
