//! Forwarding to upstreams: one pooled keep-alive client per upstream, header
//! rules, the route timeout, error classification and the one retry.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, Uri, Version};
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use metrics::Counter;
use tokio::time::Instant;

use crate::body::{Body, BodyIdle, BodyTooLarge, ClientBodyFailed, RequestBody, UpstreamBody};
use crate::config::{HostMode, ProxyTarget, UpstreamConfig};
use crate::error::{GatewayError, find_source};
use crate::headers;
use crate::metrics::UpstreamMetrics;
use crate::router::rewrite_path;

/// The body sent upstream: the client's, streamed, or nothing (which makes
/// the request safe to send twice).
type OutgoingBody = Either<RequestBody, Empty<Bytes>>;

/// One configured upstream with its connection pool and metrics.
pub struct Upstream {
    pub config: UpstreamConfig,
    pub metrics: UpstreamMetrics,
    client: Client<CountingConnector, OutgoingBody>,
    /// Keeps no idle connections, so a retry always gets a new one rather
    /// than another pooled connection that may be just as stale.
    fresh: Client<CountingConnector, OutgoingBody>,
    retries: Counter,
}

impl Upstream {
    pub fn new(config: UpstreamConfig) -> Self {
        let metrics = UpstreamMetrics::new(&config.name);
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(config.connect_timeout));
        http.set_nodelay(true);
        let connector = CountingConnector { inner: http, opened: metrics.connections_opened.clone() };
        let client = Client::builder(TokioExecutor::new())
            // Without a timer the pool's idle timeout never fires.
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(config.pool_idle_timeout)
            .pool_max_idle_per_host(config.pool_max_idle_per_host)
            .build(connector.clone());
        let fresh = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build(connector);
        let retries = metrics::counter!(crate::metrics::UPSTREAM_RETRIES, "upstream" => config.name.clone());
        Upstream { config, metrics, client, fresh, retries }
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
        client_ip: &HeaderValue,
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
        headers::add_forwarding(&mut parts.headers, client_ip, original_host.as_ref(), parts.version);
        let host = match (target.host, original_host) {
            (HostMode::Preserve, Some(h)) => h,
            _ => HeaderValue::from_str(self.config.authority.as_str()).expect("authority is a valid header"),
        };
        parts.headers.insert(header::HOST, host);
        parts.uri = Uri::builder()
            .scheme(self.config.scheme.clone())
            .authority(self.config.authority.clone())
            .path_and_query(path_and_query)
            .build()
            .expect("scheme, authority and path are valid");
        parts.version = Version::HTTP_11;

        let started = Instant::now();
        let has_body = !http_body::Body::is_end_stream(&body);
        let exchange = async {
            if has_body {
                let body = RequestBody::new(body, max_body, target.body_timeout);
                return self.client.request(Request::from_parts(parts, Either::Left(body))).await;
            }
            // A request without a body and with an idempotent method may be
            // sent again (RFC 9110 §9.2.2). That covers the race where the
            // upstream closes an idle pooled connection just as the request
            // is written on it; hyper-util retries only when nothing was
            // written yet.
            let retry = is_idempotent(&parts.method).then(|| copy_head(&parts));
            match self.client.request(Request::from_parts(parts, Either::Right(Empty::new()))).await {
                Err(e) if retry.is_some() && is_stale_connection(&e) => {
                    self.retries.increment(1);
                    tracing::debug!(upstream = %self.config.name, error = %error_chain(&e), "retrying on a fresh connection");
                    self.fresh.request(retry.expect("checked")).await
                }
                other => other,
            }
        };
        let response = match tokio::time::timeout_at(deadline, exchange).await {
            Err(_) => {
                return Err(GatewayError::UpstreamTimeout {
                    upstream: self.config.name.clone(),
                    after: target.timeout,
                });
            }
            Ok(Err(e)) => return Err(self.classify(&e)),
            Ok(Ok(r)) => r,
        };
        self.metrics.record(response.status().as_u16(), started.elapsed());
        let (mut parts, body) = response.into_parts();
        headers::strip_hop_by_hop(&mut parts.headers);
        headers::append_via(&mut parts.headers, parts.version);
        let body = UpstreamBody::new(
            body,
            target.body_timeout,
            self.metrics.body_failed.clone(),
            self.metrics.body_stalled.clone(),
        );
        Ok(Response::from_parts(parts, Body::Upstream(body)))
    }

    /// Maps a client error to the gateway error (and so the status and kind).
    /// Failures of the client's own request body are the client's.
    fn classify(&self, e: &hyper_util::client::legacy::Error) -> GatewayError {
        if let Some(too_large) = find_source::<BodyTooLarge>(e) {
            return GatewayError::BodyTooLarge { limit: too_large.0 };
        }
        if let Some(idle) = find_source::<BodyIdle>(e) {
            return GatewayError::BodyTimeout { after: idle.0 };
        }
        if let Some(failed) = find_source::<ClientBodyFailed>(e) {
            return GatewayError::ClientBody(failed.to_string());
        }
        let upstream = self.config.name.clone();
        let detail = error_chain(e);
        if e.is_connect() {
            return GatewayError::UpstreamConnect { upstream, authority: self.config.authority.to_string(), detail };
        }
        match find_source::<hyper::Error>(e) {
            Some(h) if h.is_parse() || h.is_parse_status() || h.is_parse_too_large() => {
                GatewayError::UpstreamProtocol { upstream, detail }
            }
            _ => GatewayError::UpstreamReset { upstream, detail },
        }
    }
}

fn is_idempotent(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE)
}

/// A copy of a bodiless request's head, for the one retry.
fn copy_head(parts: &http::request::Parts) -> Request<OutgoingBody> {
    let mut req = Request::new(Either::Right(Empty::new()));
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = parts.uri.clone();
    *req.version_mut() = parts.version;
    *req.headers_mut() = parts.headers.clone();
    req
}

/// Whether the error is the upstream closing a connection under a request
/// before any response byte arrived.
fn is_stale_connection(e: &hyper_util::client::legacy::Error) -> bool {
    if e.is_connect() {
        return false;
    }
    if let Some(h) = find_source::<hyper::Error>(e)
        && (h.is_incomplete_message() || h.is_canceled())
    {
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

/// Wraps the HTTP connector to count every TCP connection opened, so that
/// `gateway_upstream_connections_opened_total` shows connection reuse.
#[derive(Clone)]
struct CountingConnector {
    inner: HttpConnector,
    opened: Counter,
}

impl tower::Service<Uri> for CountingConnector {
    type Response = <HttpConnector as tower::Service<Uri>>::Response;
    type Error = <HttpConnector as tower::Service<Uri>>::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.inner.call(uri);
        let opened = self.opened.clone();
        Box::pin(async move {
            let conn = connecting.await?;
            opened.increment(1);
            Ok(conn)
        })
    }
}
