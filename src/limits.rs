//! Request screening and per-route load shedding.
//!
//! [`screen`] is a pure function over a request head: it refuses what a
//! gateway must never forward (ambiguous framing, targets that would let a
//! client pick another host, malformed encoding) and what passes a
//! configured limit, before any byte goes upstream. Malformed request lines,
//! header names, duplicate or obfuscated `Content-Length`/`Transfer-Encoding`
//! and oversized heads never get this far: hyper refuses them with 400, 414
//! or 431 and closes the connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Uri, Version};

use crate::error::GatewayError;

/// The most header fields a request may have: httparse's storage for an
/// HTTP/1.1 head (hyper's HTTP/1.1 server's limit too), and a count
/// [`screen`] holds an HTTP/2 request to, whose fields would otherwise be
/// bounded only by their bytes.
pub const MAX_FIELDS: usize = 100;

/// Whether every `%` in `s` starts a two-hex-digit escape.
pub fn valid_percent_encoding(s: &str) -> bool {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            if i + 2 >= b.len() || !b[i + 1].is_ascii_hexdigit() || !b[i + 2].is_ascii_hexdigit() {
                return false;
            }
            i += 3;
        } else {
            i += 1;
        }
    }
    true
}

/// HTTP/2 and later, given the request's `hosts` Host fields (the first
/// one `host`): a Host field is optional beside `:authority`, but two are
/// as ambiguous as in HTTP/1; and one naming another entity than
/// `:authority` is malformed (RFC 9113 §8.3.1): the upstream would be sent
/// the Host, while the client's view of whom it asked is `:authority`.
pub fn h2_host(hosts: usize, host: Option<&HeaderValue>, uri: &Uri) -> Result<(), GatewayError> {
    if hosts > 1 {
        return Err(GatewayError::BadRequest("more than one Host header"));
    }
    if let (Some(host), Some(authority)) = (host, uri.authority())
        && !host.as_bytes().eq_ignore_ascii_case(authority.as_str().as_bytes())
        && !same_entity(host, authority.as_str(), uri.scheme_str())
    {
        return Err(GatewayError::BadRequest("Host differs from :authority"));
    }
    Ok(())
}

/// Whether `host` and `authority` name one entity once both are normalised
/// (RFC 9113 §8.3.1, RFC 3986 §6.2): the host as routes compare it, the
/// port with the scheme's default for none or an empty one.
fn same_entity(host: &HeaderValue, authority: &str, scheme: Option<&str>) -> bool {
    use crate::router::host::{normal_host, split_port};
    let Ok(host) = host.to_str() else { return false };
    let default = if scheme == Some("https") { 443 } else { 80 };
    let port = |a| match split_port(a)?.1 {
        None | Some("") => Some(default),
        Some(p) if p.bytes().all(|b| b.is_ascii_digit()) => p.parse::<u16>().ok(),
        Some(_) => None,
    };
    let named = |a| normal_host(a).zip(port(a));
    named(host).is_some_and(|h| Some(h) == named(authority))
}

/// A screened request's declared body length (its `Content-Length`),
/// held apart from [`screen`]'s other checks: the server compares it with
/// the route's `max_body` only once the route's address lists have
/// admitted the client, so that a refused client learns nothing of that
/// limit (403, never 413).
#[derive(Debug, Clone, Copy)]
#[must_use]
pub struct Declared(Option<u64>);

impl Declared {
    /// A body declared longer than `max_body` is refused (413).
    pub fn within(self, max_body: u64) -> Result<(), GatewayError> {
        match self.0 {
            Some(n) if n > max_body => Err(GatewayError::BodyTooLarge { limit: max_body }),
            _ => Ok(()),
        }
    }
}

/// Checks a request head before it is routed to a target: its shape, its
/// target's length (`max_uri_length`) and its count of fields. Its declared body length is
/// returned, for [`Declared::within`].
pub fn screen(
    method: &Method,
    uri: &Uri,
    version: Version,
    headers: &HeaderMap,
    max_uri_length: u64,
) -> Result<Declared, GatewayError> {
    let target_len = uri.path_and_query().map_or(0, |pq| pq.as_str().len()) as u64;
    if target_len > max_uri_length {
        return Err(GatewayError::UriTooLong { limit: max_uri_length });
    }
    if method == Method::CONNECT {
        return Err(GatewayError::BadRequest("CONNECT is not supported"));
    }
    // RFC 9112 §3.2.4: the asterisk form asks about the server as a whole,
    // with OPTIONS only; with another method it names no resource.
    if uri.path() == "*" && method != Method::OPTIONS {
        return Err(GatewayError::BadRequest("asterisk-form request target with a method other than OPTIONS"));
    }
    // What the checks below need of the headers, in one pass over them
    // rather than four lookups, each of which hashes its name (see
    // benches/README.md, Decisions).
    let (mut hosts, mut host, mut chunked, mut declared, mut crumbs) = (0usize, None, false, None, 0usize);
    for (name, value) in headers {
        if *name == header::COOKIE {
            crumbs += 1;
        } else if *name == header::HOST {
            hosts += 1;
            host = host.or(Some(value));
        } else if *name == header::TRANSFER_ENCODING {
            chunked = true;
        } else if *name == header::CONTENT_LENGTH && declared.is_none() {
            declared = Some(value);
        }
    }
    // An HTTP/2 client sends each cookie as a field of its own (RFC 9113
    // §8.2.3), which the upstream gets as one line.
    if headers.len() - crumbs.saturating_sub(1) > MAX_FIELDS {
        return Err(GatewayError::TooManyFields { limit: MAX_FIELDS });
    }
    if version <= Version::HTTP_11 {
        // HTTP/2 carries scheme and authority in every request; in HTTP/1 an
        // absolute-form target would let the client name another host.
        if uri.scheme().is_some() || uri.authority().is_some() {
            return Err(GatewayError::BadRequest("absolute-form request target"));
        }
        // RFC 9112 §3.2: a request without exactly one Host is refused with
        // 400. HTTP/1.0 allows it, but a gateway routing on Host does not.
        match hosts {
            1 => {}
            0 => return Err(GatewayError::BadRequest("missing Host header")),
            _ => return Err(GatewayError::BadRequest("more than one Host header")),
        }
    } else {
        h2_host(hosts, host, uri)?;
    }
    // RFC 9112 §6.1: both framings at once is a smuggling shape; refuse and
    // close rather than pick one.
    if chunked && declared.is_some() {
        return Err(GatewayError::BadRequest("both Content-Length and Transfer-Encoding"));
    }
    if !valid_percent_encoding(uri.path()) || !uri.query().is_none_or(valid_percent_encoding) {
        return Err(GatewayError::BadRequest("malformed percent-encoding"));
    }
    Ok(Declared(declared.and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok())))
}

/// A route's `max_concurrent`: requests past it are shed at once.
#[derive(Debug)]
pub struct ConcurrencyLimit {
    limit: usize,
    /// The requests admitted and not yet done, shared with the limit a
    /// reload made of this one (see [`ConcurrencyLimit::with_limit`]).
    current: Arc<AtomicUsize>,
}

impl ConcurrencyLimit {
    pub fn new(limit: usize) -> Self {
        ConcurrencyLimit { limit, current: Arc::new(AtomicUsize::new(0)) }
    }

    /// The same count under another limit, for a reload that changed it:
    /// the requests in flight hold slots of the new one, so a lower limit
    /// takes them back as they finish and a higher one frees only the
    /// difference.
    pub fn with_limit(&self, limit: usize) -> Self {
        ConcurrencyLimit { limit, current: self.current.clone() }
    }

    /// The limit.
    pub fn max(&self) -> usize {
        self.limit
    }

    /// A slot, or `Overloaded` when all are taken.
    pub fn try_acquire(&self) -> Result<Slot<'_>, GatewayError> {
        let taken = self.current.fetch_add(1, Ordering::AcqRel);
        let slot = Slot(&self.current);
        if taken >= self.limit {
            return Err(GatewayError::Overloaded { limit: self.limit });
        }
        Ok(slot)
    }
}

/// Frees its slot on drop.
#[derive(Debug)]
pub struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(method: &str, target: &str, version: Version, headers: &[(&str, &str)]) -> Result<(), u16> {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        screen(&Method::from_bytes(method.as_bytes()).unwrap(), &target.parse().unwrap(), version, &h, 64)
            .and_then(|declared| declared.within(100))
            .map_err(|e| e.status().as_u16())
    }

    #[test]
    fn screen_table() {
        const HTTP_10: Version = Version::HTTP_10;
        const HTTP_11: Version = Version::HTTP_11;
        const HTTP_2: Version = Version::HTTP_2;
        let host = [("host", "x")];
        type Case<'a> = (&'a str, &'a str, Version, Vec<(&'a str, &'a str)>, Result<(), u16>);
        let long_ok = format!("/{}", "a".repeat(63));
        let long_bad = format!("/{}", "a".repeat(64));
        let names: Vec<String> = (0..=MAX_FIELDS).map(|i| format!("x-{i}")).collect();
        let fields = |n: usize| names[..n].iter().map(|n| (n.as_str(), "v")).collect::<Vec<_>>();
        let cases: Vec<Case> = vec![
            ("GET", "/a?b=c", HTTP_11, host.to_vec(), Ok(())),
            ("GET", "/a%20b", HTTP_11, host.to_vec(), Ok(())),
            ("GET", "/a", HTTP_10, host.to_vec(), Ok(())),
            ("GET", "/a", HTTP_11, vec![], Err(400)),
            ("GET", "/a", HTTP_10, vec![], Err(400)),
            ("GET", "/a", HTTP_11, vec![("host", "x"), ("host", "y")], Err(400)),
            ("GET", "http://evil.example/a", HTTP_11, host.to_vec(), Err(400)),
            ("GET", "http://x/a", HTTP_2, vec![], Ok(())),
            // HTTP/2: a Host beside `:authority` must name the same, and
            // comes once at most.
            ("GET", "http://x/a", HTTP_2, host.to_vec(), Ok(())),
            ("GET", "http://x:8080/a", HTTP_2, vec![("host", "X:8080")], Ok(())),
            ("GET", "http://x/a", HTTP_2, vec![("host", "evil.example")], Err(400)),
            ("GET", "http://x/a", HTTP_2, vec![("host", "x:8080")], Err(400)),
            // Spelt otherwise, the same entity (RFC 3986 §6.2).
            ("GET", "http://x/a", HTTP_2, vec![("host", "x:80")], Ok(())),
            ("GET", "http://x:80/a", HTTP_2, vec![("host", "X")], Ok(())),
            ("GET", "http://x/a", HTTP_2, vec![("host", "x:")], Ok(())),
            ("GET", "https://x/a", HTTP_2, vec![("host", "x:443")], Ok(())),
            ("GET", "https://x/a", HTTP_2, vec![("host", "x:80")], Err(400)),
            ("GET", "http://x/a", HTTP_2, vec![("host", "x.")], Ok(())),
            ("GET", "http://[::1]/a", HTTP_2, vec![("host", "[0::1]")], Ok(())),
            ("GET", "http://[::1]:8080/a", HTTP_2, vec![("host", "[::1]:80")], Err(400)),
            ("GET", "http://[::1]/a", HTTP_2, vec![("host", "[::2]")], Err(400)),
            ("GET", "http://x/a", HTTP_2, vec![("host", "x:080")], Ok(())),
            ("GET", "http://x/a", HTTP_2, vec![("host", "x:99999")], Err(400)),
            ("GET", "http://x/a", HTTP_2, vec![("host", "y.x")], Err(400)),
            ("GET", "http://[::1]/a", HTTP_2, vec![("host", "[::1]evil.example")], Err(400)),
            ("GET", "http://[::1]/a", HTTP_2, vec![("host", "[::1]]")], Err(400)),
            ("GET", "http://x/a", HTTP_2, vec![("host", "x:+80")], Err(400)),
            ("GET", "http://x/a", HTTP_2, vec![("host", "x"), ("host", "x")], Err(400)),
            ("GET", "/a", HTTP_2, host.to_vec(), Ok(())),
            ("CONNECT", "evil.example:443", HTTP_11, host.to_vec(), Err(400)),
            ("OPTIONS", "*", HTTP_11, host.to_vec(), Ok(())),
            ("GET", "*", HTTP_11, host.to_vec(), Err(400)),
            ("HEAD", "*", HTTP_10, host.to_vec(), Err(400)),
            ("POST", "*", HTTP_11, host.to_vec(), Err(400)),
            ("GET", "/a%zz", HTTP_11, host.to_vec(), Err(400)),
            ("GET", "/a?q=%G1", HTTP_11, host.to_vec(), Err(400)),
            ("GET", "/a%2", HTTP_11, host.to_vec(), Err(400)),
            (
                "POST",
                "/a",
                HTTP_11,
                vec![("host", "x"), ("content-length", "5"), ("transfer-encoding", "chunked")],
                Err(400),
            ),
            ("POST", "/a", HTTP_11, vec![("host", "x"), ("content-length", "100")], Ok(())),
            ("POST", "/a", HTTP_11, vec![("host", "x"), ("content-length", "101")], Err(413)),
            // The headers are read in one pass: order and neighbours do
            // not matter, and only the exact names count.
            ("GET", "/a", HTTP_11, vec![("accept", "*/*"), ("x-host", "y"), ("host", "x"), ("hostx", "z")], Ok(())),
            ("GET", "/a", HTTP_11, vec![("x-host", "y"), ("accept", "*/*")], Err(400)),
            ("GET", "/a", HTTP_11, vec![("host", "x"), ("accept", "*/*"), ("host", "x"), ("host", "x")], Err(400)),
            ("POST", "/a", HTTP_11, vec![("transfer-encoding", "chunked"), ("accept", "*/*"), ("host", "x")], Ok(())),
            (
                "POST",
                "/a",
                HTTP_11,
                vec![("transfer-encoding", "chunked"), ("host", "x"), ("accept", "*/*"), ("content-length", "5")],
                Err(400),
            ),
            (
                "POST",
                "/a",
                HTTP_11,
                vec![("content-length", "101"), ("host", "x"), ("x-content-length", "1")],
                Err(413),
            ),
            ("POST", "/a", HTTP_11, vec![("x-content-length", "101"), ("host", "x")], Ok(())),
            // The first Content-Length is the one checked (hyper refuses a
            // head whose values differ before it gets here).
            ("POST", "/a", HTTP_11, vec![("host", "x"), ("content-length", "5"), ("content-length", "101")], Ok(())),
            ("GET", &long_ok, HTTP_11, host.to_vec(), Ok(())),
            ("GET", &long_bad, HTTP_11, host.to_vec(), Err(414)),
            // As many fields as an HTTP/1.1 head may have, and one more.
            ("GET", "http://x/a", HTTP_2, fields(MAX_FIELDS), Ok(())),
            ("GET", "http://x/a", HTTP_2, fields(MAX_FIELDS + 1), Err(431)),
            // Cookie crumbs count as the one line they become.
            ("GET", "http://x/a", HTTP_2, [fields(MAX_FIELDS - 1), vec![("cookie", "a=1"); 50]].concat(), Ok(())),
            ("GET", "http://x/a", HTTP_2, [fields(MAX_FIELDS), vec![("cookie", "a=1"); 2]].concat(), Err(431)),
        ];
        for (method, target, version, headers, want) in cases {
            assert_eq!(check(method, target, version, &headers), want, "{method} {target} {version:?} {headers:?}");
        }
    }

    #[test]
    fn concurrency_limit_sheds_past_the_limit_and_frees_slots() {
        let limit = ConcurrencyLimit::new(2);
        let a = limit.try_acquire().unwrap();
        let _b = limit.try_acquire().unwrap();
        assert!(matches!(limit.try_acquire(), Err(GatewayError::Overloaded { limit: 2 })));
        drop(a);
        assert!(limit.try_acquire().is_ok());
    }

    /// A reload's changed limit counts the slots the old one handed out.
    #[test]
    fn a_changed_limit_keeps_the_count() {
        let old = ConcurrencyLimit::new(2);
        let held = [old.try_acquire().unwrap(), old.try_acquire().unwrap()];
        let lower = old.with_limit(1);
        assert!(matches!(lower.try_acquire(), Err(GatewayError::Overloaded { limit: 1 })));
        let higher = old.with_limit(3);
        let third = higher.try_acquire().unwrap();
        assert!(higher.try_acquire().is_err());
        drop(held);
        drop(third);
        assert!(lower.try_acquire().is_ok());
    }
}
