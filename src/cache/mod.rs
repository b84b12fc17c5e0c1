//! A proxy route's response cache (RFC 9111, as a shared cache), so that a
//! slow upstream answers each key once per freshness period instead of once
//! per client.
//!
//! [`RouteCache::lookup`] and [`RouteCache::serve`] stand where the route
//! would call [`Upstream::forward`]: only routes with `cache` take them (a
//! branch in `dispatch`, nothing else on other routes). `lookup` is a plain
//! call that answers hits; `serve` is the future (boxed by the route) that
//! goes upstream for the rest. It keys on what the upstream
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

mod entry;
mod fill;
mod key;
pub mod rules;
mod status;
mod store;
mod targeted;

pub use status::error_status;
use status::{Status, secs};

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};

use crate::body::Incoming;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, Uri};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::body::Body;
use crate::config::{CacheConfig, ProxyTarget};
use crate::error::GatewayError;
use crate::headers::X_REQUEST_ID;
use crate::metrics::CacheMetrics;
use crate::request::{Authenticated, Interims, Peer, RequestLog};
use crate::router::Rewritten;
use crate::upstream::Upstream;
use crate::upstream::proxy::upstream_path;
use entry::from_entry;
use fill::{Answer, Fill};
use key::{client_host, key_start};
use rules::{Ask, Present};
pub use store::Store;
use store::{Entry, FillGuard, Filled};

/// RFC 9211's response header.
pub const CACHE_STATUS: HeaderName = HeaderName::from_static("cache-status");

/// What [`RouteCache::lookup`] came to.
pub enum Looked {
    /// From the store.
    Answered(Response<Body>),
    /// `only-if-cached` with nothing to answer from.
    Failed(GatewayError),
    /// Upstream, through [`RouteCache::serve`].
    Go(Request<Incoming>, Miss),
}

/// How a request the store did not answer goes upstream.
pub enum Miss {
    /// Not the cache's (a method other than GET and HEAD, a body, an
    /// upgrade): passed on, and an unsafe one invalidates.
    Pass,
    /// Straight upstream, not stored, with this `Cache-Status`.
    Direct(Status),
    /// Filled (or joined to a fill under way) for `key`.
    Fill { key: String, entry: Option<Arc<Entry>>, fwd: &'static str },
}

/// A proxy route's cache: its store (kept by a reload when the settings
/// hold) and what it needs to go upstream from a task of its own.
pub struct RouteCache {
    pub store: Arc<Store>,
    upstream: Arc<Upstream>,
    target: ProxyTarget,
    prefix: String,
    max_body: u64,
    metrics: CacheMetrics,
    /// What every key starts with (see [`RouteCache::key_head`]).
    key_start: String,
    /// Answers carry an `X-Request-Id` (the server's `request_id`): stored
    /// heads keep a field for it (see `entry::with_slots`).
    pub(crate) id_slot: bool,
}

impl RouteCache {
    /// The cache of route `name`; `running` is the store of the route of
    /// that name before a reload, kept when its settings did not change.
    /// `id_slot`: whether answers carry an `X-Request-Id`.
    pub fn new(
        name: &str,
        target: &ProxyTarget,
        config: CacheConfig,
        (prefix, max_body, id_slot): (&str, u64, bool),
        upstream: Arc<Upstream>,
        running: Option<&Arc<Store>>,
    ) -> Arc<RouteCache> {
        let store = match running {
            Some(s) if s.config == config => s.clone(),
            _ => Store::new(config, name),
        };
        Arc::new(RouteCache {
            store,
            target: target.clone(),
            prefix: prefix.to_owned(),
            max_body,
            metrics: CacheMetrics::new(name),
            key_start: key_start(&upstream.config.name, target.host),
            id_slot,
            upstream,
        })
    }

    /// Answers `req` from the store when that needs no waiting: a fresh
    /// entry, or a stale one served while it is refreshed in the
    /// background. A plain call, not a future: a hit is answered without
    /// [`RouteCache::serve`]'s future, which the route boxes.
    pub fn lookup(
        self: &Arc<Self>,
        req: Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
    ) -> Looked {
        // Only a bodiless GET or HEAD is the cache's; an upgrade (WebSocket)
        // goes straight through.
        let method = req.method();
        let present = Present::of(req.headers());
        if (method != Method::GET && method != Method::HEAD)
            || !http_body::Body::is_end_stream(req.body())
            || present.upgrade
        {
            return Looked::Go(req, Miss::Pass);
        }
        let key = self.key(&req, peer);
        let (mut ask, only_if_cached, max_age) =
            if present.directives { rules::ask(req.headers()) } else { (Ask::Normal, false, None) };
        if ask == Ask::Bypass {
            self.metrics.bypass.increment(1);
            return Looked::Go(req, Miss::Direct(Status::fwd("bypass")));
        }
        let entry = self.store.get(&key, req.headers());
        let age = entry.as_ref().map(|e| e.age(SystemTime::now())).unwrap_or_default();
        // The client's max-age: an older entry is revalidated (§5.2.1.1).
        if max_age.is_some_and(|max| age > Duration::from_secs(max)) {
            ask = Ask::Revalidate;
        }
        if let Some(e) = &entry
            && ask == Ask::Normal
        {
            let client = present.conditional.then(|| req.headers());
            if let Some(ttl) = e.ttl_at(age) {
                self.metrics.hit.increment(1);
                return Looked::Answered(from_entry(e, req.method(), client, Status::hit(Some(ttl)), age));
            }
            if age.saturating_sub(e.lifetime) < e.while_revalidate {
                self.metrics.stale.increment(1);
                let response = from_entry(e, req.method(), client, Status::stale(), age);
                self.refresh(key, req, peer, cx, deadline, e.clone());
                return Looked::Answered(response);
            }
        }
        if only_if_cached {
            return Looked::Failed(GatewayError::NotCached);
        }
        // A HEAD is answered from a stored GET only; a range goes upstream
        // as asked (a 206 is never stored).
        if req.method() == Method::HEAD || present.range {
            self.metrics.uncacheable.increment(1);
            return Looked::Go(req, Miss::Direct(Status::fwd("miss")));
        }
        let fwd = match (&entry, ask) {
            (_, Ask::Revalidate) => "request",
            (Some(_), _) => "stale",
            (None, _) => "miss",
        };
        Looked::Go(req, Miss::Fill { key, entry, fwd })
    }

    /// Answers `req` through the upstream, as [`RouteCache::lookup`] found
    /// it must. `deadline` is the route's (arrival plus timeout); waiting
    /// on another request's fill counts toward it.
    pub async fn serve(
        self: &Arc<Self>,
        req: Request<Incoming>,
        miss: Miss,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
    ) -> Result<Response<Body>, GatewayError> {
        let (key, entry, fwd) = match miss {
            Miss::Pass => return self.pass(req, peer, cx, deadline).await,
            Miss::Direct(status) => return self.direct(req, peer, cx, deadline, status).await,
            Miss::Fill { key, entry, fwd } => (key, entry, fwd),
        };
        // The map's keys are shared (`Arc<str>`): made only past a hit.
        let key: Arc<str> = key.into();
        if !self.store.config.coalesce || self.store.passes(&key, req.headers()) {
            let guard = self.store.solo(&key);
            return self.fill(guard, key, req, peer, cx, deadline, entry, fwd).await;
        }
        match self.store.join_or_start(&key) {
            Ok(rx) => self.wait(rx, key, req, peer, cx, deadline).await,
            Err(guard) => self.fill(guard, key, req, peer, cx, deadline, entry, fwd).await,
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
        // are bounded by the fill's `body_timeout`, and a first client that
        // holds the fill back makes it give the key up: see `fill::collect`).
        let filled = match filled {
            Filled::Streaming => rx.wait_for(|f| *f != Filled::Streaming).await.map_or(Filled::NotShared, |f| *f),
            other => other,
        };
        let entry = self.store.get(&key, req.headers());
        let now = SystemTime::now();
        if filled == Filled::Stored
            && let Some(e) = &entry
            && let Some(ttl) = e.ttl(now)
        {
            self.metrics.coalesced.increment(1);
            return Ok(from_entry(e, req.method(), Some(req.headers()), Status::hit(Some(ttl)), e.age(now)));
        }
        // The upstream failed and the fill served the stale entry: so is
        // this request, when the entry it matches may be served on error.
        if let Filled::Failed(code) = filled
            && let Some(e) = &entry
            && fill::serves_on_error(e)
        {
            self.metrics.stale.increment(1);
            return Ok(from_entry(e, req.method(), Some(req.headers()), Status::on_error(code), e.age(now)));
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
        let (mut fill, client) = self.prepare(guard, key, req, peer, cx, deadline, stale);
        // The fill's 1xx go to its client's connection: to the queue that
        // connection reads, made now if it has none yet.
        if let Some(queue) = peer.connection_interims() {
            fill.peer.own_h1 = AtomicBool::new(true);
            fill.peer.interims = OnceLock::from(queue.get_or_init(Interims::default).clone());
        }
        let answer = fill::spawn(fill).await.map_err(|_| std::io::Error::other("cache fill task failed"))?;
        match answer {
            Answer::Upstream(response, ttl, targeted) => {
                let counter = if ttl.is_some() { &self.metrics.miss } else { &self.metrics.uncacheable };
                counter.increment(1);
                let status = Status { stored: ttl.is_some(), ttl: secs(ttl), ..Status::fwd(fwd) };
                Ok(with_status(response, status, targeted.as_ref()))
            }
            Answer::Entry(e, code) => {
                self.metrics.revalidated.increment(1);
                let now = SystemTime::now();
                let status = Status { fwd_status: Some(code), ttl: secs(e.ttl(now)), ..Status::fwd(fwd) };
                Ok(from_entry(&e, &Method::GET, Some(&client), status, e.age(now)))
            }
            Answer::Stale(e, code) => {
                self.metrics.stale.increment(1);
                Ok(from_entry(&e, &Method::GET, Some(&client), Status::on_error(code), e.age(SystemTime::now())))
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
        let (ip, trusted, tls, forwards_1xx) = (peer.ip, peer.trusted, peer.tls, peer.forwards_1xx);
        let forwarded_for = peer.forwarded_for.clone();
        // A 1xx the fill brings goes to no one unless the fill's client
        // waits for it (then `fill` gives it the connection's queue).
        let (own_h1, interims) = (AtomicBool::new(false), OnceLock::new());
        let timer = Default::default();
        let peer = Peer { ip, forwarded_for, trusted, tls, forwards_1xx, own_h1, interims, timer };
        let client = head.headers.clone();
        let log = cx.detached();
        (Fill { cache: self.clone(), guard, key, req, head, peer, log, deadline, stale }, client)
    }

    /// stale-while-revalidate: one background refresh per key at a time.
    fn refresh(
        self: &Arc<Self>,
        key: String,
        mut req: Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        deadline: Instant,
        stale: Arc<Entry>,
    ) {
        if let Some((guard, key)) = self.store.start(&key) {
            // The entry is refreshed whole, whatever part this client asked
            // for (RFC 5861 §3): a 206 could not replace it.
            req.headers_mut().remove(header::RANGE);
            req.headers_mut().remove(header::IF_RANGE);
            // Its client has its answer: a 1xx it brings goes to no one (in
            // the connection's queue it would reach the next request).
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
        Ok(with_status(response, status, None))
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
        let key = unsafe_method.then(|| self.key(&req, peer));
        let client_host = client_host(&req).map(str::to_owned);
        let passed = key::passed_on(req.headers(), peer.trusted);
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
                    self.store.invalidate(&self.key_for(client_host.as_deref().unwrap_or(""), &passed, path.as_str()));
                }
            }
        }
        Ok(response)
    }

    /// The key of a request: the upstream, the client's `Host` and the path
    /// and query it is sent (after `rewrite`), written straight into the
    /// key (it is made for every request).
    fn key(&self, req: &Request<Incoming>, peer: &Peer) -> String {
        let uri = req.uri();
        let host = client_host(req).unwrap_or("");
        let passed = key::passed_on(req.headers(), peer.trusted);
        match &self.target.rewrite {
            Some(rewrite) => {
                let path = Rewritten::of(uri.path(), uri.query(), &self.prefix, rewrite);
                let mut key = self.key_head(host, &passed, path.byte_len());
                path.push_to(&mut key);
                key
            }
            None => self.key_for(host, &passed, uri.path_and_query().map_or("/", |p| p.as_str())),
        }
    }

    /// The key of `path` (as sent upstream) asked for with `host` and the
    /// forwarding fields `passed` (see [`key::passed_on`]).
    fn key_for(&self, host: &str, passed: &str, path: &str) -> String {
        let mut key = self.key_head(host, passed, path.len());
        key.push_str(path);
        key
    }

    /// `upstream \n mode host \n` (see [`key_start`]), the host lowercased,
    /// with room for a path of `path_len` bytes after it. Built by hand,
    /// not with `format!`: it is made for every request.
    fn key_head(&self, host: &str, passed: &str, path_len: usize) -> String {
        let mut key = String::with_capacity(self.key_start.len() + host.len() + passed.len() + path_len + 1);
        key.push_str(&self.key_start);
        key.push_str(host);
        key[self.key_start.len()..].make_ascii_lowercase();
        key.push_str(passed);
        key.push('\n');
        key
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

/// `response` with the gateway's `Cache-Status` member after the
/// upstream's (RFC 9211 §2: the field is a list, each cache appends),
/// naming the targeted field that decided, if one did.
fn with_status(mut response: Response<Body>, status: Status, targeted: Option<&HeaderName>) -> Response<Body> {
    response.headers_mut().append(CACHE_STATUS, status.value_for(targeted));
    response
}
