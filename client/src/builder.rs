//! [`ClientBuilder`]: how to reach and authenticate to a broker (TLS CA, client certificate,
//! user and password or bearer token).

use mq_proto::v1::admin_service_client::AdminServiceClient;
use mq_proto::v1::message_queue_service_client::MessageQueueServiceClient;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::client::Client;
use crate::deadline::ClientOptions;
use crate::error::{Error, Result};

/// The gRPC client with this client's credentials on every call.
pub(crate) type Rpc = MessageQueueServiceClient<
    InterceptedService<crate::large_sends::LargeSends<Channel>, Credentials>,
>;
/// The administration service's gRPC client (queues, rights, outgoing queues), same channel.
pub(crate) type AdminRpc = AdminServiceClient<InterceptedService<Channel, Credentials>>;

/// Adds the `authorization` header (Basic user:password, or Bearer token) to every call.
/// `Debug` leaves the secret out.
#[derive(Clone, Default)]
pub struct Credentials(Option<MetadataValue<Ascii>>);

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Credentials(<redacted>)"
        } else {
            "Credentials(none)"
        })
    }
}

impl tonic::service::Interceptor for Credentials {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// Settings for [`Client`]: `Client::builder(url).ca_pem(..).user(..).connect()`.
///
/// An `https://` URL connects with TLS; the broker's certificate must be signed by the CA
/// given with [`ClientBuilder::ca_pem`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: String,
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain: Option<String>,
    credentials: Credentials,
    /// A token that cannot be sent (not visible ASCII): `connect` fails with it.
    bad_token: bool,
    options: ClientOptions,
}

impl ClientBuilder {
    pub fn new(url: impl Into<String>) -> Self {
        ClientBuilder {
            url: url.into(),
            ca: None,
            identity: None,
            domain: None,
            credentials: Credentials::default(),
            bad_token: false,
            options: ClientOptions::default(),
        }
    }

    /// Deadlines and keepalive (default: connect 5 s, calls 30 s).
    pub fn options(mut self, options: ClientOptions) -> Self {
        self.options = options;
        self
    }

    /// Trust brokers whose certificate this CA (PEM) signed.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca = Some(pem.into());
        self
    }

    /// Present this client certificate and key (PEM) for mTLS.
    pub fn client_cert_pem(mut self, cert: impl Into<Vec<u8>>, key: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert.into(), key.into()));
        self
    }

    /// The name to expect in the broker's certificate, if not the URL's host.
    pub fn domain(mut self, name: impl Into<String>) -> Self {
        self.domain = Some(name.into());
        self
    }

    /// Authenticate as `user` with `password` (checked by the broker once per stream).
    pub fn user(mut self, user: &str, password: &str) -> Self {
        let raw = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            format!("{user}:{password}"),
        );
        self.credentials = Credentials(format!("Basic {raw}").parse().ok());
        self
    }

    /// Authenticate with a bearer token.
    pub fn token(mut self, token: &str) -> Self {
        let value = format!("Bearer {}", token.trim()).parse().ok();
        self.bad_token = value.is_none();
        self.credentials = Credentials(value);
        self
    }

    /// Connects.
    pub async fn connect(self) -> Result<Client> {
        let url = self.url.clone();
        let connect_err = |reason: String| Error::Connect {
            url: url.clone(),
            reason,
        };
        // `unix:PATH` (or `unix://PATH`): the broker's Unix socket (mqd --unix-socket). The
        // endpoint's URL only names the HTTP/2 authority; the connector opens the socket.
        let unix_path = local_socket_path(&url);
        if unix_path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(connect_err(
                "a unix: URL needs the socket's path (unix:/run/mqd/mqd.sock)".into(),
            ));
        }
        let endpoint_url = if unix_path.is_some() {
            "http://localhost".to_string()
        } else {
            url.clone()
        };
        let mut endpoint = Endpoint::from_shared(endpoint_url)
            .map_err(|e| connect_err(format!("not a valid URL ({e})")))?
            .tcp_nodelay(true)
            .connect_timeout(self.options.connect_timeout)
            .http2_keep_alive_interval(self.options.keepalive_interval)
            .keep_alive_timeout(self.options.keepalive_timeout)
            .keep_alive_while_idle(true)
            .initial_stream_window_size(Some(8 * 1024 * 1024))
            .initial_connection_window_size(Some(16 * 1024 * 1024))
            .max_frame_size(Some(mq_proto::HTTP2_MAX_FRAME_SIZE));
        if self.bad_token {
            return Err(connect_err(
                "the bearer token is not valid header text (visible ASCII only)".into(),
            ));
        }
        let https = url.starts_with("https://");
        if !https && (self.ca.is_some() || self.identity.is_some()) {
            return Err(connect_err(if unix_path.is_some() {
                "a CA or client certificate was given but a unix: socket does not use TLS".into()
            } else {
                "a CA or client certificate was given but the URL is not https://".into()
            }));
        }
        if https {
            let mut tls = ClientTlsConfig::new();
            match &self.ca {
                Some(ca) => tls = tls.ca_certificate(Certificate::from_pem(ca)),
                None => return Err(connect_err(
                    "an https:// broker needs the CA that signed its certificate (--ca or MQ_CA)"
                        .into(),
                )),
            }
            if let Some((cert, key)) = &self.identity {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            if let Some(d) = &self.domain {
                tls = tls.domain_name(d.clone());
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| connect_err(format!("bad TLS settings ({e})")))?;
        }
        // The connect timeout covers TCP only; a broker that accepts but does not answer (a
        // stopped process: the kernel still accepts) would hang the HTTP/2 or TLS handshake.
        let connect = async {
            match unix_path {
                Some(path) => {
                    endpoint
                        .connect_with_connector(tower::service_fn(
                            move |_: tonic::codegen::http::Uri| {
                                let path = path.clone();
                                async move {
                                    let stream = tokio::net::UnixStream::connect(&path).await?;
                                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                                }
                            },
                        ))
                        .await
                }
                None => endpoint.connect().await,
            }
        };
        let connected = tokio::time::timeout(self.options.connect_timeout, connect)
            .await
            .map_err(|_| {
                connect_err(format!(
                    "no answer within {} (mq --connect-timeout, ClientOptions::connect_timeout)",
                    humantime::format_duration(self.options.connect_timeout)
                ))
            })?;
        let channel = connected.map_err(|e| {
            let mut reason = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                reason = format!("{reason}: {s}");
                src = s.source();
            }
            connect_err(reason)
        })?;
        let channel_for_check = channel.clone();
        let rpc = MessageQueueServiceClient::with_interceptor(
            crate::large_sends::LargeSends(channel.clone()),
            self.credentials.clone(),
        )
        .max_decoding_message_size(mq_proto::MAX_GRPC_MESSAGE)
        .max_encoding_message_size(mq_proto::MAX_GRPC_MESSAGE);
        let admin = AdminServiceClient::with_interceptor(channel, self.credentials)
            .max_decoding_message_size(mq_proto::MAX_GRPC_MESSAGE)
            .max_encoding_message_size(mq_proto::MAX_GRPC_MESSAGE);
        check_protocol(&channel_for_check, &url, self.options.call_timeout).await?;
        Ok(Client::from_parts(rpc, admin, url, self.options))
    }
}

/// The socket path of a `unix:PATH` or `unix://PATH` URL; `None` for any other URL.
fn local_socket_path(url: &str) -> Option<std::path::PathBuf> {
    let rest = url.strip_prefix("unix:")?;
    let path = rest.strip_prefix("//").unwrap_or(rest);
    Some(std::path::PathBuf::from(path))
}

/// Checks at connect that the broker speaks a revision of mq.v1 this client can use
/// ([`mq_proto::MIN_PROTOCOL_VERSION`] or newer; a newer broker only added things). Asked
/// without credentials (`GetBrokerInfo` needs none, and a wrong password is then not counted
/// twice); when the broker cannot be asked (no answer within `timeout`, refused), the first
/// real call reports why: only an answer that says "too old" fails here.
async fn check_protocol(channel: &Channel, url: &str, timeout: std::time::Duration) -> Result<()> {
    let mut grpc = MessageQueueServiceClient::new(channel.clone());
    match tokio::time::timeout(timeout, grpc.get_broker_info(())).await {
        Ok(Ok(info)) => {
            let info = info.into_inner();
            crate::client::protocol_compatible(url, info.protocol_version, &info.version)
        }
        Ok(Err(s)) if s.code() == tonic::Code::Unimplemented => Err(Error::Incompatible(format!(
            "the broker at {url} does not serve mq.v1.MessageQueueService/GetBrokerInfo: it is an mq broker older than protocol revision {} (or not an mq broker); upgrade mqd to a version as new as this client (mq-client {})",
            mq_proto::MIN_PROTOCOL_VERSION,
            env!("CARGO_PKG_VERSION")
        ))),
        // A broker that does not answer, or a connection lost while asking: the command after
        // would wait its whole deadline again (helper-73: `mq --call-timeout 2s queue list`
        // took 4 s against a stopped broker, 40 s with the defaults).
        Ok(Err(s))
            if matches!(
                s.code(),
                tonic::Code::Unavailable
                    | tonic::Code::Cancelled
                    | tonic::Code::Unknown
                    | tonic::Code::DeadlineExceeded
            ) =>
        {
            Err(Error::from(s))
        }
        Err(_) => Err(crate::deadline::deadline_error(
            "checking its protocol version",
            timeout,
        )),
        // Anything else (a refusal) is for the call that follows to report.
        Ok(Err(_)) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review m7: `Debug` does not print credentials; a token that cannot be sent is an error,
    /// not a silent anonymous connection.
    #[tokio::test]
    async fn credentials_are_redacted_and_a_bad_token_is_an_error() {
        let b = ClientBuilder::new("http://127.0.0.1:9").user("alice", "hunter2-secret");
        let shown = format!("{b:?}");
        assert!(
            shown.contains("redacted") && !shown.contains("hunter2"),
            "{shown}"
        );
        let e = ClientBuilder::new("http://127.0.0.1:9")
            .token("bad\ntoken")
            .connect()
            .await
            .expect_err("a token that is not header text must fail");
        assert!(e.to_string().contains("token"), "{e}");
    }
}
