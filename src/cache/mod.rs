//! A proxy route's response cache (RFC 9111, as a shared cache), so that a
//! slow upstream answers each key once per freshness period instead of once
//! per client.
//!
//! [`RouteCache::serve`] stands where the route would call
//! [`Upstream::forward`]: only routes with `cache` take it (a branch in
//! `dispatch`, nothing else on other routes). It keys on what the upstream
//! receives (the upstream, the client's `Host` it sees as `Host` or
//! `X-Forwarded-Host`, the path and query after
//! `rewrite`) and the request headers the stored answer's `Vary` names.
//!
//! - `rules`: the RFC's rules as pure functions (storable, fresh, stale
//!   windows, the request's directives, conditionals);
//! - `store`: the route's moka store, its metrics, and the fills under way
//!   that concurrent misses wait on;
//! - `fill`: one request upstream for a key, in its own task, streaming to
//!   the first client while it keeps the bytes for the store.

mod fill;
pub mod rules;
mod status;
mod store;

use status::Status;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::body::Body;
use crate::config::{CacheConfig, HostMode, ProxyTarget};
use crate::error::GatewayError;
use crate::headers::X_REQUEST_ID;
use crate::metrics::CacheMetrics;
use crate::request::{Authenticated, Peer, RequestLog};
use crate::upstream::Upstream;
use crate::upstream::proxy::upstream_path;
use fill::{Answer, Fill};
use rules::Ask;
pub use store::Store;
use store::{Entry, FillGuard, Filled};

/// RFC 9211's response header.
pub const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// A proxy route's cache: its store (kept by a reload when the settings
/// hold) and what it needs to go upstream from a task of its own.
pub struct RouteCache {
    pub store: Arc<Store>,
    upstream: Arc<Upstream>,
    target: ProxyTarget,
    prefix: String,
    max_body: u64,
    metrics: CacheMetrics,
}

impl RouteCache {
    /// The cache of route `name`; `running` is the store of the route of
    /// that name before a reload, kept when its settings did not change.
    pub fn new(
        name: &str,
        target: &ProxyTarget,
        config: CacheConfig,
        (prefix, max_body): (&str, u64),
        upstream: Arc<Upstream>,
        running: Option<&Arc<Store>>,
    ) -> Arc<RouteCache> {
        let store = match running {
            Some(s) if s.config == config => s.clone(),
            _ => Store::new(config, name),
        };
        Arc::new(RouteCache {
            store,
            upstream,
            target: target.clone(),
            prefix: prefix.to_owned(),
            max_body,
            metrics: CacheMetrics::new(name),
        })
    }

    /// Answers `req` from the store or through it. `deadline` is the
    /// route's (arrival plus timeout); waiting on another request's fill
    /// counts toward it.
    pub async fn serve(
        self: &Arc<Self>,
        req: Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
    ) -> Result<Response<Body>, GatewayError> {
        let method = req.method().clone();
        // Every way upstream below is boxed: their futures hold the
        // upstream request's, and inline they would make this one (boxed
        // itself, on every request) as large, copied even for a hit.
        // Only a bodiless GET or HEAD is the cache's; an upgrade (WebSocket)
        // goes straight through.
        if (method != Method::GET && method != Method::HEAD)
            || !http_body::Body::is_end_stream(req.body())
            || req.headers().contains_key(header::UPGRADE)
        {
            return Box::pin(self.pass(req, peer, cx, deadline)).await;
        }
        let key = self.key(&req)?;
        let (mut ask, only_if_cached, max_age) = rules::ask(req.headers());
        if ask == Ask::Bypass {
            self.metrics.bypass.increment(1);
            return Box::pin(self.direct(req, peer, cx, deadline, Status::fwd("bypass"))).await;
        }
        let now = SystemTime::now();
        let entry = self.store.get(&key, req.headers());
        // The client's max-age: an older entry is revalidated (§5.2.1.1).
        if let (Some(e), Some(max)) = (&entry, max_age)
            && e.age(now) > Duration::from_secs(max)
        {
            ask = Ask::Revalidate;
        }
        if let Some(e) = &entry
            && ask == Ask::Normal
        {
            if let Some(ttl) = e.ttl(now) {
                self.metrics.hit.increment(1);
                return Ok(from_entry(e, &method, req.headers(), Status::hit(Some(ttl))));
            }
            if e.staleness(now) < e.while_revalidate {
                self.metrics.stale.increment(1);
                let response = from_entry(e, &method, req.headers(), Status::stale());
                self.refresh(key.into(), req, peer, cx, deadline, e.clone());
                return Ok(response);
            }
        }
        if only_if_cached {
            return Err(GatewayError::NotCached);
        }
        // A HEAD is answered from a stored GET only; a range goes upstream
        // as asked (a 206 is never stored).
        if method == Method::HEAD || req.headers().contains_key(header::RANGE) {
            self.metrics.uncacheable.increment(1);
            return Box::pin(self.direct(req, peer, cx, deadline, Status::fwd("miss"))).await;
        }
        let fwd = match (&entry, ask) {
            (_, Ask::Revalidate) => "request",
            (Some(_), _) => "stale",
            (None, _) => "miss",
        };
        // The map's keys are shared (`Arc<str>`): made only past a hit.
        let key: Arc<str> = key.into();
        if !self.store.config.coalesce {
            let guard = self.store.solo(&key);
            return Box::pin(self.fill(guard, key, req, peer, cx, deadline, entry, fwd)).await;
        }
        match self.store.join_or_start(&key) {
            Ok(rx) => Box::pin(self.wait(rx, key, req, peer, cx, deadline)).await,
            Err(guard) => Box::pin(self.fill(guard, key, req, peer, cx, deadline, entry, fwd)).await,
        }
    }

    /// Another request's fill of the key is under way: its stored answer,
    /// or (not stored) this request goes upstream itself.
    async fn wait(
        self: &Arc<Self>,
        mut rx: watch::Receiver<Filled>,
        key: Arc<str>,
        req: Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
    ) -> Result<Response<Body>, GatewayError> {
        let filled = match tokio::time::timeout_at(deadline, rx.wait_for(|f| *f != Filled::Pending)).await {
            Err(_) => {
                let upstream = self.upstream.config.name.clone();
                return Err(GatewayError::UpstreamTimeout { upstream, after: self.target.timeout });
            }
            Ok(Ok(f)) => *f,
            Ok(Err(_)) => Filled::NotShared,
        };
        // The head came in time; the body takes what it takes (its stalls
        // are bounded by the fill's `body_timeout`).
        let filled = match filled {
            Filled::Streaming => rx.wait_for(|f| *f != Filled::Streaming).await.map_or(Filled::NotShared, |f| *f),
            other => other,
        };
        let entry = self.store.get(&key, req.headers());
        if filled == Filled::Stored
            && let Some(e) = &entry
            && let Some(ttl) = e.ttl(SystemTime::now())
        {
            self.metrics.coalesced.increment(1);
            return Ok(from_entry(e, req.method(), req.headers(), Status::hit(Some(ttl))));
        }
        // The upstream failed and the fill served the stale entry: so is
        // this request, when the entry it matches may be served on error.
        if filled == Filled::Failed
            && let Some(e) = &entry
            && fill::serves_on_error(e)
        {
            self.metrics.stale.increment(1);
            return Ok(from_entry(e, req.method(), req.headers(), Status::stale()));
        }
        // Never another client's uncacheable answer, nor one for other
        // Vary values: a fill of its own, not shared.
        let guard = self.store.solo(&key);
        let fwd = if entry.is_some() { "stale" } else { "miss" };
        self.fill(guard, key, req, peer, cx, deadline, entry, fwd).await
    }

    /// Goes upstream for `key` in a fill task (see [`fill`]) and answers
    /// from what it brings.
    #[allow(clippy::too_many_arguments)]
    async fn fill(
        self: &Arc<Self>,
        guard: FillGuard,
        key: Arc<str>,
        req: Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
        stale: Option<Arc<Entry>>,
        fwd: &'static str,
    ) -> Result<Response<Body>, GatewayError> {
        let (fill, client) = self.prepare(guard, key, req, peer, cx, deadline, stale);
        let answer = fill::spawn(fill).await.map_err(|_| std::io::Error::other("cache fill task failed"))?;
        match answer {
            Answer::Upstream(response, ttl) => {
                let counter = if ttl.is_some() { &self.metrics.miss } else { &self.metrics.uncacheable };
                counter.increment(1);
                Ok(with_status(response, Status { stored: ttl.is_some(), ttl, ..Status::fwd(fwd) }))
            }
            Answer::Entry(e, Some(code)) => {
                self.metrics.revalidated.increment(1);
                let ttl = e.ttl(SystemTime::now());
                let status = Status { fwd_status: Some(code), ttl, ..Status::fwd(fwd) };
                Ok(from_entry(&e, &Method::GET, &client, status))
            }
            Answer::Entry(e, None) => {
                self.metrics.stale.increment(1);
                Ok(from_entry(&e, &Method::GET, &client, Status::stale()))
            }
            Answer::Failed(e) => Err(e),
        }
    }

    /// A fill for `req`, and the client's headers to answer from an entry.
    #[allow(clippy::too_many_arguments)]
    fn prepare(
        self: &Arc<Self>,
        guard: FillGuard,
        key: Arc<str>,
        mut req: Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
        stale: Option<Arc<Entry>>,
    ) -> (Fill, HeaderMap) {
        let mut head = Request::new(());
        *head.method_mut() = Method::GET;
        *head.uri_mut() = req.uri().clone();
        *head.headers_mut() = req.headers().clone();
        // Judged as the authenticated request it is (see `Authenticated`):
        // the policy sees credentials even when `auth` removed them.
        if req.extensions().get::<Authenticated>().is_some() && !req.headers().contains_key(header::AUTHORIZATION) {
            head.headers_mut().insert(header::AUTHORIZATION, HeaderValue::from_static("gateway-authenticated"));
        }
        let (head, ()) = head.into_parts();
        // What is stored is a GET's answer: a HEAD refreshing a stale
        // entry in the background asks for the whole of it.
        *req.method_mut() = Method::GET;
        // The fill outlives the request's log: its ID travels as a header.
        if let Some(id) = cx.id {
            req.headers_mut().insert(X_REQUEST_ID, id.header_value());
        }
        let peer =
            Peer { ip: peer.ip, forwarded_for: peer.forwarded_for.clone(), trusted: peer.trusted, tls: peer.tls };
        let client = head.headers.clone();
        let log = cx.detached();
        (Fill { cache: self.clone(), guard, key, req, head, peer, log, deadline, stale }, client)
    }

    /// stale-while-revalidate: one background refresh per key at a time.
    fn refresh(
        self: &Arc<Self>,
        key: Arc<str>,
        req: Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
        stale: Arc<Entry>,
    ) {
        if let Err(guard) = self.store.join_or_start(&key) {
            let (fill, _) = self.prepare(guard, key, req, peer, cx, deadline, Some(stale));
            fill::spawn_background(fill);
        }
    }

    /// Straight upstream, not stored.
    async fn direct(
        &self,
        req: Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
        status: Status,
    ) -> Result<Response<Body>, GatewayError> {
        let response =
            self.upstream.forward(&self.target, &self.prefix, self.max_body, req, peer, cx, deadline).await?;
        Ok(with_status(response, status))
    }

    /// Any method but GET and HEAD goes upstream; a successful unsafe one
    /// invalidates its target and the same-origin `Location` and
    /// `Content-Location` (RFC 9111 §4.4).
    async fn pass(
        &self,
        req: Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
    ) -> Result<Response<Body>, GatewayError> {
        self.metrics.bypass.increment(1);
        let unsafe_method = !req.method().is_safe();
        let key = unsafe_method.then(|| self.key(&req)).transpose()?;
        let client_host = client_host(&req).map(str::to_owned);
        let response = self.direct(req, peer, cx, deadline, Status::fwd("bypass")).await?;
        let status = response.status();
        if let Some(key) = key
            && (status.is_success() || status.is_redirection())
        {
            self.store.invalidate(&key);
            for name in [header::LOCATION, header::CONTENT_LOCATION] {
                let uri = response.headers().get(name).and_then(|v| same_origin(v, client_host.as_deref()));
                // The URI the clients use: under this route's prefix, its
                // key has the path sent upstream (after `rewrite`); another
                // route's is not in this store.
                let path = uri
                    .filter(|u| under_prefix(u.path(), &self.prefix))
                    .and_then(|u| upstream_path(&u, &self.target, &self.prefix).ok());
                if let Some(path) = path {
                    self.store.invalidate(&self.key_for(client_host.as_deref().unwrap_or(""), path.as_str()));
                }
            }
        }
        Ok(response)
    }

    /// The key of a request: the upstream, the client's `Host` and the path
    /// and query it is sent (after `rewrite`).
    fn key(&self, req: &Request<Incoming>) -> Result<String, GatewayError> {
        let path = upstream_path(req.uri(), &self.target, &self.prefix)?;
        Ok(self.key_for(client_host(req).unwrap_or(""), path.as_str()))
    }

    /// `upstream \n mode host \n path`, the host lowercased; the host mode
    /// is in the key too (a reload may change it and keep the store). Built
    /// by hand, not with `format!`: it is made for every request.
    fn key_for(&self, host: &str, path: &str) -> String {
        let name = &self.upstream.config.name;
        let mode = match self.target.host {
            HostMode::Upstream => "u ",
            HostMode::Preserve => "p ",
        };
        let mut key = String::with_capacity(name.len() + mode.len() + host.len() + path.len() + 2);
        key.push_str(name);
        key.push('\n');
        key.push_str(mode);
        let at = key.len();
        key.push_str(host);
        key[at..].make_ascii_lowercase();
        key.push('\n');
        key.push_str(path);
        key
    }
}

/// The client's `Host`, as the key has it (before lowercasing). The
/// upstream sees it as `Host` (`host = "preserve"`) or, with its own `Host`
/// (`host = "upstream"`), as `X-Forwarded-Host` and `Forwarded: host=`,
/// which the gateway sets from it: keyed either way, or one client's `Host`
/// would choose what the others are served.
fn client_host(req: &Request<Incoming>) -> Option<&str> {
    match req.headers().get(header::HOST) {
        Some(h) => h.to_str().ok(),
        None => req.uri().authority().map(|a| a.as_str()),
    }
}

/// The path and query of a `Location` / `Content-Location` that names the
/// request's own origin (a relative reference, or an absolute one to the
/// same host).
fn same_origin(value: &HeaderValue, host: Option<&str>) -> Option<Uri> {
    let uri: Uri = value.to_str().ok()?.parse().ok()?;
    if let Some(authority) = uri.authority()
        && !host.is_some_and(|h| h.eq_ignore_ascii_case(authority.as_str()))
    {
        return None;
    }
    let path = uri.path_and_query()?.clone();
    path.as_str().starts_with('/').then(|| Uri::from(path))
}

/// Whether `path` is the route's: its prefix, segment-aware.
fn under_prefix(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    prefix.is_empty() || path.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// The client's answer from a stored entry: the full answer, its head (a
/// HEAD), or 304 when its own conditionals match.
fn from_entry(e: &Entry, method: &Method, client: &HeaderMap, status: Status) -> Response<Body> {
    let now = SystemTime::now();
    let mut headers = e.headers.clone();
    headers.insert(header::AGE, status::number(e.age(now).as_secs()));
    headers.insert(CACHE_STATUS, status.value());
    // Conditionals apply only to an answer that would be 2xx (RFC 9110
    // §13.2.1): a stored 404 stays a 404.
    let (code, body) = if e.status.is_success() && rules::not_modified(method, client, &e.headers) {
        headers.remove(header::CONTENT_LENGTH);
        (StatusCode::NOT_MODIFIED, Body::empty())
    } else if method == Method::HEAD {
        (e.status, Body::empty())
    } else {
        (e.status, Body::full(e.body.clone()))
    };
    let mut response = Response::new(body);
    *response.status_mut() = code;
    *response.headers_mut() = headers;
    response
}

/// `Cache-Status` of the gateway's own error answer on a cache route: an
/// `only-if-cached` miss went nowhere; any other failed going upstream.
pub fn error_status(e: &GatewayError) -> HeaderValue {
    match e {
        GatewayError::NotCached => HeaderValue::from_static("gateway; detail=not-cached"),
        _ => HeaderValue::from_static("gateway; fwd=miss"),
    }
}

fn with_status(mut response: Response<Body>, status: Status) -> Response<Body> {
    response.headers_mut().insert(CACHE_STATUS, status.value());
    response
}
