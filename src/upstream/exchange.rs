//! One exchange with one endpoint: a pooled connection (or a new one), the
//! resend after a stale pooled connection, and what a failure means.

use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, Uri, Version, header};
use http_body_util::{Either, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http2;
use metrics::Counter;

use super::pool::{Conn, ConnectError, Connected, Pool, SendBody, SendStalled};
use crate::access::UpstreamTiming;
use crate::body::{BodyIdle, BodyTooLarge, ClientBodyFailed};
use crate::config::Address;
use crate::error::{GatewayError, find_source};

/// How an exchange failed.
pub enum Failure {
    /// No connection could be made; the request, never sent, comes back.
    Connect(ConnectError, Box<Request<SendBody>>),
    /// The request was (at least partly) sent.
    Send(hyper::Error),
}

impl Failure {
    /// The upstream closed or reset the connection before the response
    /// head, for a reason other than the client's own body.
    pub fn is_reset(&self) -> bool {
        let Failure::Send(e) = self else { return false };
        find_source::<ClientBodyFailed>(e).is_none()
            && find_source::<BodyTooLarge>(e).is_none()
            && find_source::<BodyIdle>(e).is_none()
            && !(e.is_parse() || e.is_parse_status() || e.is_parse_too_large())
            && stalled(e).is_none()
            && tls_alert(e).is_none()
    }

    /// A failure of the client's own request body (too large, stalled,
    /// cut off), not of the upstream.
    pub fn is_clients(&self) -> bool {
        let Failure::Send(e) = self else { return false };
        find_source::<ClientBodyFailed>(e).is_some()
            || find_source::<BodyTooLarge>(e).is_some()
            || find_source::<BodyIdle>(e).is_some()
    }

    /// The gateway error (and so the status and kind). Failures of the
    /// client's own request body are the client's.
    pub fn classify(self, upstream: &str, address: &Address) -> GatewayError {
        let upstream = upstream.to_owned();
        let e = match self {
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
        if let Some(after) = stalled(&e) {
            return GatewayError::UpstreamSendTimeout { upstream, after };
        }
        if let Some(alert) = tls_alert(&e) {
            // TLS 1.3 servers check a client certificate after the client's
            // side of the handshake is done, so a refusal arrives as the
            // request is sent: still a TLS failure, not a reset.
            return GatewayError::UpstreamTls {
                upstream,
                authority: address.to_string(),
                detail: format!("TLS: the upstream refused the handshake: {alert}"),
            };
        }
        let detail = error_chain(&e);
        if e.is_parse() || e.is_parse_status() || e.is_parse_too_large() {
            GatewayError::UpstreamProtocol { upstream, detail }
        } else {
            GatewayError::UpstreamReset { upstream, detail }
        }
    }
}

/// The TLS alert the upstream sent, if that is what ended the exchange.
fn tls_alert(e: &hyper::Error) -> Option<&rustls::Error> {
    let io = find_source::<std::io::Error>(e)?;
    io.get_ref()?.downcast_ref::<rustls::Error>().filter(|t| matches!(t, rustls::Error::AlertReceived(_)))
}

/// How long the upstream left the request body unread, if that is the error.
fn stalled(e: &hyper::Error) -> Option<Duration> {
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
}

/// Sends `req` on an idle pooled connection of `pool`, or a new one. A
/// request that was not written because its connection had closed goes to
/// the next one. A retryable request that failed after being written on a
/// pooled connection (the upstream closed it just as the request went out,
/// or left stray bytes on it) is sent once more, on a new connection, so the
/// resend can never land on another stale one.
///
/// An `async move` block, not an `async fn`: an `async fn` moves the
/// request into a local of its own, and the future keeps room for both
/// (see [`crate::server::App::handle`]).
#[allow(clippy::manual_async_fn)] // See above: not an `async fn` on purpose.
pub fn exchange<'a>(
    pool: &'a Pool,
    mut req: Request<SendBody>,
    plan: Plan,
    resends: &'a Counter,
    timing: Option<&'a UpstreamTiming>,
) -> impl Future<Output = Result<(Response<Incoming>, Option<Conn>), Failure>> + 'a {
    async move {
        if pool.speaks_h2() {
            // Boxed: its state would otherwise grow every HTTP/1.1 exchange's
            // future (measured: ~140 instructions a request, in copies).
            return Box::pin(exchange_h2(pool, req, plan, resends, timing)).await;
        }
        while let Some(mut conn) = pool.take_idle() {
            conn.prepare(plan.send_timeout, plan.large_body);
            let copy = plan.retryable.then(|| HeadCopy::of(&req));
            match conn.sender.try_send_request(req).await {
                Ok(response) => return Ok((response, Some(conn))),
                Err(mut e) => match (e.take_message(), copy.and_then(HeadCopy::into_request)) {
                    (Some(unsent), _) => req = unsent,
                    (None, Some(copy)) if is_stale_connection(e.error()) => {
                        resends.increment(1);
                        tracing::debug!(error = %e.error(), "resending on a new connection");
                        req = copy;
                        break;
                    }
                    (None, _) => return Err(Failure::Send(e.into_error())),
                },
            }
        }
        // Boxed: connecting (TCP, maybe TLS) is a rare state, and unboxed it
        // made every exchange's future 700 bytes larger, for each request in
        // flight.
        let conn = match Box::pin(open(pool, timing)).await {
            Ok(Connected::Http1(conn)) => conn,
            // An `auto` upstream that chose HTTP/2 by ALPN.
            Ok(Connected::Http2(sender)) => {
                return Box::pin(send_h2(sender, req, pool.scheme(), pool.authority().clone())).await;
            }
            Err(e) => return Err(Failure::Connect(e, Box::new(req))),
        };
        send_h1(conn, req, plan).await
    }
}

/// Sends `req` on a new HTTP/1.1 connection (nothing to resend it from).
async fn send_h1(
    mut conn: Conn,
    req: Request<SendBody>,
    plan: Plan,
) -> Result<(Response<Incoming>, Option<Conn>), Failure> {
    conn.prepare(plan.send_timeout, plan.large_body);
    let response = conn.sender.send_request(req).await.map_err(Failure::Send)?;
    Ok((response, Some(conn)))
}

/// [`exchange`] over HTTP/2: on a shared connection with room for another
/// stream, or a new one. A request its connection did not take (it was
/// closing: GOAWAY) goes to another.
async fn exchange_h2(
    pool: &Pool,
    mut req: Request<SendBody>,
    plan: Plan,
    resends: &Counter,
    timing: Option<&UpstreamTiming>,
) -> Result<(Response<Incoming>, Option<Conn>), Failure> {
    let mut resent = false;
    loop {
        let mut sender = match h2_connection(pool, timing).await {
            Ok(Connected::Http2(sender)) => sender,
            // An `auto` upstream whose new connection chose HTTP/1.1 by ALPN
            // (new requests now go over HTTP/1.1 too, see `Pool::connect`).
            Ok(Connected::Http1(conn)) => {
                to_h1(&mut req);
                return send_h1(conn, req, plan).await;
            }
            Err(e) => return Err(Failure::Connect(e, Box::new(req))),
        };
        if sender.ready().await.is_err() {
            continue;
        }
        to_h2(&mut req, pool.scheme(), pool.authority());
        let copy = (plan.retryable && !resent).then(|| HeadCopy::of(&req));
        match sender.try_send_request(req).await {
            Ok(response) => return Ok((response, None)),
            Err(mut e) => match (e.take_message(), copy.and_then(HeadCopy::into_request)) {
                (Some(unsent), _) => req = unsent,
                // Refused before any processing (RFC 9113 §8.7): a GOAWAY
                // whose last stream ID is below this one, or REFUSED_STREAM.
                // A bodiless idempotent request goes once more.
                (None, Some(copy)) if not_processed(e.error()) => {
                    resends.increment(1);
                    tracing::debug!(error = %e.error(), "HTTP/2 stream not processed; sending it again");
                    (req, resent) = (copy, true);
                }
                (None, _) => return Err(Failure::Send(e.into_error())),
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
    scheme: Scheme,
    own: Authority,
) -> Result<(Response<Incoming>, Option<Conn>), Failure> {
    to_h2(&mut req, scheme, &own);
    let response = sender.send_request(req).await.map_err(Failure::Send)?;
    Ok((response, None))
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

/// A bodiless request's head, kept to send it again (on a new connection
/// when its pooled one turns out stale, or as a retry).
///
/// Kept as bytes of its own, not as a clone of the request. A clone's
/// header values and path are slices of the client connection's read
/// buffer, and the copy, held until the response arrives, kept that buffer
/// alive beside the one hyper reads the client's next bytes into: 4.3 KiB
/// more per request in flight (slow-upstream at 4,000 connections peaked at
/// 181 MiB instead of 164).
///
/// One buffer holds it all: the path, then for each header a 9-byte entry
/// (its name's length and its value's, as native `u32`s, and whether the
/// value is sensitive) followed by the name and the value. The map is built
/// again, through `HeaderName::from_bytes` and `HeaderValue`, only when the
/// copy is sent, which is rare. A copy is made for nearly every proxied
/// request (each one sent on a pooled connection), so it is made for
/// speed: one allocation, no per-header clone or drop. A list of
/// `(HeaderName, end)` beside the bytes cost 1,515 instructions a request
/// to make and drop, this about 1,050 (983 to make, then one free;
/// `benches/callgrind /b 10000`); cloning the map cost more than either.
pub struct HeadCopy {
    method: Method,
    version: Version,
    /// An absolute-form URI (HTTP/2's), kept as it is; else the path is
    /// the start of `bytes`.
    uri: Option<Uri>,
    path_end: usize,
    headers: usize,
    bytes: Vec<u8>,
}

/// A header's entry in [`HeadCopy`]'s bytes, before its name and value.
const ENTRY: usize = 9;

impl HeadCopy {
    pub fn of(req: &Request<SendBody>) -> HeadCopy {
        let (uri, path) = match req.uri().scheme() {
            None => (None, req.uri().path_and_query().map_or("/", PathAndQuery::as_str)),
            Some(_) => (Some(req.uri().clone()), ""),
        };
        // Room for a typical head, grown if it is larger: exact sizing took a
        // pass over the headers that cost more than it saved.
        let mut bytes = Vec::with_capacity(path.len() + req.headers().len() * 64);
        bytes.extend_from_slice(path.as_bytes());
        for (name, value) in req.headers() {
            let (name_bytes, value_bytes) = (name.as_str().as_bytes(), value.as_bytes());
            let mut entry = [0u8; ENTRY];
            // A head is limited to far less than 4 GiB (`server.max_header_size`).
            entry[..4].copy_from_slice(&(name_bytes.len() as u32).to_ne_bytes());
            entry[4..8].copy_from_slice(&(value_bytes.len() as u32).to_ne_bytes());
            entry[8] = u8::from(value.is_sensitive());
            bytes.extend_from_slice(&entry);
            bytes.extend_from_slice(name_bytes);
            bytes.extend_from_slice(value_bytes);
        }
        HeadCopy {
            method: req.method().clone(),
            version: req.version(),
            uri,
            path_end: path.len(),
            headers: req.headers().len(),
            bytes,
        }
    }

    /// The request again; `None` only if a part no longer validates, which
    /// cannot happen to bytes taken from a valid request.
    pub fn into_request(self) -> Option<Request<SendBody>> {
        let bytes = Bytes::from(self.bytes);
        let uri = match self.uri {
            Some(uri) => uri,
            None => Uri::from(PathAndQuery::from_maybe_shared(bytes.slice(..self.path_end)).ok()?),
        };
        let mut headers = HeaderMap::with_capacity(self.headers);
        let mut at = self.path_end;
        while at < bytes.len() {
            let entry = bytes.get(at..at + ENTRY)?;
            let length = |i: usize| entry.get(i..i + 4)?.try_into().ok().map(u32::from_ne_bytes);
            let (name_at, value_at) = (at + ENTRY, at + ENTRY + length(0)? as usize);
            let end = value_at + length(4)? as usize;
            let name = HeaderName::from_bytes(bytes.get(name_at..value_at)?).ok()?;
            bytes.get(value_at..end)?;
            let mut value = HeaderValue::from_maybe_shared(bytes.slice(value_at..end)).ok()?;
            value.set_sensitive(entry[8] != 0);
            headers.append(name, value);
            at = end;
        }
        let mut req = Request::new(Either::Right(Empty::new()));
        *req.method_mut() = self.method;
        *req.version_mut() = self.version;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        Some(req)
    }
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
                // rustls: a TLS upstream closed without close_notify.
                | std::io::ErrorKind::UnexpectedEof
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A header: name, value, sensitive.
    type Header<'a> = (&'a str, &'a str, bool);

    /// A request whose path and header values are slices of one buffer, as
    /// hyper parses them from a connection's read buffer.
    fn parsed(buffer: &Bytes, uri: &str, headers: &[Header]) -> Request<SendBody> {
        let mut req = Request::new(Either::Right(Empty::new()));
        *req.method_mut() = Method::GET;
        *req.uri_mut() = uri.parse().unwrap();
        for (name, value, sensitive) in headers {
            let at = buffer.windows(value.len()).position(|w| w == value.as_bytes()).expect("value in the buffer");
            let mut v = HeaderValue::from_maybe_shared(buffer.slice(at..at + value.len())).unwrap();
            v.set_sensitive(*sensitive);
            req.headers_mut().append(HeaderName::from_bytes(name.as_bytes()).unwrap(), v);
        }
        req
    }

    #[test]
    fn a_head_copy_is_the_same_request_again() {
        let long = "c".repeat(3000);
        let many: Vec<(String, String)> = (0..40).map(|i| (format!("x-header-{i}"), "v".repeat(i * 7 + 1))).collect();
        let many: Vec<Header> =
            many.iter().enumerate().map(|(i, (n, v))| (n.as_str(), v.as_str(), i % 3 == 0)).collect();
        let buffer = Bytes::from(format!("example.com|a=1|b=2|secret|gzip, br|{long}|{}|", "v".repeat(300)));
        let cases: [(&str, &[Header]); 6] = [
            ("/", &[]),
            ("/search?q=1&r=%20", &[("host", "example.com", false), ("accept-encoding", "gzip, br", false)]),
            // Repeated names keep their order; sensitivity is kept.
            ("/p", &[("cookie", "a=1", false), ("cookie", "b=2", false), ("authorization", "secret", true)]),
            // An absolute-form URI (an HTTP/2 request) is kept whole.
            ("https://example.com:8443/x?y", &[("x-custom", "b=2", false)]),
            // Larger than the room made at first: the copy grows.
            ("/big", &[("cookie", long.as_str(), true), ("host", "example.com", false)]),
            ("/many", &many),
        ];
        for (uri, headers) in cases {
            let req = parsed(&buffer, uri, headers);
            let again = HeadCopy::of(&req).into_request().expect("a valid request is copied");
            assert_eq!(again.method(), req.method(), "{uri}");
            assert_eq!(again.version(), req.version(), "{uri}");
            assert_eq!(again.uri(), req.uri(), "{uri}");
            assert_eq!(again.headers(), req.headers(), "{uri}");
            let sensitive = |r: &Request<SendBody>| r.headers().values().map(|v| v.is_sensitive()).collect::<Vec<_>>();
            assert_eq!(sensitive(&again), sensitive(&req), "{uri}");
        }
    }

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

    /// The copy holds nothing of the buffer the request was parsed from: a
    /// clone would keep the client connection's read buffer alive until
    /// the response.
    #[test]
    fn a_head_copy_keeps_nothing_of_the_client_read_buffer() {
        let buffer = Bytes::from(b"/from-the-buffer example.com token".to_vec());
        let req = parsed(&buffer, "/from-the-buffer", &[("host", "example.com", false), ("x-token", "token", false)]);
        let copy = HeadCopy::of(&req);
        drop(req);
        assert!(buffer.is_unique(), "the copy still shares the request's buffer");
        drop(copy);
    }
}
