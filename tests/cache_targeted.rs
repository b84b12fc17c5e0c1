//! Targeted cache control (RFC 9213, issue 37 item 11): `CDN-Cache-Control`
//! (and the fields `cache.targeted` lists) decides for the route's cache in
//! place of `Cache-Control` and `Expires`. End to end on real sockets; each
//! test failed before targeted fields were read.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::cached::*;
use common::*;
use http::Request;
use hyper::body::Incoming;

/// The fields each path answers with (a test of its own per path would
/// start a gateway each).
fn fields(path: &str) -> &'static [(&'static str, &'static str)] {
    match path {
        "/c/fresh-cc-no-store" => &[("cache-control", "no-store"), ("cdn-cache-control", "max-age=60")],
        "/c/private" => &[("cdn-cache-control", "private"), ("cache-control", "max-age=600")],
        "/c/private-fields" => &[("cdn-cache-control", "private=\"set-cookie\""), ("cache-control", "max-age=600")],
        "/c/no-cache" => &[("cdn-cache-control", "no-cache"), ("cache-control", "max-age=600")],
        "/c/no-store" => &[("cdn-cache-control", "no-store"), ("cache-control", "max-age=600")],
        "/c/short" => &[("cache-control", "max-age=600"), ("cdn-cache-control", "max-age=0")],
        "/c/long" => &[("cache-control", "max-age=0"), ("cdn-cache-control", "max-age=600")],
        "/c/past-expires" => &[("cdn-cache-control", "max-age=600"), ("expires", "Thu, 01 Jan 1970 00:00:00 GMT")],
        "/c/future-expires" => &[("cdn-cache-control", "max-age=0"), ("expires", "Fri, 01 Jan 2100 00:00:00 GMT")],
        "/c/old" => &[("cdn-cache-control", "max-age=3600"), ("age", "7200")],
        "/c/invalid" => &[("cdn-cache-control", "max-age=600, &&&&&"), ("cache-control", "no-store")],
        "/c/wrong-type" => &[("cdn-cache-control", "max-age=\"600\""), ("cache-control", "no-store")],
        "/c/negative" => &[("cdn-cache-control", "max-age=-1"), ("cache-control", "no-store")],
        "/c/empty" => &[("cdn-cache-control", ""), ("cache-control", "max-age=600")],
        "/c/lines" => &[("cdn-cache-control", "max-age=600"), ("cdn-cache-control", "private")],
        "/c/bad-line" => &[("cdn-cache-control", "max-age=600"), ("cdn-cache-control", "x=\"")],
        "/c/unknown-only" => &[("cdn-cache-control", "foo"), ("cache-control", "max-age=600")],
        "/c/surrogate" => &[("surrogate-control", "max-age=600"), ("cache-control", "no-store")],
        _ => &[("cache-control", "max-age=600")],
    }
}

/// Whether the second of two requests was answered from the store, by path.
const STORED: &[(&str, bool)] = &[
    ("/c/fresh-cc-no-store", true),
    ("/c/private", false),
    ("/c/private-fields", false),
    ("/c/no-cache", false),
    ("/c/no-store", false),
    ("/c/short", false),
    ("/c/long", true),
    ("/c/past-expires", true),
    ("/c/future-expires", false),
    ("/c/old", false),
    ("/c/invalid", false),
    ("/c/wrong-type", false),
    ("/c/negative", false),
    ("/c/empty", true),
    ("/c/lines", false),
    ("/c/bad-line", false),
    ("/c/unknown-only", false),
    ("/c/surrogate", false),
];

fn by_path(req: Request<Incoming>) -> std::future::Ready<http::Response<TestBody>> {
    std::future::ready(answer(200, fields(req.uri().path()), "body"))
}

/// RFC 9213 §2.1-2.2: the first targeted field with a valid, non-empty
/// value wins wholly; an empty or invalid one (a parse error, a wrongly
/// typed known directive, one bad line of several) is ignored and
/// `Cache-Control` decides. The suite's `cdn-*` tests, and their variants.
#[tokio::test]
async fn cdn_cache_control_decides_in_place_of_cache_control() {
    let (gw, seen_) = cached("", by_path).await;
    for (path, stored) in STORED {
        let before = seen(&seen_);
        get(&gw.url(path)).await;
        let (second, _) = get(&gw.url(path)).await;
        let upstream = seen(&seen_) - before;
        assert_eq!(upstream == 1, *stored, "{path}: {} upstream, {}", upstream, cache_status(&second));
        // Every field reaches the client as the upstream sent it.
        for (name, value) in fields(path) {
            if *name != "age" {
                let got: Vec<_> = second.headers.get_all(*name).iter().map(|v| v.to_str().unwrap()).collect();
                assert!(got.contains(value), "{path}: {name}: {got:?}");
            }
        }
    }
}

/// `Cache-Status` names the targeted field that decided (RFC 9211
/// `detail`): on the stored miss, on hits, on a miss it made unstorable,
/// and not at all when `Cache-Control` decided.
#[tokio::test]
async fn cache_status_names_the_field_that_decided() {
    let (gw, _) = cached("", by_path).await;
    let (miss, _) = get(&gw.url("/c/fresh-cc-no-store")).await;
    assert_eq!(cache_status(&miss), "gateway; fwd=miss; stored; ttl=60; detail=\"cdn-cache-control\"");
    let (hit, _) = get(&gw.url("/c/fresh-cc-no-store")).await;
    let status = cache_status(&hit);
    assert!(status.starts_with("gateway; hit; ttl=") && status.ends_with("; detail=\"cdn-cache-control\""), "{status}");
    let (not_stored, _) = get(&gw.url("/c/no-store")).await;
    assert_eq!(cache_status(&not_stored), "gateway; fwd=miss; detail=\"cdn-cache-control\"");
    let (ignored, _) = get(&gw.url("/c/invalid")).await;
    assert_eq!(cache_status(&ignored), "gateway; fwd=miss");
    let (plain, _) = get(&gw.url("/c/plain")).await;
    assert_eq!(cache_status(&plain), "gateway; fwd=miss; stored; ttl=600");
}

/// `cache.targeted` lists the fields obeyed, first first: the gateway's
/// own field wins over `CDN-Cache-Control`, an invalid one falls through to
/// the next, and `targeted = []` obeys none.
#[tokio::test]
async fn the_configured_targets_in_order() {
    let handler = |req: Request<Incoming>| {
        let fields: &[(&str, &str)] = match req.uri().path() {
            "/c/own-wins" => &[("gateway-cache-control", "no-store"), ("cdn-cache-control", "max-age=600")],
            "/c/own-stores" => &[("gateway-cache-control", "max-age=600"), ("cdn-cache-control", "no-store")],
            "/c/own-invalid" => &[("gateway-cache-control", "max-age=1.5"), ("cdn-cache-control", "max-age=600")],
            _ => &[("cdn-cache-control", "max-age=600"), ("cache-control", "no-store")],
        };
        std::future::ready(answer(200, fields, "body"))
    };
    let targets = "targeted = [\"Gateway-Cache-Control\", \"CDN-Cache-Control\"]";
    let (gw, seen_) = cached(targets, handler).await;
    for (path, stored, decided) in [
        ("/c/own-wins", false, "gateway-cache-control"),
        ("/c/own-stores", true, "gateway-cache-control"),
        ("/c/own-invalid", true, "cdn-cache-control"),
        ("/c/cdn", true, "cdn-cache-control"),
    ] {
        let before = seen(&seen_);
        let (first, _) = get(&gw.url(path)).await;
        get(&gw.url(path)).await;
        assert_eq!(seen(&seen_) - before == 1, stored, "{path}: {}", cache_status(&first));
        assert!(cache_status(&first).ends_with(&format!("detail=\"{decided}\"")), "{path}: {}", cache_status(&first));
    }
    let (gw, seen_) = cached("targeted = []", handler).await;
    get(&gw.url("/c/cdn")).await;
    let (second, _) = get(&gw.url("/c/cdn")).await;
    assert_eq!(seen(&seen_), 2, "{}", cache_status(&second));
    assert_eq!(cache_status(&second), "gateway; fwd=miss");
}

/// A 304 is judged with the stored head it updates: a targeted field it
/// brings decides from then on (here it makes an entry that
/// `Cache-Control: max-age=0` kept stale fresh for a minute).
#[tokio::test]
async fn a_304_bringing_a_targeted_field_is_obeyed() {
    let n = Arc::new(AtomicUsize::new(0));
    let handler = move |req: Request<Incoming>| {
        n.fetch_add(1, Ordering::SeqCst);
        std::future::ready(if req.headers().contains_key("if-none-match") {
            answer(304, &[("etag", "\"v1\""), ("cdn-cache-control", "max-age=60")], "")
        } else {
            answer(200, &[("etag", "\"v1\""), ("cache-control", "max-age=0")], "v1")
        })
    };
    let (gw, seen_) = cached("", handler).await;
    get(&gw.url("/c/r")).await;
    let (revalidated, body) = get(&gw.url("/c/r")).await;
    assert_eq!(&body[..], b"v1");
    assert!(cache_status(&revalidated).contains("fwd-status=304"), "{}", cache_status(&revalidated));
    let (hit, _) = get(&gw.url("/c/r")).await;
    assert!(cache_status(&hit).starts_with("gateway; hit"), "{}", cache_status(&hit));
    assert!(cache_status(&hit).ends_with("detail=\"cdn-cache-control\""), "{}", cache_status(&hit));
    assert_eq!(seen(&seen_), 2);
}

/// A huge targeted field costs one linear parse: tens of thousands of
/// members, or one long string, are read and obeyed, and the stored head
/// (with the field) is what the store weighs.
#[tokio::test]
async fn huge_targeted_fields_are_bounded() {
    let many: &'static str = Box::leak((vec!["x=1"; 8_000].join(", ") + ", max-age=600").into_boxed_str());
    let long: &'static str = Box::leak(format!("x=\"{}\", max-age=600", "a".repeat(60_000)).into_boxed_str());
    let handler = move |req: Request<Incoming>| {
        let value: &'static str = if req.uri().path() == "/c/many" { many } else { long };
        std::future::ready(answer(200, &[("cdn-cache-control", value), ("cache-control", "no-store")], "body"))
    };
    let (gw, seen_) = cached("max_size = \"1MiB\"", handler).await;
    for path in ["/c/many", "/c/long"] {
        get(&gw.url(path)).await;
        let (hit, _) = get(&gw.url(path)).await;
        assert!(cache_status(&hit).starts_with("gateway; hit"), "{path}: {}", cache_status(&hit));
    }
    assert_eq!(seen(&seen_), 2);
}
