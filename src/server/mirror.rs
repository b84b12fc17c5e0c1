//! A route's `mirror`: a copy of a share of its requests sent to another
//! upstream, whose answer is read and dropped. The copy's head is made
//! before the request goes on, and it is sent from a task of its own, so
//! it never delays, fails or changes the client's answer. A request's body
//! is copied when the proxy has read all of it ahead (`request_buffer`,
//! see [`crate::body::WantsCopy`]): a larger body streams to the upstream
//! as it arrives, and holding it back for a copy would cost the client's
//! request its memory bound, so such requests are skipped and counted.
//! Copies in flight are bounded per route; past the bound they are skipped
//! and counted. A copy is never retried. Its fields are those its route's
//! upstream is sent ([`crate::upstream::proxy::forward_headers`]), and its
//! answer is read frame by frame and dropped, never held.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use crate::body::Incoming;
use http::header::{self, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Request, Uri};
use http_body::Body as _;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use metrics::Counter;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::body::{BodyCopy, WantsCopy};
use crate::config::{HostMode, MirrorConfig, Protocol, ProxyTarget, UpstreamConfig};
use crate::headers::{Stamp, X_GATEWAY_MIRROR};
use crate::request::{Peer, RequestLog};

/// Copies in flight per route at most.
pub const MAX_IN_FLIGHT: usize = 100;

/// A route's mirror, built with its table.
pub struct Mirror {
    upstream: String,
    percent: f64,
    endpoints: Vec<Authority>,
    next: AtomicUsize,
    slots: Arc<Semaphore>,
    client: Client<HttpConnector, BodyCopy>,
    /// Whether copies go in HTTP/2 (`protocol = "h2c"`).
    h2: bool,
    /// The route's prefix and target, whose rules make the copy's path and
    /// fields (its `request_buffer` bounds a body copied, its `timeout` a
    /// copy's time).
    prefix: String,
    target: ProxyTarget,
    counts: Counts,
}

/// What became of a route's copies: the metric's counters, and the same
/// counts kept for `/-/routes`.
#[derive(Clone)]
struct Counts {
    counters: [Counter; 5],
    tally: Arc<[AtomicU64; 5]>,
}

/// The `result` label values, in [`Counts`]' order.
const RESULTS: [&str; 5] = ["sent", "skipped_in_flight", "skipped_body", "answered", "failed"];
const SENT: usize = 0;
const SKIPPED_IN_FLIGHT: usize = 1;
const SKIPPED_BODY: usize = 2;
const ANSWERED: usize = 3;
const FAILED: usize = 4;

impl Counts {
    fn add(&self, result: usize) {
        self.counters[result].increment(1);
        self.tally[result].fetch_add(1, Relaxed);
    }
}

impl Mirror {
    /// The mirror of route `route`; `old` is the running one of that route,
    /// whose copies in flight and counts go on here (a reload, or a
    /// discovery change, rebuilds every route).
    pub fn new(
        (route, prefix): (&str, &str),
        p: &ProxyTarget,
        m: &MirrorConfig,
        upstream: &UpstreamConfig,
        old: Option<&Mirror>,
    ) -> Mirror {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(upstream.connect_timeout));
        connector.set_nodelay(true);
        let h2 = upstream.protocol == Protocol::H2c;
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(upstream.pool_idle_timeout)
            // A copy is never sent twice.
            .retry_canceled_requests(false)
            .http2_only(h2)
            .build(connector);
        let count = |result: &'static str| crate::metrics::mirror(route, &upstream.name, result);
        Mirror {
            upstream: upstream.name.clone(),
            percent: m.percent,
            endpoints: upstream.endpoints.iter().map(|e| e.authority.clone()).collect(),
            next: AtomicUsize::new(0),
            slots: old.map_or_else(|| Arc::new(Semaphore::new(MAX_IN_FLIGHT)), |o| o.slots.clone()),
            client,
            h2,
            prefix: prefix.to_owned(),
            target: p.clone(),
            counts: Counts {
                counters: RESULTS.map(count),
                tally: old.map_or_else(Default::default, |o| o.counts.tally.clone()),
            },
        }
    }

    /// Sends a copy of `req` if it is among the share chosen and a place
    /// is free; returns at once. A request with a body is sent once the
    /// body has been read ahead (see [`Pending`]).
    pub fn copy(&self, req: &mut Request<Incoming>, peer: &Peer, cx: &RequestLog<'_>) {
        if self.endpoints.is_empty() || fastrand::f64() * 100.0 >= self.percent {
            return;
        }
        let bodiless = req.body().is_end_stream();
        // A body announced longer than can be held is skipped at once.
        let buffer = self.target.request_buffer;
        if !bodiless && (buffer == 0 || req.body().size_hint().lower() > buffer as u64) {
            self.counts.add(SKIPPED_BODY);
            return;
        }
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            self.counts.add(SKIPPED_IN_FLIGHT);
            return;
        };
        let to = &self.endpoints[self.next.fetch_add(1, Relaxed) % self.endpoints.len()];
        let Some(head) = self.head(req, peer, cx, to) else {
            self.counts.add(FAILED);
            return;
        };
        let pending = Pending {
            head: Some((head, slot)),
            client: self.client.clone(),
            counts: self.counts.clone(),
            timeout: self.target.timeout,
        };
        if bodiless {
            pending.send(BodyCopy::default());
        } else {
            req.extensions_mut().insert(WantsCopy::new(move |body| pending.send(body)));
        }
    }

    /// For `/-/routes`: the shadow, the share, the copies in flight and
    /// what became of those sent so far.
    pub fn status(&self) -> serde_json::Value {
        let mut out = serde_json::json!({
            "upstream": self.upstream,
            "percent": self.percent,
            "in_flight": MAX_IN_FLIGHT - self.slots.available_permits(),
        });
        for (name, n) in RESULTS.iter().zip(self.counts.tally.iter()) {
            out[*name] = n.load(Relaxed).into();
        }
        out
    }

    /// The copy's head: the request's method, path (rewritten as the route
    /// rewrites it) and fields as its route's upstream is sent them, marked
    /// as a copy. `None` for a request its upstream is not sent either (a
    /// `Host` that is not one, a loop).
    fn head(&self, req: &Request<Incoming>, peer: &Peer, cx: &RequestLog<'_>, to: &Authority) -> Option<Request<()>> {
        let path_and_query = crate::upstream::proxy::upstream_path(req.uri(), &self.target, &self.prefix).ok()?;

        let (client_host, version) =
            (crate::upstream::proxy::client_host(req.headers(), req.uri()).ok()?, req.version());
        let mut headers = req.headers().clone();
        crate::headers::strip_hop_by_hop(&mut headers);
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::TRANSFER_ENCODING);
        let mut stamped = Stamp::default();
        let (host, target) = (client_host.as_ref(), &self.target);
        crate::upstream::proxy::forward_headers(&mut headers, version, host, target, peer, &mut stamped).ok()?;
        // This hop's trace, as the route's upstream is sent it.
        if let Some(trace) = &cx.trace
            && cx.propagate_trace
        {
            trace.propagate(&mut headers, &mut stamped);
        }
        stamped.insert_into(&mut headers);
        if let Some(id) = cx.id {
            headers.insert(crate::headers::X_REQUEST_ID, id.header_value());
        }
        let uri =
            Uri::builder().scheme(Scheme::HTTP).authority(to.clone()).path_and_query(path_and_query).build().ok()?;
        match (self.h2, client_host) {
            // HTTP/2 names the host once, as `:authority` (a `Host` beside it
            // must not differ, RFC 9113 §8.3.1), which hyper's client takes
            // from the URI it also pools by: the endpoint's address, as a
            // copy naming the client's host would need a connection per
            // host named.
            (true, _) => headers.remove(header::HOST),
            (false, Some(host)) if self.target.host == HostMode::Preserve => headers.insert(header::HOST, host),
            (false, _) => headers.insert(header::HOST, HeaderValue::from_str(to.as_str()).ok()?),
        };
        headers.insert(X_GATEWAY_MIRROR, HeaderValue::from_static("1"));
        let mut copy = Request::new(());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = uri;
        *copy.headers_mut() = headers;
        Some(copy)
    }
}

/// A copy with its head made and its place taken, waiting for its body;
/// dropped without it (the body was longer than `request_buffer`, or the
/// client's failed), it is counted as skipped.
struct Pending {
    head: Option<(Request<()>, OwnedSemaphorePermit)>,
    client: Client<HttpConnector, BodyCopy>,
    counts: Counts,
    timeout: Duration,
}

impl Pending {
    fn send(mut self, body: BodyCopy) {
        let Some((head, slot)) = self.head.take() else { return };
        let mut copy = head.map(|()| body);
        let len = copy.body().len();
        if len > 0 {
            copy.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        }
        self.counts.add(SENT);
        let (client, counts, timeout) = (self.client.clone(), self.counts.clone(), self.timeout);
        tokio::spawn(async move {
            let _slot = slot;
            let done = tokio::time::timeout(timeout, async {
                let response = client.request(copy).await.map_err(|_| ())?;
                // Read to its end, a frame at a time, and dropped, so the
                // connection can be reused and no answer is held whole.
                let mut body = response.into_body();
                while let Some(frame) = body.frame().await {
                    frame.map_err(drop)?;
                }
                Ok::<(), ()>(())
            })
            .await;
            match done {
                Ok(Ok(())) => counts.add(ANSWERED),
                _ => counts.add(FAILED),
            }
        });
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.head.is_some() {
            self.counts.add(SKIPPED_BODY);
        }
    }
}
