//! Responses the app makes itself: the client's view of an error, and an
//! HTTP/1.0 client's answer of unknown length.

use http::Response;
use http::header::{self, HeaderValue};

use crate::body::Body;
use crate::error::GatewayError;

/// An answer of unknown length to an HTTP/1.0 client can only end with the
/// connection (it has no chunked framing). hyper would still promise
/// `Connection: keep-alive` to a client that asked for it when the answer
/// says HTTP/1.1, then close: said to be HTTP/1.0, the answer makes hyper
/// leave keep-alive off (RFC 9112 §9.3).
pub(super) fn close_delimited_for_http10(response: &mut Response<Body>) {
    let body = response.body();
    if http_body::Body::size_hint(body).exact().is_none() && !http_body::Body::is_end_stream(body) {
        *response.version_mut() = http::Version::HTTP_10;
    }
}

/// The client's view of an error.
pub(super) fn error_response(e: &GatewayError) -> Response<Body> {
    if let GatewayError::ForwardRefused(answer) = e {
        let mut response = Response::new(Body::full(answer.body.clone()));
        *response.status_mut() = answer.status;
        *response.headers_mut() = answer.headers.clone();
        return response;
    }
    let mut builder = Response::builder().status(e.status()).header(header::CONTENT_TYPE, "text/plain; charset=utf-8");
    if let GatewayError::MethodNotAllowed { allow } = e
        && let Ok(v) = HeaderValue::from_str(allow)
    {
        builder = builder.header(header::ALLOW, v);
    }
    if let GatewayError::RateLimited { policy, state, .. } = e {
        builder = builder.header(crate::ratelimit::RATELIMIT_POLICY, policy).header(crate::ratelimit::RATELIMIT, state);
    }
    if let GatewayError::Unauthorized { challenge, .. } = e {
        builder = builder.header(header::WWW_AUTHENTICATE, challenge.clone());
    }
    if let Some(seconds) = e.retry_after() {
        builder = builder.header(header::RETRY_AFTER, seconds);
    }
    if e.closes_connection() {
        builder = builder.header(header::CONNECTION, "close");
    }
    builder.body(Body::full(e.body())).expect("valid response")
}
