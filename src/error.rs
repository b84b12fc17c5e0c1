//! Request errors and the one mapping from an error to a status code, a
//! metric `kind` and a response body.
//!
//! Errors know their source, which picks the status: upstream failure → 502,
//! upstream too slow → 504, the client's fault → 4xx, ours → 500.

use std::time::Duration;

use http::StatusCode;

/// Why a request could not be answered normally.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No route matches the path.
    #[error("no route matches the path")]
    NoRoute,
    /// The route does not allow the method; `allow` lists what it does.
    #[error("method not allowed")]
    MethodNotAllowed { allow: String },
    /// `Cache-Control: only-if-cached` and the route's cache has no entry
    /// it may serve (RFC 9111 §5.2.1.7).
    #[error("not in the cache (only-if-cached)")]
    NotCached,
    /// The request path is refused: it climbs above `/`, has an encoded
    /// slash where those are refused, or (file routes) has NUL, a backslash
    /// or an encoded slash in a segment.
    #[error("bad request path: {0}")]
    BadPath(&'static str),
    /// A request the gateway refuses to forward: missing Host, absolute-form
    /// or CONNECT targets, invalid percent-encoding, ambiguous framing.
    #[error("bad request: {0}")]
    BadRequest(&'static str),
    /// The request target is longer than `server.max_uri_length`.
    #[error("request target longer than {limit} bytes")]
    UriTooLong { limit: u64 },
    /// The request has more header fields than an HTTP/1.1 head may
    /// (an HTTP/2 request's are counted here; an HTTP/1.1 head's parser
    /// refuses them first).
    #[error("more than {limit} header fields")]
    TooManyFields { limit: usize },
    /// The request body (declared or streamed) passed the route's `max_body`.
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge { limit: u64 },
    /// The client paused sending its body longer than the route's `body_timeout`.
    #[error("request body stalled for {}", humantime::format_duration(*.after))]
    BodyTimeout { after: Duration },
    /// The route's timeout passed while the gateway still waited for the
    /// client's request body: the client's fault, not the upstream's.
    #[error("request body not complete within the route timeout of {}", humantime::format_duration(*.after))]
    BodyNotInTime { after: Duration },
    /// The upstream ended the exchange while the gateway was still waiting
    /// for the client's request body: the client's slowness, not the
    /// upstream's failure.
    #[error("request body not complete when the upstream ended the exchange: {detail}")]
    BodyIncomplete { detail: String },
    /// The client's body failed: not as HTTP frames it (a 400).
    #[error("client request body failed: {0}")]
    ClientBody(String),
    /// The client closed its connection (or reset its stream) before the
    /// end of its request body: logged and counted as 499, as one that
    /// leaves while its answer is awaited.
    #[error("client closed its connection before the end of its request body: {0}")]
    ClientLeft(String),
    /// The route is at its `max_concurrent` limit: load is shed.
    #[error("route at its concurrency limit of {limit}")]
    Overloaded { limit: usize },
    /// The upstream is at `max_requests` and its queue is full.
    #[error("upstream {upstream}: at max_requests with all {queue} queue places taken")]
    QueueFull { upstream: String, queue: usize },
    /// The route's timeout passed while the request waited in the queue.
    #[error("upstream {upstream}: still queued at the route timeout of {}", humantime::format_duration(*.after))]
    QueuedPastRouteTimeout { upstream: String, after: Duration },
    /// The request waited `queue_timeout` for one of the upstream's slots.
    #[error("upstream {upstream}: no slot within the queue timeout of {}", humantime::format_duration(*.after))]
    QueueTimeout { upstream: String, after: Duration },
    /// No endpoint of the upstream may take traffic (all unhealthy or
    /// ejected); `retry_after` is a hint in seconds.
    #[error("upstream {upstream}: no endpoint may take traffic")]
    Unavailable { upstream: String, retry_after: u64 },
    /// The request's `Via` says it passed this gateway already: a route
    /// leads back to the gateway (RFC 5842 §7.2).
    #[error("request loop: the request passed this gateway already (Via)")]
    LoopDetected,
    /// The route's rate limit refused the request; `retry_after` (seconds)
    /// is `None` when waiting would not help (no key), `policy` and `state`
    /// are the `RateLimit-Policy` and `RateLimit` values.
    #[error("rate limited")]
    RateLimited { retry_after: Option<u64>, policy: http::HeaderValue, state: http::HeaderValue },
    /// Nothing to serve at that path.
    #[error("not found")]
    NotFound,
    /// The client's address is refused by the route's `allow`/`deny`
    /// (`None`: it could not be told, e.g. a malformed `X-Forwarded-For`
    /// from a trusted proxy).
    #[error("client address {} refused by the address list", .client.map_or("unknown".to_owned(), |c| c.to_string()))]
    AddressDenied { client: Option<std::net::IpAddr> },
    /// An admin request from outside `metrics.allow`, naming a host the
    /// admin listener does not answer (`metrics.hosts`), or sent by a
    /// cross-origin page.
    #[error("admin request refused: {0}")]
    AdminRefused(String),
    /// No credentials, or ones not accepted; `challenge` is the
    /// `WWW-Authenticate` value. `reason` never holds a credential.
    #[error("{kind} credentials refused: {reason}")]
    Unauthorized { kind: &'static str, reason: &'static str, challenge: http::HeaderValue },
    /// The forward auth service refused the request: its answer (status,
    /// body and the headers a login flow needs) goes to the client as it is.
    #[error("forward auth answered {}", .0.status)]
    ForwardRefused(Box<RelayedAnswer>),
    /// As many verifications run as the gateway allows at once.
    #[error("{kind}: {limit} verifications already running")]
    AuthBusy { kind: &'static str, limit: usize },
    /// The verification itself failed (not the credentials).
    #[error("{kind}: verification failed: {detail}")]
    AuthError { kind: &'static str, detail: String },
    /// A local I/O error other than not-found.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The upstream could not be reached (refused, unreachable, connect timeout).
    #[error("upstream {upstream}: connect {authority}: {detail}")]
    UpstreamConnect { upstream: String, authority: String, detail: String },
    /// The TLS handshake with an `https://` upstream failed.
    #[error("upstream {upstream}: connect {authority}: {detail}")]
    UpstreamTls { upstream: String, authority: String, detail: String },
    /// The route's timeout passed before the upstream's response head.
    #[error("upstream {upstream}: no response head within {}", humantime::format_duration(*.after))]
    UpstreamTimeout { upstream: String, after: Duration },
    /// The upstream stopped reading the request body for the route's
    /// `body_timeout`.
    #[error("upstream {upstream}: accepted no request body bytes for {}", humantime::format_duration(*.after))]
    UpstreamSendTimeout { upstream: String, after: Duration },
    /// The upstream closed or reset the connection before the response head.
    #[error("upstream {upstream}: connection closed before the response head: {detail}")]
    UpstreamReset { upstream: String, detail: String },
    /// The upstream answered something that is not valid HTTP.
    #[error("upstream {upstream}: invalid response: {detail}")]
    UpstreamProtocol { upstream: String, detail: String },
}

/// An answer relayed to the client as it is (a forward auth refusal).
#[derive(Debug)]
pub struct RelayedAnswer {
    pub status: StatusCode,
    /// Only the headers meant for the client.
    pub headers: http::HeaderMap,
    pub body: bytes::Bytes,
}

impl GatewayError {
    /// The status code the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::NoRoute | GatewayError::NotFound => StatusCode::NOT_FOUND,
            GatewayError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::AddressDenied { .. } | GatewayError::AdminRefused(_) => StatusCode::FORBIDDEN,
            GatewayError::Unauthorized { .. } => StatusCode::UNAUTHORIZED,
            GatewayError::ForwardRefused(answer) => answer.status,
            GatewayError::AuthBusy { .. } | GatewayError::AuthError { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::BadPath(_) | GatewayError::BadRequest(_) | GatewayError::ClientBody(_) => {
                StatusCode::BAD_REQUEST
            }
            GatewayError::ClientLeft(_) => CLIENT_CLOSED,
            GatewayError::UriTooLong { .. } => StatusCode::URI_TOO_LONG,
            GatewayError::TooManyFields { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            GatewayError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::BodyTimeout { .. }
            | GatewayError::BodyNotInTime { .. }
            | GatewayError::BodyIncomplete { .. } => StatusCode::REQUEST_TIMEOUT,
            GatewayError::Overloaded { .. }
            | GatewayError::QueueFull { .. }
            | GatewayError::QueueTimeout { .. }
            | GatewayError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::LoopDetected => StatusCode::LOOP_DETECTED,
            GatewayError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
            GatewayError::UpstreamConnect { .. }
            | GatewayError::UpstreamTls { .. }
            | GatewayError::UpstreamReset { .. }
            | GatewayError::UpstreamProtocol { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamTimeout { .. }
            | GatewayError::UpstreamSendTimeout { .. }
            | GatewayError::QueuedPastRouteTimeout { .. }
            | GatewayError::NotCached => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The `kind` label of `gateway_upstream_errors_total`, for upstream errors.
    pub fn upstream_kind(&self) -> Option<&'static str> {
        match self {
            GatewayError::UpstreamConnect { .. } => Some("connect"),
            GatewayError::UpstreamTls { .. } => Some("tls"),
            GatewayError::UpstreamTimeout { .. } | GatewayError::UpstreamSendTimeout { .. } => Some("timeout"),
            GatewayError::Unavailable { .. } => Some("unavailable"),
            GatewayError::UpstreamReset { .. } => Some("reset"),
            GatewayError::UpstreamProtocol { .. } => Some("protocol"),
            _ => None,
        }
    }

    /// The `reason` label of `gateway_rejected_total`, for requests refused
    /// by a limit or as hostile.
    pub fn rejection_reason(&self) -> Option<&'static str> {
        match self {
            GatewayError::BadRequest(_) => Some("bad_request"),
            GatewayError::UriTooLong { .. } => Some("uri_too_long"),
            GatewayError::TooManyFields { .. } => Some("header_too_large"),
            GatewayError::BodyTooLarge { .. } => Some("body_too_large"),
            GatewayError::BodyTimeout { .. }
            | GatewayError::BodyNotInTime { .. }
            | GatewayError::BodyIncomplete { .. } => Some("body_timeout"),
            GatewayError::Overloaded { .. } => Some("max_concurrent"),
            GatewayError::QueueFull { .. } => Some("queue_full"),
            GatewayError::QueueTimeout { .. } | GatewayError::QueuedPastRouteTimeout { .. } => Some("queue_timeout"),
            GatewayError::BadPath(_) => Some("bad_path"),
            GatewayError::RateLimited { .. } => Some("rate_limited"),
            GatewayError::LoopDetected => Some("loop_detected"),
            _ => None,
        }
    }

    /// The `kind` and `result` labels of `gateway_auth_total`, for requests
    /// refused by the route's access control.
    pub fn auth_outcome(&self) -> Option<(&'static str, &'static str)> {
        match self {
            GatewayError::AddressDenied { .. } => Some(("address", "denied")),
            GatewayError::Unauthorized { kind, .. } => Some((kind, "denied")),
            GatewayError::ForwardRefused(_) => Some(("forward", "denied")),
            GatewayError::AuthBusy { kind, .. } | GatewayError::AuthError { kind, .. } => Some((kind, "error")),
            _ => None,
        }
    }

    /// Whether the connection must close after this response: the request's
    /// framing is ambiguous or its body was left unread; or a refused admin
    /// client, which kept open would hold one of `metrics.max_connections`
    /// for the idle timeout (a few dozen would lock the scraper out).
    pub fn closes_connection(&self) -> bool {
        matches!(
            self,
            GatewayError::BadRequest(_)
                | GatewayError::BodyTooLarge { .. }
                | GatewayError::BodyTimeout { .. }
                | GatewayError::BodyNotInTime { .. }
                | GatewayError::BodyIncomplete { .. }
                | GatewayError::ClientBody(_)
                | GatewayError::ClientLeft(_)
                | GatewayError::AdminRefused(_)
        )
    }

    /// The `Retry-After` the client gets (seconds), for 503s that say when
    /// to come back.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            GatewayError::Overloaded { .. }
            | GatewayError::QueueFull { .. }
            | GatewayError::QueueTimeout { .. }
            | GatewayError::AuthBusy { .. } => Some(1),
            GatewayError::Unavailable { retry_after, .. } => Some(*retry_after),
            GatewayError::RateLimited { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The short text body the client gets. Upstream details stay in the
    /// log; the client learns only what kind of failure it was.
    pub fn body(&self) -> &'static str {
        match self {
            GatewayError::NoRoute | GatewayError::NotFound => "not found\n",
            GatewayError::MethodNotAllowed { .. } => "method not allowed\n",
            GatewayError::AddressDenied { .. } | GatewayError::AdminRefused(_) => "forbidden\n",
            GatewayError::Unauthorized { .. } => "unauthorized\n",
            // Its own body is sent instead (see the server's error_response).
            GatewayError::ForwardRefused(_) => "",
            GatewayError::AuthBusy { .. } => "service unavailable: too many logins at once, retry later\n",
            GatewayError::AuthError { .. } => "service unavailable: authentication failed\n",
            GatewayError::BadPath(_) => "bad request path\n",
            GatewayError::BadRequest(_) | GatewayError::ClientBody(_) => "bad request\n",
            GatewayError::ClientLeft(_) => "client closed request\n",
            GatewayError::UriTooLong { .. } => "request target too long\n",
            GatewayError::TooManyFields { .. } => "request header fields too large\n",
            GatewayError::BodyTooLarge { .. } => "request body too large\n",
            GatewayError::BodyTimeout { .. }
            | GatewayError::BodyNotInTime { .. }
            | GatewayError::BodyIncomplete { .. } => "request body timed out\n",
            GatewayError::Overloaded { .. } => "service unavailable: route at its concurrency limit, retry later\n",
            GatewayError::QueueFull { .. } | GatewayError::QueueTimeout { .. } => {
                "service unavailable: upstream busy, retry later\n"
            }
            GatewayError::Unavailable { .. } => "service unavailable: upstream has no available endpoint\n",
            GatewayError::RateLimited { .. } => "too many requests\n",
            GatewayError::LoopDetected => "loop detected: the request came back to this gateway\n",
            GatewayError::Io(_) => "internal error\n",
            GatewayError::UpstreamConnect { .. } => "bad gateway: upstream unreachable\n",
            GatewayError::UpstreamTls { .. } => "bad gateway: upstream TLS handshake failed\n",
            GatewayError::UpstreamReset { .. } => "bad gateway: upstream closed the connection\n",
            GatewayError::UpstreamProtocol { .. } => "bad gateway: invalid upstream response\n",
            GatewayError::UpstreamTimeout { .. } => "gateway timeout: upstream did not answer in time\n",
            GatewayError::UpstreamSendTimeout { .. } => "gateway timeout: upstream stopped reading the request\n",
            GatewayError::QueuedPastRouteTimeout { .. } => "gateway timeout: still waiting for the upstream\n",
            GatewayError::NotCached => "gateway timeout: not in the cache (only-if-cached)\n",
        }
    }
}

/// 499, nginx's status for a request whose client closed the connection
/// before it was answered. Logs and metrics use it; a client that is gone
/// is sent nothing, and one that half-closed reads it as a 4xx.
pub const CLIENT_CLOSED: StatusCode = match StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => unreachable!(),
};

/// Whether `e` says the client's connection or stream ended: the end of
/// its stream mid-body, a reset, or an HTTP/2 stream it cancelled.
pub fn client_gone(e: &(dyn std::error::Error + 'static)) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset, UnexpectedEof};
    find_source::<std::io::Error>(e)
        .is_some_and(|io| matches!(io.kind(), UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe))
        || find_source::<hyper::Error>(e).is_some_and(|h| h.is_incomplete_message())
        || find_source::<h2::Error>(e).is_some_and(|h| h.reason() == Some(h2::Reason::CANCEL) || h.is_io())
}

/// The first error of type `T` in `e`'s source chain.
pub fn find_source<'a, T: std::error::Error + 'static>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a T> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(t) = err.downcast_ref::<T>() {
            return Some(t);
        }
        cur = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate_limited(retry_after: Option<u64>) -> GatewayError {
        let v = http::HeaderValue::from_static("\"r\";r=0;t=1");
        GatewayError::RateLimited { retry_after, policy: v.clone(), state: v }
    }

    #[test]
    fn a_rate_limit_refusal_says_when_to_come_back_only_when_waiting_helps() {
        assert_eq!(rate_limited(Some(3)).retry_after(), Some(3));
        assert_eq!(rate_limited(None).retry_after(), None);
    }

    #[test]
    fn status_and_kind_per_error() {
        let up = || "a".to_owned();
        let cases: Vec<(GatewayError, u16, Option<&str>)> = vec![
            (GatewayError::NoRoute, 404, None),
            (GatewayError::NotFound, 404, None),
            (GatewayError::NotCached, 504, None),
            (GatewayError::MethodNotAllowed { allow: "GET".into() }, 405, None),
            (GatewayError::AddressDenied { client: None }, 403, None),
            (GatewayError::AdminRefused("host".into()), 403, None),
            (
                GatewayError::Unauthorized {
                    kind: "basic",
                    reason: "x",
                    challenge: http::HeaderValue::from_static("Basic"),
                },
                401,
                None,
            ),
            (GatewayError::AuthBusy { kind: "basic", limit: 1 }, 503, None),
            (
                GatewayError::ForwardRefused(Box::new(RelayedAnswer {
                    status: StatusCode::FOUND,
                    headers: http::HeaderMap::new(),
                    body: bytes::Bytes::from_static(b"login"),
                })),
                302,
                None,
            ),
            (GatewayError::AuthError { kind: "jwt", detail: "x".into() }, 503, None),
            (GatewayError::BadPath("x"), 400, None),
            (GatewayError::BadRequest("x"), 400, None),
            (GatewayError::UriTooLong { limit: 1 }, 414, None),
            (GatewayError::TooManyFields { limit: 1 }, 431, None),
            (GatewayError::BodyTooLarge { limit: 1 }, 413, None),
            (GatewayError::BodyTimeout { after: Duration::from_secs(1) }, 408, None),
            (GatewayError::BodyNotInTime { after: Duration::from_secs(1) }, 408, None),
            (GatewayError::BodyIncomplete { detail: "reset".into() }, 408, None),
            (GatewayError::Overloaded { limit: 1 }, 503, None),
            (GatewayError::QueueFull { upstream: up(), queue: 1 }, 503, None),
            (GatewayError::QueueTimeout { upstream: up(), after: Duration::from_secs(1) }, 503, None),
            (GatewayError::Unavailable { upstream: up(), retry_after: 3 }, 503, Some("unavailable")),
            (GatewayError::QueuedPastRouteTimeout { upstream: up(), after: Duration::from_secs(1) }, 504, None),
            (GatewayError::Io(std::io::Error::other("x")), 500, None),
            (rate_limited(Some(1)), 429, None),
            (
                GatewayError::UpstreamConnect { upstream: up(), authority: "h:1".into(), detail: "refused".into() },
                502,
                Some("connect"),
            ),
            (
                GatewayError::UpstreamTls { upstream: up(), authority: "h:443".into(), detail: "expired".into() },
                502,
                Some("tls"),
            ),
            (GatewayError::UpstreamReset { upstream: up(), detail: "x".into() }, 502, Some("reset")),
            (GatewayError::UpstreamProtocol { upstream: up(), detail: "x".into() }, 502, Some("protocol")),
            (GatewayError::UpstreamTimeout { upstream: up(), after: Duration::from_millis(250) }, 504, Some("timeout")),
            (
                GatewayError::UpstreamSendTimeout { upstream: up(), after: Duration::from_millis(250) },
                504,
                Some("timeout"),
            ),
        ];
        for (err, status, kind) in cases {
            assert_eq!(err.status().as_u16(), status, "{err}");
            assert_eq!(err.upstream_kind(), kind, "{err}");
            assert!(!err.body().is_empty() || matches!(err, GatewayError::ForwardRefused(_)));
        }
    }

    #[test]
    fn rejections_have_reasons_and_ambiguous_framing_closes() {
        let cases: Vec<(GatewayError, Option<&str>, bool)> = vec![
            (GatewayError::BadRequest("x"), Some("bad_request"), true),
            (GatewayError::UriTooLong { limit: 1 }, Some("uri_too_long"), false),
            (GatewayError::BodyTooLarge { limit: 1 }, Some("body_too_large"), true),
            (GatewayError::BodyTimeout { after: Duration::from_secs(1) }, Some("body_timeout"), true),
            (GatewayError::BodyNotInTime { after: Duration::from_secs(1) }, Some("body_timeout"), true),
            (GatewayError::BodyIncomplete { detail: "reset".into() }, Some("body_timeout"), true),
            (GatewayError::Overloaded { limit: 1 }, Some("max_concurrent"), false),
            (GatewayError::QueueFull { upstream: "a".into(), queue: 1 }, Some("queue_full"), false),
            (
                GatewayError::QueueTimeout { upstream: "a".into(), after: Duration::from_secs(1) },
                Some("queue_timeout"),
                false,
            ),
            (GatewayError::NotFound, None, false),
            (GatewayError::BadPath("x"), Some("bad_path"), false),
            (GatewayError::ClientBody("eof".into()), None, true),
            (GatewayError::ClientLeft("eof".into()), None, true),
            (GatewayError::AdminRefused("host".into()), None, true),
            (GatewayError::AddressDenied { client: None }, None, false),
            (rate_limited(Some(2)), Some("rate_limited"), false),
        ];
        for (err, reason, closes) in cases {
            assert_eq!(err.rejection_reason(), reason, "{err}");
            assert_eq!(err.closes_connection(), closes, "{err}");
        }
    }

    #[test]
    fn access_refusals_have_auth_labels() {
        let challenge = http::HeaderValue::from_static("Bearer");
        let cases: Vec<(GatewayError, Option<(&str, &str)>)> = vec![
            (GatewayError::AddressDenied { client: Some([10, 0, 0, 1].into()) }, Some(("address", "denied"))),
            (GatewayError::Unauthorized { kind: "jwt", reason: "expired", challenge }, Some(("jwt", "denied"))),
            (GatewayError::AuthBusy { kind: "basic", limit: 1 }, Some(("basic", "error"))),
            (GatewayError::AuthError { kind: "basic", detail: "panic".into() }, Some(("basic", "error"))),
            (GatewayError::NotFound, None),
        ];
        for (err, want) in cases {
            assert_eq!(err.auth_outcome(), want, "{err}");
        }
        assert_eq!(GatewayError::AuthBusy { kind: "basic", limit: 1 }.retry_after(), Some(1));
    }

    #[test]
    fn messages_carry_context() {
        let e = GatewayError::UpstreamConnect {
            upstream: "service_a".into(),
            authority: "127.0.0.1:8000".into(),
            detail: "connection refused".into(),
        };
        assert_eq!(e.to_string(), "upstream service_a: connect 127.0.0.1:8000: connection refused");
        let t = GatewayError::UpstreamTimeout { upstream: "a".into(), after: Duration::from_millis(250) };
        assert_eq!(t.to_string(), "upstream a: no response head within 250ms");
    }
}
