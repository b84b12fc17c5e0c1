//! A request's `cookie` fields as the one line an upstream gets: an HTTP/2
//! client's crumbs (RFC 9113 §8.2.3), and an HTTP/1 client's lines, of
//! which RFC 6265 §5.4 allows one; for the proxy path, `auth`'s forwarded
//! request, the rate limits' `header:cookie` key and a `Vary: Cookie` key
//! alike.

use std::borrow::Cow;

use http::header::{self, HeaderMap, HeaderValue};

/// The request's `cookie` fields joined with `"; "`: the one field as it is,
/// a new line for several (each trimmed, empty ones left out); `None`
/// without one.
pub fn cookie_line(headers: &HeaderMap) -> Option<Cow<'_, [u8]>> {
    let mut crumbs = headers.get_all(header::COOKIE).iter();
    let first = crumbs.next()?;
    let Some(second) = crumbs.next() else { return Some(Cow::Borrowed(first.as_bytes())) };
    let mut joined = Vec::new();
    for crumb in [first, second].into_iter().chain(crumbs) {
        let crumb = crumb.as_bytes().trim_ascii();
        if crumb.is_empty() {
            continue;
        }
        if !joined.is_empty() {
            joined.extend_from_slice(b"; ");
        }
        joined.extend_from_slice(crumb);
    }
    Some(Cow::Owned(joined))
}

/// Joins repeated `cookie` fields into one with `; `: an HTTP/2 client may
/// send each cookie as its own field, which an HTTP/1 upstream must
/// receive as one line (RFC 9113 §8.2.3), and an HTTP/1 client's second
/// line (RFC 6265 §5.4 allows one) would be read by a parser that takes
/// the first alone. Lines that are all empty go as none, not as an empty
/// `cookie:`.
pub fn join_cookies(headers: &mut HeaderMap) {
    let Some(Cow::Owned(joined)) = cookie_line(headers) else { return };
    if joined.is_empty() {
        headers.remove(header::COOKIE);
    } else if let Ok(v) = HeaderValue::from_bytes(&joined) {
        headers.insert(header::COOKIE, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crumbs_make_one_line() {
        let cases: &[(&[&str], Option<&str>, bool)] = &[
            (&[], None, false),
            (&["a=1"], Some("a=1"), false),
            (&["a=1; b=2"], Some("a=1; b=2"), false),
            (&["a=1", "b=2", "c=3"], Some("a=1; b=2; c=3"), true),
            (&["a=1", " ", "b=2 ", ""], Some("a=1; b=2"), true),
            (&["", ""], Some(""), true),
        ];
        for (crumbs, want, owned) in cases {
            let mut h = HeaderMap::new();
            for c in *crumbs {
                h.append(header::COOKIE, HeaderValue::from_str(c).unwrap());
            }
            let line = cookie_line(&h);
            assert_eq!(line.as_deref(), want.map(str::as_bytes), "{crumbs:?}");
            assert_eq!(matches!(line, Some(Cow::Owned(_))), *owned, "copied only when joined: {crumbs:?}");
        }
    }

    /// What an upstream gets: one line, or none for lines all empty (a
    /// single empty line goes as it came).
    #[test]
    fn joined_in_place() {
        let cases: &[(&[&str], &[&str])] = &[
            (&[], &[]),
            (&[""], &[""]),
            (&["a=1", "b=2"], &["a=1; b=2"]),
            (&["", " "], &[]),
            (&["", "a=1", ""], &["a=1"]),
        ];
        for (crumbs, want) in cases {
            let mut h = HeaderMap::new();
            for c in *crumbs {
                h.append(header::COOKIE, HeaderValue::from_str(c).unwrap());
            }
            join_cookies(&mut h);
            let got: Vec<&str> = h.get_all(header::COOKIE).iter().map(|v| v.to_str().unwrap()).collect();
            assert_eq!(got, *want, "{crumbs:?}");
        }
    }
}
