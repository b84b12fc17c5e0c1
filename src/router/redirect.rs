//! A route's `redirect = { status, location }`: the location template and
//! its expansion for a request. Pure, table-tested.
//!
//! Placeholders: `{scheme}` (`http` or `https`, as the client connected),
//! `{host}` (the request's host as routes match it: lower case, no port,
//! no trailing dot), `{port}` (the port the request named, else its
//! scheme's), `{path}` (the normalised path, percent-encoded as it came),
//! `{query}` (the query without `?`, empty when none) and `{uri}` (path and
//! `?query`). Each value is written as a URL needs it: characters a
//! request target may not hold never reach the header, and a location that
//! begins with the path never begins with `//` (a browser would take that
//! as another host). A placeholder that is a parameter's value
//! (`/login?next={uri}`, see [`in_value`]) is written as one value: every
//! byte but letters, digits and `-._~/:@` percent-encoded, so that the
//! client's own `&`, `=` or `#` cannot add parameters to it or end it.

use http::{HeaderMap, HeaderValue, StatusCode, Uri};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};

/// One piece of a location template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Piece {
    Text(usize, usize),
    Scheme,
    Host,
    Port,
    Path,
    Query,
    Uri,
}

/// A parsed `redirect`.
#[derive(Debug, Clone, PartialEq)]
pub struct Redirect {
    pub status: StatusCode,
    template: String,
    pieces: Vec<Piece>,
    /// Per piece, whether it is a parameter's value (see [`in_value`]).
    values: Vec<bool>,
}

impl Redirect {
    /// Reads `status` (301, 302, 303, 307 or 308) and `location`; the
    /// messages say which is wrong as `(field, message)`.
    pub fn parse(status: u16, location: &str) -> Result<Redirect, (&'static str, String)> {
        let status = match status {
            301 | 302 | 303 | 307 | 308 => StatusCode::from_u16(status).expect("a valid code"),
            other => return Err(("status", format!("{other}: use 301, 302, 303, 307 or 308"))),
        };
        let mut pieces = Vec::new();
        let mut values = Vec::new();
        let mut at = 0;
        while let Some(open) = location[at..].find('{').map(|i| at + i) {
            if open > at {
                pieces.push(Piece::Text(at, open));
                values.push(false);
            }
            values.push(in_value(&location[..open]));
            let close = location[open..].find('}').map(|i| open + i).ok_or_else(|| ("location", unclosed(open)))?;
            pieces.push(match &location[open + 1..close] {
                "scheme" => Piece::Scheme,
                "host" => Piece::Host,
                "port" => Piece::Port,
                "path" => Piece::Path,
                "query" => Piece::Query,
                "uri" => Piece::Uri,
                other => {
                    return Err((
                        "location",
                        format!("unknown placeholder {{{other}}}: use {{scheme}} {{host}} {{port}} {{path}} {{query}} {{uri}}"),
                    ));
                }
            });
            at = close + 1;
        }
        if at < location.len() {
            pieces.push(Piece::Text(at, location.len()));
            values.push(false);
        }
        let text_ok = pieces.iter().all(|p| match p {
            Piece::Text(a, b) => location[*a..*b].bytes().all(|c| c.is_ascii_graphic() && c != b'}'),
            _ => true,
        });
        if location.is_empty() || !text_ok {
            return Err((
                "location",
                // Not the location itself: it may carry a token in its query.
                format!(
                    "must be a URL of visible characters, e.g. \"https://{{host}}{{uri}}\": {}",
                    match location.bytes().position(|c| !c.is_ascii_graphic()) {
                        Some(at) => format!("byte {} is not one", at + 1),
                        None if location.is_empty() => "it is empty".to_owned(),
                        None => "a '}' outside a placeholder".to_owned(),
                    }
                ),
            ));
        }
        Ok(Redirect { status, template: location.to_owned(), pieces, values })
    }

    /// The `Location` for a request; `None` when its host holds characters
    /// no host name has (the caller answers 400).
    pub fn location(&self, uri: &Uri, headers: &HeaderMap, tls: bool) -> Option<HeaderValue> {
        // Only an origin-form target (not `OPTIONS *`) and a host that is
        // `host[:port]` are written into a location: `port.test:1:2` would
        // read as another port.
        let uses = |a: Piece, b: Piece| self.pieces.iter().any(|&p| p == a || p == b);
        let named = uri
            .authority()
            .map(|a| a.as_str().as_bytes())
            .or_else(|| Some(headers.get(http::header::HOST)?.as_bytes()));
        let bad_host = named.is_some_and(|h| !crate::headers::valid_host(h));
        if (uses(Piece::Host, Piece::Port) && bad_host)
            || (uses(Piece::Path, Piece::Uri) && !uri.path().starts_with('/'))
        {
            return None;
        }
        let host = || super::host::request_host(uri, headers);
        let mut out = String::with_capacity(self.template.len() + uri.path().len() + 16);
        for (piece, &value) in self.pieces.iter().zip(&self.values) {
            match *piece {
                Piece::Text(a, b) => out.push_str(&self.template[a..b]),
                Piece::Scheme => out.push_str(if tls { "https" } else { "http" }),
                Piece::Host => {
                    let host = host()?;
                    if !url_host(&host) {
                        return None;
                    }
                    if value { push_value(&mut out, &host) } else { out.push_str(&host) }
                }
                Piece::Port => out.push_str(port(uri, headers)?.unwrap_or(if tls { "443" } else { "80" })),
                Piece::Path if value => push_value(&mut out, uri.path()),
                Piece::Query if value => push_value(&mut out, uri.query().unwrap_or("")),
                Piece::Uri if value => push_value(&mut out, uri.path_and_query().map_or("", |pq| pq.as_str())),
                Piece::Path => push_path(&mut out, uri.path()),
                Piece::Query => push_escaped(&mut out, uri.query().unwrap_or("")),
                Piece::Uri => {
                    push_path(&mut out, uri.path());
                    if let Some(q) = uri.query() {
                        out.push('?');
                        push_escaped(&mut out, q);
                    }
                }
            }
        }
        HeaderValue::from_str(&out).ok()
    }

    /// The `location` as configured, placeholders and all.
    pub fn template(&self) -> &str {
        &self.template
    }
}

/// Whether `host` (as routes match it) may be written as a location's
/// host: a name or IPv4 address of letters, digits, `-`, `.` and `_`; or
/// an IP literal (RFC 3986 §3.2.2) holding an IPv6 address or an
/// IPvFuture (`v`, hex digits, `.`, then letters, digits, `-`, `.`, `_`
/// and `:`). Not an IPv6 address with a zone ID (`%25eth0`, RFC 6874): it
/// names an interface of the client's own machine, and browsers refuse it.
fn url_host(host: &str) -> bool {
    let plain = |s: &str, extra: &[u8]| {
        s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b) || extra.contains(&b))
    };
    let Some(literal) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) else { return plain(host, b"") };
    if literal.parse::<std::net::Ipv6Addr>().is_ok() {
        return true;
    }
    let future = literal.strip_prefix('v').and_then(|f| f.split_once('.'));
    future.is_some_and(|(version, address)| {
        !version.is_empty()
            && version.bytes().all(|b| b.is_ascii_hexdigit())
            && !address.is_empty()
            && plain(address, b":")
    })
}

/// Not the location itself: it may carry a token in its query.
fn unclosed(open: usize) -> String {
    format!("the '{{' at byte {} has no '}}'", open + 1)
}

/// The port the request named, if any (`Some(None)`: none); `None` for
/// one that is not a port.
fn port<'a>(uri: &'a Uri, headers: &'a HeaderMap) -> Option<Option<&'a str>> {
    let authority = match uri.authority() {
        Some(a) => a.as_str(),
        None => match headers.get(http::header::HOST) {
            Some(host) => host.to_str().ok()?,
            None => return Some(None),
        },
    };
    let after_host = match authority.rfind(']') {
        Some(end) => &authority[end + 1..],
        None => authority,
    };
    let Some((_, port)) = after_host.rsplit_once(':') else { return Some(None) };
    if port.is_empty() {
        return Some(None);
    }
    // A port is a 16-bit number, written without leading zeros.
    let fits = !(port.len() > 1 && port.starts_with('0')) && port.parse::<u16>().is_ok();
    fits.then_some(Some(port))
}

/// Whether a placeholder after `before` (the template up to it) is a
/// parameter's value: in the query, or in the fragment when there is one
/// (a page's own router reads `#/login?next=`), the last of `&` and `=` is
/// `=`. A `?` does not end a value (`?return={path}?{query}` is one).
fn in_value(before: &str) -> bool {
    let part = match before.rfind('#') {
        Some(hash) => &before[hash..],
        None => match before.find('?') {
            Some(query) => &before[query..],
            None => return false,
        },
    };
    part.rfind(['&', '=']).is_some_and(|i| part.as_bytes()[i] == b'=')
}

/// A parameter's value, written as one: `{uri}`'s `?` and the
/// client's `&`, `=`, `#` and `%` percent-encoded too.
fn push_value(out: &mut String, s: &str) {
    const KEPT: &AsciiSet =
        &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~').remove(b'/').remove(b':').remove(b'@');
    out.extend(utf8_percent_encode(s, KEPT));
}

/// The path, never starting with `//` when it starts the location.
fn push_path(out: &mut String, path: &str) {
    let rest = path.trim_start_matches('/');
    let path = if out.is_empty() && path.len() - rest.len() > 1 { &path[path.len() - rest.len() - 1..] } else { path };
    push_escaped(out, path);
}

/// Copies `s`, percent-encoding what a URL in a header must not hold raw
/// (a parsed target holds none of it; this keeps it so whatever the
/// parser lets through).
fn push_escaped(out: &mut String, s: &str) {
    for c in s.chars() {
        if c.is_ascii_graphic() && c != '\\' && c != '"' {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(template: &str, target: &str, host: Option<&str>, tls: bool) -> Option<String> {
        let r = Redirect::parse(308, template).unwrap();
        let mut headers = HeaderMap::new();
        if let Some(h) = host {
            headers.insert(http::header::HOST, h.parse().unwrap());
        }
        r.location(&target.parse().unwrap(), &headers, tls).map(|v| v.to_str().unwrap().to_owned())
    }

    #[test]
    fn placeholders_expand() {
        type Case<'a> = (&'a str, &'a str, Option<&'a str>, bool, Option<&'a str>);
        let cases: &[Case] = &[
            ("https://{host}{uri}", "/a/b?x=1", Some("Example.COM:8080"), false, Some("https://example.com/a/b?x=1")),
            ("https://{host}{path}", "/a/b?x=1", Some("example.com"), false, Some("https://example.com/a/b")),
            ("{scheme}://{host}:{port}{path}?{query}", "/p?q", Some("h:81"), true, Some("https://h:81/p?q")),
            ("{scheme}://{host}:{port}/", "/p", Some("h"), true, Some("https://h:443/")),
            ("{scheme}://{host}:{port}/", "/p", Some("[::1]:9"), false, Some("http://[::1]:9/")),
            ("/new{uri}", "/old?a=%20", Some("h"), false, Some("/new/old?a=%20")),
            ("{uri}", "//evil.example/x", Some("h"), false, Some("/evil.example/x")),
            ("{path}", "///evil.example", Some("h"), false, Some("/evil.example")),
            ("https://{host}{path}", "//x", Some("h"), false, Some("https://h//x")),
            ("https://{host}/", "/", Some("a/b"), false, None),
            ("https://{host}/", "/", Some("u@evil"), false, None),
            ("https://{host}/", "/", None, false, None),
            ("https://fixed.example/", "/", None, false, Some("https://fixed.example/")),
            // A Host that is not host[:port], or names no host; `OPTIONS *`.
            ("http://{host}{path}", "/p", Some("port.test:1:2"), false, None),
            ("http://{host}:{port}/", "/p", Some("port.test:99x"), false, None),
            ("http://{host}/", "/p", Some(""), false, None),
            ("http://{host}/", "/p", Some(".."), false, None),
            ("https://fixed.example/", "/", Some("port.test:1:2"), false, Some("https://fixed.example/")),
            ("https://www.example.com{uri}", "*", Some("h"), false, None),
            ("https://www.example.com/", "*", Some("h"), false, Some("https://www.example.com/")),
            // A port that is not one is refused, never written.
            ("http://{host}:{port}/", "/p", Some("h:99999"), false, None),
            ("http://{host}:{port}/", "/p", Some("h:00000000000000000000443"), false, None),
            ("http://{host}:{port}/", "/p", Some("h:"), false, Some("http://h:80/")),
            ("http://{host}:{port}/", "/p", Some("h:8080"), true, Some("http://h:8080/")),
            // An IP literal is written only as a URL may hold one (RFC 3986
            // §3.2.2): an IPv6 address (canonical) or an IPvFuture
            // (`v` 1*HEXDIG "." ...); anything else between brackets is
            // no host, and an IPv6 zone ID (RFC 6874) names an interface of
            // the client's own machine: 400 for both.
            ("http://{host}/", "/p", Some("[::FFFF:1.2.3.4]"), false, Some("http://[::ffff:1.2.3.4]/")),
            ("http://{host}/", "/p", Some("[v1.x]"), false, Some("http://[v1.x]/")),
            ("http://{host}:{port}/", "/p", Some("[V1F.a:B]:81"), false, Some("http://[v1f.a:b]:81/")),
            ("http://{host}/", "/p", Some("[fe80::1%25eth0]"), false, None),
            ("http://{host}/", "/p", Some("[fe80::1%eth0]"), false, None),
            ("http://{host}/", "/p", Some("[abc]"), false, None),
            ("http://{host}/", "/p", Some("[.]"), false, None),
            ("http://{host}/", "/p", Some("[1.2.3.4]"), false, None),
            ("http://{host}/", "/p", Some("[vg.x]"), false, None),
            ("http://{host}/", "/p", Some("[v.x]"), false, None),
            ("http://{host}/", "/p", Some("[v1.]"), false, None),
            ("http://{host}/", "/p", Some("[v1x]"), false, None),
            ("http://{host}/", "/p", Some("[::1::2]"), false, None),
            // A parameter's value is written as one value: the
            // client's `&`, `=`, `#`, `%` and `{uri}`'s `?` encoded.
            (
                "/login?next={uri}",
                "/q?x=a&next=//evil",
                Some("h"),
                false,
                Some("/login?next=/q%3Fx%3Da%26next%3D//evil"),
            ),
            ("/login?a=1&next={path}&b=2", "/a%26b=c", Some("h"), false, Some("/login?a=1&next=/a%2526b%3Dc&b=2")),
            ("/l?q={query}", "/p?a=1&b=2", Some("h"), false, Some("/l?q=a%3D1%26b%3D2")),
            ("/l?h={host}&p={port}&s={scheme}", "/p", Some("[::1]:8"), true, Some("/l?h=%5B::1%5D&p=8&s=https")),
            // Not a value: the query itself, a path, or past a fragment.
            ("/new?{query}", "/p?a=1&b=2", Some("h"), false, Some("/new?a=1&b=2")),
            ("/new?x=1&{query}", "/p?a=1&b=2", Some("h"), false, Some("/new?x=1&a=1&b=2")),
            ("/a=b{uri}", "/p?a=1", Some("h"), false, Some("/a=b/p?a=1")),
            ("/new?{query}#{path}", "/p?a=1&b=2", Some("h"), false, Some("/new?a=1&b=2#/p")),
            // A `?` inside a value does not end it; a fragment's parameters.
            ("/l?next={path}?{query}", "/r?a&next=//e", Some("h"), false, Some("/l?next=/r?a%26next%3D//e")),
            (
                "https://s/l?return={scheme}://{host}{path}?{query}",
                "/p?a=1&return=https://e/",
                Some("h"),
                false,
                Some("https://s/l?return=http://h/p?a%3D1%26return%3Dhttps://e/"),
            ),
            (
                "/app?v=2#/login?next={uri}",
                "/q?a&next=//e",
                Some("h"),
                false,
                Some("/app?v=2#/login?next=/q%3Fa%26next%3D//e"),
            ),
            ("/x?y#z={query}", "/p?a=1&b", Some("h"), false, Some("/x?y#z=a%3D1%26b")),
            // Not written by {host}, the literal does not matter.
            ("https://fixed.example{uri}", "/p", Some("[abc]"), false, Some("https://fixed.example/p")),
        ];
        for (template, target, host, tls, want) in cases {
            assert_eq!(expand(template, target, *host, *tls).as_deref(), *want, "{template} {target} {host:?}");
        }
    }

    #[test]
    fn templates_and_statuses_are_checked() {
        assert!(Redirect::parse(308, "https://{host}{uri}").is_ok());
        for status in [200, 300, 304, 305, 404] {
            assert_eq!(Redirect::parse(status, "/").unwrap_err().0, "status", "{status}");
        }
        for bad in ["https://{hots}/", "https://{host", "a b", "", "/x}", "/\u{7f}"] {
            assert_eq!(Redirect::parse(301, bad).unwrap_err().0, "location", "{bad:?}");
        }
        // A refusal does not quote the location, which may hold a token.
        let (_, message) = Redirect::parse(301, "/l?token=SECRET&next={uri").unwrap_err();
        assert_eq!(message, "the '{' at byte 22 has no '}'");
    }
}
