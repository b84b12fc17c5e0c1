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

/// Writes the low `out.len()` hex digits of `n`, lower-case, zero-padded
/// (`out.len()` even, at most 32). A byte, two digits, at a time.
pub fn hex(n: u128, out: &mut [u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bytes = n.to_be_bytes();
    let low = &bytes[16 - out.len() / 2..];
    for (pair, b) in out.chunks_exact_mut(2).zip(low) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
}

/// Whether a client's `X-Request-Id` may be kept: 1 to 128 visible ASCII
/// characters (no spaces, no controls, nothing beyond ASCII).
pub fn is_valid(id: &HeaderValue) -> bool {
    let b = id.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
}

/// A request's ID: the client's own, or one made here, as the header value
/// it is sent as. A made one is built once, on bytes that clone without
/// allocating (`Bytes::from_owner`): it goes to the upstream, into the
/// copy kept for a resend, and into the response.
#[derive(Debug, Clone)]
pub enum RequestId {
    Made(HeaderValue),
    Given(HeaderValue),
}

impl RequestId {
    /// The client's own ID if it may be kept (the first, if repeated), else
    /// a new one.
    pub fn for_request(headers: &HeaderMap) -> RequestId {
        match headers.get(X_REQUEST_ID) {
            // Copied, not cloned: a clone would be a slice of the client
            // connection's read buffer, kept alive for the whole request.
            Some(given) if is_valid(given) => RequestId::Given(
                HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(given.as_bytes().to_vec()))
                    .unwrap_or_else(|_| given.clone()),
            ),
            _ => {
                let mut made = [0u8; 32];
                hex(fastrand::u128(..), &mut made);
                RequestId::Made(shared_value(made))
            }
        }
    }

    /// As text, for log lines.
    pub fn as_str(&self) -> &str {
        let (RequestId::Made(v) | RequestId::Given(v)) = self;
        v.to_str().expect("an ID is visible ASCII")
    }

    /// As a header value (for the upstream request and the response).
    pub fn header_value(&self) -> HeaderValue {
        let (RequestId::Made(v) | RequestId::Given(v)) = self;
        v.clone()
    }
}

/// A header value of `bytes` (hex digits and dashes), whose clones share
/// them: a value made from a slice is copied into a `Vec`-backed `Bytes`,
/// and the first clone of that allocates again to share it.
pub fn shared_value<const N: usize>(bytes: [u8; N]) -> HeaderValue {
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(bytes)).expect("hex digits are a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A kept ID is the client's, copied: a clone would be a slice of the
    /// buffer the request was parsed from, held for the whole request.
    #[test]
    fn a_kept_id_holds_nothing_of_the_request_buffer() {
        let buffer = bytes::Bytes::from(b"req-42".to_vec());
        let mut headers = HeaderMap::new();
        headers.insert(X_REQUEST_ID, HeaderValue::from_maybe_shared(buffer.slice(..)).unwrap());
        let id = RequestId::for_request(&headers);
        drop(headers);
        assert_eq!(id.as_str(), "req-42");
        assert!(buffer.is_unique(), "the ID still shares the request's buffer");
    }

    #[test]
    fn hex_table() {
        let cases: &[(u128, usize, &str)] = &[
            (0, 2, "00"),
            (0x1, 2, "01"),
            (0xab, 2, "ab"),
            (0xb7ad6b7169203331, 16, "b7ad6b7169203331"),
            (0x0af7651916cd43dd8448eb211c80319c, 32, "0af7651916cd43dd8448eb211c80319c"),
            (u128::MAX, 32, "ffffffffffffffffffffffffffffffff"),
            (0x1234, 2, "34"),
        ];
        for (n, len, want) in cases {
            let mut out = vec![0u8; *len];
            hex(*n, &mut out);
            assert_eq!(std::str::from_utf8(&out).unwrap(), *want, "{n:x}");
        }
    }

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
