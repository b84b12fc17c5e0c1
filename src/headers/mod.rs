//! Header rules for proxying: pure functions, table-tested (`tests`), and
//! the names the gateway sets or reads itself.
//!
//! - `rules`: the per-route `request_headers` / `response_headers` rules.
//!
//! - Hop-by-hop headers are removed in both directions: the fixed list of
//!   RFC 9110 §7.6.1 (plus the legacy `Keep-Alive` and `Proxy-Connection`)
//!   and every header named in `Connection`. `Trailer` is end-to-end (it is
//!   not in that list), so declared trailers pass; `TE` is hop-by-hop, and
//!   only its `trailers` member is passed on (the client accepts trailers).
//!   `Expect` goes with them: the gateway answers a client's expectation
//!   itself (see [`strip_hop_by_hop`]).
//! - The client's address is appended to `X-Forwarded-For` (as nginx's
//!   `$proxy_add_x_forwarded_for`). `X-Forwarded-Proto`, `X-Forwarded-Host`
//!   and `Forwarded` (RFC 7239) are kept from a trusted proxy and replaced by
//!   this hop's own values from anyone else; `Via` gets this hop appended
//!   (RFC 9110 §7.6.3) under the gateway's name (see `via`).
//! - HTTP/2 `cookie` fields are joined with `; ` for an HTTP/1 upstream
//!   (RFC 9113 §8.2.3).

use http::Version;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

mod client_ip;
mod cookies;
pub mod etags;
mod host;
pub mod interim;
mod nominated;
pub mod parsed;
mod proxy_only;
mod quoted;
pub mod rules;
pub mod spare;
pub mod stamp;
pub mod via;

pub use client_ip::forwarded_for;
pub use cookies::{cookie_line, join_cookies};
pub use host::valid_host;
pub use nominated::Nominated;
pub use parsed::digits;
pub use proxy_only::{FROM_PROXIES_ONLY, drop_proxy_only, is_proxy_only};
pub use quoted::push_quoted;
pub use stamp::{Field, Stamp};
pub use via::Via;

/// Headers that are always hop-by-hop (RFC 9110 §7.6.1, §7.8; RFC 9112 §6.1).
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
];

/// `X-Request-Id`: one per request, to the upstream and back to the client.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// W3C trace context's `traceparent`.
pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
/// W3C trace context's `tracestate`.
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// `X-Forwarded-For`.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`.
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// `Forwarded` (RFC 7239).
pub const FORWARDED: HeaderName = HeaderName::from_static("forwarded");
/// Marks a route's mirror's copy: set only by the gateway, on copies.
pub const X_GATEWAY_MIRROR: HeaderName = HeaderName::from_static("x-gateway-mirror");

/// The request headers the gateway sets itself on the way upstream. Stacks
/// that map header names to CGI-style variables (PEP 3333's `HTTP_X_...`,
/// CGI, Werkzeug's ProxyFix) read `X_Forwarded_Proto` as `X-Forwarded-Proto`,
/// so a client could spoof through an underscore spelling what the gateway
/// sets; such spellings are removed (see [`same_cgi_name`]).
const SET_BY_POLICY: [HeaderName; 5] =
    [X_FORWARDED_FOR, X_FORWARDED_PROTO, X_FORWARDED_HOST, X_REQUEST_ID, X_GATEWAY_MIRROR];

/// Every request header the gateway sets itself: what a client may not
/// supply in its request trailers either.
pub const SET_BY_GATEWAY: [HeaderName; 10] = [
    X_FORWARDED_FOR,
    X_FORWARDED_PROTO,
    X_FORWARDED_HOST,
    X_REQUEST_ID,
    X_GATEWAY_MIRROR,
    FORWARDED,
    header::VIA,
    header::HOST,
    TRACEPARENT,
    TRACESTATE,
];

/// Whether two header names are one CGI variable: they differ, but only
/// where one has `-` and the other `_` (CGI and WSGI map both to `_`).
/// Header names are lower-case already.
pub fn same_cgi_name(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a != b
        && a.bytes().zip(b.bytes()).all(|(x, y)| x == y || matches!((x, y), (b'-', b'_') | (b'_', b'-')))
}

/// Removes every header whose name is one of `names` in another spelling
/// of `-` and `_` (see [`same_cgi_name`]); with `all`, every name holding
/// `_` too (nginx's `underscores_in_headers off`).
pub fn remove_other_spellings<'a>(
    headers: &mut HeaderMap,
    names: impl Iterator<Item = &'a HeaderName> + Clone,
    all: bool,
) {
    let spelled: Vec<HeaderName> = headers
        .keys()
        .filter(|n| {
            (all && n.as_str().contains('_')) || names.clone().any(|want| same_cgi_name(n.as_str(), want.as_str()))
        })
        .cloned()
        .collect();
    for name in spelled {
        headers.remove(name);
    }
}

/// Whether `name` is always hop-by-hop (`Upgrade` included).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || name == header::UPGRADE
}

/// Whether a trailer section may not carry `name` (RFC 9110 §6.5.1): a
/// field that frames, routes or authenticates the message or controls its
/// handling, which a recipient would take from the trailers at its peril,
/// as hyper's client leaves out of a request's; and the connection-specific
/// fields, which HTTP/2 forbids outright (RFC 9113 §8.2.2).
pub fn forbidden_in_trailers(name: &HeaderName) -> bool {
    is_hop_by_hop(name)
        || [
            header::AUTHORIZATION,
            header::CACHE_CONTROL,
            header::CONTENT_ENCODING,
            header::CONTENT_LENGTH,
            header::CONTENT_RANGE,
            header::CONTENT_TYPE,
            header::HOST,
            header::MAX_FORWARDS,
            header::SET_COOKIE,
            header::TRAILER,
        ]
        .contains(name)
}

/// Takes out of a trailer section what it may not carry (see
/// [`forbidden_in_trailers`]).
pub fn strip_forbidden_trailers(trailers: &mut HeaderMap) {
    if trailers.keys().any(forbidden_in_trailers) {
        let names: Vec<HeaderName> = trailers.keys().filter(|n| forbidden_in_trailers(n)).cloned().collect();
        for name in names {
            trailers.remove(name);
        }
    }
}

/// Removes hop-by-hop headers, including every header named in `Connection`.
/// `Upgrade` is hop-by-hop too (a tunnelled upgrade puts it back, see
/// [`upgrade_requested`]). A `TE`
/// that lists `trailers` becomes `TE: trailers` (RFC 9110 §10.1.4): the
/// client accepts trailers, which the next hop needs to know to send them.
///
/// `Expect` goes too. The gateway owns a client's expectation (RFC 9110
/// §10.1.1 lets a proxy answer it): the client-facing connection sends `100
/// Continue` when the body is first read, and HTTP/1.0's is ignored. Passed
/// on, an upstream could refuse it with a final answer (417, 401) and leave
/// the body, already on its way, unread on a connection that goes back to
/// the pool, where it would be read as the next client's request.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if has_hop_by_hop(headers) {
        strip_present_hop_by_hop(headers);
    }
}

/// Whether any hop-by-hop header is present. Most messages carry none: one
/// scan over the names present is cheaper than a hashed removal (or
/// lookup) per hop-by-hop name.
pub fn has_hop_by_hop(headers: &HeaderMap) -> bool {
    headers.keys().any(|name| is_hop_by_hop(name) || name == header::EXPECT)
}

/// Whether the upstream may see request header `name` otherwise than the
/// client sent it: a hop-by-hop field (always, or `nominated` by the
/// request's `Connection`), dropped on the way, or one the gateway sets
/// per client or per request. A response that varies on such a field
/// cannot be keyed by the client's value. Not `Host`, nor
/// `X-Forwarded-Host` and `X-Forwarded-Proto`: a cache key holds them as a
/// trusted proxy sent them, and else they come from `Host` and the listener.
pub fn not_as_sent(name: &HeaderName, nominated: &Nominated) -> bool {
    if name == header::HOST || name == X_FORWARDED_HOST || name == X_FORWARDED_PROTO {
        return false;
    }
    HOP_BY_HOP.contains(name) || SET_BY_GATEWAY.contains(name) || nominated.contains(name)
}

/// [`strip_hop_by_hop`] once [`has_hop_by_hop`] said there is something to
/// strip.
pub fn strip_present_hop_by_hop(headers: &mut HeaderMap) {
    // Names listed in Connection must go before Connection itself does.
    // Host is for every recipient (RFC 9110 §7.2), so a listing of it is
    // ignored: it would let a client take the upstream's Host away.
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .filter(|name| name != header::HOST)
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    let te_trailers = headers.get_all(header::TE).iter().any(|v| list_has(v, "trailers"));
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
    headers.remove(header::EXPECT);
    if te_trailers {
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
    }
}

/// Removes, now, the headers the client named in `Connection` (but Host and
/// the ones hop-by-hop anyway, which the last step before the upstream
/// removes), and takes their names out of `Connection`. For a step that
/// adds headers of its own before that last step (credentials' claims, a
/// forward auth service's headers): a client could otherwise name them in
/// `Connection` and have the gateway strip what it set itself.
pub fn drop_nominated(headers: &mut HeaderMap) {
    if !headers.contains_key(header::CONNECTION) {
        return;
    }
    let mut kept: Vec<String> = Vec::new();
    let mut named: Vec<HeaderName> = Vec::new();
    for token in headers.get_all(header::CONNECTION).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')) {
        let token = token.trim();
        match HeaderName::from_bytes(token.as_bytes()) {
            // `close` is an option, not a header.
            Ok(name) if name != header::HOST && !is_hop_by_hop(&name) && name.as_str() != "close" => named.push(name),
            _ if token.is_empty() => {}
            _ => kept.push(token.to_owned()),
        }
    }
    if named.is_empty() {
        return;
    }
    for name in named {
        headers.remove(name);
    }
    match HeaderValue::from_str(&kept.join(", ")) {
        Ok(v) if !kept.is_empty() => headers.insert(header::CONNECTION, v),
        _ => headers.remove(header::CONNECTION),
    };
}

/// The protocol a request asks to upgrade to (`Upgrade`, RFC 9110 §7.8),
/// if its `Connection` lists `upgrade` so the request really asks for it.
/// `h2c` is never passed on: an upstream that switched would take HTTP/2
/// requests through the tunnel for any path, past the gateway's routes and
/// rules ("h2c smuggling"): a request asking for others too asks for those
/// only, one asking for it alone goes on without its upgrade headers.
pub fn upgrade_requested(headers: &HeaderMap) -> Option<HeaderValue> {
    let mut values = headers.get_all(header::UPGRADE).iter();
    let upgrade = values.next()?;
    if values.next().is_some() || !headers.get_all(header::CONNECTION).iter().any(|v| list_has(v, "upgrade")) {
        return None;
    }
    let protocols = upgrade.to_str().ok()?;
    let h2c = |p: &&str| p.split('/').next().is_some_and(|n| n.eq_ignore_ascii_case("h2c"));
    let asked: Vec<&str> = protocols.split(',').map(str::trim).filter(|p| !p.is_empty()).collect();
    let kept: Vec<&str> = asked.iter().filter(|p| !h2c(p)).copied().collect();
    match kept.len() == asked.len() {
        true => (!asked.is_empty()).then(|| upgrade.clone()),
        false => HeaderValue::from_str(&kept.join(", ")).ok().filter(|_| !kept.is_empty()),
    }
}

/// Whether a `101` that switched to `answered` (its `Upgrade`) keeps to
/// what the request asked for (`asked`): RFC 9110 §7.8 lets a server switch
/// only to protocols the client listed, and it must say which. Anything else
/// would let an upstream open, say, h2c through a tunnel the gateway
/// thought was a WebSocket.
pub fn upgrade_accepted(asked: &HeaderValue, answered: Option<&HeaderValue>) -> bool {
    let (Ok(asked), Some(Ok(answered))) = (asked.to_str(), answered.map(HeaderValue::to_str)) else {
        return false;
    };
    let mut switched = answered.split(',').map(str::trim).filter(|p| !p.is_empty()).peekable();
    switched.peek().is_some() && switched.all(|p| asked.split(',').any(|a| a.trim().eq_ignore_ascii_case(p)))
}

/// Whether a comma-separated header value lists `token` (case-insensitive,
/// parameters ignored).
fn list_has(value: &HeaderValue, token: &str) -> bool {
    value.to_str().is_ok_and(|v| {
        v.split(',').any(|item| item.split(';').next().is_some_and(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// Appends this hop to `Via`, keeping earlier hops.
pub fn append_via(headers: &mut HeaderMap, via: &Via, version: Version) {
    append_list(headers, header::VIA, via.entry(version).clone());
}

/// [`strip_hop_by_hop`], then [`append_via`], with one pass over the names
/// for both: most responses carry neither a hop-by-hop field nor `Via`,
/// and a lookup of `Via` costs a hash.
pub fn strip_hop_by_hop_then_via(headers: &mut HeaderMap, via: &Via, version: Version) {
    let (mut hop_by_hop, mut present) = (false, false);
    for name in headers.keys() {
        hop_by_hop |= is_hop_by_hop(name) || name == header::EXPECT;
        present |= name == header::VIA;
    }
    if hop_by_hop {
        // (A `Via` that `Connection` names goes too: this hop's entry is then all.)
        strip_present_hop_by_hop(headers);
    }
    add_to_list(headers, header::VIA, present, via.entry(version).clone());
}

/// Appends `item` to a comma-separated list header, merging existing values
/// into one line.
fn append_list(headers: &mut HeaderMap, name: HeaderName, item: HeaderValue) {
    let present = headers.contains_key(&name);
    add_to_list(headers, name, present, item);
}

/// [`append_list`] when the caller knows whether `name` is `present`.
fn add_to_list(headers: &mut HeaderMap, name: HeaderName, present: bool, item: HeaderValue) {
    if !present {
        headers.insert(name, item);
        return;
    }
    let mut joined = Vec::new();
    // An empty line adds no element: joined, it would make an empty one
    // (`, 10.0.0.1`), which a sender must not make (RFC 9110 §5.6.1).
    for v in headers.get_all(&name).iter().map(|v| v.as_bytes().trim_ascii()).filter(|v| !v.is_empty()) {
        joined.extend_from_slice(v);
        joined.extend_from_slice(b", ");
    }
    joined.extend_from_slice(item.as_bytes());
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(name, v);
    }
}

/// Sets the forwarding headers on a request on its way upstream.
/// `client_ip` comes from [`forwarded_for`]; `original_host` is the client's
/// `Host` (or HTTP/2 `:authority`); `trusted` says whether the peer is a
/// trusted proxy, whose `X-Forwarded-Proto`, `X-Forwarded-Host` and
/// `Forwarded` are kept (this hop's `Forwarded` element is appended).
/// Returns true, and changes nothing, when the request has passed this
/// gateway already (its `Via` holds `via`'s name): a loop. A field the
/// request does not carry goes to `stamp`, which also notes whether it
/// carries an `X-Request-Id` and a `traceparent` (a pass over the names is
/// made here anyway).
#[must_use]
#[allow(clippy::too_many_arguments)]
pub fn add_forwarding(
    headers: &mut HeaderMap,
    client_ip: &HeaderValue,
    original_host: Option<&HeaderValue>,
    via_entry: &Via,
    version: Version,
    trusted: bool,
    https: bool,
    stamp: &mut Stamp,
) -> bool {
    // Which of the names below the request has, in one pass over its
    // names rather than a lookup each: a lookup hashes the name (a custom
    // one byte by byte), and most requests carry none of them (see
    // benches/README.md, Decisions).
    let (mut underscore, mut xff, mut xfp, mut xfh, mut forwarded, mut via, mut marker) =
        (false, false, false, false, false, false, false);
    for name in headers.keys() {
        if *name == X_FORWARDED_FOR {
            xff = true;
        } else if *name == X_FORWARDED_PROTO {
            xfp = true;
        } else if *name == X_FORWARDED_HOST {
            xfh = true;
        } else if *name == FORWARDED {
            forwarded = true;
        } else if *name == header::VIA {
            via = true;
        } else if *name == X_REQUEST_ID {
            stamp.carried.request_id = true;
        } else if *name == TRACEPARENT {
            stamp.carried.traceparent = true;
        } else if *name == X_GATEWAY_MIRROR {
            marker = true;
        } else if let [b'x', rest @ ..] = name.as_str().as_bytes()
            && rest.contains(&b'_')
        {
            // Every name in SET_BY_POLICY starts with `x`: a first-byte test
            // spares the scan for every other header.
            underscore = true;
        }
    }
    // Read only when present: most requests carry no `Via`.
    if via && via_entry.seen_in(headers) {
        return true;
    }
    if underscore {
        remove_other_spellings(headers, SET_BY_POLICY.iter(), false);
    }
    // Only the gateway marks a copy: a client's mark would tell the
    // upstream its request is one (and, say, to send no mail).
    if marker {
        headers.remove(X_GATEWAY_MIRROR);
    }
    // An absent field is stamped (see `stamp`), a present one changed in
    // the map.
    if xff {
        add_to_list(headers, X_FORWARDED_FOR, true, client_ip.clone());
    } else {
        stamp.add(Field::ForwardedFor, client_ip.clone());
    }
    let proto = HeaderValue::from_static(if https { "https" } else { "http" });
    match (trusted, xfp) {
        (_, false) => stamp.add(Field::ForwardedProto, proto),
        (false, true) => {
            headers.insert(X_FORWARDED_PROTO, proto);
        }
        // From a trusted proxy, one line: the last, the one it added
        // after any its client sent (an upstream reading the first would
        // read the client's).
        (true, true) => last_line_only(headers, X_FORWARDED_PROTO),
    }
    if trusted && xfh {
        last_line_only(headers, X_FORWARDED_HOST);
    } else {
        match original_host {
            Some(host) if !xfh => stamp.add(Field::ForwardedHost, host.clone()),
            Some(host) => {
                headers.insert(X_FORWARDED_HOST, host.clone());
            }
            None if xfh => {
                headers.remove(X_FORWARDED_HOST);
            }
            None => {}
        }
    }
    // Only touched when present: most requests carry none, and this hop's
    // own element costs formatting.
    if forwarded {
        let element = forwarded_element(client_ip, original_host, https);
        if trusted {
            add_to_list(headers, FORWARDED, true, element);
        } else {
            headers.insert(FORWARDED, element);
        }
    }
    if via {
        add_to_list(headers, header::VIA, true, via_entry.entry(version).clone());
    } else {
        stamp.add(Field::Via, via_entry.entry(version).clone());
    }
    false
}

/// Keeps only the last line of `name` (a single-valued field).
fn last_line_only(headers: &mut HeaderMap, name: HeaderName) {
    let mut lines = headers.get_all(&name).iter();
    if let (Some(_), Some(last)) = (lines.next(), lines.next_back()) {
        let last = last.clone();
        headers.insert(name, last);
    }
}

/// This hop's `Forwarded` element: `for=...;proto=http;host=...`, quoted as
/// RFC 7239 §4 requires (IPv6 addresses in brackets, hosts with a port).
fn forwarded_element(client_ip: &HeaderValue, host: Option<&HeaderValue>, https: bool) -> HeaderValue {
    fn quoted_if_needed(out: &mut Vec<u8>, value: &[u8]) {
        let token = value.iter().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b));
        if token {
            out.extend_from_slice(value);
        } else {
            push_quoted(out, value);
        }
    }
    let mut out = b"for=".to_vec();
    let ip = client_ip.as_bytes();
    if ip.contains(&b':') {
        out.extend_from_slice(b"\"[");
        out.extend_from_slice(ip);
        out.extend_from_slice(b"]\"");
    } else {
        out.extend_from_slice(ip);
    }
    out.extend_from_slice(if https { b";proto=https" } else { b";proto=http" });
    if let Some(host) = host {
        out.extend_from_slice(b";host=");
        quoted_if_needed(&mut out, host.as_bytes());
    }
    HeaderValue::from_bytes(&out).unwrap_or_else(|_| HeaderValue::from_static("for=unknown"))
}

#[cfg(test)]
mod tests;
