//! Header rules for proxying: pure functions, table-tested.
//!
//! - Hop-by-hop headers are removed in both directions: the fixed list of
//!   RFC 9110 §7.6.1 (plus the legacy `Keep-Alive` and `Proxy-Connection`)
//!   and every header named in `Connection`.
//! - The client's address is appended to `X-Forwarded-For`;
//!   `X-Forwarded-Proto` and `X-Forwarded-Host` are set (RFC 7239's
//!   de-facto predecessors, which upstreams commonly read);
//!   `Via` gets this hop appended (RFC 9110 §7.6.3).

use std::net::IpAddr;

use http::Version;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that are always hop-by-hop (RFC 9110 §7.6.1, §7.8; RFC 9112 §6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// `X-Forwarded-For`.
pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Forwarded-Host`.
pub const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Removes hop-by-hop headers, including every header named in `Connection`.
/// `Upgrade` is hop-by-hop too; the gateway does not tunnel upgrades.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one scan over the names present is cheaper
    // than a hashed removal per hop-by-hop name.
    if !headers.keys().any(|name| HOP_BY_HOP.contains(name) || name == header::UPGRADE) {
        return;
    }
    // Names listed in Connection must go before Connection itself does.
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// The `Via` token for a message of `version` passing this gateway.
fn via_value(version: Version) -> &'static str {
    match version {
        Version::HTTP_10 => "1.0 gateway",
        Version::HTTP_2 => "2 gateway",
        Version::HTTP_3 => "3 gateway",
        _ => "1.1 gateway",
    }
}

/// Appends this hop to `Via`, keeping earlier hops.
pub fn append_via(headers: &mut HeaderMap, version: Version) {
    append_list(headers, header::VIA, HeaderValue::from_static(via_value(version)));
}

/// Appends `item` to a comma-separated list header, merging existing values
/// into one line.
fn append_list(headers: &mut HeaderMap, name: HeaderName, item: HeaderValue) {
    if !headers.contains_key(&name) {
        headers.insert(name, item);
        return;
    }
    let mut joined = Vec::new();
    for v in headers.get_all(&name) {
        joined.extend_from_slice(v.as_bytes());
        joined.extend_from_slice(b", ");
    }
    joined.extend_from_slice(item.as_bytes());
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(name, v);
    }
}

/// The client's address as an `X-Forwarded-For` item. Made once per
/// connection: formatting an address costs more than the rest of the
/// forwarding rules together.
pub fn forwarded_for(ip: IpAddr) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(ip.to_string())).expect("an IP address is a valid header")
}

/// Sets the forwarding headers on a request on its way upstream.
/// `client_ip` comes from [`forwarded_for`]; `original_host` is the client's
/// `Host` (or HTTP/2 `:authority`).
pub fn add_forwarding(
    headers: &mut HeaderMap,
    client_ip: &HeaderValue,
    original_host: Option<&HeaderValue>,
    version: Version,
) {
    append_list(headers, X_FORWARDED_FOR, client_ip.clone());
    headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
    match original_host {
        Some(host) => {
            headers.insert(X_FORWARDED_HOST, host.clone());
        }
        None => {
            headers.remove(X_FORWARDED_HOST);
        }
    }
    append_via(headers, version);
}

#[cfg(test)]
mod tests {
    use super::*;

    type Pairs<'a> = &'a [(&'a str, &'a str)];

    fn map(pairs: Pairs) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<String> {
        let mut n: Vec<String> = h.keys().map(|k| k.to_string()).collect();
        n.sort();
        n
    }

    #[test]
    fn strips_fixed_and_connection_named_headers() {
        let cases: &[(Pairs, &[&str])] = &[
            (&[("connection", "close"), ("content-type", "text/plain")], &["content-type"]),
            (
                &[
                    ("connection", "X-Secret, keep-alive"),
                    ("x-secret", "1"),
                    ("keep-alive", "timeout=5"),
                    ("x-ok", "1"),
                ],
                &["x-ok"],
            ),
            (&[("connection", "x-a"), ("connection", "X-B"), ("x-a", "1"), ("x-b", "2"), ("x-c", "3")], &["x-c"]),
            (
                &[
                    ("te", "trailers"),
                    ("trailer", "x"),
                    ("transfer-encoding", "chunked"),
                    ("upgrade", "websocket"),
                    ("proxy-authorization", "Basic x"),
                    ("proxy-authenticate", "Basic"),
                    ("proxy-connection", "keep-alive"),
                    ("host", "h"),
                ],
                &["host"],
            ),
            (&[("connection", "bad header name!, x-a"), ("x-a", "1")], &[]),
            (&[("x-forwarded-for", "1.2.3.4")], &["x-forwarded-for"]),
        ];
        for (input, want) in cases {
            let mut h = map(input);
            strip_hop_by_hop(&mut h);
            assert_eq!(names(&h), *want, "{input:?}");
        }
    }

    #[test]
    fn forwarding_headers_append_and_set() {
        // (input, client Host, version, want X-Forwarded-For, want X-Forwarded-Host, want Via)
        type Case<'a> = (Pairs<'a>, Option<&'a str>, Version, &'a str, Option<&'a str>, &'a str);
        let cases: &[Case] = &[
            (&[], Some("example.com"), Version::HTTP_11, "10.0.0.1", Some("example.com"), "1.1 gateway"),
            (
                &[("x-forwarded-for", "1.1.1.1"), ("via", "1.0 edge")],
                Some("h:8080"),
                Version::HTTP_10,
                "1.1.1.1, 10.0.0.1",
                Some("h:8080"),
                "1.0 edge, 1.0 gateway",
            ),
            (
                &[("x-forwarded-for", "1.1.1.1"), ("x-forwarded-for", "2.2.2.2"), ("x-forwarded-host", "spoofed")],
                None,
                Version::HTTP_2,
                "1.1.1.1, 2.2.2.2, 10.0.0.1",
                None,
                "2 gateway",
            ),
        ];
        for (input, host, version, xff, xfh, via) in cases {
            let mut h = map(input);
            let host = host.map(HeaderValue::from_static);
            add_forwarding(&mut h, &forwarded_for("10.0.0.1".parse().unwrap()), host.as_ref(), *version);
            assert_eq!(h.get_all(X_FORWARDED_FOR).iter().count(), 1);
            assert_eq!(h[X_FORWARDED_FOR], *xff);
            assert_eq!(h[X_FORWARDED_PROTO], "http");
            assert_eq!(h.get(X_FORWARDED_HOST).map(|v| v.to_str().unwrap()), *xfh);
            assert_eq!(h[header::VIA], *via);
        }
    }
}
