//! What a request is counted by: the client's address block, or a
//! header's value read as the rest of the gateway reads it, so that one
//! client, credential, cookie or host has one bucket however it is spelt.

use std::borrow::Cow;

use http::{HeaderMap, HeaderName, HeaderValue, Request, header};

use crate::headers::{cookie_line, same_cgi_name};
use crate::router::host::normal_host;

/// The value a `header:NAME` key counts `req` by, or `None` without one
/// (see [`header_key`]). Three headers are read as the gateway reads them:
/// - `Authorization` and `Proxy-Authorization`: the credential as `auth`
///   reads it (see [`credential`]);
/// - `Cookie`: its lines (an HTTP/2 client's crumbs, an HTTP/1 client's
///   lines) joined with `"; "`, as the proxy path sends them on;
/// - `Host`: the one the proxy path sends on (HTTP/2's `:authority`
///   without a `Host`), the host name as routes match it (lower case,
///   without the port and a trailing dot).
pub(super) fn header_value<'r, B>(req: &'r Request<B>, name: &HeaderName) -> Option<Cow<'r, [u8]>> {
    let headers = req.headers();
    if *name == header::HOST {
        let host = header_key(headers, name).map(HeaderValue::as_bytes);
        let host = host.or_else(|| req.uri().authority().map(|a| a.as_str().as_bytes()))?;
        // As routes match it: a port or a trailing dot of the client's
        // choosing would make each spelling a new bucket.
        return Some(match std::str::from_utf8(host).ok().and_then(normal_host) {
            Some(Cow::Borrowed(name)) => Cow::Borrowed(name.as_bytes()),
            Some(Cow::Owned(name)) => Cow::Owned(name.into_bytes()),
            None => lower_case(host),
        });
    }
    if *name == header::COOKIE {
        return cookie_line(headers);
    }
    let value = header_key(headers, name)?.as_bytes();
    if *name == header::AUTHORIZATION || *name == header::PROXY_AUTHORIZATION {
        return Some(credential(value));
    }
    Some(Cow::Borrowed(value))
}

/// The value of header `name` (in either spelling of `-` and `_`: an
/// upstream reading CGI-style variables takes both for one); `None`
/// without one, and `None` with more than one: a client that added a
/// second value of its own would get a new bucket for each, while the
/// upstream still reads the first. Such a request counts as one without
/// the header (`missing_key` decides).
fn header_key<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h HeaderValue> {
    let mut values = headers.iter().filter(|(n, _)| *n == name || same_cgi_name(n.as_str(), name.as_str()));
    let (_, value) = values.next()?;
    if values.next().is_some() {
        return None;
    }
    Some(value)
}

/// A credential (`auth-scheme [ 1*SP token68 / #auth-param ]`, RFC 9110
/// §11.4) as `auth` reads it: the scheme in lower case (it is
/// case-insensitive, §11.1), one space, the rest without the blanks
/// around it; so that each spelling of one credential is one bucket.
fn credential(value: &[u8]) -> Cow<'_, [u8]> {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let trimmed = value.trim_ascii();
    let (scheme, rest) = match trimmed.iter().position(blank) {
        Some(at) => (&trimmed[..at], trimmed[at..].trim_ascii()),
        None => (trimmed, &b""[..]),
    };
    let one_space =
        rest.is_empty() || (value.get(scheme.len()) == Some(&b' ') && value.len() == scheme.len() + 1 + rest.len());
    let canonical = trimmed.len() == value.len() && one_space && !scheme.iter().any(u8::is_ascii_uppercase);
    if canonical {
        return Cow::Borrowed(value);
    }
    let mut out = scheme.to_ascii_lowercase();
    if !rest.is_empty() {
        out.push(b' ');
        out.extend_from_slice(rest);
    }
    Cow::Owned(out)
}

fn lower_case(value: &[u8]) -> Cow<'_, [u8]> {
    if value.iter().any(u8::is_ascii_uppercase) { Cow::Owned(value.to_ascii_lowercase()) } else { Cow::Borrowed(value) }
}

/// The bucket of a client address: an IPv4 address, or an IPv6 address's
/// /64. One host is commonly given a whole /64, and keyed per address it
/// would get a fresh bucket for each of its 2^64 addresses.
pub(super) fn client_block(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            std::net::IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Version;

    #[test]
    fn an_ipv6_client_is_its_64() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        assert_eq!(client_block(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(client_block(ip("2001:db8:1:2:ffff:ffff:ffff:ffff")), ip("2001:db8:1:2::"));
        assert_ne!(client_block(ip("2001:db8:1:3::1")), client_block(ip("2001:db8:1:2::1")));
        assert_eq!(client_block(ip("192.0.2.7")), ip("192.0.2.7"));
    }

    #[test]
    fn a_header_key_is_its_one_value_in_either_spelling() {
        let name = HeaderName::from_static("x-api-key");
        let mut h = HeaderMap::new();
        assert_eq!(header_key(&h, &name), None);
        h.append("x-api-key", HeaderValue::from_static("a"));
        assert_eq!(header_key(&h, &name).unwrap(), "a");
        h.insert("x-api-keys", HeaderValue::from_static("c"));
        assert_eq!(header_key(&h, &name).unwrap(), "a", "another name is not the key");
        h.append("x_api_key", HeaderValue::from_static("b"));
        assert_eq!(header_key(&h, &name), None, "a second value, in the other spelling, is no key");
        let mut h = HeaderMap::new();
        h.append("x-api-key", HeaderValue::from_static("a"));
        h.append("x-api-key", HeaderValue::from_static("r4nd0m"));
        assert_eq!(header_key(&h, &name), None, "nor a second line");
    }

    #[test]
    fn each_spelling_of_a_credential_is_one_key() {
        let cases: &[(&str, &str)] = &[
            ("Basic YWxpY2U6cHc=", "basic YWxpY2U6cHc="),
            ("basic YWxpY2U6cHc=", "basic YWxpY2U6cHc="),
            ("BASIC    YWxpY2U6cHc=", "basic YWxpY2U6cHc="),
            ("bAsIc \t YWxpY2U6cHc=  ", "basic YWxpY2U6cHc="),
            ("Basic\tYWxpY2U6cHc=", "basic YWxpY2U6cHc="),
            ("Bearer abc.def.ghi", "bearer abc.def.ghi"),
            ("bearer\t\tabc.def.ghi", "bearer abc.def.ghi"),
            // The token itself keeps its case: base64 and tokens are case-sensitive.
            ("Bearer ABC.def.ghi", "bearer ABC.def.ghi"),
            ("Negotiate", "negotiate"),
            ("Digest  username=\"a\", realm=\"r\"", "digest username=\"a\", realm=\"r\""),
        ];
        for (sent, key) in cases {
            assert_eq!(credential(sent.as_bytes()), key.as_bytes(), "{sent:?}");
        }
        assert!(matches!(credential(b"basic YWxpY2U6cHc="), Cow::Borrowed(_)), "the canonical spelling is not copied");
    }

    fn request(version: Version, uri: &str, headers: &[(&str, &str)]) -> Request<()> {
        let mut req = Request::builder().version(version).uri(uri);
        for (n, v) in headers {
            req = req.header(*n, *v);
        }
        req.body(()).unwrap()
    }

    #[test]
    fn http2_cookie_crumbs_and_authority() {
        let cookie = HeaderName::from_static("cookie");
        let crumbs = [("cookie", "a=1"), ("cookie", "b=2"), ("cookie", "c=3")];
        let h2 = request(Version::HTTP_2, "https://Example.com/", &crumbs);
        assert_eq!(header_value(&h2, &cookie).unwrap(), &b"a=1; b=2; c=3"[..]);
        let one = request(Version::HTTP_2, "/", &[("cookie", "a=1; b=2; c=3")]);
        assert_eq!(header_value(&one, &cookie), header_value(&h2, &cookie), "one bucket, crumbs or not");
        let h1 = request(Version::HTTP_11, "/", &crumbs[..2]);
        assert_eq!(
            header_value(&h1, &cookie).unwrap(),
            &b"a=1; b=2"[..],
            "HTTP/1 lines are joined as the upstream gets them"
        );
        let host = header::HOST;
        assert_eq!(header_value(&h2, &host).unwrap(), &b"example.com"[..], ":authority without a Host");
        let both = request(Version::HTTP_11, "/", &[("host", "API.example")]);
        assert_eq!(header_value(&both, &host).unwrap(), &b"api.example"[..]);
        for spelt in ["api.example:1", "API.example.", "api.example.:80", "api.example:019210"] {
            let one = request(Version::HTTP_11, "/", &[("host", spelt)]);
            assert_eq!(header_value(&one, &host).unwrap(), &b"api.example"[..], "{spelt}: one bucket");
        }
        let v6 = request(Version::HTTP_11, "/", &[("host", "[0:0::1]:8080")]);
        assert_eq!(header_value(&v6, &host).unwrap(), &b"[::1]"[..]);
        assert_eq!(header_value(&request(Version::HTTP_11, "/", &[]), &host), None);
    }
}
