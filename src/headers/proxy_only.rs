//! Forwarding fields the gateway does not set but upstreams believe: kept
//! only from a trusted proxy.

use http::{HeaderMap, HeaderName};

/// Fields that tell an upstream where a request came from or how it
/// arrived, which only a proxy in front of it may say and the gateway does
/// not set: frameworks act on them (Rack takes `X-Forwarded-Ssl: on` and
/// `X-Forwarded-Scheme` for HTTPS, Tornado `X-Scheme`, gunicorn
/// `X-Forwarded-Protocol`, apps log `X-Real-IP` or `True-Client-IP` as the
/// client, Envoy's upstreams take `X-Forwarded-Client-Cert` as the client's
/// certificate). Traefik removes most of them from a peer it does not
/// trust.
pub const FROM_PROXIES_ONLY: [HeaderName; 18] = [
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-forwarded-uri"),
    HeaderName::from_static("x-forwarded-method"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-forwarded-protocol"),
    HeaderName::from_static("x-scheme"),
    HeaderName::from_static("x-url-scheme"),
    HeaderName::from_static("front-end-https"),
    HeaderName::from_static("x-forwarded-client-cert"),
    HeaderName::from_static("x-forwarded-tls-client-cert"),
    HeaderName::from_static("x-forwarded-tls-client-cert-info"),
    HeaderName::from_static("true-client-ip"),
    HeaderName::from_static("x-client-ip"),
    HeaderName::from_static("x-cluster-client-ip"),
];

/// The forwarding fields the gateway replaces with its own for a peer it
/// does not trust (`add_forwarding`): taken out of such a request with the
/// others, so that a route's `headers` condition cannot be met by a value
/// the upstream never gets. (An untrusted client's `Forwarded` then gets no
/// element of this hop, as a request that carried none.)
const REPLACED: [HeaderName; 3] = [super::X_FORWARDED_PROTO, super::X_FORWARDED_HOST, super::FORWARDED];

/// Removes every field [`FROM_PROXIES_ONLY`] and [`REPLACED`] list, in any
/// spelling of `-` and `_` (one CGI variable to a WSGI upstream), from the
/// request of a peer that is not a trusted proxy. Done before the route is
/// chosen, and so before its credentials and header rules: what they set
/// stays.
pub fn drop_proxy_only(headers: &mut HeaderMap) {
    // One pass over the names first: most requests carry none of them,
    // and a removal by name costs a hash.
    if !headers.keys().any(dropped) {
        return;
    }
    let found: Vec<HeaderName> = headers.keys().filter(|n| dropped(n)).cloned().collect();
    for name in found {
        headers.remove(name);
    }
}

/// Whether `name` is one of [`FROM_PROXIES_ONLY`] in some spelling.
pub fn is_proxy_only(name: &HeaderName) -> bool {
    spelled_as(name.as_str().as_bytes(), &FROM_PROXIES_ONLY)
}

/// What [`drop_proxy_only`] takes out.
fn dropped(name: &HeaderName) -> bool {
    let b = name.as_str().as_bytes();
    // Every listed name starts with `x`, `f` or `t` and is 8 to 32 bytes
    // long (`forwarded` is 9): a test of both spares most names the
    // comparisons.
    (8..=32).contains(&b.len())
        && matches!(b[0], b'x' | b'f' | b't')
        && (spelled_as(b, &FROM_PROXIES_ONLY) || spelled_as(b, &REPLACED))
}

/// Whether `name` is one of `list`, or one with `_` where it has `-`.
fn spelled_as(name: &[u8], list: &[HeaderName]) -> bool {
    list.iter().any(|want| {
        let want = want.as_str().as_bytes();
        want.len() == name.len() && want.iter().zip(name).all(|(&w, &c)| w == c || (w == b'-' && c == b'_'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_listed_name_goes_and_nothing_else() {
        let cases = [
            ("x-real-ip", true),
            ("x_real_ip", true),
            ("x-real_ip", true),
            ("x-forwarded-prefix", true),
            ("x_forwarded_ssl", true),
            ("x-forwarded-tls-client-cert-info", true),
            ("x-forwarded-client-cert", true),
            ("x-scheme", true),
            ("front_end_https", true),
            ("true-client-ip", true),
            ("x-cluster-client-ip", true),
            ("x-forwarded-proto", true),
            ("x_forwarded_host", true),
            ("x-forwarded-for", false),
            ("forwarded", true),
            ("x-schemes", false),
            ("x-real-ips", false),
            ("x-real-i", false),
            ("y-real-ip", false),
            ("xx-real-ip", false),
            ("host", false),
            ("x-request-id", false),
        ];
        for (name, gone) in cases {
            let mut headers = HeaderMap::new();
            headers.insert(HeaderName::from_bytes(name.as_bytes()).unwrap(), "v".parse().unwrap());
            headers.append("x-real-ip-not", "kept".parse().unwrap());
            headers.insert("accept", "*/*".parse().unwrap());
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            let replaced = ["x-forwarded-proto", "x_forwarded_host", "forwarded"].contains(&name.as_str());
            assert_eq!(is_proxy_only(&name), gone && !replaced, "{name}");
            drop_proxy_only(&mut headers);
            assert_eq!(!headers.contains_key(&name), gone, "{name}");
            assert_eq!(headers.len(), if gone { 2 } else { 3 }, "{name}: only it goes");
        }
    }

    #[test]
    fn every_line_of_a_listed_field_goes() {
        let mut headers = HeaderMap::new();
        headers.append("x-real-ip", "1.2.3.4".parse().unwrap());
        headers.append("x-real-ip", "5.6.7.8".parse().unwrap());
        headers.append("x_forwarded_port", "443".parse().unwrap());
        drop_proxy_only(&mut headers);
        assert!(headers.is_empty(), "{headers:?}");
    }
}
