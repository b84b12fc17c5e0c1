//! What a cache key holds besides the upstream and the path: the client's
//! `Host`, and the forwarding fields a trusted proxy passes on.

use http::HeaderMap;
use http::header;

use crate::body::Incoming;
use crate::config::HostMode;
use crate::headers::{FORWARDED, X_FORWARDED_HOST, X_FORWARDED_PROTO};
use http::Request;

/// The start of every key of a route: its upstream and its host mode (a
/// reload may change the mode and keep the store).
pub(super) fn key_start(upstream: &str, host: HostMode) -> String {
    let mode = match host {
        HostMode::Upstream => "u ",
        HostMode::Preserve => "p ",
    };
    format!("{upstream}\n{mode}")
}

/// The client's `Host`, as the key has it (before lowercasing). The
/// upstream sees it as `Host` (`host = "preserve"`) or, with its own `Host`
/// (`host = "upstream"`), as `X-Forwarded-Host` and `Forwarded: host=`,
/// which the gateway sets from it: keyed either way, or one client's `Host`
/// would choose what the others are served.
pub(super) fn client_host(req: &Request<Incoming>) -> Option<&str> {
    match req.headers().get(header::HOST) {
        Some(h) => h.to_str().ok(),
        None => req.uri().authority().map(|a| a.as_str()),
    }
}

/// The forwarding fields a trusted peer sent (`X-Forwarded-Host`,
/// `X-Forwarded-Proto`, `Forwarded`, and those only a proxy may send:
/// `X-Forwarded-Prefix`, `X-Forwarded-Ssl`, ..., in the order it sent
/// them), written for a key: they reach the upstream as sent (`Forwarded`
/// with the gateway's element after them), so an answer may depend on them
/// (a link to the forwarded host or under the forwarded prefix, a redirect
/// to `https` for a client that came over `http`), and one client's must
/// not choose what another is served. Empty for an untrusted peer, whose
/// fields the gateway replaces from the `Host` the key holds already, or
/// removes. Each field's lines in order, each byte outside visible ASCII
/// escaped (`%` too), so that no two sets of lines write the same text.
pub(super) fn passed_on(headers: &HeaderMap, trusted: bool) -> String {
    let mut out = String::new();
    if !trusted {
        return out;
    }
    for name in [X_FORWARDED_HOST, X_FORWARDED_PROTO, FORWARDED] {
        // A control byte no field value holds ends each field and starts
        // each line.
        out.push('\u{2}');
        for value in headers.get_all(&name) {
            push_line(&mut out, value);
        }
    }
    for (name, value) in headers.iter().filter(|(n, _)| crate::headers::is_proxy_only(n)) {
        out.push('\u{3}');
        out.push_str(name.as_str());
        push_line(&mut out, value);
    }
    if out.len() == 3 {
        // None of them: the key of an untrusted peer's request.
        out.clear();
    }
    out
}

/// One line of a field, escaped for [`passed_on`].
fn push_line(out: &mut String, value: &http::HeaderValue) {
    out.push('\u{1}');
    for &b in value.as_bytes() {
        match b {
            b'%' | 0..0x20 | 0x7f.. => out.push_str(&format!("%{b:02X}")),
            _ => out.push(char::from(b)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn map(fields: &[(&str, &[u8])]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (name, value) in fields {
            m.append(http::HeaderName::from_bytes(name.as_bytes()).unwrap(), HeaderValue::from_bytes(value).unwrap());
        }
        m
    }

    /// Sets of forwarding fields the upstream sees differently write
    /// different keys; an untrusted peer's, and a trusted one's without
    /// any, write none.
    #[test]
    fn passed_on_fields_are_told_apart() {
        let sets: [&[(&str, &[u8])]; 14] = [
            &[],
            &[("x-forwarded-host", b"a")],
            &[("x-forwarded-proto", b"a")],
            &[("forwarded", b"a")],
            &[("x-forwarded-host", b"a,b")],
            &[("x-forwarded-host", b"a"), ("x-forwarded-host", b"b")],
            &[("x-forwarded-host", b"")],
            &[("x-forwarded-host", b"%E9")],
            &[("x-forwarded-host", b"\xe9")],
            &[("x-forwarded-prefix", b"/a")],
            &[("x-forwarded-prefix", b"/b")],
            &[("x_forwarded_prefix", b"/a")],
            &[("x-forwarded-ssl", b"on")],
            &[("x-forwarded-host", b"a"), ("x-forwarded-ssl", b"on")],
        ];
        let keys: Vec<String> = sets.iter().map(|s| passed_on(&map(s), true)).collect();
        for (i, a) in keys.iter().enumerate() {
            for b in &keys[i + 1..] {
                assert_ne!(a, b, "{keys:?}");
            }
        }
        assert_eq!(keys[0], "");
        assert_eq!(passed_on(&map(sets[1]), false), "");
        // Not a forwarding field: not in the key.
        assert_eq!(passed_on(&map(&[("x-other", b"a")]), true), "");
    }
}
