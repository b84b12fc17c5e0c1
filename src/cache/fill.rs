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

use crate::body::Incoming;
use bytes::{Bytes, BytesMut};
use http::{HeaderName, Method, Request, Response, StatusCode, header, request};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::RouteCache;
use super::entry::{content_length, judge, refresh, vary_of};
use super::rules;
use super::store::{Entry, FillGuard, Filled, VaryValues};
use super::targeted;
use crate::body::{Body, BoxError};
use crate::error::GatewayError;
use crate::request::{Peer, RequestLog};

/// What the first client of a fill is answered with.
pub enum Answer {
    /// The upstream's answer (streaming); `Some` with its freshness left
    /// when it is being stored; the targeted field that decided, if one did.
    Upstream(Response<Body>, Option<Duration>, Option<HeaderName>),
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
    /// The client's head as the rules judge it (before the conditionals
    /// the fill adds).
    pub head: request::Parts,
    pub peer: Peer,
    pub log: RequestLog<'static>,
    pub deadline: Instant,
    /// The entry being revalidated, or served if the upstream fails.
    pub stale: Option<Arc<Entry>>,
}

/// Whether what a fill's answer is (not storable, too large) may be taken
/// for the key's answer to everyone (see `store::PASS_FOR`): not for a
/// request with credentials, cookies or its own `Cache-Control`, whose
/// answer may be that client's alone (a signed-in user's `private` page)
/// or unstorable because of the request (`Authorization`, `no-store`). One
/// such request must not turn coalescing off for every other client, a
/// stampede at the key's next expiry.
fn for_everyone(head: &request::Parts) -> bool {
    ![header::AUTHORIZATION, header::COOKIE, header::CACHE_CONTROL].iter().any(|n| head.headers.contains_key(n))
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
            let config = &cache.store.config;
            let windows = (config.stale_while_revalidate, config.stale_if_error);
            let (refreshed, storable) = refresh(old, &head, &parts, now, windows, (cache.id_slot, &config.targeted));
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
            // Not when a field it varies on was not the client's as sent
            // (one named in its `Connection`): the request made it so.
            let remember = for_everyone(&head) && status.is_success();
            guard.not_storable(remember.then(|| vary_of(&parts.headers, &head)).flatten());
            // Which targeted field decided, for `Cache-Status`: read again,
            // only for an answer that has one.
            let targeted = targeted::select(&parts.headers, &cache.store.config.targeted).map(|(name, _)| name);
            return send(tx, Answer::Upstream(Response::from_parts(parts, body), None, targeted));
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
            && tx
                .send(Answer::Upstream(
                    client,
                    Some(entry.lifetime.saturating_sub(entry.age(now))),
                    entry.targeted.clone(),
                ))
                .is_err()
        {
            to_client = None;
        }
        let remember = for_everyone(&head).then_some(&entry.vary);
        if let Some(bytes) = collect(body, to_client.as_ref(), cache.store.config.max_entry, &guard, remember).await {
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
    remember: Option<&VaryValues>,
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
            guard.not_storable(remember.cloned());
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
