//! The proxy's message rules: how a client's request becomes the request an
//! upstream receives (rewrite, hop-by-hop headers, forwarding headers,
//! framing), and how the upstream's response head becomes the client's.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::body::Incoming;
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Uri, Version, request, response};
use http_body_util::{Either, Empty};

use super::body::Received;
use super::exchange::{Plan, is_idempotent};
use super::pool::SendBody;
use super::tunnel::ClientSide;
use crate::body::{BodyState, RequestBody};
use crate::config::ProxyTarget;
use crate::error::GatewayError;
use crate::headers::{self, Stamp};
use crate::request::Peer;
use crate::router::Rewritten;

/// A request body the proxy forwards: a client's, or none (`()`: a request
/// the gateway makes itself, such as the cache's unconditional refetch).
pub trait ClientBody {
    fn into_incoming(self) -> Option<Incoming>;
}

impl ClientBody for Incoming {
    #[inline]
    fn into_incoming(self) -> Option<Incoming> {
        Some(self)
    }
}

impl ClientBody for () {
    #[inline]
    fn into_incoming(self) -> Option<Incoming> {
        None
    }
}

/// A request ready for an upstream, but for its `Host` (which depends on
/// the endpoint when the route sends the upstream's own).
pub struct Prepared {
    pub parts: request::Parts,
    pub body: SendBody,
    pub plan: Plan,
    /// The client's `Host` (or HTTP/2 `:authority`).
    pub client_host: Option<HeaderValue>,
    /// The client's side of the connection, once switched, when the request
    /// asks for an upgrade the route tunnels.
    pub upgrade: Option<ClientSide>,
    /// What the request body tells of itself (when there is a body).
    pub body_state: Option<Arc<BodyState>>,
}

/// The client's `Host` (an HTTP/2 client's `:authority`); one that is not
/// host[:port] is a bad request (RFC 9112 §3.2), which an HTTP/2 upstream
/// could not even be sent as `:authority`.
pub fn client_host(headers: &http::HeaderMap, uri: &Uri) -> Result<Option<HeaderValue>, GatewayError> {
    let host = headers
        .get(header::HOST)
        .cloned()
        .or_else(|| uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()));
    match host {
        Some(host) if !headers::valid_host(host.as_bytes()) => Err(GatewayError::BadRequest("invalid Host")),
        host => Ok(host),
    }
}

/// The steps every request's fields take on the way to an upstream, a
/// route's mirror's copy's too (hop-by-hop fields are stripped before):
/// an HTTP/2 client's `Cookie` lines joined, the forwarding fields (those
/// the request did not carry go to `stamped`), and, if the route says so,
/// every name with `_`. `LoopDetected` if the request passed this gateway.
pub fn forward_headers(
    headers: &mut http::HeaderMap,
    version: Version,
    client_host: Option<&HeaderValue>,
    target: &ProxyTarget,
    peer: &Peer,
    stamped: &mut Stamp,
) -> Result<(), GatewayError> {
    // Cookie lines joined, an HTTP/1 client's too: looked for only when
    // some field is repeated (a count the map keeps), which most requests'
    // are not.
    if version == Version::HTTP_2 || headers.len() != headers.keys_len() {
        headers::join_cookies(headers);
    }
    let (via, trusted, tls) = (&target.via, peer.trusted, peer.tls);
    if headers::add_forwarding(headers, &peer.forwarded_for, client_host, via, version, trusted, tls, stamped) {
        return Err(GatewayError::LoopDetected);
    }
    if target.drop_underscore_headers {
        headers::remove_other_spellings(headers, std::iter::empty(), true);
    }
    Ok(())
}

/// Applies the route's rewrite and the header rules to a client request;
/// the fields it adds that the request did not carry go to `stamped` (see
/// [`headers::stamp`]), which the caller keeps in place (a move copies it).
pub fn prepare_request<B: ClientBody>(
    req: Request<B>,
    target: &ProxyTarget,
    prefix: &str,
    max_body: u64,
    peer: &Peer,
    counted: Option<Arc<AtomicU64>>,
    stamped: &mut Stamp,
) -> Result<Prepared, GatewayError> {
    let (mut parts, body) = req.into_parts();
    let body = body.into_incoming();
    let path_and_query = upstream_path(&parts.uri, target, prefix)?;
    let client_host = client_host(&parts.headers, &parts.uri)?;
    let mut upgrade = None;
    if headers::has_hop_by_hop(&parts.headers) {
        let protocol = match target.upgrade {
            Some(_) if parts.version == Version::HTTP_11 => headers::upgrade_requested(&parts.headers),
            _ => None,
        };
        headers::strip_present_hop_by_hop(&mut parts.headers);
        if let Some(protocol) = protocol {
            // The two headers an upgrade needs go on to the upstream (the
            // rest of Connection's list stays hop-by-hop); the client's
            // side of the tunnel is taken from the request.
            parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, protocol);
            upgrade = match parts.extensions.remove::<hyper::upgrade::OnUpgrade>() {
                Some(on) => Some(ClientSide::Hyper(on)),
                // The gateway's own connection (see `Peer::own_h1`).
                None => peer.own_h1().then_some(ClientSide::Connection),
            };
        }
    }
    let from_http2 = parts.version == Version::HTTP_2;
    forward_headers(&mut parts.headers, parts.version, client_host.as_ref(), target, peer, stamped)?;
    // Origin-form on the wire (RFC 9112 §3.2.1); the connection already
    // names the upstream.
    parts.uri = Uri::from(path_and_query);
    parts.version = Version::HTTP_11;

    let has_body = body.as_ref().is_some_and(|b| !http_body::Body::is_end_stream(b));
    if has_body && !parts.headers.contains_key(header::CONTENT_LENGTH) {
        // A body of unknown length (chunked, or HTTP/2 without
        // content-length) goes upstream chunked. Said explicitly because
        // hyper would frame a GET or HEAD of unknown length as empty and
        // silently drop its body.
        parts.headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
    let large_body = has_body
        && body.as_ref().is_some_and(|b| {
            http_body::Body::size_hint(b).upper().is_none_or(|n| n > u64::from(crate::net::NOTSENT_LOWAT))
        });
    let (body, body_state) = if let Some(body) = body.filter(|_| has_body) {
        let guarded = target.guarded_trailers.clone();
        let body = RequestBody::new(body, max_body, target.body_timeout, from_http2, counted, guarded);
        let state = body.state();
        (Either::Left(Box::new(body)), Some(state))
    } else {
        (Either::Right(Empty::new()), None)
    };
    let retryable = !has_body && is_idempotent(&parts.method);
    let forwards_1xx = peer.forwards_1xx;
    let plan = Plan { retryable, send_timeout: target.body_timeout, large_body, may_resend: true, forwards_1xx };
    Ok(Prepared { parts, body, plan, client_host, upgrade, body_state })
}

/// The path and query the upstream is sent for `uri`: after the route's
/// `rewrite` (the cache keys on it too).
pub fn upstream_path(uri: &Uri, target: &ProxyTarget, prefix: &str) -> Result<PathAndQuery, GatewayError> {
    Ok(match &target.rewrite {
        // Copied into the thread's block (no allocation of its own).
        Some(rewrite) => {
            let pieces = Rewritten::of(uri.path(), uri.query(), prefix, rewrite).pieces();
            let path = crate::block::copy_of(pieces.map(str::as_bytes));
            PathAndQuery::from_maybe_shared(path)
                .map_err(|_| GatewayError::BadPath("rewritten path is not a valid URI"))?
        }
        None => uri.path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/")),
    })
}

/// Refuses a response status the gateway must not relay. `upgrading`: the
/// request asked for an upgrade the route tunnels.
pub fn check_status(status: u16, upstream: &str, upgrading: bool) -> Result<(), GatewayError> {
    if !(100..=599).contains(&status) {
        // hyper accepts 100-999; past 599 it is not HTTP (RFC 9110 §15),
        // and passing it on would also mint metric series.
        return Err(GatewayError::UpstreamProtocol {
            upstream: upstream.to_owned(),
            detail: format!("status {status} is outside 100-599"),
        });
    }
    if status == 101 && !upgrading {
        // No upgrade was passed on, so a 101 was never asked for: relaying
        // it would hand the client a switched protocol the gateway does not
        // carry.
        return Err(GatewayError::UpstreamProtocol {
            upstream: upstream.to_owned(),
            detail: "101 Switching Protocols without an upgrade request".into(),
        });
    }
    Ok(())
}

/// Applies the header rules to an upstream response head (`via`: the
/// gateway's `Via` entries). Returns whether its connection may be reused.
pub fn prepare_response(parts: &mut response::Parts, body: &Received, via: &headers::Via) -> bool {
    if parts.status == http::StatusCode::SWITCHING_PROTOCOLS {
        // The protocol switched to, for the client (RFC 9110 §15.2.2); the
        // rest is stripped as from any response.
        let protocol = parts.headers.get(header::UPGRADE).cloned();
        headers::strip_hop_by_hop(&mut parts.headers);
        if let Some(protocol) = protocol {
            parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, protocol);
        }
        headers::append_via(&mut parts.headers, via, parts.version);
        return false;
    }
    // Content-Length beside Transfer-Encoding (the body is framed by the
    // latter and both headers are kept): the framings disagree, so the length
    // must not be passed on (RFC 9112 §6.3), and a connection whose
    // upstream frames like that is not reused.
    // (The body's framing first: a length-framed body, the usual case,
    // needs no header lookup.)
    let reusable =
        !(http_body::Body::size_hint(body).exact().is_none() && parts.headers.contains_key(header::CONTENT_LENGTH));
    if !reusable {
        parts.headers.remove(header::CONTENT_LENGTH);
    }
    headers::strip_hop_by_hop_then_via(&mut parts.headers, via, parts.version);
    reusable
}
