//! Request IDs: every request carries an `X-Request-Id` to the upstream, back
//! to the client (exactly one) and into every log line about it. A client's
//! own is kept if it is 1-128 visible ASCII characters; anything else is
//! replaced by 128 random bits as 32 hex digits. (Set in place by
//! [`crate::server::App::handle`] and the proxy; see `App::handle` for why
//! not with tower-http's request-id layers.)

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// `X-Request-Id`.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Writes `n` as lower-case hex, zero-padded to `out`'s length.
pub fn hex(mut n: u128, out: &mut [u8]) {
    for b in out.iter_mut().rev() {
        *b = b"0123456789abcdef"[(n & 0xf) as usize];
        n >>= 4;
    }
}

/// Whether a client's `X-Request-Id` may be kept: 1 to 128 visible ASCII
/// characters (no spaces, no controls, nothing beyond ASCII).
pub fn is_valid(id: &HeaderValue) -> bool {
    let b = id.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
}

/// A request's ID: the client's own, or one made here. Kept inline, so
/// a made ID costs no allocation until it is written into a header.
#[derive(Debug, Clone)]
pub enum RequestId {
    Made([u8; 32]),
    Given(HeaderValue),
}

impl RequestId {
    /// The client's own ID if it may be kept (the first, if repeated), else
    /// a new one.
    pub fn for_request(headers: &HeaderMap) -> RequestId {
        match headers.get(X_REQUEST_ID) {
            Some(given) if is_valid(given) => RequestId::Given(given.clone()),
            _ => {
                let mut made = [0u8; 32];
                hex(fastrand::u128(..), &mut made);
                RequestId::Made(made)
            }
        }
    }

    /// As text, for log lines.
    pub fn as_str(&self) -> &str {
        match self {
            RequestId::Made(b) => std::str::from_utf8(b).expect("hex digits"),
            RequestId::Given(v) => v.to_str().expect("a valid ID is visible ASCII"),
        }
    }

    /// As a header value (for the upstream request and the response).
    pub fn header_value(&self) -> HeaderValue {
        match self {
            RequestId::Made(b) => HeaderValue::from_bytes(b).expect("hex digits are a valid header value"),
            RequestId::Given(v) => v.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validity_table() {
        let long_ok = "a".repeat(128);
        let long_bad = "a".repeat(129);
        let cases: &[(&[u8], bool)] = &[
            (b"abc-123", true),
            (b"0f8fad5b-d9cb-469f-a165-70867728950e", true),
            (b"!~{}", true),
            (long_ok.as_bytes(), true),
            (b"", false),
            (long_bad.as_bytes(), false),
            (b"has space", false),
            (b"tab\there", false),
            ("caf\u{e9}".as_bytes(), false),
        ];
        for (id, want) in cases {
            let Ok(v) = HeaderValue::from_bytes(id) else { continue };
            assert_eq!(is_valid(&v), *want, "{:?}", String::from_utf8_lossy(id));
        }
    }

    #[test]
    fn a_valid_id_is_kept_and_anything_else_replaced() {
        // (ids sent, the one kept, if any)
        let cases: &[(&[&str], Option<&str>)] = &[
            (&[], None),
            (&["good"], Some("good")),
            (&["bad id"], None),
            (&["first", "second"], Some("first")),
            (&["bad id", "second"], None),
        ];
        for (sent, kept) in cases {
            let mut h = HeaderMap::new();
            for id in *sent {
                h.append(X_REQUEST_ID, HeaderValue::from_str(id).unwrap());
            }
            let id = RequestId::for_request(&h);
            assert_eq!(id.header_value().to_str().unwrap(), id.as_str());
            match kept {
                Some(k) => assert_eq!(id.as_str(), *k, "{sent:?}"),
                None => assert!(matches!(id, RequestId::Made(_)) && is_valid(&id.header_value()), "{sent:?}"),
            }
        }
    }

    #[test]
    fn new_ids_are_32_hex_digits_and_differ() {
        let h = HeaderMap::new();
        let (a, b) = (RequestId::for_request(&h).header_value(), RequestId::for_request(&h).header_value());
        assert_eq!(a.len(), 32);
        assert!(a.as_bytes().iter().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
