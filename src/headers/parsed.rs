//! A head's fields as `httparse` found them, made into `http` types for
//! the own HTTP/1.1 connections (the client's and the upstream's).
//!
//! Hand-written because `http` checks again what `httparse` has just
//! checked: `HeaderName::from_bytes` maps every name through a table
//! before it looks it up, and `HeaderValue::from_maybe_shared` reads every
//! byte of every value a second time (see benches/README.md, Decisions).

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue, InvalidHeaderName};

use super::{TRACEPARENT, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO, X_REQUEST_ID};

/// A field name: the names most heads carry, spelled as clients and
/// servers send them, without a lookup; any other through `http`.
pub fn name(raw: &[u8]) -> Result<HeaderName, InvalidHeaderName> {
    match known(raw) {
        Some(name) => Ok(name),
        None => HeaderName::from_bytes(raw),
    }
}

/// A field value `httparse` accepted: a slice of `head`, not checked again.
///
/// # Safety
///
/// `head[from..to]` must be a field value as `httparse`'s default
/// configuration returned it (which refuses an obsolete line folding
/// rather than leave its CR LF in a value): `httparse` accepted each of
/// its bytes as HTAB, SP, VCHAR or obs-text, on its table and SIMD paths
/// alike, the bytes `HeaderValue` accepts (`tests::parsed_values_are_header_values`
/// checks each of the 256 at offsets around each SIMD width, on the path
/// `httparse` takes on the machine the tests run on).
#[allow(unsafe_code)]
pub(crate) unsafe fn value(head: &Bytes, from: u32, to: u32) -> HeaderValue {
    let bytes = head.slice(from as usize..to as usize);
    // SAFETY: as the caller promises, above.
    unsafe { HeaderValue::from_maybe_shared_unchecked(bytes) }
}

/// The name `raw` spells, if it is one of the common ones in its usual
/// (`Content-Length`) or lower-case spelling. By length first, so a name
/// is compared with a few of the same length at most.
fn known(raw: &[u8]) -> Option<HeaderName> {
    macro_rules! one_of {
        ($($spelt:pat => $name:expr),* $(,)?) => {
            match raw { $($spelt => Some($name),)* _ => None }
        };
    }
    match raw.len() {
        2 => one_of!(b"TE" | b"te" => header::TE),
        3 => one_of!(b"Via" | b"via" => header::VIA, b"Age" | b"age" => header::AGE),
        4 => one_of!(
            b"Host" | b"host" => header::HOST,
            b"Date" | b"date" => header::DATE,
            b"ETag" | b"etag" => header::ETAG,
            b"Vary" | b"vary" => header::VARY,
        ),
        5 => one_of!(b"Range" | b"range" => header::RANGE),
        6 => one_of!(
            b"Accept" | b"accept" => header::ACCEPT,
            b"Cookie" | b"cookie" => header::COOKIE,
            b"Server" | b"server" => header::SERVER,
            b"Origin" | b"origin" => header::ORIGIN,
            b"Expect" | b"expect" => header::EXPECT,
            b"Pragma" | b"pragma" => header::PRAGMA,
        ),
        7 => one_of!(
            b"Referer" | b"referer" => header::REFERER,
            b"Upgrade" | b"upgrade" => header::UPGRADE,
            b"Expires" | b"expires" => header::EXPIRES,
        ),
        8 => one_of!(b"Location" | b"location" => header::LOCATION),
        10 => one_of!(
            b"Connection" | b"connection" => header::CONNECTION,
            b"User-Agent" | b"user-agent" => header::USER_AGENT,
            b"Set-Cookie" | b"set-cookie" => header::SET_COOKIE,
        ),
        11 => one_of!(b"traceparent" | b"Traceparent" => TRACEPARENT),
        12 => one_of!(
            b"Content-Type" | b"content-type" => header::CONTENT_TYPE,
            b"X-Request-Id" | b"X-Request-ID" | b"x-request-id" => X_REQUEST_ID,
        ),
        13 => one_of!(
            b"Cache-Control" | b"cache-control" => header::CACHE_CONTROL,
            b"Authorization" | b"authorization" => header::AUTHORIZATION,
            b"Last-Modified" | b"last-modified" => header::LAST_MODIFIED,
            b"If-None-Match" | b"if-none-match" => header::IF_NONE_MATCH,
            b"Accept-Ranges" | b"accept-ranges" => header::ACCEPT_RANGES,
        ),
        14 => one_of!(b"Content-Length" | b"content-length" => header::CONTENT_LENGTH),
        15 => one_of!(
            b"Accept-Encoding" | b"accept-encoding" => header::ACCEPT_ENCODING,
            b"Accept-Language" | b"accept-language" => header::ACCEPT_LANGUAGE,
            b"X-Forwarded-For" | b"x-forwarded-for" => X_FORWARDED_FOR,
        ),
        16 => one_of!(
            b"Content-Encoding" | b"content-encoding" => header::CONTENT_ENCODING,
            b"X-Forwarded-Host" | b"x-forwarded-host" => X_FORWARDED_HOST,
        ),
        17 => one_of!(
            b"Transfer-Encoding" | b"transfer-encoding" => header::TRANSFER_ENCODING,
            b"If-Modified-Since" | b"if-modified-since" => header::IF_MODIFIED_SINCE,
            b"X-Forwarded-Proto" | b"x-forwarded-proto" => X_FORWARDED_PROTO,
        ),
        _ => None,
    }
}

/// A decimal number of ASCII digits only (no sign, no space, no list), as a
/// `Content-Length` is read on both HTTP/1 connections.
pub fn digits(bytes: &[u8]) -> Option<u64> {
    if bytes.is_empty() {
        return None;
    }
    bytes.iter().try_fold(0u64, |n, &b| match b {
        b'0'..=b'9' => n.checked_mul(10)?.checked_add(u64::from(b - b'0')),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every spelling the table knows, and what `http` makes of it.
    const SPELLINGS: &[&str] = &[
        "TE",
        "te",
        "Via",
        "via",
        "Age",
        "age",
        "Host",
        "host",
        "Date",
        "date",
        "ETag",
        "etag",
        "Vary",
        "vary",
        "Range",
        "range",
        "Accept",
        "accept",
        "Cookie",
        "cookie",
        "Server",
        "server",
        "Origin",
        "origin",
        "Expect",
        "expect",
        "Pragma",
        "pragma",
        "Referer",
        "referer",
        "Upgrade",
        "upgrade",
        "Expires",
        "expires",
        "Location",
        "location",
        "Connection",
        "connection",
        "User-Agent",
        "user-agent",
        "Set-Cookie",
        "set-cookie",
        "traceparent",
        "Traceparent",
        "Content-Type",
        "content-type",
        "X-Request-Id",
        "X-Request-ID",
        "x-request-id",
        "Cache-Control",
        "cache-control",
        "Authorization",
        "authorization",
        "Last-Modified",
        "last-modified",
        "If-None-Match",
        "if-none-match",
        "Accept-Ranges",
        "accept-ranges",
        "Content-Length",
        "content-length",
        "Accept-Encoding",
        "accept-encoding",
        "Accept-Language",
        "accept-language",
        "X-Forwarded-For",
        "x-forwarded-for",
        "Content-Encoding",
        "content-encoding",
        "X-Forwarded-Host",
        "x-forwarded-host",
        "Transfer-Encoding",
        "transfer-encoding",
        "If-Modified-Since",
        "if-modified-since",
        "X-Forwarded-Proto",
        "x-forwarded-proto",
    ];

    #[test]
    fn known_names_are_the_ones_http_parses() {
        for spelt in SPELLINGS {
            let known = known(spelt.as_bytes()).unwrap_or_else(|| panic!("{spelt} not known"));
            assert_eq!(known, HeaderName::from_bytes(spelt.as_bytes()).unwrap(), "{spelt}");
        }
    }

    #[test]
    fn any_name_is_the_one_http_parses_or_refused_alike() {
        let mut odd: Vec<Vec<u8>> = SPELLINGS.iter().map(|s| s.as_bytes().to_vec()).collect();
        odd.extend(SPELLINGS.iter().map(|s| s.to_ascii_uppercase().into_bytes()));
        odd.extend(SPELLINGS.iter().map(|s| format!("{s}x").into_bytes()));
        odd.extend(SPELLINGS.iter().map(|s| s.as_bytes()[1..].to_vec()));
        odd.extend(["x-sum", "X_Under", "", "Host ", "Ho st", "cont\u{e9}nt-type"].map(|s| s.as_bytes().to_vec()));
        odd.extend([b"Host\0".to_vec(), b"Content-Length\xff".to_vec()]);
        for raw in &odd {
            assert_eq!(name(raw).ok(), HeaderName::from_bytes(raw).ok(), "{:?}", String::from_utf8_lossy(raw));
        }
    }

    #[test]
    fn parsed_values_are_header_values() {
        // httparse reads 32 bytes at a time (AVX2), 16 (SSE 4.2), 8 (SWAR)
        // and 1: each byte at the offsets that reach each of them.
        let widths = [1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65];
        let mut accepted = [false; 256];
        for byte in 0..=255u8 {
            for len in widths {
                for at in [0, len / 2, len - 1] {
                    let mut v = vec![b'a'; len];
                    v[at] = byte;
                    let mut head = b"GET / HTTP/1.1\r\nX: ".to_vec();
                    head.extend_from_slice(&v);
                    head.extend_from_slice(b"\r\n\r\n");
                    let mut fields = [httparse::EMPTY_HEADER; 4];
                    let mut req = httparse::Request::new(&mut fields);
                    if let Ok(httparse::Status::Complete(_)) = req.parse(&head) {
                        let parsed = req.headers[0].value;
                        assert!(HeaderValue::from_bytes(parsed).is_ok(), "byte {byte:#x} at {at} of {len}");
                        accepted[byte as usize] |= parsed.contains(&byte);
                    }
                    let mut head = b"HTTP/1.1 200 OK\r\nX: ".to_vec();
                    head.extend_from_slice(&v);
                    head.extend_from_slice(b"\r\n\r\n");
                    let mut fields = [httparse::EMPTY_HEADER; 4];
                    let mut res = httparse::Response::new(&mut fields);
                    if let Ok(httparse::Status::Complete(_)) = res.parse(&head) {
                        let parsed = res.headers[0].value;
                        assert!(HeaderValue::from_bytes(parsed).is_ok(), "byte {byte:#x} at {at} of {len}");
                    }
                }
            }
        }
        // The check saw what it was meant to: the bytes a value may hold
        // were accepted, and none of the others.
        let may = |b: usize| b == 9 || (32..127).contains(&b) || b >= 128;
        assert!((0..256).all(|b| accepted[b] == may(b)), "{:?}", (0..256).filter(|&b| accepted[b] != may(b)));
    }

    #[test]
    fn a_value_is_its_slice_of_the_head() {
        let head = Bytes::from_static(b"X-Sum: 12\t34\r\n");
        #[allow(unsafe_code)]
        // SAFETY: valid field values.
        let (v, empty) = unsafe { (value(&head, 7, 12), value(&head, 0, 0)) };
        assert_eq!(v, "12\t34");
        assert_eq!(empty, "");
    }
}
