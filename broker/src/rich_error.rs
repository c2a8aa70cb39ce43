//! Rich gRPC errors: every failed call carries a `google.rpc.Status` with one
//! `google.rpc.ErrorInfo` (domain `mq`, a reason from the table in mq.proto).

use std::collections::HashMap;
use std::task::{Context, Poll};

use mq_proto::reason;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// A status with `code`, `message` and an ErrorInfo of `reason`.
pub(crate) fn status(code: Code, reason: &str, message: impl Into<String>) -> Status {
    Status::with_error_details(
        code,
        message,
        ErrorDetails::with_error_info(reason, reason::DOMAIN, HashMap::<String, String>::new()),
    )
}

/// The reason of an error status that did not say one: from its code (the sites that know
/// better use [`status`]).
pub(crate) fn default_reason(code: Code) -> &'static str {
    match code {
        Code::InvalidArgument => reason::INVALID_ARGUMENT,
        Code::NotFound => reason::NOT_FOUND,
        Code::AlreadyExists => reason::ALREADY_EXISTS,
        Code::PermissionDenied => reason::PERMISSION_DENIED,
        Code::Unauthenticated => reason::UNAUTHENTICATED,
        Code::ResourceExhausted | Code::OutOfRange => reason::LIMIT_EXCEEDED,
        Code::FailedPrecondition => reason::FAILED_PRECONDITION,
        Code::Aborted => reason::TX_TIMEOUT,
        Code::DeadlineExceeded => reason::IDLE_TIMEOUT,
        Code::Unavailable => reason::SHUTTING_DOWN,
        _ => reason::INTERNAL,
    }
}

const DETAILS: &str = "grpc-status-details-bin";

/// Adds the details to a non-OK status in `headers` (the headers of a trailers-only response,
/// or the trailers of a stream) that has none.
fn enrich(headers: &mut http::HeaderMap) {
    let failed = headers
        .get("grpc-status")
        .is_some_and(|v| v.as_bytes() != b"0");
    if !failed || headers.contains_key(DETAILS) {
        return;
    }
    let Some(s) = Status::from_header_map(headers) else {
        return;
    };
    let rich = status(s.code(), default_reason(s.code()), s.message());
    if let Err(e) = rich.add_header(headers) {
        tracing::debug!(error = %e, "cannot add error details");
    }
}

/// The tower layer in front of every gRPC service that gives every error status without
/// details its ErrorInfo ([`default_reason`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ErrorInfoLayer;

impl<S> tower::Layer<S> for ErrorInfoLayer {
    type Service = WithErrorInfo<S>;
    fn layer(&self, inner: S) -> WithErrorInfo<S> {
        WithErrorInfo { inner }
    }
}

/// See [`ErrorInfoLayer`].
#[derive(Debug, Clone)]
pub(crate) struct WithErrorInfo<S> {
    inner: S,
}

impl<S, B, RB> tower::Service<http::Request<B>> for WithErrorInfo<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = http::Response<Body<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        ResponseFuture {
            inner: self.inner.call(req),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`WithErrorInfo`].
    #[derive(Debug)]
    pub(crate) struct ResponseFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, RB, E> std::future::Future for ResponseFuture<F>
where
    F: std::future::Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = Result<http::Response<Body<RB>>, E>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let r = std::task::ready!(self.project().inner.poll(cx));
        Poll::Ready(r.map(|mut resp| {
            // A trailers-only response carries its status in the headers.
            enrich(resp.headers_mut());
            resp.map(|inner| Body { inner })
        }))
    }
}

pin_project_lite::pin_project! {
    /// A response body whose error trailers get their details.
    #[derive(Debug)]
    pub(crate) struct Body<B> {
        #[pin]
        inner: B,
    }
}

impl<B: http_body::Body> http_body::Body for Body<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let mut r = std::task::ready!(self.project().inner.poll_frame(cx));
        if let Some(Ok(f)) = &mut r {
            if let Some(t) = f.trailers_mut() {
                enrich(t);
            }
        }
        Poll::Ready(r)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_without_details_gets_its_reason_and_one_with_details_keeps_them() {
        let mut h = http::HeaderMap::new();
        Status::resource_exhausted("this connection has 64 open transactions")
            .add_header(&mut h)
            .unwrap();
        enrich(&mut h);
        let s = Status::from_header_map(&h).unwrap();
        assert_eq!(s.code(), Code::ResourceExhausted);
        assert_eq!(s.message(), "this connection has 64 open transactions");
        let info = s.get_details_error_info().expect("ErrorInfo");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("LIMIT_EXCEEDED", "mq")
        );

        let mut h = http::HeaderMap::new();
        status(Code::NotFound, reason::QUEUE_NOT_FOUND, "no queue")
            .add_header(&mut h)
            .unwrap();
        enrich(&mut h);
        let s = Status::from_header_map(&h).unwrap();
        assert_eq!(
            s.get_details_error_info().unwrap().reason,
            "QUEUE_NOT_FOUND"
        );

        let mut ok = http::HeaderMap::new();
        ok.insert("grpc-status", "0".parse().unwrap());
        enrich(&mut ok);
        assert!(!ok.contains_key(DETAILS));
    }
}
