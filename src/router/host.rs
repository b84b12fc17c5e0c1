//! Host names as routes name them and as requests carry them: pure
//! functions, table-tested.
//!
//! A request's host is its `:authority` (HTTP/2) or absolute-form target's
//! authority, else its `Host` field, without the port and a trailing dot,
//! in lower case. An IPv6 literal keeps its brackets, in its canonical
//! form (RFC 5952: `[0:0::1]` is `[::1]`), so any spelling of an address
//! meets the route that names it.

use std::borrow::Cow;

use http::{HeaderMap, Uri};

/// One entry of a route's `hosts`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HostPattern {
    /// A name, lower case, no trailing dot.
    Exact(String),
    /// `*.suffix`: any name ending in `.suffix`, with one label or more
    /// before it (`suffix` lower case).
    Wildcard(String),
}

impl HostPattern {
    /// Reads a route's `hosts` entry; the message says what is wrong.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let lower = text.trim_end_matches('.').to_ascii_lowercase();
        if let Some(suffix) = lower.strip_prefix("*.") {
            if !is_name(suffix) {
                return Err(format!("{text:?}: a wildcard is \"*.\" and a name, e.g. \"*.example.com\""));
            }
            return Ok(HostPattern::Wildcard(suffix.to_owned()));
        }
        if lower.starts_with('[') && lower.ends_with(']') {
            return match lower[1..lower.len() - 1].parse::<std::net::Ipv6Addr>() {
                Ok(ip) => Ok(HostPattern::Exact(format!("[{ip}]"))),
                Err(_) => Err(format!("{text:?} is not an IPv6 literal")),
            };
        }
        if lower.contains(':') {
            return Err(format!("{text:?}: name a host without a port (a request's port is ignored)"));
        }
        if !is_name(&lower) {
            return Err(format!(
                "{text:?}: use a host name (letters, digits, '-', '_', '.'), \"*.name\" or \"[ipv6]\""
            ));
        }
        Ok(HostPattern::Exact(lower))
    }

    /// As it is written in a file.
    pub fn describe(&self) -> String {
        match self {
            HostPattern::Exact(name) => name.clone(),
            HostPattern::Wildcard(suffix) => format!("*.{suffix}"),
        }
    }
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.split('.').all(|label| {
            !label.is_empty() && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The labels of a wildcard's suffix (`example.com`: 2).
pub fn labels(name: &str) -> usize {
    name.bytes().filter(|&b| b == b'.').count() + 1
}

/// The request's host as routes match it: `None` when it names none (an
/// HTTP/1.0 request without `Host`) or not as text.
pub fn request_host<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Option<Cow<'a, str>> {
    let authority = match uri.authority() {
        Some(a) => a.as_str(),
        None => headers.get(http::header::HOST)?.to_str().ok()?,
    };
    normal_host(authority)
}

/// The host an authority (`host[:port]`) names, in one spelling: without
/// the port and a trailing dot, lower case, an IPv6 literal canonical.
/// `None` for one with user-info or no host.
pub fn normal_host(authority: &str) -> Option<Cow<'_, str>> {
    if authority.contains('@') {
        return None;
    }
    let (host, _) = split_port(authority)?;
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    if let Some(ip) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')?.parse::<std::net::Ipv6Addr>().ok()) {
        return Some(Cow::Owned(format!("[{ip}]")));
    }
    Some(match host.bytes().any(|b| b.is_ascii_uppercase()) {
        true => Cow::Owned(host.to_ascii_lowercase()),
        false => Cow::Borrowed(host),
    })
}

/// An authority's host and what follows its `:` (the port), if anything;
/// `None` when something else follows the host (`[::1]x`).
pub fn split_port(authority: &str) -> Option<(&str, Option<&str>)> {
    let end = match authority.starts_with('[') {
        true => authority.find(']').map_or(authority.len(), |end| end + 1),
        false => authority.find(':').unwrap_or(authority.len()),
    };
    let (host, rest) = authority.split_at(end);
    match rest {
        "" => Some((host, None)),
        _ => Some((host, Some(rest.strip_prefix(':')?))),
    }
}

/// The suffix of `host` made of its last `n` labels, when `host` has more
/// than `n` (a wildcard never matches its own suffix).
pub fn suffix(host: &str, n: usize) -> Option<&str> {
    let mut seen = 0;
    for (i, b) in host.bytes().enumerate().rev() {
        if b == b'.' {
            seen += 1;
            if seen == n {
                return Some(&host[i + 1..]);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_parse_lower_and_refuse_ports() {
        let ok: &[(&str, HostPattern)] = &[
            ("API.Example.com", HostPattern::Exact("api.example.com".into())),
            ("example.com.", HostPattern::Exact("example.com".into())),
            ("*.Example.com", HostPattern::Wildcard("example.com".into())),
            ("*.localhost", HostPattern::Wildcard("localhost".into())),
            ("[::1]", HostPattern::Exact("[::1]".into())),
            ("[0:0:0:0:0:0:0:1]", HostPattern::Exact("[::1]".into())),
            ("[2001:DB8::0001]", HostPattern::Exact("[2001:db8::1]".into())),
            ("127.0.0.1", HostPattern::Exact("127.0.0.1".into())),
        ];
        for (text, want) in ok {
            assert_eq!(HostPattern::parse(text).as_ref(), Ok(want), "{text}");
        }
        for bad in ["example.com:80", "*", "*.", "a.*.com", "*example.com", "a..b", "", "[nope]", "a b", "x/y"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn request_host_drops_port_dot_and_case() {
        let cases: &[(&str, Option<&str>, Option<&str>)] = &[
            ("/x", Some("Api.Example.COM:8080"), Some("api.example.com")),
            ("/x", Some("example.com."), Some("example.com")),
            ("/x", Some("example.com.:80"), Some("example.com")),
            ("/x", Some("[::1]:8080"), Some("[::1]")),
            ("/x", Some("[::1]"), Some("[::1]")),
            ("/x", Some("[0::1]:80"), Some("[::1]")),
            ("/x", Some("[::0001]"), Some("[::1]")),
            ("/x", Some("[2001:DB8:0:0::1]"), Some("[2001:db8::1]")),
            ("/x", None, None),
            ("/x", Some(""), None),
            ("http://Other.example:81/x", Some("ignored.example"), Some("other.example")),
        ];
        for (target, host, want) in cases {
            let uri: Uri = target.parse().unwrap();
            let mut headers = HeaderMap::new();
            if let Some(h) = host {
                headers.insert(http::header::HOST, h.parse().unwrap());
            }
            assert_eq!(request_host(&uri, &headers).as_deref(), *want, "{target} {host:?}");
        }
    }

    #[test]
    fn suffix_takes_the_last_labels_of_a_longer_name() {
        assert_eq!(suffix("a.b.example.com", 2), Some("example.com"));
        assert_eq!(suffix("a.b.example.com", 3), Some("b.example.com"));
        assert_eq!(suffix("example.com", 2), None);
        assert_eq!(suffix("a.example.com", 2), Some("example.com"));
        assert_eq!(suffix("localhost", 1), None);
        assert_eq!(labels("example.com"), 2);
    }
}
