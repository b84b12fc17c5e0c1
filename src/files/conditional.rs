//! Conditional and range requests on a file, pure and table-tested: what
//! `If-Match`, `If-Unmodified-Since`, `If-None-Match`, `If-Modified-Since`,
//! `Range` and `If-Range` (RFC 9110 §13, §14) make of a request for a file
//! with a given validator, date and length, evaluated in the order of RFC
//! 9110 §13.2.2.

use std::time::SystemTime;

use http::Method;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// The entity tags a conditional field lists over all its lines, which
/// make one list (RFC 9110 §5.3); none from a line that is not text.
fn tags(headers: &HeaderMap, name: HeaderName) -> impl Iterator<Item = &str> {
    headers
        .get_all(name)
        .into_iter()
        .flat_map(|line| crate::headers::etags::entity_tags(line.to_str().unwrap_or_default()))
}

/// Whether `If-None-Match` matches `etag` (weak comparison, RFC 9110 §13.1.2).
pub fn none_match(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let ours = etag.to_str().unwrap_or_default();
    tags(headers, header::IF_NONE_MATCH).any(|t| t == "*" || t.trim_start_matches("W/") == ours)
}

/// Whether `If-Match` holds for `etag`: `*` (the file exists), or one of
/// its entity tags equal to it by the strong comparison, which a weak tag
/// never passes (RFC 9110 §13.1.1, §8.8.3.2).
fn matches(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let ours = etag.to_str().unwrap_or_default();
    tags(headers, header::IF_MATCH).any(|t| t == "*" || (t == ours && !t.starts_with("W/")))
}

/// Whether `If-Match` names `etag` (a strong tag) itself, `*` aside.
pub fn if_match_names(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let ours = etag.to_str().unwrap_or_default();
    tags(headers, header::IF_MATCH).any(|t| t == ours && !t.starts_with("W/"))
}

/// A time in whole seconds: HTTP dates have one-second resolution.
fn secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A conditional field's date in whole seconds; `None` if it is not one,
/// or the field has more than one line (it is then ignored, RFC 9110
/// §13.1.3, §13.1.4).
fn date(headers: &HeaderMap, name: HeaderName) -> Option<u64> {
    let mut lines = headers.get_all(name).into_iter();
    let (Some(line), None) = (lines.next(), lines.next()) else { return None };
    line.to_str().ok().and_then(|s| httpdate::parse_http_date(s).ok()).map(secs)
}

/// Whether the request's preconditions fail for a file with this ETag and
/// date (answered 412): `If-Match`, else `If-Unmodified-Since` (RFC 9110
/// §13.2.2, steps 1 and 2; §13.1.1, §13.1.4).
pub fn precondition_failed(etag: &HeaderValue, modified: SystemTime, headers: &HeaderMap) -> bool {
    match headers.contains_key(header::IF_MATCH) {
        true => !matches(headers, etag),
        false => date(headers, header::IF_UNMODIFIED_SINCE).is_some_and(|since| secs(modified) > since),
    }
}

/// The outcome of evaluating conditional and range headers, pure.
#[derive(Debug, PartialEq, Eq)]
pub enum Plan {
    PreconditionFailed,
    NotModified,
    Full,
    Partial(u64, u64),
    Unsatisfiable,
}

/// What to answer for a file with this ETag, date and length, to a
/// request with `headers`, now (the answer's `Date` is now, by the same
/// clock).
pub fn plan(entry_etag: &HeaderValue, modified: SystemTime, len: u64, method: &Method, headers: &HeaderMap) -> Plan {
    plan_at(entry_etag, modified, len, method, headers, crate::clock::coarse_now())
}

/// [`plan`] in an answer dated `now`.
fn plan_at(
    entry_etag: &HeaderValue,
    modified: SystemTime,
    len: u64,
    method: &Method,
    headers: &HeaderMap,
    now: SystemTime,
) -> Plan {
    if precondition_failed(entry_etag, modified, headers) {
        return Plan::PreconditionFailed;
    }
    if headers.contains_key(header::IF_NONE_MATCH) {
        if none_match(headers, entry_etag) {
            return Plan::NotModified;
        }
    } else if date(headers, header::IF_MODIFIED_SINCE).is_some_and(|since| secs(modified) <= since) {
        // Unmodified since (RFC 9110 §13.1.3).
        return Plan::NotModified;
    }
    if method != Method::GET {
        return Plan::Full;
    }
    let Some(range) = headers.get(header::RANGE).and_then(|r| r.to_str().ok()) else {
        return Plan::Full;
    };
    // If-Range: a validator that no longer matches means "send it all".
    if let Some(if_range) = headers.get(header::IF_RANGE)
        && !if_range_holds(if_range, entry_etag, modified, now)
    {
        return Plan::Full;
    }
    match http_range_header::parse_range_header(range) {
        // Only bytes ranges are understood; anything else is ignored (RFC 9110 §14.2).
        Err(_) => Plan::Full,
        Ok(parsed) => match parsed.validate(len) {
            Ok(ranges) if ranges.len() == 1 => Plan::Partial(*ranges[0].start(), *ranges[0].end()),
            // Multiple ranges would need multipart/byteranges; the whole file is a valid answer.
            Ok(_) => Plan::Full,
            Err(_) => Plan::Unsatisfiable,
        },
    }
}

/// Whether `If-Range` names the file as it is (RFC 9110 §13.1.5): its
/// strong tag, or its `Last-Modified` exactly, when that date is strong,
/// at least a second before the answer's `Date` (§8.8.2.2): a file
/// modified in the second it is answered in may change again within that
/// second and keep the date.
fn if_range_holds(if_range: &HeaderValue, etag: &HeaderValue, modified: SystemTime, now: SystemTime) -> bool {
    if if_range == etag {
        return true;
    }
    secs(modified) < secs(now) && if_range.to_str().ok() == Some(httpdate::fmt_http_date(modified).as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hv(s: &str) -> HeaderValue {
        HeaderValue::from_str(s).unwrap()
    }

    #[test]
    fn plan_table() {
        let etag = hv("\"abc-10\"");
        let modified = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        let lm = httpdate::fmt_http_date(modified);
        let later = httpdate::fmt_http_date(modified + std::time::Duration::from_secs(60));
        let (lm2, later2) = (lm.clone(), later.clone());
        let earlier = httpdate::fmt_http_date(modified - std::time::Duration::from_secs(60));
        type Case<'a> = (Method, Vec<(&'a str, String)>, Plan);
        let cases: Vec<Case> = vec![
            (Method::GET, vec![], Plan::Full),
            (Method::GET, vec![("if-none-match", "\"abc-10\"".into())], Plan::NotModified),
            (Method::GET, vec![("if-none-match", "W/\"abc-10\"".into())], Plan::NotModified),
            (Method::GET, vec![("if-none-match", "\"x\", \"abc-10\"".into())], Plan::NotModified),
            (Method::GET, vec![("if-none-match", "*".into())], Plan::NotModified),
            (Method::GET, vec![("if-none-match", "\"other\"".into())], Plan::Full),
            (Method::HEAD, vec![("if-none-match", "\"abc-10\"".into())], Plan::NotModified),
            (Method::GET, vec![("if-modified-since", lm.clone())], Plan::NotModified),
            (Method::GET, vec![("if-modified-since", later)], Plan::NotModified),
            (Method::GET, vec![("if-modified-since", earlier.clone())], Plan::Full),
            (Method::GET, vec![("if-none-match", "\"other\"".into()), ("if-modified-since", lm.clone())], Plan::Full),
            (Method::GET, vec![("range", "bytes=0-3".into())], Plan::Partial(0, 3)),
            (Method::GET, vec![("range", "bytes=-4".into())], Plan::Partial(6, 9)),
            (Method::GET, vec![("range", "bytes=5-".into())], Plan::Partial(5, 9)),
            (Method::GET, vec![("range", "bytes=5-100".into())], Plan::Partial(5, 9)),
            (Method::GET, vec![("range", "bytes=20-30".into())], Plan::Unsatisfiable),
            (Method::GET, vec![("range", "lines=1-2".into())], Plan::Full),
            (Method::GET, vec![("range", "bytes=0-1,4-5".into())], Plan::Full),
            (Method::HEAD, vec![("range", "bytes=0-3".into())], Plan::Full),
            (Method::GET, vec![("range", "bytes=0-3".into()), ("if-range", "\"abc-10\"".into())], Plan::Partial(0, 3)),
            (Method::GET, vec![("range", "bytes=0-3".into()), ("if-range", lm)], Plan::Partial(0, 3)),
            (Method::GET, vec![("range", "bytes=0-3".into()), ("if-range", "\"old\"".into())], Plan::Full),
            (Method::GET, vec![("range", "bytes=0-3".into()), ("if-range", earlier.clone())], Plan::Full),
            (Method::GET, vec![("range", "bytes=0-3".into()), ("if-range", "W/\"abc-10\"".into())], Plan::Full),
            // If-Match: strong comparison; `*` for a file that exists.
            (Method::GET, vec![("if-match", "\"abc-10\"".into())], Plan::Full),
            (Method::GET, vec![("if-match", "\"x\", \"abc-10\"".into())], Plan::Full),
            (Method::GET, vec![("if-match", "*".into())], Plan::Full),
            (Method::GET, vec![("if-match", "\"nope\"".into())], Plan::PreconditionFailed),
            (Method::GET, vec![("if-match", "W/\"abc-10\"".into())], Plan::PreconditionFailed),
            (Method::HEAD, vec![("if-match", "\"nope\"".into())], Plan::PreconditionFailed),
            // Before If-None-Match and Range (RFC 9110 §13.2.2).
            (
                Method::GET,
                vec![("if-match", "\"nope\"".into()), ("if-none-match", "\"abc-10\"".into())],
                Plan::PreconditionFailed,
            ),
            (
                Method::GET,
                vec![("if-match", "\"nope\"".into()), ("range", "bytes=0-3".into())],
                Plan::PreconditionFailed,
            ),
            (Method::GET, vec![("if-match", "\"abc-10\"".into()), ("range", "bytes=0-3".into())], Plan::Partial(0, 3)),
            // If-Unmodified-Since, only without If-Match; a bad date is ignored.
            (Method::GET, vec![("if-unmodified-since", earlier.clone())], Plan::PreconditionFailed),
            (Method::GET, vec![("if-unmodified-since", lm2.clone())], Plan::Full),
            (Method::GET, vec![("if-unmodified-since", later2.clone())], Plan::Full),
            (Method::GET, vec![("if-unmodified-since", "yesterday".into())], Plan::Full),
            (Method::GET, vec![("if-match", "*".into()), ("if-unmodified-since", earlier.clone())], Plan::Full),
            // A field's lines make one list (RFC 9110 §5.3); a date field
            // with more than one is ignored (§13.1.3, §13.1.4).
            (Method::GET, vec![("if-match", "\"nope\"".into()), ("if-match", "\"abc-10\"".into())], Plan::Full),
            (
                Method::GET,
                vec![("if-none-match", "\"nope\"".into()), ("if-none-match", "\"abc-10\"".into())],
                Plan::NotModified,
            ),
            (
                Method::GET,
                vec![("if-unmodified-since", earlier.clone()), ("if-unmodified-since", later2.clone())],
                Plan::Full,
            ),
            (Method::GET, vec![("if-modified-since", later2.clone()), ("if-modified-since", earlier)], Plan::Full),
        ];
        for (method, hs, want) in cases {
            let mut headers = HeaderMap::new();
            for (k, v) in &hs {
                headers.append(http::HeaderName::from_static(k), hv(v));
            }
            let now = modified + std::time::Duration::from_secs(1);
            assert_eq!(plan_at(&etag, modified, 10, &method, &headers, now), want, "{method} {hs:?}");
        }
    }

    /// A date in `If-Range` counts only when it is strong: the file's
    /// `Last-Modified` a whole second or more before the answer's `Date`
    /// (RFC 9110 §13.1.5, §8.8.2.2); its strong tag counts whenever.
    #[test]
    fn if_range_dates_must_be_strong() {
        let etag = hv("\"abc-10\"");
        let t = |s: u64, ms: u64| SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(s * 1000 + ms);
        let modified = t(1_700_000_000, 900);
        let lm = httpdate::fmt_http_date(modified);
        // If-Range, answer's date, plan.
        let cases: &[(&str, SystemTime, Plan)] = &[
            (&lm, t(1_700_000_000, 950), Plan::Full),
            (&lm, t(1_700_000_000, 900), Plan::Full),
            (&lm, t(1_700_000_001, 0), Plan::Partial(0, 3)),
            (&lm, t(1_700_000_060, 0), Plan::Partial(0, 3)),
            // A clock behind the file's time: never strong.
            (&lm, t(1_699_999_999, 0), Plan::Full),
            ("\"abc-10\"", t(1_700_000_000, 950), Plan::Partial(0, 3)),
        ];
        for (if_range, now, want) in cases {
            let mut headers = HeaderMap::new();
            headers.insert(header::RANGE, hv("bytes=0-3"));
            headers.insert(header::IF_RANGE, hv(if_range));
            assert_eq!(plan_at(&etag, modified, 10, &Method::GET, &headers, *now), *want, "{if_range} at {now:?}");
        }
    }
}
