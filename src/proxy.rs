//! Forwarding to upstreams: header rules, the route timeout, the connection
//! pool, error classification and the one retry.

use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, Uri, Version};
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use metrics::Counter;
use tokio::time::Instant;

use crate::body::{Body, BodyIdle, BodyTooLarge, ClientBodyFailed, RequestBody, UpstreamBody};
use crate::config::{HostMode, ProxyTarget, UpstreamConfig};
use crate::error::{GatewayError, find_source};
use crate::headers;
use crate::metrics::UpstreamMetrics;
use crate::pool::{Conn, ConnectError, Pool, SendBody, SendStalled};
use crate::router::rewrite_path;
use crate::server::Peer;

/// One configured upstream with its connection pool and metrics.
pub struct Upstream {
    pub config: UpstreamConfig,
    pub metrics: UpstreamMetrics,
    pool: Pool,
    /// The `Host` sent when the route asks for the upstream's own.
    host: HeaderValue,
    retries: Counter,
}

/// How an exchange with the upstream failed.
enum Failure {
    Connect(ConnectError),
    Send(hyper::Error),
}

impl Upstream {
    pub fn new(config: UpstreamConfig) -> Self {
        let metrics = UpstreamMetrics::new(&config.name);
        let pool = Pool::new(&config, metrics.connections_opened.clone());
        let host = HeaderValue::from_str(config.authority.as_str()).expect("an authority is a valid header");
        let retries = metrics::counter!(crate::metrics::UPSTREAM_RETRIES, "upstream" => config.name.clone());
        Upstream { config, metrics, pool, host, retries }
    }

    /// Forwards `req` (matched by a route with `prefix` and body limit
    /// `max_body`) and returns the upstream's response head with its body
    /// streaming. `deadline` is the request's arrival plus the route's timeout.
    pub async fn forward(
        &self,
        target: &ProxyTarget,
        prefix: &str,
        max_body: u64,
        req: Request<Incoming>,
        peer: &Peer,
        deadline: Instant,
    ) -> Result<Response<Body>, GatewayError> {
        let (mut parts, body) = req.into_parts();
        let path_and_query = match &target.rewrite {
            Some(rewrite) => rewrite_path(parts.uri.path(), parts.uri.query(), prefix, rewrite)
                .parse::<PathAndQuery>()
                .map_err(|_| GatewayError::BadPath("rewritten path is not a valid URI"))?,
            None => parts.uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")),
        };
        // HTTP/2 clients send :authority instead of Host.
        let original_host = parts
            .headers
            .get(header::HOST)
            .cloned()
            .or_else(|| parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()));
        headers::strip_hop_by_hop(&mut parts.headers);
        if parts.version == Version::HTTP_2 {
            headers::join_cookies(&mut parts.headers);
        }
        headers::add_forwarding(
            &mut parts.headers,
            &peer.forwarded_for,
            original_host.as_ref(),
            parts.version,
            peer.trusted,
        );
        let host = match (target.host, original_host) {
            (HostMode::Preserve, Some(h)) => h,
            _ => self.host.clone(),
        };
        parts.headers.insert(header::HOST, host);
        // Origin-form on the wire (RFC 9112 §3.2.1); the connection already
        // names the upstream.
        parts.uri = Uri::from(path_and_query);
        let from_http2 = parts.version == Version::HTTP_2;
        parts.version = Version::HTTP_11;

        let started = Instant::now();
        let has_body = !http_body::Body::is_end_stream(&body);
        if has_body && !parts.headers.contains_key(header::CONTENT_LENGTH) {
            // A body of unknown length (chunked, or HTTP/2 without
            // content-length) goes upstream chunked. Said explicitly because
            // hyper would frame a GET or HEAD of unknown length as empty and
            // silently drop its body.
            parts.headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        }
        let body = if has_body {
            Either::Left(RequestBody::new(body, max_body, target.body_timeout, from_http2))
        } else {
            Either::Right(Empty::new())
        };
        // A request without a body and with an idempotent method may be sent
        // again (RFC 9110 §9.2.2).
        let retryable = !has_body && is_idempotent(&parts.method);
        let large = has_body
            && http_body::Body::size_hint(&body).upper().is_none_or(|n| n > u64::from(crate::listener::NOTSENT_LOWAT));
        let exchange = self.exchange(Request::from_parts(parts, body), retryable, (target.body_timeout, large));
        let (response, conn) = match tokio::time::timeout_at(deadline, exchange).await {
            Err(_) => {
                return Err(GatewayError::UpstreamTimeout {
                    upstream: self.config.name.clone(),
                    after: target.timeout,
                });
            }
            Ok(Err(e)) => return Err(self.classify(e)),
            Ok(Ok(r)) => r,
        };
        let status = response.status().as_u16();
        if !(100..=599).contains(&status) {
            // hyper accepts 100-999; past 599 it is not HTTP (RFC 9110 §15),
            // and passing it on would also mint metric series.
            return Err(GatewayError::UpstreamProtocol {
                upstream: self.config.name.clone(),
                detail: format!("status {status} is outside 100-599"),
            });
        }
        if status == 101 {
            // Upgrade is stripped on the way up, so a 101 was never asked
            // for: relaying it would hand the client a switched protocol
            // the gateway does not carry.
            return Err(GatewayError::UpstreamProtocol {
                upstream: self.config.name.clone(),
                detail: "101 Switching Protocols without an upgrade request".into(),
            });
        }
        self.metrics.record(status, started.elapsed());
        let (mut parts, body) = response.into_parts();
        // Content-Length beside Transfer-Encoding (hyper frames the body by
        // the latter and keeps both headers): the framings disagree, so the
        // length must not be passed on (RFC 9112 §6.3), and a connection
        // whose upstream frames like that is not reused.
        let reusable = !(parts.headers.contains_key(header::CONTENT_LENGTH)
            && http_body::Body::size_hint(&body).exact().is_none());
        if !reusable {
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        headers::strip_hop_by_hop(&mut parts.headers);
        headers::append_via(&mut parts.headers, parts.version);
        let body = UpstreamBody::new(
            body,
            conn,
            reusable,
            target.body_timeout,
            self.metrics.body_failed.clone(),
            self.metrics.body_stalled.clone(),
        );
        Ok(Response::from_parts(parts, Body::Upstream(body)))
    }

    /// Sends `req` on an idle pooled connection, or a new one. A request
    /// that was not written because its connection had closed goes to the
    /// next one. A retryable request that failed after being written on a
    /// pooled connection (the upstream closed it just as the request went
    /// out) is sent once more, on a new connection, so the retry can never
    /// land on another stale one.
    async fn exchange(
        &self,
        mut req: Request<SendBody>,
        retryable: bool,
        (send_timeout, large_body): (std::time::Duration, bool),
    ) -> Result<(Response<Incoming>, Conn), Failure> {
        while let Some(mut conn) = self.pool.take_idle() {
            conn.prepare(send_timeout, large_body);
            let copy = retryable.then(|| copy_head(&req));
            match conn.sender.try_send_request(req).await {
                Ok(response) => return Ok((response, conn)),
                Err(mut e) => match (e.take_message(), copy) {
                    (Some(unsent), _) => req = unsent,
                    (None, Some(copy)) if is_stale_connection(e.error()) => {
                        self.retries.increment(1);
                        tracing::debug!(upstream = %self.config.name, error = %e.error(), "retrying on a new connection");
                        req = copy;
                        break;
                    }
                    (None, _) => return Err(Failure::Send(e.into_error())),
                },
            }
        }
        let mut conn = self.pool.connect().await.map_err(Failure::Connect)?;
        conn.prepare(send_timeout, large_body);
        let response = conn.sender.send_request(req).await.map_err(Failure::Send)?;
        Ok((response, conn))
    }

    /// Maps a failure to the gateway error (and so the status and kind).
    /// Failures of the client's own request body are the client's.
    fn classify(&self, failure: Failure) -> GatewayError {
        let upstream = self.config.name.clone();
        let e = match failure {
            Failure::Connect(e) => {
                return GatewayError::UpstreamConnect {
                    upstream,
                    authority: self.config.authority.to_string(),
                    detail: e.to_string(),
                };
            }
            Failure::Send(e) => e,
        };
        if let Some(too_large) = find_source::<BodyTooLarge>(&e) {
            return GatewayError::BodyTooLarge { limit: too_large.0 };
        }
        if let Some(idle) = find_source::<BodyIdle>(&e) {
            return GatewayError::BodyTimeout { after: idle.0 };
        }
        if let Some(failed) = find_source::<ClientBodyFailed>(&e) {
            return GatewayError::ClientBody(failed.to_string());
        }
        if let Some(stalled) =
            find_source::<std::io::Error>(&e).and_then(|io| io.get_ref()?.downcast_ref::<SendStalled>())
        {
            return GatewayError::UpstreamSendTimeout { upstream, after: stalled.0 };
        }
        let detail = error_chain(&e);
        if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
            GatewayError::UpstreamProtocol { upstream, detail }
        } else {
            GatewayError::UpstreamReset { upstream, detail }
        }
    }
}

fn is_idempotent(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE)
}

/// A copy of a bodiless request's head, for the one retry.
fn copy_head(req: &Request<SendBody>) -> Request<SendBody> {
    let mut copy = Request::new(Either::Right(Empty::new()));
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    copy
}

/// Whether the error, on a pooled connection, says the connection went bad
/// while idle: the upstream closed it under the request before any response
/// byte arrived, or left bytes on it that were not part of this response
/// (a body after a HEAD response, RFC 9110 §9.3.2).
fn is_stale_connection(e: &hyper::Error) -> bool {
    if e.is_incomplete_message() || e.is_canceled() || e.is_parse() {
        return true;
    }
    find_source::<std::io::Error>(e).is_some_and(|io| {
        matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::ConnectionAborted
        )
    })
}

/// `outer: inner: innermost`, for log lines and error details.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(err) = cur {
        let s = err.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = err.source();
    }
    out
}
