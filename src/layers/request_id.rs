//! Request IDs: every request carries an `X-Request-Id` to the upstream, back
//! to the client (exactly one) and into every log line about it. A client's
//! own is kept if it is 1-128 visible ASCII characters; anything else is
//! replaced by 128 random bits as 32 hex digits. (Set in place by
//! [`crate::server::App::handle`] and the proxy; see `App::handle` for why
//! not with tower-http's request-id layers.)

use http::HeaderMap;
use http::header::HeaderValue;

pub use crate::headers::X_REQUEST_ID;

/// Writes the low `out.len()` hex digits of `n`, lower-case, zero-padded
/// (`out.len()` even, at most 32). A byte, two digits, at a time, from a
/// table of the 256 digit pairs.
pub fn hex(n: u128, out: &mut [u8]) {
    const PAIRS: [[u8; 2]; 256] = {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut pairs = [[0u8; 2]; 256];
        let mut i = 0;
        while i < 256 {
            pairs[i] = [DIGITS[i >> 4], DIGITS[i & 0xf]];
            i += 1;
        }
        pairs
    };
    let bytes = n.to_be_bytes();
    let low = &bytes[16 - out.len() / 2..];
    for (pair, b) in out.chunks_exact_mut(2).zip(low) {
        pair.copy_from_slice(&PAIRS[usize::from(*b)]);
    }
}

/// Whether a client's `X-Request-Id` may be kept: 1 to 128 visible ASCII
/// characters (no spaces, no controls, nothing beyond ASCII).
pub fn is_valid(id: &HeaderValue) -> bool {
    let b = id.as_bytes();
    !b.is_empty() && b.len() <= 128 && b.iter().all(|c| c.is_ascii_graphic())
}

/// A request's ID: the client's own, or one made here, as the header value
/// it is sent as. Either is built once, on bytes that clone without
/// allocating ([`copied_value`]): it goes to the upstream, into the copy
/// kept for a resend, and into the response.
#[derive(Debug, Clone)]
pub enum RequestId {
    Made(HeaderValue),
    Given(HeaderValue),
}

impl RequestId {
    /// The client's own ID if it may be kept (the first, if repeated), else
    /// a new one.
    pub fn for_request(headers: &HeaderMap) -> RequestId {
        // Looked up only if a pass over the names finds it: most requests
        // carry none, and a pass is cheaper than hashing the name (see
        // `TraceContext::from_headers`).
        let given = if headers.keys().any(|name| *name == X_REQUEST_ID) { headers.get(X_REQUEST_ID) } else { None };
        RequestId::for_given(given)
    }

    /// The ID for a request whose first `X-Request-Id` is `given`: it, if
    /// it may be kept, else a new one (as [`RequestId::for_request`]).
    pub fn for_given(given: Option<&HeaderValue>) -> RequestId {
        match given {
            // Copied, not cloned: a clone would be a slice of the buffer
            // the head was read or copied into (see `listener::detach`),
            // kept alive for the whole request.
            Some(given) if is_valid(given) => {
                RequestId::Given(copied_value(given.as_bytes()).unwrap_or_else(|| given.clone()))
            }
            _ => {
                let mut made = [0u8; 32];
                hex(fastrand::u128(..), &mut made);
                RequestId::Made(copied_value(&made).expect("hex digits are a valid header value"))
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

/// A header value holding a copy of `bytes` (`None` if they are not a valid
/// value), whose clones share it without allocating (see [`crate::block`]).
pub fn copied_value(bytes: &[u8]) -> Option<HeaderValue> {
    HeaderValue::from_maybe_shared(crate::block::copy_of([bytes])).ok()
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

    /// Copies are exact, whatever their length (one larger than a block
    /// gets its own), do not share the caller's bytes, and refuse what is
    /// not a header value.
    #[test]
    fn copied_values_table() {
        let long = "v".repeat(5000);
        let mut kept = Vec::new();
        for round in 0..200 {
            for text in ["", "a", "0af7651916cd43dd8448eb211c80319c", long.as_str(), "x-1 y"] {
                let source = bytes::Bytes::from(text.to_owned());
                let v = copied_value(&source).expect("a valid value");
                assert_eq!(v.as_bytes(), text.as_bytes(), "round {round}");
                // (An empty `Bytes` is static, never unique.)
                assert!(text.is_empty() || source.is_unique(), "the copy shares the caller's bytes");
                kept.push((v, text.len()));
            }
        }
        // Earlier copies are untouched by later ones cut from the same block.
        assert!(kept.iter().all(|(v, len)| v.len() == *len && v.as_bytes().iter().all(|b| *b != 0)));
        for bad in [&b"line\nbreak"[..], b"nul\0", b"del\x7f"] {
            assert!(copied_value(bad).is_none(), "{bad:?}");
        }
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
