//! The entry a fill stores: what of an answer's head is kept (and what of
//! the filling request: only its `Vary` fields), the windows it may be
//! served in, and how a 304 refreshes it.

use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode, header, request, response};

use super::CACHE_STATUS;
use super::RouteCache;
use super::rules::{self, Directives};
use super::status::{Stamps, Status};
use super::store::Entry;
use super::targeted;
use crate::body::Body;
use crate::headers::X_REQUEST_ID;

/// The entry a storable head makes (its body still to come), or `None`.
pub(super) fn judge(
    cache: &RouteCache,
    head: &request::Parts,
    parts: &response::Parts,
    now: SystemTime,
) -> Option<Entry> {
    let config = &cache.store.config;
    if content_length(&parts.headers).is_some_and(|n| n > config.max_entry) {
        return None;
    }
    let windows = (config.stale_while_revalidate, config.stale_if_error);
    entry_of(head, parts, now, (config.default_ttl, &config.targeted), windows, cache.id_slot)
}

/// The entry for a response head to a request head, if it may be stored,
/// judged by its first valid targeted field of `targets` in place of its
/// `Cache-Control` and `Expires` (RFC 9213), or by those.
pub fn entry_of(
    head: &request::Parts,
    parts: &response::Parts,
    now: SystemTime,
    (default_ttl, targets): (Duration, &[http::HeaderName]),
    (while_revalidate, if_error): (Duration, Duration),
    id_slot: bool,
) -> Option<Entry> {
    // What is kept is copied out of the connections' read buffers (a
    // header value received is a slice of one, which it would keep
    // alive), and of the request only its `Vary` fields: the store's
    // weights are then what it really holds.
    let (judged, targeted) = targeted::judged(&parts.headers, targets);
    let d = Directives::of(&judged);
    let lifetime = rules::lifetime(&judged, &d, default_ttl);
    if !rules::storable_by_head(parts.status, &judged, lifetime) || !rules::storable_for(&head.headers, &d) {
        return None;
    }
    drop(judged);
    let mut parts = detached_response(parts);
    // RFC 9110 §6.6.1: an answer without `Date` is given its receipt time,
    // or each hit would carry its own time as `Date` beside its `Age`.
    if !parts.headers.contains_key(header::DATE) {
        parts.headers.insert(header::DATE, date_value(now));
    }
    let vary = vary_of(&parts.headers, head)?;
    Some(Entry {
        born: Entry::born(&parts.headers, now),
        status: parts.status,
        headers: with_slots(parts.headers, id_slot),
        body: Bytes::new(),
        lifetime: lifetime.expect("storable has a lifetime"),
        while_revalidate: rules::stale_window(&d, d.stale_while_revalidate, while_revalidate),
        if_error: rules::stale_window(&d, d.stale_if_error, if_error),
        vary,
        targeted,
        stamps: Stamps::default(),
    })
}

/// What an answer with `response`'s head to `head` varies on, or `None`
/// when it cannot be keyed: a Vary name that is not a header name cannot
/// be matched, and one the upstream did not see as the client sent it
/// (hop-by-hop, or set by the gateway) cannot key the client's answer.
pub(super) fn vary_of(
    response: &http::HeaderMap,
    head: &request::Parts,
) -> Option<Vec<(http::HeaderName, Option<String>)>> {
    let nominated = crate::headers::Nominated::of(&head.headers);
    rules::vary_names(response)
        .map(|n| {
            let name = http::HeaderName::from_bytes(n.as_bytes()).ok()?;
            if crate::headers::not_as_sent(&name, &nominated) {
                return None;
            }
            let value = rules::vary_value(&head.headers, &name);
            Some((name, value))
        })
        .collect()
}

/// `when` as an HTTP date.
pub(super) fn date_value(when: SystemTime) -> http::HeaderValue {
    http::HeaderValue::from_str(&httpdate::fmt_http_date(when)).expect("an HTTP date is a header value")
}

/// A 304's head merged into the stored one (RFC 9111 §4.3.4), fresh again
/// from now, and whether the merged head may be stored. Everything the
/// entry's use depends on is judged again from the merged head: its
/// storability, lifetime, stale windows and what it varies on (for the
/// request that revalidated it).
pub(super) fn refresh(
    old: &Entry,
    head: &request::Parts,
    not_modified: &response::Parts,
    now: SystemTime,
    (while_revalidate, if_error): (Duration, Duration),
    (id_slot, targets): (bool, &[http::HeaderName]),
) -> (Entry, bool) {
    let mut not_modified = detached_response(not_modified);
    // Its age is the 304's (the stored `Age` was the old answer's), its
    // `Date` the receipt time when it has none.
    if !not_modified.headers.contains_key(header::DATE) {
        not_modified.headers.insert(header::DATE, date_value(now));
    }
    let not_modified = &not_modified;
    let mut headers = old.headers.clone();
    let updated = |name: &&header::HeaderName| {
        ![header::CONTENT_LENGTH, header::CONTENT_ENCODING, header::TRANSFER_ENCODING, header::CONTENT_RANGE]
            .contains(*name)
    };
    // Every line of a field the 304 has replaces every line stored.
    for name in not_modified.headers.keys().filter(updated) {
        headers.remove(name);
    }
    for (name, value) in not_modified.headers.iter().filter(|(n, _)| updated(n)) {
        headers.append(name.clone(), value.clone());
    }
    if !not_modified.headers.contains_key(header::AGE) {
        headers.remove(header::AGE);
    }
    let (judged, targeted) = targeted::judged(&headers, targets);
    let d = Directives::of(&judged);
    let lifetime = rules::lifetime(&judged, &d, old.lifetime).unwrap_or(old.lifetime);
    let vary = vary_of(&headers, head);
    let storable = rules::storable_by_head(old.status, &judged, Some(lifetime))
        && rules::storable_for(&head.headers, &d)
        && vary.is_some();
    drop(judged);
    let entry = Entry {
        born: Entry::born(&not_modified.headers, now),
        status: old.status,
        headers: with_slots(headers, id_slot),
        body: old.body.clone(),
        lifetime,
        while_revalidate: rules::stale_window(&d, d.stale_while_revalidate, while_revalidate),
        if_error: rules::stale_window(&d, d.stale_if_error, if_error),
        vary: vary.unwrap_or_else(|| old.vary.clone()),
        targeted,
        stamps: Stamps::default(),
    };
    (entry, storable)
}

/// `headers` in allocations of their own.
pub(super) fn detached(headers: &http::HeaderMap) -> http::HeaderMap {
    let mut out = http::HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let mut copy = http::HeaderValue::from_bytes(value.as_bytes()).expect("was a header value");
        copy.set_sensitive(value.is_sensitive());
        out.append(name.clone(), copy);
    }
    out
}

/// A response head with its headers detached (see [`detached`]).
pub(super) fn detached_response(parts: &response::Parts) -> response::Parts {
    let mut r = Response::new(());
    *r.status_mut() = parts.status;
    *r.version_mut() = parts.version;
    *r.headers_mut() = detached(&parts.headers);
    r.into_parts().0
}

/// A stored head with a field for each one every answer from it sets
/// (`Age`, `Cache-Status`, and `X-Request-Id` when `id_slot`), a
/// placeholder where the upstream sent none. An answer is a clone of the
/// head, and a clone has no spare room: adding a field to it grew its
/// entries on every hit (a reallocation and a copy of every field), where
/// replacing a value does not (see benches/README.md, Decisions). Every
/// placeholder is replaced before an answer leaves: `Age` and
/// `Cache-Status` by `from_entry`, `X-Request-Id` by `App::handle`.
pub(super) fn with_slots(mut headers: http::HeaderMap, id_slot: bool) -> http::HeaderMap {
    // The gateway's `Cache-Status` member goes after the upstream's
    // (RFC 9211 §2): its slot is the last line, whatever came before.
    let upstream: Vec<_> =
        headers.get_all(super::CACHE_STATUS).iter().filter(|v| v.as_bytes() != b"-").cloned().collect();
    headers.remove(super::CACHE_STATUS);
    for value in upstream {
        headers.append(super::CACHE_STATUS, value);
    }
    headers.append(super::CACHE_STATUS, http::HeaderValue::from_static("-"));
    let slots = [(header::AGE, true), (X_REQUEST_ID, id_slot)];
    for (name, wanted) in slots {
        if wanted && !headers.contains_key(&name) {
            headers.insert(name, http::HeaderValue::from_static("-"));
        }
    }
    // An insert reserves a place before it looks for the name: with one
    // to spare in the table of indices (which a clone keeps), replacing a
    // value grows nothing.
    headers.reserve(1);
    headers
}

impl Entry {
    pub(super) fn clone_entry(&self) -> Entry {
        Entry {
            born: self.born,
            status: self.status,
            headers: self.headers.clone(),
            body: self.body.clone(),
            lifetime: self.lifetime,
            while_revalidate: self.while_revalidate,
            if_error: self.if_error,
            vary: self.vary.clone(),
            targeted: self.targeted.clone(),
            stamps: Stamps::default(),
        }
    }
}

pub(super) fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// The client's answer from a stored entry of age `age`: the full answer,
/// its head (a HEAD), or 304 when the conditionals of `client` (the
/// request's headers, `None` when it has none) match.
pub(super) fn from_entry(
    e: &Entry,
    method: &Method,
    client: Option<&HeaderMap>,
    status: Status,
    age: Duration,
) -> Response<Body> {
    let mut headers = e.headers.clone();
    let (age, status) = e.stamps.get(age.as_secs(), status, e.targeted.as_ref());
    headers.insert(header::AGE, age);
    // The gateway's member is the last line (see `with_slots`),
    // after the upstream's.
    match headers.entry(CACHE_STATUS) {
        header::Entry::Occupied(mut o) => {
            if let Some(last) = o.iter_mut().last() {
                *last = status;
            }
        }
        header::Entry::Vacant(v) => {
            v.insert(status);
        }
    }
    // Conditionals apply only to an answer that would be 2xx (RFC 9110
    // §13.2.1): a stored 404 stays a 404.
    let not_modified = client.is_some_and(|c| e.status.is_success() && rules::not_modified(method, c, &e.headers));
    let (code, body) = if not_modified {
        headers.remove(header::CONTENT_LENGTH);
        (StatusCode::NOT_MODIFIED, Body::empty())
    } else if method == Method::HEAD {
        (e.status, Body::empty())
    } else {
        (e.status, Body::full(e.body.clone()))
    };
    let mut response = Response::new(body);
    *response.status_mut() = code;
    *response.headers_mut() = headers;
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::status::Status;
    use http::Request;

    /// An answer made from a stored head sets its fields in place: neither
    /// its `Age` and `Cache-Status` nor the `X-Request-Id` set after them
    /// grow the clone of the head, whatever the upstream sent.
    #[test]
    fn an_answer_from_a_stored_head_grows_no_map() {
        let fields: [&[(&str, &str)]; 4] = [
            &[("cache-control", "max-age=60")],
            &[("cache-control", "max-age=60"), ("age", "3"), ("x-request-id", "up"), ("cache-status", "up; hit")],
            &[("cache-control", "max-age=60"), ("content-type", "text/plain"), ("etag", "\"e\""), ("via", "1.1 a")],
            &[("cache-control", "max-age=60"), ("set-cookie2", "x"), ("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")],
        ];
        let windows = (Duration::ZERO, Duration::ZERO);
        for (fields, id_slot) in fields.iter().flat_map(|f| [(f, true), (f, false)]) {
            let head = Request::get("http://h/x").body(()).unwrap().into_parts().0;
            let mut response = Response::builder().status(200);
            for (n, v) in fields.iter() {
                response = response.header(*n, *v);
            }
            let parts = response.body(()).unwrap().into_parts().0;
            let e =
                entry_of(&head, &parts, SystemTime::now(), (Duration::ZERO, &[]), windows, id_slot).expect("storable");
            let status = Status::hit(Some(Duration::from_secs(60)));
            let mut answer = super::from_entry(&e, &http::Method::GET, None, status, Duration::from_secs(1));
            // A field added (not replaced) grows the entries, a full table
            // the indices.
            let grown = |h: &http::HeaderMap| h.len() != e.headers.len() || h.capacity() != e.headers.capacity();
            assert!(!grown(answer.headers()), "{fields:?}: Age or Cache-Status grew the map");
            if id_slot {
                answer.headers_mut().insert(X_REQUEST_ID, http::HeaderValue::from_static("0123"));
                assert!(!grown(answer.headers()), "{fields:?}: X-Request-Id grew the map");
            }
            let from_upstream = fields.iter().any(|(n, _)| *n == "x-request-id");
            assert_eq!(answer.headers().get_all(X_REQUEST_ID).iter().count(), usize::from(id_slot || from_upstream));
        }
    }
}
