//! One exchange with one endpoint: a pooled connection (or a new one), the
//! resend after a stale pooled connection, and what a failure means.

use std::sync::OnceLock;
use std::time::Duration;

use http::header::HeaderValue;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, Uri, Version, header};
use http_body_util::{Either, Empty};
use hyper::client::conn::http2;

use super::body::Received;
use super::connect::ConnectError;
use super::h1;
use super::io::SendStalled;
use super::pool::{Conn, Connected, Pool, SendBody};
use super::retry::HeadCopy;
use crate::access::UpstreamTiming;
use crate::body::{BodyIdle, BodyTooLarge, ClientBodyFailed};
use crate::config::Address;
use crate::error::{GatewayError, find_source};
use crate::headers::Stamp;
use crate::request::Interims;

/// What an exchange comes to: the response head (an HTTP/1.1 body holds
/// its connection until it is done), or how it failed.
pub type Exchanged = Result<Response<Received>, Failure>;

/// How an exchange failed.
pub enum Failure {
    /// No connection could be made; the request, never sent, comes back.
    Connect(ConnectError, Box<Request<SendBody>>),
    /// The request was (at least partly) sent over HTTP/1.1.
    Send(h1::Error),
    /// The request was (at least partly) sent over HTTP/2.
    SendH2(hyper::Error),
}

impl Failure {
    /// The error of a sent request, and whether it says the upstream broke
    /// the protocol.
    fn sent(&self) -> Option<(&(dyn std::error::Error + 'static), bool)> {
        match self {
            Failure::Connect(..) => None,
            Failure::Send(e) => Some((e, e.is_parse())),
            Failure::SendH2(e) => Some((e, e.is_parse() || e.is_parse_status() || e.is_parse_too_large())),
        }
    }

    /// The upstream closed or reset the connection before the response
    /// head, for a reason other than the client's own body.
    pub fn is_reset(&self) -> bool {
        let Some((e, protocol)) = self.sent() else { return false };
        !self.is_clients() && !protocol && stalled(e).is_none() && tls_alert(e).is_none()
    }

    /// A failure of the client's own request body (too large, stalled,
    /// cut off), not of the upstream.
    pub fn is_clients(&self) -> bool {
        let Some((e, _)) = self.sent() else { return false };
        find_source::<ClientBodyFailed>(e).is_some()
            || find_source::<BodyTooLarge>(e).is_some()
            || find_source::<BodyIdle>(e).is_some()
    }

    /// The gateway error (and so the status and kind). Failures of the
    /// client's own request body are the client's.
    pub fn classify(self, upstream: &str, address: &Address) -> GatewayError {
        let upstream = upstream.to_owned();
        let protocol = self.sent().is_some_and(|(_, p)| p);
        let e: Box<dyn std::error::Error + 'static> = match self {
            Failure::Connect(e @ ConnectError::Tls(_), _) => {
                return GatewayError::UpstreamTls { upstream, authority: address.to_string(), detail: e.to_string() };
            }
            Failure::Connect(e, _) => {
                return GatewayError::UpstreamConnect {
                    upstream,
                    authority: address.to_string(),
                    detail: e.to_string(),
                };
            }
            Failure::Send(e) => Box::new(e),
            Failure::SendH2(e) => Box::new(e),
        };
        let e = &*e;
        if let Some(too_large) = find_source::<BodyTooLarge>(e) {
            return GatewayError::BodyTooLarge { limit: too_large.0 };
        }
        if let Some(idle) = find_source::<BodyIdle>(e) {
            return GatewayError::BodyTimeout { after: idle.0 };
        }
        if let Some(failed) = find_source::<ClientBodyFailed>(e) {
            return match failed.client_gone() {
                true => GatewayError::ClientLeft(failed.to_string()),
                false => GatewayError::ClientBody(failed.to_string()),
            };
        }
        if let Some(after) = stalled(e) {
            return GatewayError::UpstreamSendTimeout { upstream, after };
        }
        if let Some(alert) = tls_alert(e) {
            // TLS 1.3 servers check a client certificate after the client's
            // side of the handshake is done, so a refusal arrives as the
            // request is sent: still a TLS failure, not a reset.
            return GatewayError::UpstreamTls {
                upstream,
                authority: address.to_string(),
                detail: format!("TLS: the upstream refused the handshake: {alert}"),
            };
        }
        let detail = error_chain(e);
        if protocol {
            GatewayError::UpstreamProtocol { upstream, detail }
        } else {
            GatewayError::UpstreamReset { upstream, detail }
        }
    }
}

/// The TLS alert the upstream sent, if that is what ended the exchange.
fn tls_alert<'a>(e: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let io = find_source::<std::io::Error>(e)?;
    io.get_ref()?.downcast_ref::<rustls::Error>().filter(|t| matches!(t, rustls::Error::AlertReceived(_)))
}

/// How long the upstream left the request body unread, if that is the error.
fn stalled(e: &(dyn std::error::Error + 'static)) -> Option<Duration> {
    find_source::<std::io::Error>(e).and_then(|io| io.get_ref()?.downcast_ref::<SendStalled>()).map(|s| s.0)
}

/// What an exchange needs to know about the request besides itself.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// Bodiless and idempotent: may be sent again (RFC 9110 §9.2.2).
    pub retryable: bool,
    /// The route's body timeout, for writes the upstream does not take.
    pub send_timeout: Duration,
    /// The body may pass 64 KiB (see `Conn::prepare`).
    pub large_body: bool,
    /// The request has not been resent after a stale pooled connection yet
    /// (that happens once a request at most).
    pub may_resend: bool,
    /// The client's connection may forward 1xx (see `Peer::forwards_1xx`).
    pub forwards_1xx: bool,
}

/// Sends `req` on an idle pooled connection of `pool`, or a new one. A
/// pooled connection the upstream closed while idle is passed over before
/// anything is written on it (see [`Pool::take_idle`]). A retryable request that
/// failed after being written on a pooled connection, before any response
/// byte (the upstream closed it just as the request went out), is sent
/// once more, on a new connection so the resend can
/// never land on another stale one, when `resend` allows: once a request,
/// and within the retry budget, since the upstream may have seen it.
/// `interims`: the client connection's 1xx queue, made at the first 1xx, if
/// the connection is the own HTTP/1.1 one (see `Peer::interims`). `stamp`:
/// the fields added to `req` beside its map (see [`crate::headers::stamp`]),
/// written after its head's fields over HTTP/1.1, put into its map for
/// HTTP/2, and never left in a request handed back unsent.
///
/// An `async move` block, not an `async fn`: an `async fn` moves the
/// request into a local of its own, and the future keeps room for both
/// (see [`crate::server::App::handle`]).
#[allow(clippy::manual_async_fn)] // See above: not an `async fn` on purpose.
pub fn exchange<'a>(
    pool: &'a Pool,
    req: Request<SendBody>,
    stamp: &'a Stamp,
    plan: Plan,
    resend: &'a (dyn Fn() -> bool + Sync),
    timing: Option<&'a UpstreamTiming>,
    interims: Option<&'a OnceLock<Interims>>,
) -> impl Future<Output = Exchanged> + 'a {
    async move {
        if pool.speaks_h2() {
            // Boxed: its state would otherwise grow every HTTP/1.1 exchange's
            // future, and the copies of it (see benches/README.md, Decisions).
            return Box::pin(exchange_h2(pool, req, stamp, plan, resend, (timing, interims))).await;
        }
        let forwards = plan.forwards_1xx;
        if let Some(conn) = pool.take_idle() {
            let encoded = h1::Encoded::keeping(req, stamp, plan.retryable && plan.may_resend, forwards, interims);
            match send_h1(conn, encoded, plan).await {
                Ok(response) => return Ok(response),
                Err(Failure::Send(mut e)) => match e.take_kept() {
                    Some(kept) if resend() => {
                        tracing::debug!(error = %e, "resending on a new connection");
                        return Box::pin(resend_h1(pool, kept, stamp, plan, timing, e)).await;
                    }
                    _ => return Err(Failure::Send(e)),
                },
                Err(other) => return Err(other),
            }
        }
        // Boxed: connecting (TCP, maybe TLS) is a rare state, and unboxed it
        // makes every exchange's future larger, for each request in flight
        // (see benches/README.md, Decisions).
        let conn = match Box::pin(open(pool, timing)).await {
            Ok(Connected::Http1(conn)) => conn,
            // An `auto` upstream that chose HTTP/2 by ALPN.
            Ok(Connected::Http2(sender)) => {
                return Box::pin(send_h2(sender, req, stamp, pool.scheme(), pool.authority().clone())).await;
            }
            Err(e) => return Err(Failure::Connect(e, Box::new(req))),
        };
        send_h1(conn, h1::Encoded::of(req, stamp, forwards, interims), plan).await
    }
}

/// Sends a request, `encoded`, on an HTTP/1.1 connection. The callers
/// encode it (a plain call) rather than this taking the request: the
/// request would then be kept, beside the encoding's future, in the future
/// of every exchange in flight. Not an `async fn`, as `exchange`.
fn send_h1<'a>(mut conn: Conn, encoded: h1::Encoded<'a>, plan: Plan) -> impl Future<Output = Exchanged> + 'a {
    conn.prepare(plan.send_timeout, plan.large_body);
    futures_util::FutureExt::map(h1::send_encoded(conn, encoded), |sent| match sent {
        Ok(response) => Ok(response.map(Received::Http1)),
        Err(e) => Err(Failure::Send(e)),
    })
}

/// The resend of a bodiless request `kept` as it was encoded, after its
/// pooled connection failed with `stale`: on a new connection (which
/// cannot be stale). Where it must go as a request again (connecting
/// failed, and the request may go to another endpoint; an `auto`
/// upstream's new connection chose HTTP/2), it is parsed back from the
/// bytes; that failing (it cannot: they are what was encoded) ends the
/// exchange with the stale connection's error.
async fn resend_h1(
    pool: &Pool,
    kept: bytes::BytesMut,
    stamp: &Stamp,
    plan: Plan,
    timing: Option<&UpstreamTiming>,
    stale: h1::Error,
) -> Exchanged {
    // Without the stamped fields the bytes hold: they go with the request
    // again (see `Stamp::remove_from`).
    let request = |kept: bytes::BytesMut| {
        let mut req = h1::request_of(&kept.freeze(), Either::Right(Empty::new()))?;
        stamp.remove_from(req.headers_mut());
        Some(req)
    };
    match open(pool, timing).await {
        Ok(Connected::Http1(conn)) => send_h1(conn, h1::Encoded::again(kept), plan).await,
        Ok(Connected::Http2(sender)) => match request(kept) {
            Some(req) => Box::pin(send_h2(sender, req, stamp, pool.scheme(), pool.authority().clone())).await,
            None => Err(Failure::Send(stale)),
        },
        Err(e) => match request(kept) {
            Some(req) => Err(Failure::Connect(e, Box::new(req))),
            None => Err(Failure::Send(stale)),
        },
    }
}

/// [`exchange`] over HTTP/2: on a shared connection with room for another
/// stream, or a new one. A request its connection did not take (it was
/// closing: GOAWAY) goes to another.
async fn exchange_h2(
    pool: &Pool,
    mut req: Request<SendBody>,
    stamp: &Stamp,
    plan: Plan,
    resend: &(dyn Fn() -> bool + Sync),
    (timing, interims): (Option<&UpstreamTiming>, Option<&OnceLock<Interims>>),
) -> Exchanged {
    loop {
        let mut sender = match h2_connection(pool, timing).await {
            Ok(Connected::Http2(sender)) => sender,
            // An `auto` upstream whose new connection chose HTTP/1.1 by ALPN
            // (new requests now go over HTTP/1.1 too, see `Pool::connect`).
            Ok(Connected::Http1(conn)) => {
                to_h1(&mut req);
                return send_h1(conn, h1::Encoded::of(req, stamp, plan.forwards_1xx, interims), plan).await;
            }
            Err(e) => return Err(Failure::Connect(e, Box::new(req))),
        };
        if sender.ready().await.is_err() {
            continue;
        }
        to_h2(&mut req, pool.scheme(), pool.authority());
        let copy = (plan.retryable && plan.may_resend).then(|| HeadCopy::of(&req));
        stamp.insert_into(req.headers_mut());
        match sender.try_send_request(req).await {
            Ok(response) => return Ok(response.map(Received::Http2)),
            Err(mut e) => match (e.take_message(), copy.and_then(HeadCopy::into_request)) {
                (Some(unsent), _) => {
                    req = unsent;
                    stamp.remove_from(req.headers_mut());
                }
                // Refused before any processing (RFC 9113 §8.7): a GOAWAY
                // whose last stream ID is below this one, or REFUSED_STREAM.
                // A bodiless idempotent request goes once more, as the HTTP/1
                // resend does: once a request, within the retry budget.
                (None, Some(copy)) if not_processed(e.error()) && resend() => {
                    tracing::debug!(error = %e.error(), "HTTP/2 stream not processed; sending it again");
                    let once = Plan { may_resend: false, ..plan };
                    return Box::pin(exchange_h2(pool, copy, stamp, once, &|| false, (timing, interims))).await;
                }
                (None, _) => return Err(Failure::SendH2(e.into_error())),
            },
        }
    }
}

/// Opens a connection, noting how long it took for the access log.
async fn open(pool: &Pool, timing: Option<&UpstreamTiming>) -> Result<Connected, ConnectError> {
    let connecting = tokio::time::Instant::now();
    let connected = pool.connect().await?;
    if let Some(t) = timing {
        t.set_connect(connecting.elapsed());
    }
    Ok(connected)
}

/// An HTTP/2 connection to send on (see `Pool::h2_sender`), or a new one.
/// One request opens it; those that arrive meanwhile wait, then look again,
/// and share its failure if it failed. A new connection of an `auto`
/// upstream may have chosen HTTP/1.1 instead.
async fn h2_connection(pool: &Pool, timing: Option<&UpstreamTiming>) -> Result<Connected, ConnectError> {
    if let Some(sender) = pool.h2_sender() {
        return Ok(Connected::Http2(sender));
    }
    let waiting = tokio::time::Instant::now();
    let _opening = pool.h2_opening().await;
    if let Some(sender) = pool.h2_sender() {
        return Ok(Connected::Http2(sender));
    }
    if let Some(why) = pool.h2_failed_since(waiting) {
        return Err(ConnectError::Io(std::io::Error::other(why)));
    }
    open(pool, timing).await.inspect_err(|e| pool.h2_connect_failed(e))
}

/// Whether an HTTP/2 upstream said the stream was never processed: a
/// REFUSED_STREAM reset, or a GOAWAY without error that it fell beyond.
fn not_processed(e: &hyper::Error) -> bool {
    find_source::<h2::Error>(e).is_some_and(|h| {
        h.reason() == Some(h2::Reason::REFUSED_STREAM) || (h.is_go_away() && h.reason() == Some(h2::Reason::NO_ERROR))
    })
}

async fn send_h2(
    mut sender: http2::SendRequest<SendBody>,
    mut req: Request<SendBody>,
    stamp: &Stamp,
    scheme: Scheme,
    own: Authority,
) -> Exchanged {
    stamp.insert_into(req.headers_mut());
    to_h2(&mut req, scheme, &own);
    let response = sender.send_request(req).await.map_err(Failure::SendH2)?;
    Ok(response.map(Received::Http2))
}

/// Makes a request prepared for HTTP/1.1 an HTTP/2 one: the `Host` becomes
/// `:authority` (with `:scheme`), and the connection-specific headers HTTP/2
/// forbids (RFC 9113 §8.2.2) go; `TE: trailers` stays (gRPC needs it).
fn to_h2(req: &mut Request<SendBody>, scheme: Scheme, own: &Authority) {
    if req.version() == Version::HTTP_2 {
        return;
    }
    *req.version_mut() = Version::HTTP_2;
    let headers = req.headers_mut();
    let host = headers.remove(header::HOST);
    for name in [header::TRANSFER_ENCODING, header::CONNECTION, header::UPGRADE] {
        headers.remove(name);
    }
    // A Host that is no authority (one the screening let through) gets the
    // endpoint's own: hyper cannot send a request without one.
    let authority = host.and_then(|h| Authority::try_from(h.as_bytes()).ok()).unwrap_or_else(|| own.clone());
    let mut parts = req.uri().clone().into_parts();
    parts.scheme = Some(scheme);
    parts.authority = Some(authority);
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(PathAndQuery::from_static("/"));
    }
    if let Ok(uri) = Uri::from_parts(parts) {
        *req.uri_mut() = uri;
    }
}

/// Undoes [`to_h2`] for a request that goes over HTTP/1.1 after all: the
/// authority becomes `Host` again and the target its origin form.
fn to_h1(req: &mut Request<SendBody>) {
    if req.version() != Version::HTTP_2 {
        return;
    }
    *req.version_mut() = Version::HTTP_11;
    let uri = std::mem::take(req.uri_mut());
    if let Some(host) = uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
        req.headers_mut().insert(header::HOST, host);
    }
    *req.uri_mut() = uri.path_and_query().cloned().map_or_else(|| Uri::from_static("/"), Uri::from);
}

pub fn is_idempotent(m: &Method) -> bool {
    matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE)
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

#[cfg(test)]
mod tests {
    use http_body_util::{Either, Empty};

    use super::*;

    /// A request made HTTP/2 and then sent over HTTP/1.1 after all (an
    /// `auto` upstream's new connection chose it) is the request it was.
    #[test]
    fn to_h1_undoes_to_h2() {
        let own = Authority::from_static("upstream:8443");
        // (target, Host sent, Host after the round trip)
        let cases = [
            ("/", Some("example.com"), "example.com"),
            ("/search?q=1&r=%20", Some("example.com:8080"), "example.com:8080"),
            // No Host (or none usable): the endpoint's own authority.
            ("/x", None, "upstream:8443"),
            ("/y", Some("not an authority"), "upstream:8443"),
        ];
        for (target, host, want) in cases {
            let mut req = Request::new(Either::Right(Empty::new()));
            *req.uri_mut() = target.parse().unwrap();
            if let Some(h) = host {
                req.headers_mut().insert(header::HOST, HeaderValue::from_str(h).unwrap());
            }
            to_h2(&mut req, Scheme::HTTPS, &own);
            assert_eq!(req.version(), Version::HTTP_2);
            to_h1(&mut req);
            assert_eq!(req.version(), Version::HTTP_11, "{target}");
            assert_eq!(req.uri(), target, "{target}");
            assert_eq!(req.headers()[header::HOST], want, "{target}");
            // A request never made HTTP/2 is left alone.
            let before = req.uri().clone();
            to_h1(&mut req);
            assert_eq!(req.uri(), &before);
        }
    }
}
