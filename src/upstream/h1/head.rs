//! Message heads: the request head as written (RFC 9112 §3, origin form),
//! and the response head as parsed by `httparse` with the body's framing
//! decided from it (RFC 9112 §6.3). Pure functions over bytes, tested by
//! tables here and fed the same bytes as hyper's client in
//! `tests/h1_differential.rs`.

use std::mem::MaybeUninit;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{StatusCode, Version, request};
use smallvec::SmallVec;

use super::Error;
use super::seen::{Seen, agreed_length, content_length};
use crate::headers::{Stamp, parsed};

/// Header fields a response head may have, as hyper allows.
pub const MAX_HEADERS: usize = 100;

/// The bytes a response head may take before it is refused, as hyper's
/// default read buffer limit (8 KiB plus 4 KiB per header field).
pub const MAX_HEAD: usize = 8192 + 4096 * 100;

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 1xx, 204, 304, `Content-Length: 0`).
    Empty,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding` ending in `chunked`.
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub version: Version,
    pub headers: HeaderMap,
    /// A reason phrase other than the status code's canonical one.
    pub reason: Option<Bytes>,
    pub framing: Framing,
    /// The connection may carry another request after this response (by
    /// version, `Connection` and framing).
    pub keep_alive: bool,
}

/// How a request body goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendFraming {
    /// Exactly this many bytes (`Content-Length`); 0 for none.
    Length(u64),
    /// Chunked, with the trailer fields the request declared in `Trailer`.
    Chunked(Vec<HeaderName>),
}

/// Writes the request head to `out`, its fields then those it is stamped
/// with; returns how its body is framed. The request's own headers decide,
/// as in hyper's client: `Transfer-Encoding` (the proxy sets `chunked` for a
/// body of unknown length), else `Content-Length`, else no body (a stamp
/// holds no framing field).
pub fn encode_request(parts: &request::Parts, stamp: &Stamp, out: &mut BytesMut) -> SendFraming {
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let target = if target.is_empty() { "/" } else { target };
    // Room for the whole head at once: an estimate that fell short grew
    // the buffer, copying it, on most requests.
    // The framing headers noted on the way: a lookup of each costs a hash.
    let (mut fields, mut chunked, mut length) = (0, false, false);
    for (name, value) in &parts.headers {
        fields += name.as_str().len() + value.len() + 4;
        chunked |= *name == header::TRANSFER_ENCODING;
        length |= *name == header::CONTENT_LENGTH;
    }
    out.reserve(parts.method.as_str().len() + target.len() + 14 + fields + stamp.encoded_len());
    out.put_slice(parts.method.as_str().as_bytes());
    out.put_u8(b' ');
    out.put_slice(target.as_bytes());
    out.put_slice(b" HTTP/1.1\r\n");
    for (name, value) in &parts.headers {
        out.put_slice(name.as_str().as_bytes());
        out.put_slice(b": ");
        out.put_slice(value.as_bytes());
        out.put_slice(b"\r\n");
    }
    stamp.write(out);
    out.put_slice(b"\r\n");
    if chunked {
        let declared = parts.headers.get_all(header::TRAILER).iter();
        let names = declared
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
            .collect();
        return SendFraming::Chunked(names);
    }
    let n = if length { content_length(&parts.headers).ok().flatten().unwrap_or(0) } else { 0 };
    SendFraming::Length(n)
}

/// The bodiless request `bytes` hold as [`encode_request`] wrote them
/// (kept by `Encoded::keeping`), as a request again: for a resend that goes
/// elsewhere than a new HTTP/1.1 connection (connecting failed, or an
/// `auto` upstream's new connection chose HTTP/2). Parsed by httparse;
/// `None` if the bytes are not such a request.
pub fn request_of<B>(bytes: &Bytes, body: B) -> Option<http::Request<B>> {
    let lines = memchr::memchr_iter(b'\n', bytes).count();
    let mut storage = vec![httparse::EMPTY_HEADER; lines];
    let mut parsed = httparse::Request::new(&mut storage);
    let httparse::Status::Complete(_) = parsed.parse(bytes).ok()? else { return None };
    let mut req = http::Request::new(body);
    *req.method_mut() = http::Method::from_bytes(parsed.method?.as_bytes()).ok()?;
    let path = bytes.slice_ref(parsed.path?.as_bytes());
    *req.uri_mut() = http::Uri::from(http::uri::PathAndQuery::from_maybe_shared(path).ok()?);
    let headers = req.headers_mut();
    for field in parsed.headers.iter() {
        let name = HeaderName::from_bytes(field.name.as_bytes()).ok()?;
        let mut value = HeaderValue::from_maybe_shared(bytes.slice_ref(field.value)).ok()?;
        // The bytes do not say which values were sensitive (never indexed
        // by HTTP/2's HPACK): the credentials are, as RFC 7541 §7.1.3
        // advises, for a resend that goes out over HTTP/2.
        value.set_sensitive(matches!(name, header::AUTHORIZATION | header::PROXY_AUTHORIZATION | header::COOKIE));
        headers.append(name, value);
    }
    Some(req)
}

/// Fields the gateway may add to a response after its head is parsed.
const ADDED_ON_THE_WAY_BACK: usize = 4;

/// What a parse of the bytes read so far found.
pub enum Parsed {
    /// The head is not complete yet.
    Partial,
    /// A 1xx other than 101, its bytes taken off (RFC 9110 §15.2).
    Interim(Bytes),
    /// The response head, its bytes consumed.
    Head(Head),
}

/// Where one header field's name and value lie in the head's bytes.
type Span = (u32, u32, u32, u32);

/// Parses a response head at the start of `buf` and, once it is complete,
/// takes its bytes off `buf`: the header values are slices of them (no
/// copy). `head_request`: the request was HEAD (its response has no body,
/// RFC 9110 §9.3.2).
pub fn parse(buf: &mut BytesMut, head_request: bool) -> Result<Parsed, Error> {
    // Not filled first (a pass over all of it, for every head): the
    // fields found are pushed.
    let mut spans = SmallVec::<[Span; MAX_HEADERS]>::new();
    let (len, code, version, reason) = {
        // Left uninitialised, as the listener's parse leaves them: httparse
        // writes the fields it finds, and filling all of them first cost
        // every head a pass over the whole array.
        let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut res = httparse::Response::new(&mut []);
        let bytes: &[u8] = buf;
        let parsed =
            httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut res, bytes, &mut storage);
        let len = match parsed {
            Ok(httparse::Status::Complete(len)) if len <= MAX_HEAD => len,
            Ok(httparse::Status::Complete(_)) => return Err(Error::too_large()),
            Ok(httparse::Status::Partial) if bytes.len() >= MAX_HEAD => return Err(Error::too_large()),
            Ok(httparse::Status::Partial) => return Ok(Parsed::Partial),
            Err(httparse::Error::TooManyHeaders) => return Err(Error::too_large()),
            Err(e) => return Err(Error::parse(why(e))),
        };
        let base = bytes.as_ptr() as usize;
        // An empty slice may point anywhere (httparse returns a constant).
        let at = |s: &[u8]| if s.is_empty() { 0 } else { (s.as_ptr() as usize - base) as u32 };
        for h in res.headers.iter() {
            let (name, value) = (at(h.name.as_bytes()), at(h.value));
            spans.push((name, name + h.name.len() as u32, value, value + h.value.len() as u32));
        }
        let reason = res.reason.map(|r| (at(r.as_bytes()), at(r.as_bytes()) + r.len() as u32));
        (len, res.code.unwrap_or(0), res.version.unwrap_or(0), reason)
    };
    if (100..200).contains(&code) && code != 101 {
        return Ok(Parsed::Interim(buf.split_to(len).freeze()));
    }
    let status = StatusCode::from_u16(code).map_err(|_| Error::parse("invalid status code"))?;
    let frozen = buf.split_to(len).freeze();
    let version = if version == 1 { Version::HTTP_11 } else { Version::HTTP_10 };
    let reason = reason
        .map(|(from, to)| frozen.slice(from as usize..to as usize))
        .filter(|r| Some(&r[..]) != status.canonical_reason().map(str::as_bytes));
    // Room for what the way back adds (`Via`, `X-Request-Id`, a cache's
    // `Age` and `Cache-Status`): sized to the parsed fields alone, the map
    // is grown, all of it moved, for the first of them.
    let mut headers = crate::headers::spare::map_with_room(spans.len() + ADDED_ON_THE_WAY_BACK);
    // The framing fields noted on the way: looking them up again costs
    // every response a hash each.
    let mut seen = Seen::default();
    for &(n0, n1, v0, v1) in &spans[..] {
        let name = parsed::name(&frozen[n0 as usize..n1 as usize]).map_err(|_| Error::parse("invalid header name"))?;
        #[allow(unsafe_code)] // SAFETY: a value span `httparse` (default configuration) returned.
        let value = unsafe { parsed::value(&frozen, v0, v1) };
        seen.note(&name, &value);
        headers.append(name, value);
    }
    let framing = framing(status, version, &headers, &seen, head_request)?;
    if seen.lengths > 1 || seen.listed {
        one_content_length(&mut headers, framing);
    }
    let keep_alive =
        keep_alive(version, &headers, &seen) && framing != Framing::Close && status != StatusCode::SWITCHING_PROTOCOLS;
    Ok(Parsed::Head(Head { status, version, headers, reason, framing, keep_alive }))
}

/// What httparse refused, in a few words.
pub(super) fn why(e: httparse::Error) -> &'static str {
    match e {
        httparse::Error::HeaderName => "invalid header name",
        httparse::Error::HeaderValue => "invalid header value",
        httparse::Error::NewLine => "invalid new line",
        httparse::Error::Status => "invalid status",
        httparse::Error::Token => "invalid token",
        httparse::Error::TooManyHeaders => "too many headers",
        httparse::Error::Version => "invalid HTTP version",
    }
}

/// The body's framing (RFC 9112 §6.3), refusing what cannot be framed:
/// `Transfer-Encoding` in HTTP/1.0, an invalid or conflicting
/// `Content-Length`, and any transfer coding but one `chunked`.
fn framing(
    status: StatusCode,
    version: Version,
    headers: &HeaderMap,
    seen: &Seen,
    head_request: bool,
) -> Result<Framing, Error> {
    if matches!(status.as_u16(), 101 | 204 | 304) || head_request {
        // A bodiless answer's Content-Length frames nothing, but one that is
        // no length is refused as on a body's answer: passed on, it reaches
        // the client (RFC 9110 §8.6: a sender must not forward it), and two
        // that disagree leave hyper's server sending no status line at all.
        seen.length.agreed()?;
        return Ok(Framing::Empty);
    }
    if seen.transfer_encoding {
        if version == Version::HTTP_10 {
            return Err(Error::parse("Transfer-Encoding in an HTTP/1.0 response"));
        }
        // Only `chunked`, once: the gateway decodes no other coding, and
        // `Transfer-Encoding` is hop-by-hop, so a body still in `gzip` (or
        // framed by the close after another coding, RFC 9112 §6.3 item 4)
        // would reach the client looking like plain bytes. nginx refuses
        // the same ("upstream sent unknown Transfer-Encoding"). A
        // Content-Length beside it is overridden, and the connection not
        // reused (see `keep_alive`).
        // Empty list items are ignored (RFC 9110 §5.6.1.2).
        let mut codings = headers
            .get_all(header::TRANSFER_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .filter(|c| !c.is_empty());
        let only_chunked =
            codings.next().is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")) && codings.next().is_none();
        if !only_chunked {
            return Err(Error::parse("a transfer coding other than chunked"));
        }
        return Ok(Framing::Chunked);
    }
    match seen.length.checked()? {
        Some(0) => Ok(Framing::Empty),
        Some(n) => Ok(Framing::Length(n)),
        None => Ok(Framing::Close),
    }
}

/// A `Content-Length` sent as a list of one value repeated (`5, 5`, or in
/// several lines) passed on as that one value (RFC 9110 §8.6 allows
/// either that or refusing it): many clients refuse a list.
fn one_content_length(headers: &mut HeaderMap, framing: Framing) {
    // Beside Transfer-Encoding it frames nothing; it is left as it came.
    if headers.contains_key(header::TRANSFER_ENCODING) {
        return;
    }
    let length = match framing {
        Framing::Length(n) => Some(n),
        Framing::Empty => agreed_length(headers).ok().flatten(),
        _ => None,
    };
    if let Some(n) = length {
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
    }
}

/// Whether the response lets the connection stay open: HTTP/1.1 unless a
/// `Connection` line says `close`, HTTP/1.0 only with `keep-alive` (RFC
/// 9112 §9.3), and never when `Content-Length` came beside
/// `Transfer-Encoding` (RFC 9112 §6.1: such a message may be an attack).
fn keep_alive(version: Version, headers: &HeaderMap, seen: &Seen) -> bool {
    if seen.transfer_encoding && seen.lengths > 0 {
        return false;
    }
    let mut keep = version == Version::HTTP_11;
    if !seen.connection {
        return keep;
    }
    for value in headers.get_all(header::CONNECTION) {
        if has_token(value, "close") {
            return false;
        }
        keep |= has_token(value, "keep-alive");
    }
    keep
}

/// Whether a comma-separated header value lists `token` (any case).
pub fn has_token(value: &HeaderValue, token: &str) -> bool {
    value.as_bytes().split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str, head_request: bool) -> Result<Head, Error> {
        let mut buf = BytesMut::from(format!("{raw}body").as_bytes());
        match parse(&mut buf, head_request)? {
            Parsed::Head(h) => {
                assert_eq!(&buf[..], b"body", "{raw:?}");
                Ok(h)
            }
            Parsed::Interim(_) => panic!("interim"),
            Parsed::Partial => panic!("partial"),
        }
    }

    fn parse_str(raw: &str) -> Result<Parsed, Error> {
        parse(&mut BytesMut::from(raw.as_bytes()), false)
    }

    /// A list-valued or repeated `Content-Length` of one value is passed
    /// on as that value; a single one is left as it came.
    #[test]
    fn a_repeated_content_length_becomes_one() {
        let cases = [
            ("content-length: 5, 5\r\n", false, "5"),
            ("content-length: 5\r\ncontent-length: 5\r\n", false, "5"),
            ("content-length: 5,5\r\n", true, "5"),
            ("content-length: 5\r\n", false, "5"),
            ("content-length: 007\r\n", false, "007"),
        ];
        for (fields, head_request, want) in cases {
            let raw = format!("HTTP/1.1 200 OK\r\n{fields}\r\n");
            let Ok(Parsed::Head(h)) = parse(&mut BytesMut::from(raw.as_bytes()), head_request) else {
                panic!("{raw:?} refused");
            };
            let values: Vec<_> = h.headers.get_all(header::CONTENT_LENGTH).iter().collect();
            assert_eq!(values, [want], "{raw:?}");
        }
    }

    /// (response head, HEAD request, framing, keep-alive); `None`: refused.
    #[test]
    fn framing_follows_rfc_9112_section_6_3() {
        use Framing::*;
        type Case = (&'static str, bool, Option<(Framing, bool)>);
        let cases: &[Case] = &[
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", false, Some((Length(5), true))),
            ("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", false, Some((Empty, true))),
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", true, Some((Empty, true))),
            ("HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n", false, Some((Empty, true))),
            ("HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\n\r\n", false, Some((Empty, true))),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", false, Some((Chunked, true))),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: CHUNKED \r\n\r\n", false, Some((Chunked, true))),
            // A coding the gateway does not decode, or chunked twice: refused.
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked,\r\n\r\n", false, Some((Chunked, true))),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: \r\ntransfer-encoding: chunked\r\n\r\n",
                false,
                Some((Chunked, true)),
            ),
            ("HTTP/1.1 204 No Content\r\ntransfer-encoding: gzip\r\n\r\n", false, Some((Empty, true))),
            (
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n",
                false,
                Some((Chunked, false)),
            ),
            ("HTTP/1.1 200 OK\r\n\r\n", false, Some((Close, false))),
            ("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\n", false, Some((Length(1), false))),
            (
                "HTTP/1.1 200 OK\r\nconnection: keep-alive\r\nconnection: close\r\ncontent-length: 1\r\n\r\n",
                false,
                Some((Length(1), false)),
            ),
            ("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n", false, Some((Length(1), false))),
            ("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n", false, Some((Length(1), true))),
            ("HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\ncontent-length: 5\r\n\r\n", false, Some((Length(5), true))),
            ("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n", false, Some((Empty, false))),
            ("HTTP/1.1 700 Odd\r\ncontent-length: 0\r\n\r\n", false, Some((Empty, true))),
            ("HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n", false, None),
            // A bodiless answer's Content-Length must be a length too (RFC
            // 9110 §8.6), of any size: it frames nothing.
            ("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n", true, None),
            ("HTTP/1.1 200 OK\r\ncontent-length: abc\r\n\r\n", true, None),
            ("HTTP/1.1 200 OK\r\ncontent-length: 5, 6\r\n\r\n", true, None),
            ("HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n", true, None),
            ("HTTP/1.1 204 No Content\r\ncontent-length: +5\r\n\r\n", false, None),
            ("HTTP/1.1 304 Not Modified\r\ncontent-length: 5x\r\n\r\n", false, None),
            ("HTTP/1.1 304 Not Modified\r\ntransfer-encoding: chunked\r\ncontent-length: x\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551615\r\n\r\n", true, Some((Empty, true))),
            ("HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551614\r\n\r\n", false, None),
            (
                "HTTP/1.1 200 OK\r\ncontent-length: 18446744073709551613\r\n\r\n",
                false,
                Some((Length(u64::MAX - 2), true)),
            ),
            // Transfer-Encoding overrides even a Content-Length that is no
            // length (and the connection is not reused).
            (
                "HTTP/1.1 200 OK\r\ncontent-length: x\r\ntransfer-encoding: chunked\r\n\r\n",
                false,
                Some((Chunked, false)),
            ),
            (
                "HTTP/1.1 200 OK\r\nconnection: keep-alive, close\r\ncontent-length: 1\r\n\r\n",
                false,
                Some((Length(1), false)),
            ),
            ("HTTP/1.1 304 Not Modified\r\ncontent-length: 5, 5\r\n\r\n", false, Some((Empty, true))),
            ("HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\ncontent-length: 5 5\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\ncontent-length:\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\nx: a\r\n b\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\nx: a\0b\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\nx y: a\r\n\r\n", false, None),
            ("HTTP/1.1 200 OK\r\nx : a\r\n\r\n", false, None),
            ("HTTP/1.1 099 Low\r\n\r\n", false, None),
            ("HTTP/2.0 200 OK\r\n\r\n", false, None),
        ];
        for (raw, head_request, want) in cases {
            let got = head(raw, *head_request).ok().map(|h| (h.framing, h.keep_alive));
            assert_eq!(got, *want, "{raw:?}");
        }
    }

    #[test]
    fn interim_responses_are_skipped_and_heads_are_bounded() {
        let mut buf = BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n"[..]);
        assert!(matches!(parse(&mut buf, false), Ok(Parsed::Interim(_))));
        assert!(matches!(parse(&mut buf, false), Ok(Parsed::Head(h)) if h.status == 204));
        assert!(matches!(parse_str("HTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\n"), Ok(Parsed::Interim(_))));
        assert!(matches!(parse_str("HTTP/1.1 200 OK\r\ncontent-le"), Ok(Parsed::Partial)));
        let long = format!("HTTP/1.1 200 OK\r\nx: {}", "a".repeat(MAX_HEAD));
        assert!(parse_str(&long).is_err_and(|e| e.is_parse()));
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x{i}: y\r\n")).collect();
        assert!(parse_str(&format!("HTTP/1.1 200 OK\r\n{many}\r\n")).is_err_and(|e| e.is_parse()));
        let reason = |raw: &str| match parse_str(raw) {
            Ok(Parsed::Head(h)) => h.reason,
            _ => panic!("{raw}"),
        };
        assert_eq!(reason("HTTP/1.1 200 OK\r\n\r\n"), None);
        assert_eq!(reason("HTTP/1.1 200 Fine\r\n\r\n").as_deref(), Some(&b"Fine"[..]));
    }

    #[test]
    fn a_request_head_is_written_in_origin_form_with_its_framing() {
        let req = http::Request::post("/a?b=1")
            .header("host", "up")
            .header("transfer-encoding", "chunked")
            .header("trailer", "x-sum, content-length")
            .body(())
            .unwrap();
        let (parts, ()) = req.into_parts();
        let mut out = BytesMut::new();
        let framing = encode_request(&parts, &Stamp::default(), &mut out);
        assert_eq!(
            &out[..],
            b"POST /a?b=1 HTTP/1.1\r\nhost: up\r\ntransfer-encoding: chunked\r\ntrailer: x-sum, content-length\r\n\r\n"
        );
        let want = vec![HeaderName::from_static("x-sum"), header::CONTENT_LENGTH];
        assert_eq!(framing, SendFraming::Chunked(want));
        assert_eq!(out.capacity(), out.len(), "exactly the head's room: a kept head holds no more");
        let (parts, ()) = http::Request::get("/").header("content-length", "3").body(()).unwrap().into_parts();
        assert_eq!(encode_request(&parts, &Stamp::default(), &mut BytesMut::new()), SendFraming::Length(3));
        let (parts, ()) = http::Request::get("/").header("x-length", "3").body(()).unwrap().into_parts();
        assert_eq!(encode_request(&parts, &Stamp::default(), &mut BytesMut::new()), SendFraming::Length(0));
    }

    #[test]
    fn a_kept_request_is_the_request_again() {
        let (parts, ()) = http::Request::get("/a/b?c=1")
            .header("host", "up:8080")
            .header("x-two", "1")
            .header("x-two", "2")
            .header("via", "1.1 gateway")
            .body(())
            .unwrap()
            .into_parts();
        let mut out = BytesMut::new();
        encode_request(&parts, &Stamp::default(), &mut out);
        let again: http::Request<()> = request_of(&out.freeze(), ()).expect("a request");
        assert_eq!((again.method(), again.uri()), (&http::Method::GET, &"/a/b?c=1".parse::<http::Uri>().unwrap()));
        assert_eq!(again.headers(), &parts.headers);
        let (parts, ()) =
            http::Request::get("/").header("cookie", "a=1").header("x-a", "b").body(()).unwrap().into_parts();
        let mut out = BytesMut::new();
        encode_request(&parts, &Stamp::default(), &mut out);
        let again: http::Request<()> = request_of(&out.freeze(), ()).expect("a request");
        assert!(again.headers()["cookie"].is_sensitive(), "credentials stay out of HPACK's table");
        assert!(!again.headers()["x-a"].is_sensitive());
        assert!(request_of(&Bytes::from_static(b"GET / HTTP/1.1\r\nhost: x\r\n"), ()).is_none(), "unfinished");
    }
}
