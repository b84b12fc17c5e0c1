//! A response head encoded for the client (RFC 9112 §4, §6), with the
//! body's framing decided the way hyper's server decides it
//! (`proto::h1::role::Server::encode` and `Conn::enforce_version`), and
//! the body's frames encoded in that framing. Pure: parts in, bytes out.

use std::cell::RefCell;
use std::time::{Duration, SystemTime};

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version, response};

use super::head::has_token;
use crate::headers::X_REQUEST_ID;

/// What the response's body is known to be, as hyper's dispatcher tells
/// its encoder: none at all, a known length, or a stream of unknown length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    None,
    Known(u64),
    Unknown,
}

/// How the body goes on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Encoder {
    /// Exactly this many bytes (0: none is written).
    Length(u64),
    /// Chunks, with the trailer fields the response declared in `Trailer`.
    Chunked(Vec<HeaderName>),
    /// Until the connection closes.
    Close,
}

/// The request a response answers, as far as the response's framing goes.
#[derive(Debug, Clone, Copy)]
pub struct Asked<'a> {
    pub method: &'a Method,
    pub version: Version,
    /// The connection may carry another request (the request allowed it
    /// and no shutdown has begun).
    pub keep_alive: bool,
}

/// Encodes the response head into `out`; returns the body's encoder and
/// whether the connection must close after the response. `id`: the
/// request ID, written after the map's fields in place of any
/// `X-Request-Id` there (see `server::App::handle_with`).
pub fn head(
    parts: &mut response::Parts,
    body: BodyLength,
    asked: Asked<'_>,
    id: Option<&HeaderValue>,
    out: &mut BytesMut,
) -> (Encoder, bool) {
    let status = parts.status;
    let (version, keep_alive) = fix_connection(parts, asked);
    let connect_ok = *asked.method == Method::CONNECT && status.is_success();
    let can_chunk = can_chunk(asked.method, status);
    let can_length = !(status.is_informational() || connect_ok || bodiless(status));
    status_line(out, version, status, parts.extensions.get::<hyper::ext::ReasonPhrase>());
    let chunk_ok = version != Version::HTTP_10 && can_chunk;
    let written = fields(&parts.headers, body, asked.method, (chunk_ok, connect_ok), id, out);
    let mut encoder = match written.encoder {
        Some(encoder) => encoder,
        None => match body {
            BodyLength::Unknown if chunk_ok => {
                out.put_slice(b"transfer-encoding: chunked\r\n");
                Encoder::Chunked(Vec::new())
            }
            BodyLength::Unknown => Encoder::Close,
            BodyLength::None | BodyLength::Known(0) => {
                if can_length && *asked.method != Method::HEAD {
                    out.put_slice(b"content-length: 0\r\n");
                }
                Encoder::Length(0)
            }
            BodyLength::Known(n) if can_length => {
                let mut digits = [0u8; 20];
                field(out, "content-length", number(n, 10, &mut digits));
                Encoder::Length(n)
            }
            BodyLength::Known(_) => Encoder::Length(0),
        },
    };
    if !can_chunk {
        encoder = Encoder::Length(0);
    }
    if let (Encoder::Chunked(allowed), Some(names)) = (&mut encoder, written.trailers) {
        *allowed = names;
    }
    let last = status == StatusCode::SWITCHING_PROTOCOLS
        || connect_ok
        || !keep_alive
        || written.close
        || encoder == Encoder::Close;
    if !written.date {
        date(out);
    }
    out.put_slice(b"\r\n");
    (encoder, last)
}

/// Room for a response head with `headers` and the fields and framing
/// this module adds, so that it is written into one allocation.
pub fn capacity(headers: &HeaderMap) -> usize {
    let fields: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum();
    // The status line, `date`, and a framing and a `connection` field.
    fields + 160
}

/// hyper's `enforce_version`: an HTTP/1.0 client keeps the connection
/// only when told so (and gets an HTTP/1.0 status line); an HTTP/1.1 one
/// is told when it will not. Returns the status line's version and
/// whether the connection stays open.
fn fix_connection(parts: &mut response::Parts, asked: Asked<'_>) -> (Version, bool) {
    let says = |token| parts.headers.get_all(header::CONNECTION).iter().any(|v| has_token(v, token));
    let keep_alive = asked.keep_alive;
    if asked.version != Version::HTTP_10 {
        if !keep_alive && !says("close") {
            parts.headers.append(header::CONNECTION, HeaderValue::from_static("close"));
        }
        return (parts.version, keep_alive);
    }
    if says("keep-alive") {
        return (Version::HTTP_10, keep_alive);
    }
    // An answer that closes its connection is not said to keep it.
    if parts.version == Version::HTTP_10 || says("close") {
        return (Version::HTTP_10, false);
    }
    if keep_alive && parts.version == Version::HTTP_11 {
        parts.headers.append(header::CONNECTION, HeaderValue::from_static("keep-alive"));
    }
    (Version::HTTP_10, keep_alive)
}

/// What writing the fields found.
struct Written {
    /// The framing a `Content-Length` or `Transfer-Encoding` field set.
    encoder: Option<Encoder>,
    date: bool,
    /// The names `Trailer` declared.
    trailers: Option<Vec<HeaderName>>,
    /// `Connection: close`.
    close: bool,
}

/// Writes the header fields, each name on one line but for the ordinary
/// ones (as hyper does), and the framing fields only where they may be.
fn fields(
    headers: &HeaderMap,
    body: BodyLength,
    method: &Method,
    (chunk_ok, connect_ok): (bool, bool),
    id: Option<&HeaderValue>,
    out: &mut BytesMut,
) -> Written {
    let mut w = Written { encoder: None, date: false, trailers: None, close: false };
    let mut wrote_len = connect_ok;
    // One walk over the fields (a name's lines come one after the other,
    // sharing the name's address): a look-up per name costs a hash each.
    let mut previous: *const HeaderName = std::ptr::null();
    for (name, value) in headers.iter() {
        let again = std::ptr::eq(previous, name);
        previous = name;
        let whole =
            matches!(*name, header::CONTENT_LENGTH | header::TRANSFER_ENCODING | header::CONNECTION | header::TRAILER);
        if again && whole {
            continue;
        }
        let values = || headers.get_all(name);
        match *name {
            header::CONTENT_LENGTH if !wrote_len => {
                let first = value;
                let n = match body {
                    BodyLength::Known(n) => n,
                    BodyLength::Unknown => match crate::headers::digits(first.as_bytes()) {
                        Some(n) => n,
                        None => continue,
                    },
                    BodyLength::None if *method != Method::HEAD => continue,
                    BodyLength::None => 0,
                };
                w.encoder = Some(Encoder::Length(n));
                field(out, "content-length", first.as_bytes());
                wrote_len = true;
            }
            header::CONTENT_LENGTH => {}
            header::TRANSFER_ENCODING if !wrote_len && chunk_ok => {
                wrote_len = true;
                w.encoder = Some(Encoder::Chunked(Vec::new()));
                let mut line = joined(values().iter());
                if !is_chunked(values().iter().next_back().expect("a value")) {
                    line.extend_from_slice(b", chunked");
                }
                field(out, "transfer-encoding", &line);
            }
            header::TRANSFER_ENCODING => {}
            header::CONNECTION => {
                w.close |= values().iter().any(|v| has_token(v, "close"));
                field(out, "connection", &joined(values().iter()));
            }
            header::TRAILER if chunk_ok => {
                let names = values().into_iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(','));
                let names = names.filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok());
                w.trailers.get_or_insert_with(Vec::new).extend(names);
                field(out, "trailer", &joined(values().iter()));
            }
            header::TRAILER => {}
            _ if id.is_some() && *name == X_REQUEST_ID => {}
            _ => {
                w.date |= *name == header::DATE;
                field(out, name.as_str(), value.as_bytes());
            }
        }
    }
    if let Some(id) = id {
        field(out, X_REQUEST_ID.as_str(), id.as_bytes());
    }
    w
}

/// Whether a response may have a body at all (and so chunks).
/// What a response's framing turns on of its request's method: `HEAD`,
/// `CONNECT` or another (see [`framed_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FramedAs {
    Head,
    Connect,
    Other,
}

impl FramedAs {
    /// A method framed as this one: `GET` for any other.
    pub fn method(self) -> Method {
        match self {
            FramedAs::Head => Method::HEAD,
            FramedAs::Connect => Method::CONNECT,
            FramedAs::Other => Method::GET,
        }
    }
}

/// How [`head`] frames the answer to a `method` request.
pub fn framed_as(method: &Method) -> FramedAs {
    match *method {
        Method::HEAD => FramedAs::Head,
        Method::CONNECT => FramedAs::Connect,
        _ => FramedAs::Other,
    }
}

fn can_chunk(method: &Method, status: StatusCode) -> bool {
    let connect_ok = *method == Method::CONNECT && status.is_success();
    !(*method == Method::HEAD || status.is_informational() || bodiless(status) || connect_ok)
}

fn bodiless(status: StatusCode) -> bool {
    matches!(status, StatusCode::NO_CONTENT | StatusCode::NOT_MODIFIED)
}

fn status_line(out: &mut BytesMut, version: Version, status: StatusCode, reason: Option<&hyper::ext::ReasonPhrase>) {
    out.put_slice(if version == Version::HTTP_10 { b"HTTP/1.0 " } else { b"HTTP/1.1 " });
    out.put_slice(status.as_str().as_bytes());
    out.put_u8(b' ');
    match reason {
        Some(reason) => out.put_slice(reason.as_bytes()),
        // A reason must be written: many parsers expect one.
        None => out.put_slice(status.canonical_reason().unwrap_or("<none>").as_bytes()),
    }
    out.put_slice(b"\r\n");
}

fn field(out: &mut BytesMut, name: &str, value: &[u8]) {
    out.reserve(name.len() + value.len() + 4);
    out.put_slice(name.as_bytes());
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
}

/// `n` in base `radix` (10, or 16 with capitals), written without an
/// allocation into `buf`.
fn number(mut n: u64, radix: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b"0123456789ABCDEF"[(n % radix) as usize];
        n /= radix;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// The values of a field's lines as one line's value, joined by `, `.
fn joined<'a>(values: impl Iterator<Item = &'a HeaderValue>) -> Vec<u8> {
    let mut line = Vec::new();
    for v in values {
        if !line.is_empty() {
            line.extend_from_slice(b", ");
        }
        line.extend_from_slice(v.as_bytes());
    }
    line
}

fn is_chunked(value: &HeaderValue) -> bool {
    value.to_str().is_ok_and(|s| s.rsplit(',').next().is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked")))
}

/// Appends a `date` field.
fn date(out: &mut BytesMut) {
    with_date(|text| field(out, "date", text));
}

/// Runs `f` on the `date` field's value, formatted once a second per
/// thread.
pub fn with_date<R>(f: impl FnOnce(&Bytes) -> R) -> R {
    thread_local! {
        static CACHED: RefCell<(u64, Bytes)> = const { RefCell::new((0, Bytes::new())) };
    }
    // The coarse clock is exact enough for a field of whole seconds, and
    // cheaper to read, once a response.
    let second = crate::clock::coarse_seconds();
    CACHED.with_borrow_mut(|(at, text)| {
        if *at != second || text.is_empty() {
            *text = Bytes::from(httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(second)));
            *at = second;
        }
        f(text)
    })
}

/// A 1xx head from the upstream (`raw`, as it came) as the client gets
/// it: the status and its reason, and the fields but the hop-by-hop ones
/// (RFC 9110 §7.6.1). Nothing is written if `raw` is not such a head.
pub fn interim(raw: &[u8], out: &mut BytesMut, request_ids: bool) {
    let mut storage = [httparse::EMPTY_HEADER; super::head::MAX_HEADERS];
    let mut parsed = httparse::Response::new(&mut storage);
    let Ok(httparse::Status::Complete(_)) = parsed.parse(raw) else { return };
    let Some(status) = parsed.code.and_then(|c| StatusCode::from_u16(c).ok()).filter(StatusCode::is_informational)
    else {
        return;
    };
    let mut fields = HeaderMap::with_capacity(parsed.headers.len());
    for f in parsed.headers.iter() {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(f.name.as_bytes()), HeaderValue::from_bytes(f.value)) {
            fields.append(name, value);
        }
    }
    crate::headers::interim::strip(&mut fields, request_ids);
    // The upstream's own, as a final head's is kept; none, the usual one.
    let reason =
        parsed.reason.filter(|r| !r.is_empty()).and_then(|r| hyper::ext::ReasonPhrase::try_from(r.as_bytes()).ok());
    status_line(out, Version::HTTP_11, status, reason.as_ref());
    for (name, value) in &fields {
        field(out, name.as_str(), value.as_bytes());
    }
    out.put_slice(b"\r\n");
}

/// Trailer fields no sender may put in a trailer section (RFC 9110 §6.5.1),
/// as hyper's encoder drops them.
const NOT_IN_TRAILERS: &[HeaderName] = &[
    header::AUTHORIZATION,
    header::CACHE_CONTROL,
    header::CONTENT_ENCODING,
    header::CONTENT_LENGTH,
    header::CONTENT_RANGE,
    header::CONTENT_TYPE,
    header::HOST,
    header::MAX_FORWARDS,
    header::SET_COOKIE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::TE,
];

/// One data frame as a chunk (`chunked`), into `out`.
pub fn chunk(out: &mut BytesMut, data: &[u8]) {
    if data.is_empty() {
        return;
    }
    out.reserve(data.len() + 20);
    let mut digits = [0u8; 20];
    out.put_slice(number(data.len() as u64, 16, &mut digits));
    out.put_slice(b"\r\n");
    out.put_slice(data);
    out.put_slice(b"\r\n");
}

/// The chunked body's end, with the trailer fields `allowed` lets through.
pub fn last_chunk(out: &mut BytesMut, trailers: Option<&HeaderMap>, allowed: &[HeaderName]) {
    out.put_slice(b"0\r\n");
    for (name, value) in trailers.into_iter().flatten() {
        if allowed.contains(name) && !NOT_IN_TRAILERS.contains(name) {
            field(out, name.as_str(), value.as_bytes());
        }
    }
    out.put_slice(b"\r\n");
}

#[cfg(test)]
#[path = "encode_tests.rs"]
mod tests;
