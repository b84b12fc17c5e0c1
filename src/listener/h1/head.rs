//! A request head as `httparse` reads it, made into `http::request::Parts`
//! with the body's framing decided the way hyper's server decides it (RFC
//! 9112 §6.3, with hyper's choices where the RFC leaves one), so that
//! switching `server.http1` changes no decision (`tests/h1_differential.rs`
//! checks). Pure: bytes in, a head or a refusal out.

use std::mem::MaybeUninit;

use bytes::BytesMut;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri, Version, request};
use smallvec::SmallVec;

/// Header fields a request head may have, as hyper allows.
pub const MAX_HEADERS: usize = crate::limits::MAX_FIELDS;

/// Fields the gateway may add to a request on its way (see `parse`).
const ADDED_FIELDS: usize = 8;

/// The longest request target hyper's parser takes (past it, 414).
const MAX_URI_LEN: usize = (u16::MAX - 1) as usize;

/// How a request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding` ending in `chunked`.
    Chunked,
}

/// A parsed request head.
#[derive(Debug)]
pub struct Head {
    pub parts: request::Parts,
    pub meta: Meta,
}

/// What a head decides besides its [`request::Parts`] (see [`parse_into`]).
#[derive(Debug, Clone, Copy)]
pub struct Meta {
    pub framing: Framing,
    /// The connection may carry another request after this one.
    pub keep_alive: bool,
    /// `Expect: 100-continue` (HTTP/1.1).
    pub expect_continue: bool,
    /// `TE` lists `trailers`: as hyper, trailer fields go only to a client
    /// that said it takes them.
    pub trailers_ok: bool,
}

/// Why a head was refused: the status answered, and the `reason` counted;
/// with the head's first `X-Request-Id` when it was read whole (for the
/// answer's ID, by the rule any request's follows).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub status: StatusCode,
    pub reason: &'static str,
    pub given_id: Option<HeaderValue>,
}

const fn bad(status: StatusCode, reason: &'static str) -> Refused {
    Refused { status, reason, given_id: None }
}

impl Refused {
    /// With the first `X-Request-Id` of `head`, a head `httparse` read
    /// whole: read again, as only a refusal needs it.
    #[cold]
    fn of_head(mut self, head: &[u8]) -> Refused {
        let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut storage);
        if let Ok(httparse::Status::Complete(_)) = req.parse(head) {
            let given = req.headers.iter().find(|h| h.name.eq_ignore_ascii_case(crate::headers::X_REQUEST_ID.as_str()));
            self.given_id = given.and_then(|h| crate::layers::request_id::copied_value(h.value));
        }
        self
    }
}
const MALFORMED: Refused = bad(StatusCode::BAD_REQUEST, "malformed");
const TOO_LARGE: Refused = bad(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE, "header_too_large");

/// Parses a request head at the start of `buf` (see [`parse_into`]).
pub fn parse(buf: &mut BytesMut, max: usize) -> Result<Option<Head>, Refused> {
    let mut parts = None;
    let meta = parse_into(buf, max, &mut parts)?;
    Ok(meta.map(|meta| Head { parts: parts.expect("set with its meta"), meta }))
}

/// Parses a request head at the start of `buf`; once complete, takes its
/// bytes off `buf` (the target and values are slices of them, no copy),
/// puts its parts in `out` and returns the rest of what it decides.
/// `Ok(None)`: not complete yet. `max`: the bytes a head may take.
///
/// The parts are written where the caller keeps them, not returned: the
/// head handed back through the connection's futures was copied whole at
/// each level (see benches/README.md, Decisions).
pub fn parse_into(buf: &mut BytesMut, max: usize, out: &mut Option<request::Parts>) -> Result<Option<Meta>, Refused> {
    // Not filled first (a pass over all of it, for every head): the
    // fields found are pushed.
    let mut spans = SmallVec::<[(u32, u32, u32, u32); MAX_HEADERS]>::new();
    let (len, method, target, version) = {
        // Left uninitialised, as hyper's parser leaves them: httparse
        // writes the fields it finds, and filling all of them first cost
        // every head a pass over the whole array.
        let mut storage = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
        let mut req = httparse::Request::new(&mut []);
        let bytes: &[u8] = buf;
        let len = match req.parse_with_uninit_headers(bytes, &mut storage) {
            Ok(httparse::Status::Complete(len)) if len <= max => len,
            Ok(httparse::Status::Complete(_)) => return Err(TOO_LARGE),
            Ok(httparse::Status::Partial) if bytes.len() >= max => return Err(TOO_LARGE),
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(httparse::Error::TooManyHeaders) => return Err(TOO_LARGE),
            Err(_) => return Err(MALFORMED),
        };
        let base = bytes.as_ptr() as usize;
        // An empty slice may point anywhere (httparse returns a constant).
        let at = |s: &[u8]| if s.is_empty() { 0 } else { (s.as_ptr() as usize - base) as u32 };
        for h in req.headers.iter() {
            let (name, value) = (at(h.name.as_bytes()), at(h.value));
            spans.push((name, name + h.name.len() as u32, value, value + h.value.len() as u32));
        }
        let path = req.path.unwrap_or_default();
        if path.len() > MAX_URI_LEN {
            return Err(bad(StatusCode::URI_TOO_LONG, "malformed").of_head(&bytes[..len]));
        }
        let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes())
            .map_err(|_| MALFORMED.of_head(&bytes[..len]))?;
        let target = (at(path.as_bytes()), at(path.as_bytes()) + path.len() as u32);
        (len, method, target, req.version.unwrap_or(0))
    };
    let frozen = buf.split_to(len).freeze();
    // (Each refusal from here on carries the head's ID: see `Refused::of_head`.)
    let uri = Uri::from_maybe_shared(frozen.slice(target.0 as usize..target.1 as usize))
        .map_err(|_| MALFORMED.of_head(&frozen))?;
    let version = if version == 1 { Version::HTTP_11 } else { Version::HTTP_10 };
    let fields = spans.iter().map(|&(n0, n1, v0, v1)| (&frozen[n0 as usize..n1 as usize], (v0, v1)));
    let mut head = Fields::new(version);
    // Room for the fields the gateway adds before it forwards the request
    // (forwarding, `via`, request id), which would grow the map twice.
    let mut headers = crate::headers::spare::map_with_room(spans.len() + ADDED_FIELDS);
    for (name, (v0, v1)) in fields {
        let name = crate::headers::parsed::name(name).map_err(|_| MALFORMED.of_head(&frozen))?;
        // SAFETY: a value span `httparse` (default configuration) returned.
        #[allow(unsafe_code)]
        let value = unsafe { crate::headers::parsed::value(&frozen, v0, v1) };
        if head.take(&name, &value, &mut headers).map_err(|r| r.of_head(&frozen))? {
            headers.append(name, value);
        }
    }
    let trailers_ok = head.trailers_ok;
    let (framing, keep_alive, expect_continue) = head.finish().map_err(|r| r.of_head(&frozen))?;
    let parts = out.insert(http::Request::new(()).into_parts().0);
    (parts.method, parts.uri, parts.version, parts.headers) = (method, uri, version, headers);
    Ok(Some(Meta { framing, keep_alive, expect_continue, trailers_ok }))
}

/// What the fields of a head decide, field by field, as hyper's server
/// (`proto::h1::role::Server::parse`) does.
struct Fields {
    version: Version,
    framing: Framing,
    keep_alive: bool,
    close: bool,
    expect_continue: bool,
    trailers_ok: bool,
    length: Option<u64>,
    has_length: bool,
    chunked_te: Option<bool>,
}

impl Fields {
    fn new(version: Version) -> Fields {
        Fields {
            version,
            framing: Framing::Empty,
            keep_alive: version == Version::HTTP_11,
            close: false,
            expect_continue: false,
            trailers_ok: false,
            length: None,
            has_length: false,
            chunked_te: None,
        }
    }

    /// Takes one field into account; returns whether it goes into the
    /// request's headers (a repeated `Content-Length`, or one beside
    /// `Transfer-Encoding`, does not).
    fn take(&mut self, name: &HeaderName, value: &HeaderValue, headers: &mut HeaderMap) -> Result<bool, Refused> {
        match *name {
            header::TRANSFER_ENCODING => {
                // RFC 9112 §6.1: a transfer coding in HTTP/1.0 cannot be
                // trusted; `chunked` must be the last coding.
                if self.version != Version::HTTP_11 {
                    return Err(MALFORMED);
                }
                if self.has_length && self.length.take().is_some() {
                    headers.remove(header::CONTENT_LENGTH);
                }
                let chunked = is_chunked(value);
                self.chunked_te = Some(chunked);
                if chunked {
                    self.framing = Framing::Chunked;
                }
            }
            header::CONTENT_LENGTH => {
                self.has_length = true;
                if self.chunked_te.is_some() {
                    return Ok(false);
                }
                let n = crate::headers::digits(value.as_bytes()).ok_or(MALFORMED)?;
                if let Some(before) = self.length {
                    return if before == n { Ok(false) } else { Err(MALFORMED) };
                }
                // The largest lengths are taken for states by hyper's decoder.
                if n > u64::MAX - 2 {
                    return Err(TOO_LARGE);
                }
                self.framing = if n == 0 { Framing::Empty } else { Framing::Length(n) };
                self.length = Some(n);
            }
            header::CONNECTION => {
                // Once any line asks to close, a later keep-alive does not undo it.
                if self.close || has_token(value, "close") {
                    (self.close, self.keep_alive) = (true, false);
                } else if !self.keep_alive {
                    self.keep_alive = has_token(value, "keep-alive");
                }
            }
            header::EXPECT => self.expect_continue = value.as_bytes().eq_ignore_ascii_case(b"100-continue"),
            // Here, where every field is looked at: a look-up in the map
            // after would cost a hash.
            header::TE => self.trailers_ok |= has_token(value, "trailers"),
            _ => {}
        }
        Ok(true)
    }

    fn finish(self) -> Result<(Framing, bool, bool), Refused> {
        if self.chunked_te == Some(false) {
            return Err(MALFORMED);
        }
        // RFC 9112 §6.1: such a message may be an attempt at smuggling; the
        // connection is closed after it.
        let keep_alive = self.keep_alive && !(self.chunked_te.is_some() && self.has_length);
        Ok((self.framing, keep_alive, self.expect_continue))
    }
}

/// `chunked` is the last coding listed.
fn is_chunked(value: &HeaderValue) -> bool {
    let Ok(s) = value.to_str() else { return false };
    s.rsplit(',').next().is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"))
}

/// Whether a comma-separated header value lists `token` (any case).
pub fn has_token(value: &HeaderValue, token: &str) -> bool {
    value.to_str().is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Option<Head>, Refused> {
        parse(&mut BytesMut::from(raw), 8192)
    }

    /// Framing and keep-alive, or the status refusing the head.
    type Decided = Result<(Framing, bool), u16>;

    /// (head, what is decided).
    #[test]
    fn framing_and_keep_alive_are_decided_as_hyper_decides_them() {
        use Framing::*;
        let ok = |f, k| Ok((f, k));
        let cases: &[(&str, Decided)] = &[
            ("GET / HTTP/1.1\r\nhost: a\r\n\r\n", ok(Empty, true)),
            ("GET / HTTP/1.0\r\n\r\n", ok(Empty, false)),
            ("GET / HTTP/1.0\r\nconnection: keep-alive\r\n\r\n", ok(Empty, true)),
            ("GET / HTTP/1.1\r\nconnection: close\r\nconnection: keep-alive\r\n\r\n", ok(Empty, false)),
            ("POST / HTTP/1.1\r\ncontent-length: 5\r\n\r\n", ok(Length(5), true)),
            ("POST / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 5\r\n\r\n", ok(Length(5), true)),
            ("POST / HTTP/1.1\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\ncontent-length: 5, 5\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\ncontent-length: +5\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\ncontent-length: 99999999999999999999\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\ncontent-length: 18446744073709551615\r\n\r\n", Err(431)),
            ("POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n", ok(Chunked, true)),
            ("POST / HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n", ok(Chunked, true)),
            ("POST / HTTP/1.1\r\ntransfer-encoding: chunked, identity\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ntransfer-encoding: gzip\r\n\r\n", Err(400)),
            ("POST / HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n", Err(400)),
            ("POST / HTTP/1.1\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n", ok(Chunked, false)),
            ("POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n", ok(Chunked, false)),
            ("GET / HTTP/1.1\r\nx: a\r\n b\r\n\r\n", Err(400)),
            ("GET / HTTP/1.1\nx: a\n\n", ok(Empty, true)),
            ("GET / HTTP/1.1\r\nx : a\r\n\r\n", Err(400)),
            ("GET / HTTP/2.0\r\n\r\n", Err(400)),
            ("G@T / HTTP/1.1\r\n\r\n", Err(400)),
            ("GET /a b HTTP/1.1\r\n\r\n", Err(400)),
        ];
        for (raw, want) in cases {
            let got = head(raw).map(|h| h.map(|h| (h.meta.framing, h.meta.keep_alive)).expect("complete"));
            assert_eq!(got.map_err(|r| r.status.as_u16()), *want, "{raw:?}");
        }
    }

    /// A refused head read whole carries its first `X-Request-Id` (for the
    /// answer's); one not read whole carries none.
    #[test]
    fn a_refusal_carries_the_heads_request_id() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                "POST / HTTP/1.1\r\nX-Request-Id: a\r\nx-request-id: b\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
                Some("a"),
            ),
            ("POST / HTTP/1.0\r\nx-request-id: c\r\ntransfer-encoding: chunked\r\n\r\n", Some("c")),
            ("POST / HTTP/1.1\r\ntransfer-encoding: gzip\r\n\r\n", None),
            ("GET /a b HTTP/1.1\r\nx-request-id: d\r\n\r\n", None),
        ];
        for (raw, want) in cases {
            let refused = head(raw).unwrap_err();
            assert_eq!(refused.given_id.as_ref().map(|v| v.to_str().unwrap()), *want, "{raw:?}");
        }
    }

    #[test]
    fn a_head_is_parts_and_bounded() {
        let mut buf = BytesMut::from("PUT /a?b HTTP/1.1\r\nHost: h\r\nX-Two: 1\r\nx-two: 2\r\n\r\nBODY");
        let h = parse(&mut buf, 8192).unwrap().unwrap();
        assert_eq!((&h.parts.method, h.parts.uri.to_string().as_str()), (&Method::PUT, "/a?b"));
        assert_eq!(h.parts.headers.get_all("x-two").iter().count(), 2);
        assert_eq!(&buf[..], b"BODY", "the head's bytes are taken off");
        assert!(head("GET / HTTP/1.1\r\nHost: h\r\n").unwrap().is_none());
        let long = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(9000));
        assert_eq!(head(&long).unwrap_err().status, 431);
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x{i}: y\r\n")).collect();
        assert_eq!(
            parse(&mut BytesMut::from(format!("GET / HTTP/1.1\r\n{many}\r\n").as_str()), 1 << 20).unwrap_err().status,
            431
        );
        let expect = head("PUT / HTTP/1.1\r\nexpect: 100-Continue\r\ncontent-length: 1\r\n\r\n").unwrap().unwrap();
        assert!(expect.meta.expect_continue);
    }
}
