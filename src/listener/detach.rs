//! A request head copied out of hyper's read buffer as the request is
//! handed to the gateway.
//!
//! hyper's HTTP/1 server parses a request head in its connection's read
//! buffer and hands the target and every field value over as slices of it.
//! With the head parsed, and before the request's future first runs, it
//! reads the connection again (to notice a client that goes away), and its
//! `reserve` finds the buffer shared with those slices: so it allocates a
//! new buffer for every request, while the old one lives until the
//! request lets go of its head: with many slow requests in flight, that
//! churn costs resident memory on every connection (see
//! benches/README.md, Decisions). Copied out here, in the service's
//! synchronous call, the head leaves the buffer unshared, and hyper reuses
//! it.
//!
//! The copies are cut from a per-thread block rather than allocated one by
//! one, as [`crate::layers::request_id::copied_value`] does for single
//! values: a cut is a reference count where an allocation of its own would
//! be two (the bytes and their shared count). A request's fields live only
//! until its upstream request is encoded (or its answer is made), so a
//! block is freed soon after it is used up; one held by a request that
//! waits (in a queue, or for a cache fill) holds at most a block, less than
//! the read buffer it would hold otherwise.

use bytes::{Bytes, BytesMut};
use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Uri, Version};

/// The size of the per-thread block the heads are copied into (a larger
/// head gets a block of its own size).
const BLOCK: usize = 4096;

/// Replaces `req`'s target and field values with copies of their own (see
/// the module's documentation). HTTP/2 requests are left as they are: they
/// do not come from hyper's HTTP/1 read buffer.
pub fn detach<B>(req: &mut Request<B>) {
    if req.version() == Version::HTTP_2 {
        return;
    }
    let origin_form = req.uri().scheme().is_none() && req.uri().authority().is_none();
    let target: &[u8] = match req.uri().path_and_query() {
        Some(target) if origin_form => target.as_str().as_bytes(),
        // The absolute and authority forms (a forward proxy's request,
        // CONNECT) are rare enough to be written out and parsed again.
        _ => {
            if let Ok(uri) = Uri::try_from(req.uri().to_string()) {
                *req.uri_mut() = uri;
            }
            &[]
        }
    };
    let length = target.len() + req.headers().values().map(HeaderValue::len).sum::<usize>();
    let copy = copy_into_block(length, |copy| {
        copy.extend_from_slice(target);
        for value in req.headers().values() {
            copy.extend_from_slice(value.as_bytes());
        }
    });
    let mut at = target.len();
    if at > 0
        && let Ok(target) = PathAndQuery::from_maybe_shared(copy.slice(..at))
    {
        *req.uri_mut() = Uri::from(target);
    }
    for value in req.headers_mut().values_mut() {
        let end = at + value.len();
        let sensitive = value.is_sensitive();
        // SAFETY: the bytes are an exact copy of a valid header value.
        // Checking them again would cost a pass over every byte of every
        // field of every request (see benches/README.md, Decisions).
        #[allow(unsafe_code)]
        let mut copied = unsafe { HeaderValue::from_maybe_shared_unchecked(copy.slice(at..end)) };
        copied.set_sensitive(sensitive);
        *value = copied;
        at = end;
    }
}

/// `length` bytes written by `write` into the current thread's block (a
/// new one when it has no room left), as one `Bytes` to cut slices from.
fn copy_into_block(length: usize, write: impl FnOnce(&mut BytesMut)) -> Bytes {
    thread_local! {
        static BLOCK_LEFT: std::cell::RefCell<BytesMut> = std::cell::RefCell::new(BytesMut::new());
    }
    BLOCK_LEFT.with_borrow_mut(|left| {
        if left.capacity() < length {
            *left = BytesMut::with_capacity(BLOCK.max(length));
        }
        write(left);
        debug_assert_eq!(left.len(), length);
        left.split().freeze()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request as hyper hands it over: its target and values slices of
    /// one read buffer.
    fn parsed(buffer: &Bytes, head: &str, version: Version) -> Request<()> {
        let at = |s: &str| {
            let start = head.find(s).expect("in the head");
            buffer.slice(start..start + s.len())
        };
        let mut lines = head.split("\r\n");
        let target = lines.next().expect("a request line").split(' ').nth(1).expect("a target");
        let mut req = Request::new(());
        *req.version_mut() = version;
        *req.uri_mut() = Uri::from_maybe_shared(at(target)).expect("a valid target");
        for line in lines.filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(": ").expect("a field");
            let value = HeaderValue::from_maybe_shared(at(value)).expect("a valid value");
            req.headers_mut().append(http::HeaderName::from_bytes(name.as_bytes()).expect("a name"), value);
        }
        req
    }

    /// Whatever the target and fields, nothing of the read buffer is held
    /// afterwards, and the request reads as it did.
    #[test]
    fn a_detached_head_holds_nothing_of_the_read_buffer() {
        let obs_text = "GET /o HTTP/1.1\r\nX-Latin: caf\u{e9}\r\n\r\n";
        for head in [
            "GET /b HTTP/1.1\r\nHost: example.test\r\n\r\n",
            "GET /b?x=1&y=%20 HTTP/1.1\r\nHost: h\r\nAccept: */*\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n",
            "GET /e HTTP/1.1\r\nHost: h\r\nX-Empty: \r\nX-Tab: a\tb\r\n\r\n",
            "GET http://example.test:8080/p?q HTTP/1.1\r\nHost: example.test:8080\r\n\r\n",
            "CONNECT example.test:443 HTTP/1.1\r\nHost: example.test:443\r\n\r\n",
            "OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/1.0\r\n\r\n",
            obs_text,
        ] {
            let buffer = Bytes::copy_from_slice(head.as_bytes());
            let mut req = parsed(&buffer, head, Version::HTTP_11);
            let before = (req.uri().clone(), req.headers().clone());
            if let Some(v) = req.headers_mut().get_mut("cookie") {
                v.set_sensitive(true);
            }
            let sensitive: Vec<bool> = req.headers().values().map(HeaderValue::is_sensitive).collect();
            // Clones hold the buffer too: compared, then dropped.
            let (uri, headers) = before;
            assert_eq!(req.uri(), &uri, "{head:?}");
            assert_eq!(req.uri().to_string(), uri.to_string(), "{head:?}");
            drop(uri);
            detach(&mut req);
            assert_eq!(req.headers(), &headers, "{head:?}");
            drop(headers);
            assert!(buffer.is_unique(), "{head:?}: the request still holds the read buffer");
            let after: Vec<bool> = req.headers().values().map(HeaderValue::is_sensitive).collect();
            assert_eq!(after, sensitive, "{head:?}: sensitivity kept");
        }
    }

    /// HTTP/2 requests are left alone; a head longer than a block is
    /// copied whole.
    #[test]
    fn http2_is_left_and_long_heads_are_whole() {
        let head = "GET /h2 HTTP/2\r\nHost: h\r\n\r\n";
        let buffer = Bytes::copy_from_slice(head.as_bytes());
        let mut req = parsed(&buffer, head, Version::HTTP_2);
        detach(&mut req);
        assert!(!buffer.is_unique(), "an HTTP/2 request is not copied");

        let long = format!("GET /long HTTP/1.1\r\nX-Long: {}\r\nX-After: z\r\n\r\n", "v".repeat(3 * BLOCK));
        let buffer = Bytes::copy_from_slice(long.as_bytes());
        let mut req = parsed(&buffer, &long, Version::HTTP_11);
        detach(&mut req);
        assert!(buffer.is_unique());
        assert_eq!(req.headers()["x-long"].len(), 3 * BLOCK);
        assert_eq!(req.headers()["x-after"], "z");
        assert_eq!(req.uri(), "/long");
    }
}
