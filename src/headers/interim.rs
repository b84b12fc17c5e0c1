//! The fields of an upstream's 1xx answer as they are passed on.

use http::header::{self, HeaderMap};

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
