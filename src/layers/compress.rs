//! Response compression per route (`compress = true`), with tower-http's
//! `CompressionLayer` (gzip, br, zstd, by the client's `Accept-Encoding`
//! with q-values) and the predicate here: only compressible types, only
//! bodies of at least [`MIN_SIZE`], never 206 or 304 or a response whose
//! `Cache-Control` says `no-transform` (tower-http itself
//! skips responses that already have a `Content-Encoding` or a
//! `Content-Range`, and adds `Vary: Accept-Encoding`).
//!
//! A strong `ETag` names exact bytes, so a response compressed on the fly
//! keeps its `ETag` only as a weak one ([`weaken_etag`]), as nginx does;
//! every form of a compressible response (identity, 304, HEAD too) says
//! `Vary: Accept-Encoding` ([`settle_validators`]).
//! Cached files are compressed once and keep a strong `ETag` per encoding
//! (see `files`); tower-http leaves those alone, as they arrive encoded.

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body::Body;
use tower_http::compression::Predicate;

/// Smaller bodies are sent as they are: compression would save next to
/// nothing and cost a frame of its own.
pub const MIN_SIZE: u64 = 256;

/// What may be compressed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Compressible;

/// Marks the response to a `HEAD` request: its body is empty, but the
/// compression layer must choose as it would for the `GET` (RFC 9110
/// §9.3.2: the same header fields), so its size is its `Content-Length`.
#[derive(Debug, Clone, Copy)]
pub struct ForHead;

/// Marks a response whose coding was already chosen (a cached file, sent
/// in a stored form or as it is): the compression layer leaves it alone.
#[derive(Debug, Clone, Copy)]
pub struct Settled;

/// Marks the response to a request whose `If-Match` names an entity tag
/// ([`pins_a_form`]): sent as it is, the form whose tag was compared.
#[derive(Debug, Clone, Copy)]
pub struct Pinned;

/// Whether the request's `If-Match` names an entity tag (not `*`; an
/// empty line names none). The upstream or the file compared it with the
/// tag of the form it sends; a form encoded here has only a weak tag,
/// which `If-Match` never matches (RFC 9110 §13.1.1), so such a request is
/// answered in that form. A line that is not text is taken as one.
pub fn pins_a_form(headers: &http::HeaderMap) -> bool {
    headers.get_all(header::IF_MATCH).iter().any(|line| match line.to_str() {
        Ok(list) => crate::headers::etags::entity_tags(list).any(|tag| tag != "*"),
        Err(_) => true,
    })
}

impl Predicate for Compressible {
    fn should_compress<B: Body>(&self, response: &Response<B>) -> bool {
        if response.extensions().get::<Settled>().is_some() || response.extensions().get::<Pinned>().is_some() {
            return false;
        }
        let status = response.status();
        if status == StatusCode::PARTIAL_CONTENT
            || status == StatusCode::NOT_MODIFIED
            || no_transform(response.headers())
        {
            return false;
        }
        let for_head = response.extensions().get::<ForHead>().is_some();
        let length = response.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
        let size = match response.body().size_hint().exact() {
            Some(n) if !for_head => Some(n),
            // A HEAD's body is empty, so its length says the GET's size;
            // one the gateway made itself (an error) still holds the
            // GET's body and may have no length.
            Some(n) if length.is_none() && n > 0 => Some(n),
            _ => length,
        };
        let big_enough = size.is_none_or(|n| n >= MIN_SIZE);
        big_enough && response.headers().get(header::CONTENT_TYPE).is_some_and(is_compressible)
    }
}

/// Text, JSON, JavaScript, XML, SVG and a few more: types that compress.
pub fn is_compressible(content_type: &HeaderValue) -> bool {
    let Ok(ct) = content_type.to_str() else { return false };
    let essence = ct.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    let (kind, sub) = essence.split_once('/').unwrap_or((&essence, ""));
    match kind {
        "text" => sub != "event-stream",
        "application" => {
            matches!(
                sub,
                "json"
                    | "javascript"
                    | "ecmascript"
                    | "xml"
                    | "xhtml+xml"
                    | "rss+xml"
                    | "atom+xml"
                    | "wasm"
                    | "x-javascript"
                    | "manifest+json"
                    | "ld+json"
                    | "graphql-response+json"
                    | "x-ndjson"
            ) || sub.ends_with("+json")
                || sub.ends_with("+xml")
        }
        "image" => sub == "svg+xml" || sub == "x-icon" || sub == "bmp",
        "font" => matches!(sub, "ttf" | "otf"),
        _ => false,
    }
}

/// Marks a response that reached the compression layer already encoded (a
/// cached file's stored variant, or an upstream's own encoding): its `ETag`
/// is its own and stays strong.
#[derive(Debug, Clone, Copy)]
pub struct PreEncoded;

/// Before the compression layer: see [`PreEncoded`].
pub fn mark_encoded<B>(mut response: Response<B>) -> Response<B> {
    if response.headers().contains_key(header::CONTENT_ENCODING) {
        response.extensions_mut().insert(PreEncoded);
    }
    response
}

/// After the compression layer, on every response of a compressing route
/// but those whose coding was chosen before it ([`Settled`],
/// [`PreEncoded`]): a response encoded here gets a weak `ETag` (its bytes
/// are not those the tag names), as nginx does; one that could have been
/// (a compressible type, or a 304, whose type is often left out, and
/// `Cache-Control` allows transforms) says `Vary: Accept-Encoding` in
/// every form, so a cache keeps the codings apart. The identity form keeps
/// its strong tag: `If-Range` and ranges still work with it.
///
/// A 304 carries the `ETag` its 200 would have (RFC 9110 §15.4.5): the
/// weak one when the client holds the encoded form (see [`Held`]).
pub fn settle_validators<B>(response: Response<B>, held: Option<&Held>) -> Response<B> {
    let ext = response.extensions();
    if ext.get::<Settled>().is_some() || ext.get::<PreEncoded>().is_some() {
        return response;
    }
    let headers = response.headers();
    let encoded_here = headers.contains_key(header::CONTENT_ENCODING);
    let could_be = match headers.get(header::CONTENT_TYPE) {
        Some(ct) => is_compressible(ct),
        None => response.status() == StatusCode::NOT_MODIFIED,
    };
    let varies = encoded_here || (could_be && !no_transform(headers));
    if !varies {
        return response;
    }
    let encoded_for_client = encoded_here
        || (response.status() == StatusCode::NOT_MODIFIED
            && headers.get(header::ETAG).is_some_and(|etag| held.is_some_and(|h| h.weak_form_of(etag))));
    let mut response = response;
    let headers = response.headers_mut();
    let listed = headers.get_all(header::VARY).iter().any(|v| {
        v.to_str()
            .is_ok_and(|v| v.split(',').any(|t| t.trim() == "*" || t.trim().eq_ignore_ascii_case("accept-encoding")))
    });
    if !listed {
        headers.append(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    if encoded_for_client { weaken_etag(response) } else { response }
}

/// The answer to a HEAD on a compressing route: its GET's headers and no
/// body. A length its GET would send (a body the gateway made, such as an
/// error's, sent as it is) is said, as on a route without compression; an
/// upstream's or a file's HEAD has an empty body, which says nothing of
/// its GET's length, and a 204 or 304 has none to say.
pub fn head_of(mut response: Response<crate::body::Body>) -> Response<crate::body::Body> {
    let headers = response.headers();
    let framed = [header::CONTENT_LENGTH, header::CONTENT_ENCODING, header::TRANSFER_ENCODING]
        .iter()
        .any(|name| headers.contains_key(name));
    let status = response.status();
    let bodiless = status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED || status.is_informational();
    if let (false, false, Some(n @ 1..)) = (framed, bodiless, response.body().size_hint().exact()) {
        response.headers_mut().insert(header::CONTENT_LENGTH, n.into());
    }
    response.map(|_| crate::body::Body::empty())
}

/// What a conditional request on a compressing route says the client
/// holds: its `If-None-Match` lines, kept only when it accepts a coding
/// the gateway makes. A 304 whose strong tag the client lists only in its
/// weak form answers a client that holds the form encoded here, so it
/// carries that form's weak tag, as the 200 to the same request would.
#[derive(Debug, Clone)]
pub struct Held(Vec<HeaderValue>);

impl Held {
    /// `None` when no 304 could need it: no `If-None-Match`, no coding
    /// the client accepts, or an `If-Match` that keeps the answer as it is
    /// ([`pins_a_form`]).
    pub fn of(headers: &http::HeaderMap) -> Option<Held> {
        let lines = headers.get_all(header::IF_NONE_MATCH);
        let mut lines = lines.iter().peekable();
        lines.peek()?;
        negotiate(headers.get(header::ACCEPT_ENCODING))?;
        if pins_a_form(headers) {
            return None;
        }
        Some(Held(lines.cloned().collect()))
    }

    /// Whether the client lists `etag` (a strong tag) in its weak form
    /// and not as it is.
    fn weak_form_of(&self, etag: &HeaderValue) -> bool {
        let Ok(ours) = etag.to_str() else { return false };
        if ours.starts_with("W/") {
            return false;
        }
        let tags =
            || self.0.iter().flat_map(|line| crate::headers::etags::entity_tags(line.to_str().unwrap_or_default()));
        tags().any(|t| t.strip_prefix("W/") == Some(ours)) && !tags().any(|t| t == ours)
    }
}

/// Whether `Cache-Control` forbids transforming the content (RFC 9111
/// §5.2.2.6), compression included.
pub fn no_transform(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(header::CACHE_CONTROL)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.split(',').any(|d| d.trim().eq_ignore_ascii_case("no-transform"))))
}

/// Makes a strong `ETag` weak: for a response compressed on the fly, whose
/// bytes are no longer those the tag was made for.
pub fn weaken_etag<B>(mut response: Response<B>) -> Response<B> {
    if let Some(etag) = response.headers().get(header::ETAG)
        && !etag.as_bytes().starts_with(b"W/")
    {
        let mut weak = b"W/".to_vec();
        weak.extend_from_slice(etag.as_bytes());
        if let Ok(v) = HeaderValue::from_bytes(&weak) {
            response.headers_mut().insert(header::ETAG, v);
        }
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A HEAD's answer has no body, and says the length its GET would
    /// send: that of a body sent as it is, none for one encoded here.
    #[test]
    fn a_head_says_the_length_of_its_get() {
        let answer = |status: u16, body: &'static str, fields: &[(header::HeaderName, &'static str)]| {
            let mut r = Response::new(crate::body::Body::full(body));
            *r.status_mut() = StatusCode::from_u16(status).unwrap();
            for (name, value) in fields {
                r.headers_mut().insert(name, HeaderValue::from_static(value));
            }
            let r = head_of(r);
            assert_eq!(r.body().size_hint().exact(), Some(0));
            r.headers().get(header::CONTENT_LENGTH).map(|v| v.to_str().unwrap().to_owned())
        };
        let error = "bad gateway\n";
        assert_eq!(answer(502, error, &[]).as_deref(), Some("12"));
        assert_eq!(answer(200, error, &[(header::CONTENT_LENGTH, "4096")]).as_deref(), Some("4096"));
        assert_eq!(answer(200, error, &[(header::CONTENT_ENCODING, "gzip")]), None);
        assert_eq!(answer(200, error, &[(header::TRANSFER_ENCODING, "chunked")]), None);
        // An upstream's HEAD (an empty body) and a 204 or 304 get none made up.
        assert_eq!(answer(200, "", &[]), None);
        assert_eq!(answer(204, error, &[]), None);
        assert_eq!(answer(304, error, &[]), None);
    }

    /// Which `If-Match` keeps an answer as it is: one naming a tag, on any
    /// line; `*` alone does not.
    #[test]
    fn if_match_with_a_tag_pins_the_form() {
        let cases: &[(&[&str], bool)] = &[
            (&[], false),
            (&["*"], false),
            (&[" * "], false),
            (&[""], false),
            (&[" , ,"], false),
            (&["\"a\""], true),
            (&["*", "W/\"a\""], true),
            (&["", "\"a\""], true),
        ];
        for (lines, want) in cases {
            let mut req = http::HeaderMap::new();
            req.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
            req.insert(header::IF_NONE_MATCH, HeaderValue::from_static("W/\"a\""));
            for line in *lines {
                req.append(header::IF_MATCH, HeaderValue::from_static(line));
            }
            assert_eq!(pins_a_form(&req), *want, "{lines:?}");
            assert_eq!(Held::of(&req).is_none(), *want, "{lines:?}");
        }
    }

    /// A 304's tag on a compressing route, by what the request says the
    /// client holds: (Accept-Encoding, If-None-Match lines, the 304's
    /// ETag, the ETag sent).
    #[test]
    fn a_304_carries_the_tag_of_the_form_the_client_holds() {
        let cases: &[(Option<&str>, &[&str], &str, &str)] = &[
            (Some("gzip"), &["W/\"a\""], "\"a\"", "W/\"a\""),
            (Some("br;q=0.5"), &["\"x\", W/\"a\""], "\"a\"", "W/\"a\""),
            // Over two lines, one list.
            (Some("gzip"), &["\"x\"", "W/\"a\""], "\"a\"", "W/\"a\""),
            // It holds the identity form (too, or only).
            (Some("gzip"), &["\"a\""], "\"a\"", "\"a\""),
            (Some("gzip"), &["W/\"a\", \"a\""], "\"a\"", "\"a\""),
            // Another tag, a star, a tag that is weak already.
            (Some("gzip"), &["W/\"b\""], "\"a\"", "\"a\""),
            (Some("gzip"), &["*"], "\"a\"", "\"a\""),
            (Some("gzip"), &["W/\"a\""], "W/\"a\"", "W/\"a\""),
            // A comma inside a tag's quotes.
            (Some("gzip"), &["W/\"a,b\""], "\"a,b\"", "W/\"a,b\""),
            (Some("gzip"), &["W/\"a,b\", \"a,b\""], "\"a,b\"", "\"a,b\""),
            // No coding it accepts: its 200 would be the identity form.
            (None, &["W/\"a\""], "\"a\"", "\"a\""),
            (Some("gzip;q=0, identity"), &["W/\"a\""], "\"a\"", "\"a\""),
        ];
        for (accept, lines, etag, want) in cases {
            let mut req = http::HeaderMap::new();
            if let Some(a) = accept {
                req.insert(header::ACCEPT_ENCODING, HeaderValue::from_static(a));
            }
            for line in *lines {
                req.append(header::IF_NONE_MATCH, HeaderValue::from_static(line));
            }
            let mut r = Response::new(());
            *r.status_mut() = StatusCode::NOT_MODIFIED;
            r.headers_mut().insert(header::ETAG, HeaderValue::from_static(etag));
            let held = Held::of(&req);
            let r = settle_validators(r, held.as_ref());
            assert_eq!(r.headers()[header::ETAG], *want, "{accept:?} {lines:?} {etag}");
            // Only a 304 is judged by it: a 200 not encoded here keeps its tag.
            let mut ok = Response::new(());
            ok.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            ok.headers_mut().insert(header::ETAG, HeaderValue::from_static(etag));
            assert_eq!(settle_validators(ok, held.as_ref()).headers()[header::ETAG], *etag);
        }
    }

    /// A HEAD is compressed as its GET would be: by its length, by its
    /// body when the gateway made it with one and no length, and as a body
    /// of unknown size otherwise.
    #[test]
    fn a_head_is_judged_as_its_get() {
        let response = |head: bool, length: Option<u64>, body: &'static str| {
            let mut r = Response::new(crate::body::Body::full(body));
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            if let Some(n) = length {
                r.headers_mut().insert(header::CONTENT_LENGTH, n.into());
            }
            if head {
                r.extensions_mut().insert(ForHead);
            }
            r
        };
        let error = "precondition failed\n";
        let cases = [
            (false, None, error, false),
            (true, None, error, false),
            (true, Some(4096), "", true),
            (true, Some(20), "", false),
            (true, None, "", true),
            (false, None, "", false),
        ];
        for (head, length, body, want) in cases {
            assert_eq!(Compressible.should_compress(&response(head, length, body)), want, "{head} {length:?} {body:?}");
        }
    }

    #[test]
    fn compressible_types() {
        let yes = [
            "text/html",
            "text/css; charset=utf-8",
            "application/json",
            "application/vnd.api+json",
            "image/svg+xml",
            "application/javascript",
            "application/xml",
        ];
        let no = [
            "image/png",
            "image/jpeg",
            "application/octet-stream",
            "text/event-stream",
            "application/zip",
            "video/mp4",
            "application/grpc",
        ];
        for t in yes {
            assert!(is_compressible(&HeaderValue::from_static(t)), "{t}");
        }
        for t in no {
            assert!(!is_compressible(&HeaderValue::from_static(t)), "{t}");
        }
    }
}

/// A content coding the gateway can produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Br,
    Zstd,
    Gzip,
}

impl Coding {
    pub const ALL: [Coding; 3] = [Coding::Br, Coding::Zstd, Coding::Gzip];

    pub fn token(self) -> &'static str {
        match self {
            Coding::Br => "br",
            Coding::Zstd => "zstd",
            Coding::Gzip => "gzip",
        }
    }
}

/// The coding the client prefers among those the gateway produces, by
/// `Accept-Encoding` q-values (RFC 9110 §12.5.3); ties go to the one that
/// usually compresses best (br, zstd, gzip). `None`: send it as it is.
///
/// Hand-written for the file cache, which picks a stored variant itself;
/// tower-http's negotiation (used for everything else) is not public.
pub fn negotiate(accept: Option<&HeaderValue>) -> Option<Coding> {
    let text = accept?.to_str().ok()?;
    let q_of = |wanted: &str| -> Option<f32> {
        let mut star = None;
        for item in text.split(',') {
            let mut parts = item.split(';');
            let token = parts.next()?.trim();
            let q = parts
                .find_map(|p| p.trim().strip_prefix("q=").or_else(|| p.trim().strip_prefix("Q=")))
                .and_then(|q| q.trim().parse::<f32>().ok())
                .unwrap_or(1.0);
            if token.eq_ignore_ascii_case(wanted) {
                return Some(q);
            }
            if token == "*" {
                star = Some(q);
            }
        }
        star
    };
    let mut best: Option<(Coding, f32)> = None;
    for coding in Coding::ALL {
        if let Some(q) = q_of(coding.token())
            && q > 0.0
            && best.is_none_or(|(_, b)| q > b)
        {
            best = Some((coding, q));
        }
    }
    best.map(|(c, _)| c)
}

#[cfg(test)]
mod negotiate_tests {
    use super::*;

    #[test]
    fn negotiate_table() {
        let cases: &[(Option<&str>, Option<Coding>)] = &[
            (None, None),
            (Some(""), None),
            (Some("identity"), None),
            (Some("gzip"), Some(Coding::Gzip)),
            (Some("gzip, deflate, br"), Some(Coding::Br)),
            (Some("gzip;q=1.0, br;q=0.5"), Some(Coding::Gzip)),
            (Some("br;q=0, gzip;q=0.1"), Some(Coding::Gzip)),
            (Some("zstd, gzip"), Some(Coding::Zstd)),
            (Some("*"), Some(Coding::Br)),
            (Some("*;q=0.5, gzip;q=0.8"), Some(Coding::Gzip)),
            (Some("*, br;q=0"), Some(Coding::Zstd)),
            (Some("gzip;q=0"), None),
            (Some("GZIP"), Some(Coding::Gzip)),
        ];
        for (accept, want) in cases {
            let v = accept.map(HeaderValue::from_static);
            assert_eq!(negotiate(v.as_ref()), *want, "{accept:?}");
        }
    }
}
