//! An HTTP/2 client's `cookie` fields as the one line an HTTP/1 upstream
//! gets (RFC 9113 §8.2.3): for the proxy path, `auth`'s forwarded request
//! and the rate limits' `header:cookie` key alike.

use std::borrow::Cow;

use http::header::{self, HeaderMap, HeaderValue};

/// The request's `cookie` fields joined with `"; "`: the one field as it is,
/// a new line for several; `None` without one.
pub fn cookie_line(headers: &HeaderMap) -> Option<Cow<'_, [u8]>> {
    let mut crumbs = headers.get_all(header::COOKIE).iter();
    let first = crumbs.next()?.as_bytes();
    let Some(second) = crumbs.next() else { return Some(Cow::Borrowed(first)) };
    let mut joined = first.to_vec();
    for crumb in std::iter::once(second).chain(crumbs) {
        joined.extend_from_slice(b"; ");
        joined.extend_from_slice(crumb.as_bytes());
    }
    Some(Cow::Owned(joined))
}

/// Joins repeated `cookie` fields into one with `; ` (RFC 9113 §8.2.3): an
/// HTTP/2 client may send each cookie as its own field, which an HTTP/1
/// upstream must receive as one line.
pub fn join_cookies(headers: &mut HeaderMap) {
    let Some(Cow::Owned(joined)) = cookie_line(headers) else { return };
    if let Ok(v) = HeaderValue::from_bytes(&joined) {
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
}
