//! HTTPS for the HTTP port: mqd's own certificate and key (`--tls-cert`, `--tls-key`), handshakes off the accept loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// How long a TLS handshake may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at once, at most (more connections wait to be accepted).
const MAX_HANDSHAKES: usize = 64;
/// Handshakes in progress at once from one IP address; more from it are closed as accepted, so
/// one client's silent sockets cannot take every handshake place (70 held a browser's handshake
/// for 9.5 s).
const MAX_HANDSHAKES_PER_PEER: usize = 8;

/// The HTTP port's TLS configuration: whenever mqd has a certificate, the HTTP port uses it
/// too (no client certificates: browsers log in with a user's password).
/// Checks the gRPC port's TLS files as the HTTP port's are checked (the certificate, its key,
/// that they match, and the client CA), before the journal is opened: tonic reported a bad
/// file only as "transport error", after recovery (helper-67).
pub(crate) fn check_grpc_files(sec: &crate::tls::SecurityConfig) -> Result<(), String> {
    server_config(sec).map_err(|e| e.replace("TLS for the HTTP port", "TLS"))?;
    if let Some(ca) = &sec.tls_client_ca {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(ca)
            .and_then(|i| i.collect::<Result<_, _>>())
            .map_err(|e| format!("cannot read the client CA {}: {e}", ca.display()))?;
        if certs.is_empty() {
            return Err(format!("no certificate in the client CA {}", ca.display()));
        }
        let mut roots = rustls::RootCertStore::empty();
        for c in certs {
            roots
                .add(c)
                .map_err(|e| format!("the client CA {}: {e}", ca.display()))?;
        }
    }
    Ok(())
}

pub(crate) fn server_config(
    sec: &crate::tls::SecurityConfig,
) -> Result<Option<Arc<rustls::ServerConfig>>, String> {
    let (Some(cert), Some(key)) = (&sec.tls_cert, &sec.tls_key) else {
        return Ok(None);
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<_, _>>())
        .map_err(|e| format!("cannot read the certificate {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot read the private key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS for the HTTP port: {e}"))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS for the HTTP port: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Some(Arc::new(config)))
}

/// A listener whose connections have finished their TLS handshake. A task accepts TCP
/// connections and runs each handshake in its own task (bounded in time and number), so a slow
/// or silent client holds up no one else; failed handshakes are dropped.
#[derive(Debug)]
pub(crate) struct TlsListener {
    rx: mpsc::Receiver<(tokio_rustls::server::TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> TlsListener {
        let local = listener.local_addr();
        let (tx, rx) = mpsc::channel(16);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let permits = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        let per_peer = Arc::new(PerPeer::default());
        let task = tokio::spawn(async move {
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!("HTTP port: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(peer_place) = per_peer.clone().enter(peer.ip()) else {
                    tracing::debug!(%peer, "HTTP port: {MAX_HANDSHAKES_PER_PEER} TLS handshakes from this address in progress; closing");
                    continue;
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let _permit = permit;
                    let _peer_place = peer_place;
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, "HTTP port: TLS handshake failed: {e}")
                        }
                        Err(_) => tracing::debug!(%peer, "HTTP port: TLS handshake timed out"),
                    }
                });
            }
        });
        TlsListener { rx, local, task }
    }
}

/// Handshakes in progress per IP address.
#[derive(Debug, Default)]
struct PerPeer(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

impl PerPeer {
    /// A place for one more handshake from `ip`, or `None` if it has the most.
    fn enter(self: Arc<Self>, ip: std::net::IpAddr) -> Option<PeerPlace> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_insert(0);
        if *n >= MAX_HANDSHAKES_PER_PEER {
            return None;
        }
        *n += 1;
        drop(m);
        Some(PeerPlace(self, ip))
    }
}

/// One handshake's place; given back when dropped.
struct PeerPlace(Arc<PerPeer>, std::net::IpAddr);

impl Drop for PeerPlace {
    fn drop(&mut self) {
        let mut m = self.0 .0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task ended (it does not, but for its panic): accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local {
            Ok(a) => Ok(*a),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}

/// The address of the peer of an HTTP connection, plain or TLS (`ConnectInfo<Peer>`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub SocketAddr);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_address_has_at_most_its_handshake_places() {
        let p = Arc::new(PerPeer::default());
        let a: std::net::IpAddr = "127.0.0.1".parse().unwrap();
        let b: std::net::IpAddr = "127.0.0.2".parse().unwrap();
        let held: Vec<_> = (0..MAX_HANDSHAKES_PER_PEER)
            .map(|_| p.clone().enter(a).expect("a place"))
            .collect();
        assert!(p.clone().enter(a).is_none(), "one place too many");
        let other = p
            .clone()
            .enter(b)
            .expect("another address has its own places");
        drop(held);
        drop(other);
        assert!(p.0.lock().unwrap().is_empty(), "every place given back");
        assert!(p.clone().enter(a).is_some());
    }
}
