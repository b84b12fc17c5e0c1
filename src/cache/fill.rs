//! A fill: one request upstream for a key, in a task of its own so that the
//! client that started it may leave without cancelling it for the clients
//! waiting on it. The head decides: a 304 refreshes the stale entry, an
//! error may serve it (stale-if-error), a storable answer streams to the
//! first client as it arrives while its bytes are kept for the store, and
//! anything else goes to the first client untouched. Past `max_entry` the
//! rest of the body is handed to the client to read itself, unbuffered.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::{Method, Request, Response, StatusCode, header, request, response};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::RouteCache;
use super::rules::{self, Directives};
use super::status::Stamps;
use super::store::{Entry, FillGuard, Filled};
use crate::body::{Body, BoxError};
use crate::error::GatewayError;
use crate::headers::X_REQUEST_ID;
use crate::request::{Peer, RequestLog};

/// What the first client of a fill is answered with.
pub enum Answer {
    /// The upstream's answer (streaming); `Some` with its freshness left
    /// when it is being stored.
    Upstream(Response<Body>, Option<Duration>),
    /// A stored entry refreshed by an answer of this status (a 304).
    Entry(Arc<Entry>, u16),
    /// A stale entry served because the upstream failed: with the status
    /// it answered, if it answered.
    Stale(Arc<Entry>, Option<u16>),
    Failed(GatewayError),
}

/// One fill's inputs.
pub struct Fill {
    pub cache: Arc<RouteCache>,
    pub guard: FillGuard,
    pub key: Arc<str>,
    pub req: Request<Incoming>,
    /// The client's head as the policy judges it (before the conditionals
    /// the fill adds).
    pub head: request::Parts,
    pub peer: Peer,
    pub log: RequestLog<'static>,
    pub deadline: Instant,
    /// The entry being revalidated, or served if the upstream fails.
    pub stale: Option<Arc<Entry>>,
}

/// Starts `fill` in a task; its first client's answer comes on the receiver.
pub fn spawn(fill: Fill) -> oneshot::Receiver<Answer> {
    let (tx, rx) = oneshot::channel();
    // Boxed: the fill's future holds the upstream request's, large enough
    // that the task moving it by value cost more than the heap copy.
    tokio::spawn(Box::pin(fill.run(Some(tx))));
    rx
}

/// Starts `fill` with no client to answer (a background refresh).
pub fn spawn_background(fill: Fill) {
    tokio::spawn(Box::pin(fill.run(None)));
}

impl Fill {
    async fn run(mut self, tx: Option<oneshot::Sender<Answer>>) {
        // The request again without conditionals, for a 304 that selects
        // no stored answer (only when revalidating).
        let mut again = None;
        if let Some(stale) = &self.stale {
            conditional(&mut self.req, stale);
            let (mut parts, ()) = Request::new(()).into_parts();
            (parts.method, parts.uri, parts.version) = (Method::GET, self.req.uri().clone(), self.req.version());
            parts.headers = self.req.headers().clone();
            parts.extensions = self.req.extensions().clone();
            parts.headers.remove(header::IF_NONE_MATCH);
            parts.headers.remove(header::IF_MODIFIED_SINCE);
            again = Some(Request::from_parts(parts, ()));
        }
        let Fill { cache, guard, key, req, head, peer, log, deadline, mut stale } = self;
        let up = &cache.upstream;
        let forwarded = up.forward(&cache.target, &cache.prefix, cache.max_body, req, &peer, &log, deadline).await;
        let mut forwarded = forwarded.map(|r| (r, SystemTime::now()));
        // RFC 9111 §4.3.4: a 304 whose validator is not the stored answer's
        // updates nothing; the answer is asked for whole.
        let unselected = match (&forwarded, &stale) {
            (Ok((r, _)), Some(old)) => {
                r.status() == StatusCode::NOT_MODIFIED && !rules::selects(&old.headers, r.headers())
            }
            _ => false,
        };
        if unselected && let Some(again) = again {
            stale = None;
            let refetched = up.forward(&cache.target, &cache.prefix, cache.max_body, again, &peer, &log, deadline);
            forwarded = refetched.await.map(|r| (r, SystemTime::now()));
        }
        let (response, now) = match forwarded {
            Ok(r) => r,
            Err(e) => {
                let answer = match stale.filter(|s| serves_on_error(s)) {
                    Some(s) => {
                        guard.publish(Filled::Failed(None));
                        Answer::Stale(s, None)
                    }
                    None => Answer::Failed(e),
                };
                return send(tx, answer);
            }
        };
        let status = response.status();
        if let (StatusCode::NOT_MODIFIED, Some(old)) = (status, &stale) {
            let (parts, _) = response.into_parts();
            let config = cache.store.config;
            let windows = (config.stale_while_revalidate, config.stale_if_error);
            let (refreshed, storable) = refresh(old, &head, &parts, now, windows, cache.id_slot);
            // The merged head is judged again: a 304 may bring what must not
            // be stored (a `Set-Cookie` for the client that revalidated,
            // `private`, `no-store`). Then only this client gets it; the
            // others go upstream themselves.
            if storable {
                cache.store.replace(&key, refreshed.clone_entry(), old);
                guard.publish(Filled::Stored);
            }
            return send(tx, Answer::Entry(Arc::new(refreshed), 304));
        }
        if rules::ERROR_STATUSES.contains(&status.as_u16())
            && let Some(s) = stale.filter(|s| serves_on_error(s))
        {
            guard.publish(Filled::Failed(Some(status.as_u16())));
            return send(tx, Answer::Stale(s, Some(status.as_u16())));
        }
        let (parts, body) = response.into_parts();
        let Some(entry) = judge(&cache, &head, &parts, now) else {
            return send(tx, Answer::Upstream(Response::from_parts(parts, body), None));
        };
        guard.publish(Filled::Streaming);
        let (chunks_tx, chunks) = mpsc::channel(1);
        let length = content_length(&parts.headers);
        let client = Response::from_parts(
            parts,
            Body::Streamed(Box::pin(ChannelBody { rx: chunks, rest: None, length, ended: false })),
        );
        let mut to_client = Some(chunks_tx);
        if let Some(tx) = tx
            && tx.send(Answer::Upstream(client, Some(entry.lifetime.saturating_sub(entry.age(now))))).is_err()
        {
            to_client = None;
        }
        if let Some(bytes) = collect(body, to_client.as_ref(), cache.store.config.max_entry, &guard).await {
            cache.store.put(&key, Entry { body: bytes, ..entry });
            guard.publish(Filled::Stored);
            // The key is free for the next fill while the client reads on.
            drop(guard);
            if let Some(to) = to_client {
                let _ = to.send(Msg::End).await;
            }
        }
    }
}

fn send(tx: Option<oneshot::Sender<Answer>>, answer: Answer) {
    if let Some(tx) = tx {
        let _ = tx.send(answer);
    }
}

/// Whether a stale entry is within its `stale-if-error` window.
pub fn serves_on_error(entry: &Entry) -> bool {
    entry.staleness(SystemTime::now()) < entry.if_error
}

/// The validators of the entry replace the client's conditionals
/// (RFC 9111 §4.3.1); the client's own are answered from the entry.
fn conditional(req: &mut Request<Incoming>, stale: &Entry) {
    let headers = req.headers_mut();
    headers.remove(header::IF_NONE_MATCH);
    headers.remove(header::IF_MODIFIED_SINCE);
    if let Some(etag) = stale.headers.get(header::ETAG) {
        headers.insert(header::IF_NONE_MATCH, etag.clone());
    }
    if let Some(modified) = stale.headers.get(header::LAST_MODIFIED) {
        headers.insert(header::IF_MODIFIED_SINCE, modified.clone());
    }
}

/// The entry a storable head makes (its body still to come), or `None`.
fn judge(cache: &RouteCache, head: &request::Parts, parts: &response::Parts, now: SystemTime) -> Option<Entry> {
    let config = cache.store.config;
    if content_length(&parts.headers).is_some_and(|n| n > config.max_entry) {
        return None;
    }
    let windows = (config.stale_while_revalidate, config.stale_if_error);
    entry_of(head, parts, now, config.default_ttl, windows, cache.id_slot)
}

/// The entry for a response head to a request head, if it may be stored.
pub fn entry_of(
    head: &request::Parts,
    parts: &response::Parts,
    now: SystemTime,
    default_ttl: Duration,
    (while_revalidate, if_error): (Duration, Duration),
    id_slot: bool,
) -> Option<Entry> {
    // What is kept is copied out of the connections' read buffers (a
    // header value received is a slice of one, which it would keep
    // alive), and of the request only what the policy reads: the store's
    // weights are then what it really holds.
    let d = Directives::of(&parts.headers);
    let lifetime = rules::lifetime(&parts.headers, &d, default_ttl);
    if !rules::storable_by_head(parts.status, &parts.headers, lifetime) || !rules::storable_for(&head.headers, &d) {
        return None;
    }
    let mut parts = detached_response(parts);
    // RFC 9110 §6.6.1: an answer without `Date` is given its receipt time,
    // or each hit would carry its own time as `Date` beside its `Age`.
    if !parts.headers.contains_key(header::DATE) {
        parts.headers.insert(header::DATE, date_value(now));
    }
    let parts = &parts;
    if !rules::policy(&policy_head(head), parts, now).is_storable() {
        return None;
    }
    let vary = vary_of(&parts.headers, head)?;
    Some(Entry {
        born: Entry::born(&parts.headers, now),
        status: parts.status,
        headers: with_slots(parts.headers.clone(), id_slot),
        body: Bytes::new(),
        lifetime: lifetime.expect("storable has a lifetime"),
        while_revalidate: rules::stale_window(&d, d.stale_while_revalidate, while_revalidate),
        if_error: rules::stale_window(&d, d.stale_if_error, if_error),
        vary,
        stamps: Stamps::default(),
    })
}

/// What an answer with `response`'s head to `head` varies on, or `None`
/// when it cannot be keyed: a Vary name that is not a header name cannot
/// be matched, and one the upstream did not see as the client sent it
/// (hop-by-hop, or set by the gateway) cannot key the client's answer.
fn vary_of(response: &http::HeaderMap, head: &request::Parts) -> Option<Vec<(http::HeaderName, Option<String>)>> {
    rules::vary_names(response)
        .map(|n| {
            let name = http::HeaderName::from_bytes(n.as_bytes()).ok()?;
            if crate::headers::not_as_sent(&name, &head.headers) {
                return None;
            }
            let value = rules::vary_value(&head.headers, &name);
            Some((name, value))
        })
        .collect()
}

/// `when` as an HTTP date.
fn date_value(when: SystemTime) -> http::HeaderValue {
    http::HeaderValue::from_str(&httpdate::fmt_http_date(when)).expect("an HTTP date is a header value")
}

/// A 304's head merged into the stored one (RFC 9111 §4.3.4), fresh again
/// from now, and whether the merged head may be stored. Everything the
/// entry's use depends on is judged again from the merged head: its
/// storability, lifetime, stale windows and what it varies on (for the
/// request that revalidated it).
fn refresh(
    old: &Entry,
    head: &request::Parts,
    not_modified: &response::Parts,
    now: SystemTime,
    (while_revalidate, if_error): (Duration, Duration),
    id_slot: bool,
) -> (Entry, bool) {
    let mut not_modified = detached_response(not_modified);
    // Its age is the 304's (the stored `Age` was the old answer's), its
    // `Date` the receipt time when it has none.
    if !not_modified.headers.contains_key(header::DATE) {
        not_modified.headers.insert(header::DATE, date_value(now));
    }
    let not_modified = &not_modified;
    let mut headers = old.headers.clone();
    let updated = |name: &&header::HeaderName| {
        ![header::CONTENT_LENGTH, header::CONTENT_ENCODING, header::TRANSFER_ENCODING, header::CONTENT_RANGE]
            .contains(*name)
    };
    // Every line of a field the 304 has replaces every line stored.
    for name in not_modified.headers.keys().filter(updated) {
        headers.remove(name);
    }
    for (name, value) in not_modified.headers.iter().filter(|(n, _)| updated(n)) {
        headers.append(name.clone(), value.clone());
    }
    if !not_modified.headers.contains_key(header::AGE) {
        headers.remove(header::AGE);
    }
    let d = Directives::of(&headers);
    let lifetime = rules::lifetime(&headers, &d, old.lifetime).unwrap_or(old.lifetime);
    let mut merged = Response::new(());
    *merged.status_mut() = old.status;
    *merged.headers_mut() = headers;
    let (merged, ()) = merged.into_parts();
    let policy = rules::policy(&policy_head(head), &merged, now);
    let vary = vary_of(&merged.headers, head);
    let storable = rules::storable(&policy, merged.status, &merged.headers, Some(lifetime))
        && rules::storable_for(&head.headers, &d)
        && vary.is_some();
    let entry = Entry {
        born: Entry::born(&not_modified.headers, now),
        status: old.status,
        headers: with_slots(merged.headers, id_slot),
        body: old.body.clone(),
        lifetime,
        while_revalidate: rules::stale_window(&d, d.stale_while_revalidate, while_revalidate),
        if_error: rules::stale_window(&d, d.stale_if_error, if_error),
        vary: vary.unwrap_or_else(|| old.vary.clone()),
        stamps: Stamps::default(),
    };
    (entry, storable)
}

/// `headers` in allocations of their own.
fn detached(headers: &http::HeaderMap) -> http::HeaderMap {
    let mut out = http::HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let mut copy = http::HeaderValue::from_bytes(value.as_bytes()).expect("was a header value");
        copy.set_sensitive(value.is_sensitive());
        out.append(name.clone(), copy);
    }
    out
}

/// A response head with its headers detached (see [`detached`]).
fn detached_response(parts: &response::Parts) -> response::Parts {
    let mut r = Response::new(());
    *r.status_mut() = parts.status;
    *r.version_mut() = parts.version;
    *r.headers_mut() = detached(&parts.headers);
    r.into_parts().0
}

/// What the crate's policy reads of a request to judge an answer
/// storable: its method, its URI and whether it said `no-store`. Nothing
/// else of the client's head is given to it: the policy copies and parses
/// what it is given, and a client's large fields cost far more there than
/// the bytes it sent. `Authorization` is judged by [`rules::storable_for`]
/// instead (the crate reads the answer's directives with a comma split
/// that finds `public` inside a quoted argument).
fn policy_head(head: &request::Parts) -> request::Parts {
    let mut r = Request::new(());
    *r.method_mut() = head.method.clone();
    // The URI too is a slice of the read buffer: copied.
    *r.uri_mut() = http::Uri::try_from(head.uri.to_string()).unwrap_or_default();
    *r.version_mut() = head.version;
    if Directives::of(&head.headers).no_store {
        r.headers_mut().insert(header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    }
    r.into_parts().0
}

/// A stored head with a field for each one every answer from it sets
/// (`Age`, `Cache-Status`, and `X-Request-Id` when `id_slot`), a
/// placeholder where the upstream sent none. An answer is a clone of the
/// head, and a clone has no spare room: adding a field to it grew its
/// entries on every hit (a reallocation and a copy of every field), where
/// replacing a value does not (see benches/README.md, Decisions). Every
/// placeholder is replaced before an answer leaves: `Age` and
/// `Cache-Status` by `from_entry`, `X-Request-Id` by `App::handle`.
fn with_slots(mut headers: http::HeaderMap, id_slot: bool) -> http::HeaderMap {
    // The gateway's `Cache-Status` member goes after the upstream's
    // (RFC 9211 §2): its slot is the last line, whatever came before.
    let upstream: Vec<_> =
        headers.get_all(super::CACHE_STATUS).iter().filter(|v| v.as_bytes() != b"-").cloned().collect();
    headers.remove(super::CACHE_STATUS);
    for value in upstream {
        headers.append(super::CACHE_STATUS, value);
    }
    headers.append(super::CACHE_STATUS, http::HeaderValue::from_static("-"));
    let slots = [(header::AGE, true), (X_REQUEST_ID, id_slot)];
    for (name, wanted) in slots {
        if wanted && !headers.contains_key(&name) {
            headers.insert(name, http::HeaderValue::from_static("-"));
        }
    }
    // An insert reserves a place before it looks for the name: with one
    // to spare in the table of indices (which a clone keeps), replacing a
    // value grows nothing.
    headers.reserve(1);
    headers
}

impl Entry {
    fn clone_entry(&self) -> Entry {
        Entry {
            born: self.born,
            status: self.status,
            headers: self.headers.clone(),
            body: self.body.clone(),
            lifetime: self.lifetime,
            while_revalidate: self.while_revalidate,
            if_error: self.if_error,
            vary: self.vary.clone(),
            stamps: Stamps::default(),
        }
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// How long the fill waits for its first client to take a frame before it
/// stops keeping a copy for the store: past it, that client reads the rest
/// of the answer itself, as on the uncached path.
const CLIENT_STALL: Duration = Duration::from_secs(1);

/// Reads the body, passing each frame to the client while there is one;
/// `Some` with the whole body when it ended complete within `max_entry`.
/// The client is handed one frame at a time, the next read once it took
/// it: a client that does not read holds back the fill rather than a copy
/// of the answer piling up for it. One that holds it back past
/// [`CLIENT_STALL`] gets the rest of the body to read itself and nothing is
/// stored, so that what an idle reader holds is what it would on a route
/// without a cache (and those waiting on the fill go upstream themselves).
async fn collect(
    mut body: Body,
    client: Option<&mpsc::Sender<Msg>>,
    max_entry: u64,
    guard: &FillGuard,
) -> Option<Bytes> {
    let mut kept = BytesMut::new();
    let mut client = client.filter(|c| !c.is_closed());
    loop {
        let frame = match body.frame().await {
            None => return Some(kept.freeze()),
            Some(Ok(frame)) => frame,
            Some(Err(e)) => {
                // Cut short: never stored; the client's answer is cut short too.
                guard.publish(Filled::NotShared);
                drop(kept);
                if let Some(c) = client {
                    let _ = c.send(Msg::Error(e)).await;
                }
                return None;
            }
        };
        let too_large = frame.data_ref().is_some_and(|d| kept.len() as u64 + d.len() as u64 > max_entry);
        if too_large {
            // Too large to store: the client reads the rest itself.
            guard.publish(Filled::NotShared);
            drop(kept);
            hand_over(client, frame, body).await;
            return None;
        }
        let Some(c) = client else {
            if let Some(data) = frame.data_ref() {
                kept.extend_from_slice(data);
            }
            continue;
        };
        match tokio::time::timeout(CLIENT_STALL, c.reserve()).await {
            Ok(Ok(permit)) => {
                if let Some(data) = frame.data_ref() {
                    kept.extend_from_slice(data);
                }
                permit.send(Msg::Frame(frame));
            }
            // The first client left: the fill goes on for the others.
            Ok(Err(_)) => {
                client = None;
                if let Some(data) = frame.data_ref() {
                    kept.extend_from_slice(data);
                }
            }
            Err(_) => {
                guard.publish(Filled::NotShared);
                drop(kept);
                hand_over(client, frame, body).await;
                return None;
            }
        }
    }
}

/// Gives the client `frame` and then the rest of `body` to read itself.
async fn hand_over(client: Option<&mpsc::Sender<Msg>>, frame: Frame<Bytes>, body: Body) {
    if let Some(c) = client
        && c.send(Msg::Frame(frame)).await.is_ok()
    {
        let _ = c.send(Msg::Rest(body)).await;
    }
}

/// What the fill passes the first client.
enum Msg {
    Frame(Frame<Bytes>),
    /// The rest of the body, to read directly.
    Rest(Body),
    Error(BoxError),
    End,
}

/// The first client's body while a fill keeps a copy.
struct ChannelBody {
    rx: mpsc::Receiver<Msg>,
    rest: Option<Body>,
    length: Option<u64>,
    ended: bool,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(rest) = &mut self.rest {
                return Pin::new(rest).poll_frame(cx);
            }
            if self.ended {
                return Poll::Ready(None);
            }
            return match self.rx.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Msg::Frame(f))) => Poll::Ready(Some(Ok(f))),
                Poll::Ready(Some(Msg::Rest(body))) => {
                    self.rest = Some(body);
                    continue;
                }
                Poll::Ready(Some(Msg::Error(e))) => Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Msg::End)) => {
                    self.ended = true;
                    Poll::Ready(None)
                }
                // The fill ended without its end: the body is incomplete.
                Poll::Ready(None) => {
                    self.ended = true;
                    Poll::Ready(Some(Err("cache fill ended before the body did".into())))
                }
            };
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.length.map(SizeHint::with_exact).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::status::Status;

    /// An answer made from a stored head sets its fields in place: neither
    /// its `Age` and `Cache-Status` nor the `X-Request-Id` set after them
    /// grow the clone of the head, whatever the upstream sent.
    #[test]
    fn an_answer_from_a_stored_head_grows_no_map() {
        let fields: [&[(&str, &str)]; 4] = [
            &[("cache-control", "max-age=60")],
            &[("cache-control", "max-age=60"), ("age", "3"), ("x-request-id", "up"), ("cache-status", "up; hit")],
            &[("cache-control", "max-age=60"), ("content-type", "text/plain"), ("etag", "\"e\""), ("via", "1.1 a")],
            &[("cache-control", "max-age=60"), ("set-cookie2", "x"), ("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")],
        ];
        let windows = (Duration::ZERO, Duration::ZERO);
        for (fields, id_slot) in fields.iter().flat_map(|f| [(f, true), (f, false)]) {
            let head = Request::get("http://h/x").body(()).unwrap().into_parts().0;
            let mut response = Response::builder().status(200);
            for (n, v) in fields.iter() {
                response = response.header(*n, *v);
            }
            let parts = response.body(()).unwrap().into_parts().0;
            let e = entry_of(&head, &parts, SystemTime::now(), Duration::ZERO, windows, id_slot).expect("storable");
            let status = Status::hit(Some(Duration::from_secs(60)));
            let mut answer = crate::cache::from_entry(&e, &http::Method::GET, None, status, Duration::from_secs(1));
            // A field added (not replaced) grows the entries, a full table
            // the indices.
            let grown = |h: &http::HeaderMap| h.len() != e.headers.len() || h.capacity() != e.headers.capacity();
            assert!(!grown(answer.headers()), "{fields:?}: Age or Cache-Status grew the map");
            if id_slot {
                answer.headers_mut().insert(X_REQUEST_ID, http::HeaderValue::from_static("0123"));
                assert!(!grown(answer.headers()), "{fields:?}: X-Request-Id grew the map");
            }
            let from_upstream = fields.iter().any(|(n, _)| *n == "x-request-id");
            assert_eq!(answer.headers().get_all(X_REQUEST_ID).iter().count(), usize::from(id_slot || from_upstream));
        }
    }
}
