//! The tower layer in front of the gRPC service that authenticates every call asynchronously ([`crate::auth::Auth::authenticate`]), so password hashing never runs on an async worker.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::server::NamedService;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};

use crate::auth::{Auth, Presented};

/// Wraps the service: puts the caller's [`crate::auth::Identity`] into the request's
/// extensions, or answers with the refusal (UNAUTHENTICATED, RESOURCE_EXHAUSTED).
#[derive(Debug, Clone)]
pub(crate) struct Authenticated<S> {
    inner: S,
    auth: Arc<Auth>,
}

impl<S> Authenticated<S> {
    pub(crate) fn new(inner: S, auth: Arc<Auth>) -> Self {
        Authenticated { inner, auth }
    }
}

impl<S: NamedService> NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

/// What the caller presented, from the HTTP request and its connection.
fn presented<B>(req: &http::Request<B>) -> Presented {
    let ext = req.extensions();
    let tls = ext.get::<TlsConnectInfo<TcpConnectInfo>>();
    let peer = ext
        .get::<TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
        .or_else(|| tls.and_then(|i| i.get_ref().remote_addr()))
        // A connection on the Unix socket stands as the loopback (login failure limits, logs).
        .or_else(|| {
            ext.get::<crate::flow::LocalConnectInfo>()
                .map(|_| crate::flow::LocalConnectInfo::ADDR)
        });
    let local_uid = ext
        .get::<crate::flow::LocalConnectInfo>()
        .and_then(|i| i.uid);
    let cert_name = tls
        .and_then(|i| i.peer_certs())
        .and_then(|c| c.first().and_then(|d| crate::auth::cert_name(d.as_ref())));
    Presented {
        authorization: req
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(|v| v.to_str().map(str::to_string).map_err(|_| ())),
        peer,
        cert_name,
        local_uid,
    }
}

impl<S, B> tower::Service<http::Request<B>> for Authenticated<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<tonic::body::Body>>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        // The clone that was polled ready serves this call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let auth = self.auth.clone();
        let p = presented(&req);
        Box::pin(async move {
            match auth.authenticate(p).await {
                Ok(who) => {
                    if auth.proves(&who) {
                        if let Some(proof) = req.extensions().get::<crate::flow::Proof>() {
                            proof.prove();
                        }
                    }
                    req.extensions_mut().insert(who);
                    inner.call(req).await
                }
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}
