//! Forwarding fields the gateway does not set but upstreams believe: kept
//! only from a trusted proxy.

use http::{HeaderMap, HeaderName};

/// Fields that tell an upstream where a request came from or how it
/// arrived, which only a proxy in front of it may say: frameworks act on
/// them (Rack takes `X-Forwarded-Ssl: on` and `X-Forwarded-Scheme` for
/// HTTPS, apps log `X-Real-IP` as the client, Envoy's upstreams take
/// `X-Forwarded-Client-Cert` as the client's certificate). Traefik removes
/// the same fields from a peer it does not trust. `X-Forwarded-For`,
/// `-Proto`, `-Host` and `Forwarded` the gateway sets itself
/// (`add_forwarding`).
pub const FROM_PROXIES_ONLY: [HeaderName; 11] = [
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
    HeaderName::from_static("x-forwarded-server"),
    HeaderName::from_static("x-forwarded-uri"),
    HeaderName::from_static("x-forwarded-method"),
    HeaderName::from_static("x-forwarded-ssl"),
    HeaderName::from_static("x-forwarded-scheme"),
    HeaderName::from_static("x-forwarded-client-cert"),
    HeaderName::from_static("x-forwarded-tls-client-cert"),
    HeaderName::from_static("x-forwarded-tls-client-cert-info"),
];

/// Removes every field [`FROM_PROXIES_ONLY`] lists, in any spelling of `-`
/// and `_` (one CGI variable to a WSGI upstream), from the request of a
/// peer that is not a trusted proxy. Done before the route's credentials
/// and header rules, so that what they set stays.
pub fn drop_proxy_only(headers: &mut HeaderMap) {
    // One pass over the names first: most requests carry none of them,
    // and a removal by name costs a hash.
    if !headers.keys().any(proxy_only) {
        return;
    }
    let found: Vec<HeaderName> = headers.keys().filter(|n| proxy_only(n)).cloned().collect();
    for name in found {
        headers.remove(name);
    }
}

/// Whether `name` is one of [`FROM_PROXIES_ONLY`] in some spelling.
fn proxy_only(name: &HeaderName) -> bool {
    let b = name.as_str().as_bytes();
    // Every listed name starts with `x-` and is 9 to 32 bytes long: a test
    // of its length and first bytes spares most names the comparisons.
    (9..=32).contains(&b.len())
        && b[0] == b'x'
        && matches!(b[1], b'-' | b'_')
        && FROM_PROXIES_ONLY.iter().any(|want| {
            let want = want.as_str().as_bytes();
            want.len() == b.len() && want.iter().zip(b).all(|(&w, &c)| w == c || (w == b'-' && c == b'_'))
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
            ("x-forwarded-for", false),
            ("x-forwarded-proto", false),
            ("x-forwarded-host", false),
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
            drop_proxy_only(&mut headers);
            assert_eq!(!headers.contains_key(name), gone, "{name}");
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
