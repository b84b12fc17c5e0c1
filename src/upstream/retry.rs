//! Whether an attempt is made again, and what it is made from.
//!
//! - [`should_retry`]: the route's retry decision, pure and table-tested:
//!   what failed, what the route retries on, whether attempts are left and
//!   whether the request can be sent again. The retry budget, which is
//!   state, is asked only after it says yes.
//! - [`HeadCopy`]: a bodiless request's head, kept to send it again.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Uri, Version};
use http_body_util::{Either, Empty};

use super::pool::SendBody;
use crate::config::RetryOn;

/// What an attempt came to, as far as retrying goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// No connection could be made: nothing was sent.
    Connect,
    /// The upstream closed or reset the connection before the response
    /// head, for a reason other than the client's own body.
    Reset,
    /// The upstream answered with this status.
    Status(u16),
    /// Anything else (a timeout, a protocol error, the client's body):
    /// never retried.
    Other,
}

/// Whether a route retries after `outcome`, with `left` retries left.
/// `resendable`: the request can be sent again whole (a bodiless
/// idempotent request whose head was kept, see [`HeadCopy`]). A request
/// that was never sent (`Connect`) comes back whole and needs no copy.
pub fn should_retry(outcome: Outcome, on: RetryOn, left: u32, resendable: bool) -> bool {
    left > 0
        && match outcome {
            Outcome::Connect => on.connect,
            Outcome::Reset => on.reset && resendable,
            Outcome::Status(503) => on.unavailable && resendable,
            Outcome::Status(_) | Outcome::Other => false,
        }
}

/// A bodiless request's head, kept to send it again (on a new connection
/// when its pooled one turns out stale, or as a retry).
///
/// Kept as bytes of its own, not as a clone of the request. A clone's
/// header values and path are slices of a buffer shared with other data
/// (an HTTP/2 connection's frame, or the block an HTTP/1 head is copied
/// into by `listener::detach`; before that copy, the client connection's
/// read buffer), and the copy, held until the response arrives, would keep
/// that buffer alive for every request in flight (see benches/README.md,
/// Decisions).
///
/// One buffer holds it all: the path, then for each header a 9-byte entry
/// (its name's length and its value's, as native `u32`s, and whether the
/// value is sensitive) followed by the name and the value. The map is built
/// again, through `HeaderName::from_bytes` and `HeaderValue`, only when the
/// copy is sent, which is rare. A copy is made for nearly every proxied
/// request (each one sent on a pooled connection), so it is made for
/// speed: one allocation, no per-header clone or drop. A list of
/// `(HeaderName, end)` beside the bytes, or a clone of the map, costs more
/// to make and drop (see benches/README.md, Decisions).
pub struct HeadCopy {
    method: Method,
    version: Version,
    /// An absolute-form URI (HTTP/2's), kept as it is; else the path is
    /// the start of `bytes`.
    uri: Option<Uri>,
    path_end: usize,
    headers: usize,
    bytes: Vec<u8>,
}

/// A header's entry in [`HeadCopy`]'s bytes, before its name and value.
const ENTRY: usize = 9;

impl HeadCopy {
    pub fn of(req: &Request<SendBody>) -> HeadCopy {
        let (uri, path) = match req.uri().scheme() {
            None => (None, req.uri().path_and_query().map_or("/", PathAndQuery::as_str)),
            Some(_) => (Some(req.uri().clone()), ""),
        };
        // Room for a typical head, grown if it is larger: exact sizing took a
        // pass over the headers that cost more than it saved.
        let mut bytes = Vec::with_capacity(path.len() + req.headers().len() * 64);
        bytes.extend_from_slice(path.as_bytes());
        for (name, value) in req.headers() {
            let (name_bytes, value_bytes) = (name.as_str().as_bytes(), value.as_bytes());
            let mut entry = [0u8; ENTRY];
            // A head is limited to far less than 4 GiB (`server.max_header_size`).
            entry[..4].copy_from_slice(&(name_bytes.len() as u32).to_ne_bytes());
            entry[4..8].copy_from_slice(&(value_bytes.len() as u32).to_ne_bytes());
            entry[8] = u8::from(value.is_sensitive());
            bytes.extend_from_slice(&entry);
            bytes.extend_from_slice(name_bytes);
            bytes.extend_from_slice(value_bytes);
        }
        HeadCopy {
            method: req.method().clone(),
            version: req.version(),
            uri,
            path_end: path.len(),
            headers: req.headers().len(),
            bytes,
        }
    }

    /// The request again; `None` only if a part no longer validates, which
    /// cannot happen to bytes taken from a valid request.
    pub fn into_request(self) -> Option<Request<SendBody>> {
        let bytes = Bytes::from(self.bytes);
        let uri = match self.uri {
            Some(uri) => uri,
            None => Uri::from(PathAndQuery::from_maybe_shared(bytes.slice(..self.path_end)).ok()?),
        };
        let mut headers = HeaderMap::with_capacity(self.headers);
        let mut at = self.path_end;
        while at < bytes.len() {
            let entry = bytes.get(at..at + ENTRY)?;
            let length = |i: usize| entry.get(i..i + 4)?.try_into().ok().map(u32::from_ne_bytes);
            let (name_at, value_at) = (at + ENTRY, at + ENTRY + length(0)? as usize);
            let end = value_at + length(4)? as usize;
            let name = HeaderName::from_bytes(bytes.get(name_at..value_at)?).ok()?;
            bytes.get(value_at..end)?;
            let mut value = HeaderValue::from_maybe_shared(bytes.slice(value_at..end)).ok()?;
            value.set_sensitive(entry[8] != 0);
            headers.append(name, value);
            at = end;
        }
        let mut req = Request::new(Either::Right(Empty::new()));
        *req.method_mut() = self.method;
        *req.version_mut() = self.version;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        Some(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_route_retries() {
        let all = RetryOn { connect: true, reset: true, unavailable: true };
        let connect_only = RetryOn { connect: true, ..RetryOn::default() };
        // (outcome, retry_on, retries left, resendable, retried)
        let cases = [
            (Outcome::Connect, connect_only, 1, false, true),
            (Outcome::Connect, all, 0, true, false),
            (Outcome::Connect, RetryOn::default(), 3, true, false),
            (Outcome::Reset, all, 1, true, true),
            // A request with a body (or not idempotent) is never resent.
            (Outcome::Reset, all, 1, false, false),
            (Outcome::Reset, connect_only, 1, true, false),
            (Outcome::Status(503), all, 2, true, true),
            (Outcome::Status(503), all, 2, false, false),
            (Outcome::Status(503), RetryOn { unavailable: false, ..all }, 2, true, false),
            (Outcome::Status(502), all, 2, true, false),
            (Outcome::Status(200), all, 2, true, false),
            (Outcome::Other, all, 2, true, false),
        ];
        for (outcome, on, left, resendable, want) in cases {
            assert_eq!(should_retry(outcome, on, left, resendable), want, "{outcome:?} {on:?} {left} {resendable}");
        }
    }

    /// A header: name, value, sensitive.
    type Header<'a> = (&'a str, &'a str, bool);

    /// A request whose path and header values are slices of one buffer, as
    /// hyper parses them from a connection's read buffer.
    fn parsed(buffer: &Bytes, uri: &str, headers: &[Header]) -> Request<SendBody> {
        let mut req = Request::new(Either::Right(Empty::new()));
        *req.method_mut() = Method::GET;
        *req.uri_mut() = uri.parse().unwrap();
        for (name, value, sensitive) in headers {
            let at = buffer.windows(value.len()).position(|w| w == value.as_bytes()).expect("value in the buffer");
            let mut v = HeaderValue::from_maybe_shared(buffer.slice(at..at + value.len())).unwrap();
            v.set_sensitive(*sensitive);
            req.headers_mut().append(HeaderName::from_bytes(name.as_bytes()).unwrap(), v);
        }
        req
    }

    #[test]
    fn a_head_copy_is_the_same_request_again() {
        let long = "c".repeat(3000);
        let many: Vec<(String, String)> = (0..40).map(|i| (format!("x-header-{i}"), "v".repeat(i * 7 + 1))).collect();
        let many: Vec<Header> =
            many.iter().enumerate().map(|(i, (n, v))| (n.as_str(), v.as_str(), i % 3 == 0)).collect();
        let buffer = Bytes::from(format!("example.com|a=1|b=2|secret|gzip, br|{long}|{}|", "v".repeat(300)));
        let cases: [(&str, &[Header]); 6] = [
            ("/", &[]),
            ("/search?q=1&r=%20", &[("host", "example.com", false), ("accept-encoding", "gzip, br", false)]),
            // Repeated names keep their order; sensitivity is kept.
            ("/p", &[("cookie", "a=1", false), ("cookie", "b=2", false), ("authorization", "secret", true)]),
            // An absolute-form URI (an HTTP/2 request) is kept whole.
            ("https://example.com:8443/x?y", &[("x-custom", "b=2", false)]),
            // Larger than the room made at first: the copy grows.
            ("/big", &[("cookie", long.as_str(), true), ("host", "example.com", false)]),
            ("/many", &many),
        ];
        for (uri, headers) in cases {
            let req = parsed(&buffer, uri, headers);
            let again = HeadCopy::of(&req).into_request().expect("a valid request is copied");
            assert_eq!(again.method(), req.method(), "{uri}");
            assert_eq!(again.version(), req.version(), "{uri}");
            assert_eq!(again.uri(), req.uri(), "{uri}");
            assert_eq!(again.headers(), req.headers(), "{uri}");
            let sensitive = |r: &Request<SendBody>| r.headers().values().map(|v| v.is_sensitive()).collect::<Vec<_>>();
            assert_eq!(sensitive(&again), sensitive(&req), "{uri}");
        }
    }

    /// The copy holds nothing of the buffer the request was parsed from: a
    /// clone would keep the client connection's read buffer alive until
    /// the response.
    #[test]
    fn a_head_copy_keeps_nothing_of_the_client_read_buffer() {
        let buffer = Bytes::from(b"/from-the-buffer example.com token".to_vec());
        let req = parsed(&buffer, "/from-the-buffer", &[("host", "example.com", false), ("x-token", "token", false)]);
        let copy = HeadCopy::of(&req);
        drop(req);
        assert!(buffer.is_unique(), "the copy still shares the request's buffer");
        drop(copy);
    }
}
