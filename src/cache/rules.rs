//! The RFC 9111 rules as pure functions of heads and clocks: what may be
//! stored, for how long it is fresh, how long it may be served stale, what
//! the request's own directives ask, and whether a client's conditional
//! matches. Table-tested here and property-tested against the RFC's rules.
//!
//! Storability, freshness and age are computed here, from the head the
//! cache judges (see `targeted`: a targeted field's directives stand for
//! `Cache-Control` there). They were the `http-cache-semantics` crate's
//! once; its storability refused statuses RFC 9111 §3 lets a cache store
//! (a 500 with `max-age`), knew nothing of `must-understand` or targeted
//! fields, read `Authorization`'s `public` with a comma split, and copied
//! and parsed both heads on every miss. It gave a `proxy-revalidate` or a
//! `Set-Cookie` response a lifetime of zero (RFC 9111 gives neither that
//! meaning), had no fixed default lifetime, and knew nothing of RFC 5861's
//! stale windows.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use http::header::{self, HeaderMap, HeaderName};
use http::{Method, StatusCode};

use crate::headers::cookie_line;

/// Statuses a shared cache may store without explicit freshness
/// (RFC 9110 §15.1), as the issue lists them.
const CACHEABLE_BY_DEFAULT: [u16; 11] = [200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501];

/// Upstream answers after which a stale entry in its `stale-if-error`
/// window is served instead (RFC 5861 §4).
pub const ERROR_STATUSES: [u16; 4] = [500, 502, 503, 504];

/// The `Cache-Control` directives the cache acts on, of a request or a
/// response (RFC 9111 §5.2). A number that does not parse counts as 0: an
/// invalid freshness makes the response stale (§4.2.1).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Directives {
    pub no_store: bool,
    pub no_cache: bool,
    pub private: bool,
    pub public: bool,
    pub must_revalidate: bool,
    pub proxy_revalidate: bool,
    pub only_if_cached: bool,
    pub must_understand: bool,
    pub max_age: Option<u64>,
    pub s_maxage: Option<u64>,
    pub stale_while_revalidate: Option<u64>,
    pub stale_if_error: Option<u64>,
}

impl Directives {
    /// The directives of every `Cache-Control` line in `headers`; a request's
    /// `Pragma: no-cache` counts as `no-cache` when it has no
    /// `Cache-Control` (RFC 9111 §5.4).
    pub fn of(headers: &HeaderMap) -> Directives {
        let mut d = Directives::default();
        let lines = headers.get_all(header::CACHE_CONTROL).iter().filter_map(|v| v.to_str().ok());
        for (name, value) in lines.flat_map(directives) {
            // The first of repeated numbers counts (§4.2.1); one too large
            // counts as 2^31 (§1.2.2); one that does not parse as 0.
            let seconds = |now: Option<u64>| {
                now.or_else(|| {
                    let v = value.unwrap_or("");
                    let digits = !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit());
                    Some(if digits { v.parse().unwrap_or(DELTA_MAX).min(DELTA_MAX) } else { 0 })
                })
            };
            match name.to_ascii_lowercase().as_str() {
                "no-store" => d.no_store = true,
                "no-cache" => d.no_cache = true,
                "private" => d.private = true,
                "public" => d.public = true,
                "must-revalidate" => d.must_revalidate = true,
                "proxy-revalidate" => d.proxy_revalidate = true,
                "only-if-cached" => d.only_if_cached = true,
                "must-understand" => d.must_understand = true,
                "max-age" => d.max_age = seconds(d.max_age),
                "s-maxage" => d.s_maxage = seconds(d.s_maxage),
                "stale-while-revalidate" => d.stale_while_revalidate = seconds(d.stale_while_revalidate),
                "stale-if-error" => d.stale_if_error = seconds(d.stale_if_error),
                _ => {}
            }
        }
        if !headers.contains_key(header::CACHE_CONTROL)
            && headers.get_all(header::PRAGMA).iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"no-cache"))
        {
            d.no_cache = true;
        }
        d
    }
}

/// Which of the request fields the cache acts on (besides `Host` and a
/// stored answer's `Vary`) a request has, found in one pass over its
/// names: most requests have none, and a lookup for each cost more.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Present {
    /// `Cache-Control` or `Pragma`.
    pub directives: bool,
    /// `If-None-Match` or `If-Modified-Since`.
    pub conditional: bool,
    pub upgrade: bool,
    pub range: bool,
}

impl Present {
    pub fn of(request: &HeaderMap) -> Present {
        let mut p = Present::default();
        for name in request.keys() {
            if *name == header::CACHE_CONTROL || *name == header::PRAGMA {
                p.directives = true;
            } else if *name == header::IF_NONE_MATCH || *name == header::IF_MODIFIED_SINCE {
                p.conditional = true;
            } else if *name == header::UPGRADE {
                p.upgrade = true;
            } else if *name == header::RANGE {
                p.range = true;
            }
        }
        p
    }
}

/// The largest delta-seconds a cache need represent (RFC 9111 §1.2.2).
pub const DELTA_MAX: u64 = 2_147_483_648;

/// The directives of one `Cache-Control` line as `(name, argument)`, the
/// argument unquoted: a comma inside a quoted string does not start a
/// directive (RFC 9110 §5.6.4). Hand-written: the `http` crate has no
/// directive parser.
fn directives(line: &str) -> impl Iterator<Item = (&str, Option<&str>)> {
    let mut rest = line;
    std::iter::from_fn(move || {
        loop {
            if rest.is_empty() {
                return None;
            }
            let (mut quoted, mut escaped, mut end) = (false, false, rest.len());
            for (i, c) in rest.char_indices() {
                match c {
                    _ if escaped => escaped = false,
                    '\\' if quoted => escaped = true,
                    '"' => quoted = !quoted,
                    ',' if !quoted => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            let item = &rest[..end];
            rest = rest.get(end + 1..).unwrap_or("");
            let (name, value) = match item.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim())),
                None => (item.trim(), None),
            };
            if name.is_empty() {
                continue;
            }
            let value = value.map(|v| v.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(v));
            return Some((name, value));
        }
    })
}

/// What a request's own directives ask of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Use the cache as usual.
    Normal,
    /// `no-cache` or `max-age=0`: a stored answer only after revalidation.
    Revalidate,
    /// `no-store`: neither looked up nor stored.
    Bypass,
}

/// The request's ask, whether it said `only-if-cached`, and its `max-age`
/// (the oldest answer it takes).
pub fn ask(request: &HeaderMap) -> (Ask, bool, Option<u64>) {
    let d = Directives::of(request);
    let ask = if d.no_store {
        Ask::Bypass
    } else if d.no_cache || d.max_age == Some(0) {
        Ask::Revalidate
    } else {
        Ask::Normal
    };
    (ask, d.only_if_cached, d.max_age)
}

/// How long a response is fresh from its generation (RFC 9111 §4.2.1):
/// `s-maxage`, then `max-age`, then `Expires` − `Date`, then
/// `default_ttl`. `None`: it states none and there is no default. A
/// response's `no-cache` (§5.2.2.4) may be stored but never used without
/// revalidation: its lifetime is zero, whatever else it says, and with a
/// validator it is stored even when it states none (to be revalidated
/// with a conditional rather than fetched whole).
pub fn lifetime(response: &HeaderMap, d: &Directives, default_ttl: Duration) -> Option<Duration> {
    let stated = stated_lifetime(response, d, default_ttl);
    if d.no_cache { (stated.is_some() || has_validator(response)).then_some(Duration::ZERO) } else { stated }
}

fn stated_lifetime(response: &HeaderMap, d: &Directives, default_ttl: Duration) -> Option<Duration> {
    if let Some(s) = d.s_maxage.or(d.max_age) {
        return Some(Duration::from_secs(s));
    }
    if let Some(expires) = response.get(header::EXPIRES) {
        // An invalid Expires (such as "0") is in the past (§5.3).
        let Some(expires) = expires.to_str().ok().and_then(|e| httpdate::parse_http_date(e).ok()) else {
            return Some(Duration::ZERO);
        };
        let date =
            response.get(header::DATE).and_then(|v| v.to_str().ok()).and_then(|v| httpdate::parse_http_date(v).ok());
        let date = date.unwrap_or_else(SystemTime::now);
        return Some(expires.duration_since(date).unwrap_or_default());
    }
    (!default_ttl.is_zero()).then_some(default_ttl)
}

/// Whether the cache may store `response` (RFC 9111 §3, with the issue's
/// stricter rules: never with `Set-Cookie`, never a 206 or a 304, never
/// `Vary: *`, never without a lifetime). A status not cacheable by default
/// is stored with explicit freshness, whatever it is (a 500 with
/// `max-age`); with `must-understand` only a status the cache understands
/// (see [`understood`]) is, and then `no-store` is ignored (§5.2.2.3).
/// The request's part is [`storable_for`].
pub fn storable_by_head(status: StatusCode, response: &HeaderMap, lifetime: Option<Duration>) -> bool {
    let d = Directives::of(response);
    let explicit = d.s_maxage.is_some() || d.max_age.is_some() || response.contains_key(header::EXPIRES);
    let never = [StatusCode::PARTIAL_CONTENT, StatusCode::NOT_MODIFIED];
    let status_ok = !status.is_informational()
        && !never.contains(&status)
        && (CACHEABLE_BY_DEFAULT.contains(&status.as_u16()) || explicit);
    let no_store = if d.must_understand { !understood(status) } else { d.no_store };
    status_ok
        && !d.private
        && !no_store
        && !response.contains_key(header::SET_COOKIE)
        && !vary_names(response).any(|n| n == "*")
        && lifetime.is_some()
}

/// Whether the cache understands a status's caching requirements (RFC 9111
/// §5.2.2.3): one HTTP registers (a name the `http` crate knows), final,
/// and not one it never stores (206, 304).
pub fn understood(status: StatusCode) -> bool {
    status.canonical_reason().is_some()
        && !status.is_informational()
        && status != StatusCode::PARTIAL_CONTENT
        && status != StatusCode::NOT_MODIFIED
}

/// Whether a shared cache may store an answer with directives `d` to a
/// request with headers `request`: never when the request said `no-store`
/// (RFC 9111 §5.2.1.5); with `Authorization` (§3.5) only one whose own
/// directives allow it (`public`, `must-revalidate`, `s-maxage`), read with
/// the quote-aware parser of [`Directives`]: a `public` inside another
/// directive's quoted argument is not one.
pub fn storable_for(request: &HeaderMap, d: &Directives) -> bool {
    let shared = !request.contains_key(header::AUTHORIZATION) || d.public || d.must_revalidate || d.s_maxage.is_some();
    shared && !(request.contains_key(header::CACHE_CONTROL) && Directives::of(request).no_store)
}

/// The header names a response's `Vary` lists, lowercased and trimmed.
pub fn vary_names(response: &HeaderMap) -> impl Iterator<Item = String> + '_ {
    response
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
}

/// Request fields whose syntax is no list (RFC 9110 §5.6.1): whitespace
/// and commas inside them may matter upstream, so their values are compared
/// as sent. Any other field, one the gateway knows as a list or one it does
/// not know, is compared by its members (RFC 9111 §4.1 and the public cache
/// test suite's `vary-normalise-*`: lines combined, whitespace around the
/// commas dropped).
const SINGLETONS: [HeaderName; 13] = [
    header::USER_AGENT,
    header::REFERER,
    header::AUTHORIZATION,
    header::PROXY_AUTHORIZATION,
    header::ORIGIN,
    header::HOST,
    header::FROM,
    header::CONTENT_TYPE,
    header::RANGE,
    header::IF_MODIFIED_SINCE,
    header::IF_UNMODIFIED_SINCE,
    header::IF_RANGE,
    // RFC 7089: a date, with a comma in it.
    HeaderName::from_static("accept-datetime"),
];

/// A request header's value as a `Vary` key compares it (RFC 9111 §4.1):
/// a list field's members from all its lines (RFC 9110 §5.3), trimmed,
/// empty ones dropped, whitespace inside them kept; `Cookie` as the
/// upstream gets it (its lines, an HTTP/2 request's crumbs or an HTTP/1
/// request's, joined with `"; "`); a field that is no list as sent, each
/// line apart.
pub fn vary_value(request: &HeaderMap, name: &HeaderName) -> Option<String> {
    let mut lines = request.get_all(name).iter().peekable();
    lines.peek()?;
    let joined: Cow<'_, [u8]> = match name {
        n if *n == header::COOKIE => cookie_line(request)?,
        // A line break, which no field value holds, keeps two lines apart
        // from one line holding both.
        _ => Cow::Owned(lines.map(|v| v.as_bytes()).collect::<Vec<_>>().join(&b'\n')),
    };
    let Ok(text) = std::str::from_utf8(&joined) else {
        // Kept as its bytes in hex behind a NUL, which no field value
        // holds: never equal to another value.
        return Some(std::iter::once("\0".to_owned()).chain(joined.iter().map(|b| format!("{b:02x}"))).collect());
    };
    if *name == header::COOKIE || SINGLETONS.contains(name) {
        return Some(text.to_owned());
    }
    Some(text.split('\n').flat_map(members).collect::<Vec<_>>().join(","))
}

/// The members of a list line (RFC 9110 §5.6.1): split at commas outside
/// quoted strings (which may hold one), trimmed of whitespace, empty ones
/// dropped.
fn members(line: &str) -> impl Iterator<Item = &str> {
    let mut rest = line;
    std::iter::from_fn(move || {
        while !rest.is_empty() {
            let (mut quoted, mut escaped) = (false, false);
            let end = rest
                .bytes()
                .position(|b| {
                    match b {
                        _ if escaped => escaped = false,
                        b'\\' if quoted => escaped = true,
                        b'"' => quoted = !quoted,
                        b',' if !quoted => return true,
                        _ => {}
                    }
                    false
                })
                .unwrap_or(rest.len());
            let member = rest[..end].trim_matches([' ', '\t']);
            rest = rest.get(end + 1..).unwrap_or("");
            if !member.is_empty() {
                return Some(member);
            }
        }
        None
    })
}

/// How long past its freshness an entry may be served stale: `window`
/// (the route's) or the response's own directive, whichever is longer,
/// and not at all when the response forbids serving it stale
/// (`must-revalidate`, `proxy-revalidate`, `no-cache`; §4.2.4, §5.2.2).
/// `s-maxage` means `proxy-revalidate` to a shared cache (§5.2.2.10): only
/// the response's own window (RFC 5861, its origin's say) applies then.
pub fn stale_window(d: &Directives, own: Option<u64>, window: Duration) -> Duration {
    if d.must_revalidate || d.proxy_revalidate || d.no_cache {
        return Duration::ZERO;
    }
    let own = Duration::from_secs(own.unwrap_or(0));
    if d.s_maxage.is_some() {
        return own;
    }
    window.max(own)
}

/// A client's `If-None-Match` / `If-Modified-Since` against a stored head
/// (RFC 9110 §13.1.2, §13.1.3): `true` answers 304. `If-None-Match` wins
/// when both are present; its comparison is weak.
pub fn not_modified(method: &Method, request: &HeaderMap, stored: &HeaderMap) -> bool {
    if method != Method::GET && method != Method::HEAD {
        return false;
    }
    let weak = |t: &str| t.trim().trim_start_matches("W/").to_owned();
    if let Some(inm) = request.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()) {
        let Some(etag) = stored.get(header::ETAG).and_then(|v| v.to_str().ok()) else {
            return false;
        };
        return inm.trim() == "*" || inm.split(',').any(|t| weak(t) == weak(etag));
    }
    let date = |h: &HeaderMap, n| {
        h.get(n).and_then(|v: &http::HeaderValue| v.to_str().ok()).and_then(|v| httpdate::parse_http_date(v).ok())
    };
    match (date(request, header::IF_MODIFIED_SINCE), date(stored, header::LAST_MODIFIED)) {
        (Some(since), Some(modified)) => modified <= since,
        _ => false,
    }
}

/// Whether a 304 with head `not_modified` selects the stored answer with
/// head `stored` for update (RFC 9111 §4.3.4): a strong `ETag` must be the
/// stored one's, strongly; a weak one must match it weakly; a 304 with no
/// `ETag` and a `Last-Modified` must have the stored one's. One with
/// neither answered the stored validators the gateway sent: it selects.
pub fn selects(stored: &HeaderMap, not_modified: &HeaderMap) -> bool {
    fn field(h: &HeaderMap, n: HeaderName) -> Option<&str> {
        h.get(n).and_then(|v| v.to_str().ok()).map(str::trim)
    }
    let old = field(stored, header::ETAG);
    match field(not_modified, header::ETAG) {
        Some(new) if !new.starts_with("W/") => old == Some(new),
        Some(new) => old.is_some_and(|o| o.trim_start_matches("W/") == new.trim_start_matches("W/")),
        None => match field(not_modified, header::LAST_MODIFIED) {
            Some(new) => field(stored, header::LAST_MODIFIED).is_none_or(|o| o == new),
            None => true,
        },
    }
}

/// An answer's age on arrival (RFC 9111 §5.1): a list-valued `Age` counts
/// its first member; an invalid one is ignored; one too large to represent
/// counts as 2^31 seconds (§1.2.2).
pub fn age_of(response: &HeaderMap) -> Duration {
    let Some(first) = response.get(header::AGE).and_then(|v| v.to_str().ok()) else {
        return Duration::ZERO;
    };
    let first = first.split(',').next().unwrap_or("").trim();
    if first.is_empty() || !first.bytes().all(|b| b.is_ascii_digit()) {
        return Duration::ZERO;
    }
    Duration::from_secs(first.parse::<u64>().unwrap_or(DELTA_MAX).min(DELTA_MAX))
}

/// Whether the stored head carries a validator to revalidate with.
pub fn has_validator(stored: &HeaderMap) -> bool {
    stored.contains_key(header::ETAG) || stored.contains_key(header::LAST_MODIFIED)
}

#[cfg(test)]
#[path = "rules_tests.rs"]
mod tests;
