//! The fields of an upstream's 1xx answer as they are passed on.

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{self, HeaderMap};

use super::rules::HeaderRules;

/// Fields a 1xx head is read with at most here; one with more is dropped.
const MAX_FIELDS: usize = 100;

/// The 1xx head `raw` (as the upstream sent it) without the fields the
/// route's response `rules` remove or set, in any spelling of `-` and `_`:
/// an operator who removes a field from the answers expects it to reach
/// no client, and one whose value the rules set gets it on the final
/// answer only (a 1xx carries nothing the rules add). `None` if `raw` is
/// not a head this can read (it is then not passed on).
pub fn without(raw: &[u8], rules: &HeaderRules) -> Option<Bytes> {
    let mut storage = [httparse::EMPTY_HEADER; MAX_FIELDS];
    let mut parsed = httparse::Response::new(&mut storage);
    let Ok(httparse::Status::Complete(_)) = parsed.parse(raw) else { return None };
    let line_end = raw.iter().position(|&b| b == b'\n')? + 1;
    let named = |field: &str| rules.names().any(|name| spelled_as(field, name.as_str()));
    let mut out = BytesMut::with_capacity(raw.len());
    out.put_slice(&raw[..line_end]);
    for f in parsed.headers.iter().filter(|f| !named(f.name)) {
        out.put_slice(f.name.as_bytes());
        out.put_slice(b": ");
        out.put_slice(f.value);
        out.put_slice(b"\r\n");
    }
    out.put_slice(b"\r\n");
    Some(out.freeze())
}

/// Whether a field named `field` (as written) is `name` (lower-case), in
/// any case and any spelling of `-` and `_` (see [`super::same_cgi_name`]).
fn spelled_as(field: &str, name: &str) -> bool {
    field.len() == name.len()
        && field
            .bytes()
            .zip(name.bytes())
            .all(|(f, n)| f.to_ascii_lowercase() == n || matches!((f, n), (b'-', b'_') | (b'_', b'-')))
}

/// Takes out of a 1xx answer's `fields` what the next hop must not get:
/// the hop-by-hop fields, all in first so that the fields `Connection`
/// names go with it (RFC 9110 §7.6.1); `TE`, a request's field; and
/// `Content-Length`, which no 1xx may carry (RFC 9110 §8.6); and, when
/// the gateway sets request IDs (`request_ids`), the upstream's
/// `X-Request-Id`, as its final head's is replaced: the gateway's comes
/// with the answer.
pub fn strip(fields: &mut HeaderMap, request_ids: bool) {
    super::strip_hop_by_hop(fields);
    fields.remove(header::TE);
    fields.remove(header::CONTENT_LENGTH);
    if request_ids {
        fields.remove(super::X_REQUEST_ID);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What reaches the client of a 103 under a route's rules: the fields
    /// named by `remove` or `set`, in any case or spelling, are gone; the
    /// status line and the other fields stay as they came.
    #[test]
    fn a_1xx_loses_the_fields_the_rules_name() {
        let rules = HeaderRules {
            set: vec![(header::SERVER, "gateway".parse().unwrap())],
            remove: vec![http::HeaderName::from_static("x-secret"), header::SET_COOKIE],
        };
        let cases: &[(&str, Option<&str>)] = &[
            (
                "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\nX-Secret: t\r\nServer: b/1\r\nSet-Cookie: s=1\r\n\r\n",
                Some("HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"),
            ),
            (
                "HTTP/1.1 102 Processing\r\nx_secret: t\r\nX-SECRET: u\r\nx-secrets: kept\r\n\r\n",
                Some("HTTP/1.1 102 Processing\r\nx-secrets: kept\r\n\r\n"),
            ),
            (
                "HTTP/1.1 103 Early Hints\nLink: </b>\nSet-Cookie: s=1\n\n",
                Some("HTTP/1.1 103 Early Hints\nLink: </b>\r\n\r\n"),
            ),
            ("HTTP/1.1 103 Early Hints\r\n\r\n", Some("HTTP/1.1 103 Early Hints\r\n\r\n")),
            ("HTTP/1.1 103 Early\r\nLink", None),
        ];
        for (raw, want) in cases {
            let got = without(raw.as_bytes(), &rules);
            assert_eq!(got.as_deref(), want.map(str::as_bytes), "{raw:?}");
        }
        let many: String = (0..=MAX_FIELDS).map(|i| format!("x{i}: y\r\n")).collect();
        assert_eq!(without(format!("HTTP/1.1 103 Early Hints\r\n{many}\r\n").as_bytes(), &rules), None);
    }

    #[test]
    fn only_end_to_end_fields_are_passed_on() {
        let mut fields = HeaderMap::new();
        for (name, value) in [
            ("link", "<a>"),
            ("connection", "close, x-hint"),
            ("x-hint", "1"),
            ("te", "trailers"),
            ("content-length", "10"),
            ("transfer-encoding", "chunked"),
            ("keep-alive", "5"),
            ("link", "<b>"),
        ] {
            fields.append(http::HeaderName::from_static(name), value.parse().unwrap());
        }
        fields.append(http::HeaderName::from_static("x-request-id"), "up-1".parse().unwrap());
        let mut kept = fields.clone();
        strip(&mut fields, true);
        let left: Vec<_> = fields.iter().map(|(n, v)| format!("{n}: {}", v.to_str().unwrap())).collect();
        assert_eq!(left, ["link: <a>", "link: <b>"]);
        // Without request IDs of the gateway's, the upstream's passes.
        strip(&mut kept, false);
        let left: Vec<_> = kept.iter().map(|(n, v)| format!("{n}: {}", v.to_str().unwrap())).collect();
        assert_eq!(left, ["link: <a>", "link: <b>", "x-request-id: up-1"]);
    }
}
