//! What the public HTTP cache test suite (scripts/cache-tests.sh) found
//! the route cache doing short of RFC 9111 and of its own documentation,
//! each end to end on real sockets and failing before its fix.

mod common;

use std::sync::{Arc, Mutex};

use common::cached::*;
use common::*;
use http::Request;
use hyper::body::Incoming;

/// RFC 9111 §3, and the documented rule ("a status cacheable by default,
/// or another with explicit freshness"): a 500, 503, 400 or an
/// unregistered 599 with `max-age` is stored. `must-understand` (§5.2.2.3)
/// stores only a status the cache understands, and then overrides
/// `no-store`. The suite's `status-*-fresh` and `*-must-understand`; only
/// the statuses cacheable by default and 302, 303, 307 were stored.
#[tokio::test]
async fn explicit_freshness_stores_any_final_status() {
    let handler = |req: Request<Incoming>| {
        let path = req.uri().path().to_owned();
        let (status, cc) = match path.as_str() {
            "/c/599-must-understand" => (599, "max-age=60, no-store, must-understand"),
            "/c/200-must-understand" => (200, "max-age=60, no-store, must-understand"),
            "/c/503-must-understand" => (503, "max-age=60, no-store, must-understand"),
            "/c/200-no-store" => (200, "max-age=60, no-store"),
            p => (p[3..].parse().unwrap(), "max-age=60"),
        };
        std::future::ready(answer(status, &[("cache-control", cc)], format!("{path} body")))
    };
    let (gw, seen_) = cached("", handler).await;
    let cases = [
        ("/c/500", true),
        ("/c/503", true),
        ("/c/400", true),
        ("/c/599", true),
        ("/c/200-must-understand", true),
        ("/c/503-must-understand", true),
        ("/c/599-must-understand", false),
        ("/c/200-no-store", false),
    ];
    for (path, stored) in cases {
        let before = seen(&seen_);
        let (first, _) = get(&gw.url(path)).await;
        let (second, body) = get(&gw.url(path)).await;
        assert_eq!(first.status, second.status, "{path}");
        assert_eq!(body, format!("{path} body"), "{path}");
        assert_eq!(seen(&seen_) - before == 1, stored, "{path}: {}", cache_status(&second));
    }
}

/// RFC 9111 §5.2.2.4: an answer with `no-cache` may be stored and used
/// once revalidated. One with an `ETag` and no stated freshness was not
/// stored at all, so every request fetched it whole (the suite's
/// `cc-resp-no-cache-revalidate`); it is now revalidated with
/// `If-None-Match` and answered from the store on a 304.
#[tokio::test]
async fn a_no_cache_answer_with_a_validator_is_revalidated() {
    let conditionals = Arc::new(Mutex::new(Vec::new()));
    let seen_by = conditionals.clone();
    let handler = move |req: Request<Incoming>| {
        let inm = req.headers().get("if-none-match").map(|v| v.to_str().unwrap().to_owned());
        seen_by.lock().unwrap().push(inm.clone());
        std::future::ready(match inm.as_deref() {
            Some("\"abcd\"") => answer(304, &[("etag", "\"abcd\""), ("cache-control", "no-cache")], ""),
            _ => answer(200, &[("etag", "\"abcd\""), ("cache-control", "no-cache")], "the body"),
        })
    };
    let (gw, _) = cached("", handler).await;
    let (first, _) = get(&gw.url("/c/nc")).await;
    assert_eq!(cache_status(&first), "gateway; fwd=miss; stored; ttl=0");
    for _ in 0..2 {
        let (again, body) = get(&gw.url("/c/nc")).await;
        assert_eq!((again.status.as_u16(), &body[..]), (200, &b"the body"[..]), "{}", cache_status(&again));
        assert!(cache_status(&again).contains("fwd-status=304"), "{}", cache_status(&again));
    }
    let asked = conditionals.lock().unwrap().clone();
    assert_eq!(asked, [None, Some("\"abcd\"".to_owned()), Some("\"abcd\"".to_owned())]);
    // Without a validator it is not stored: nothing to revalidate it by.
    let (gw, seen_) = cached("", fixed(200, &[("cache-control", "no-cache")])).await;
    let (first, _) = get(&gw.url("/c/nv")).await;
    assert_eq!(cache_status(&first), "gateway; fwd=miss");
    get(&gw.url("/c/nv")).await;
    assert_eq!(seen(&seen_), 2);
}
