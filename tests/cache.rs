//! The response cache end to end, one request at a time: what is stored,
//! for how long, under which key, revalidation, conditionals, invalidation,
//! the request's directives, size bounds, bodies; and the settings'
//! validation. Concurrency, stale answers and reloads: tests/cache_fills.rs.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::cached::*;
use common::*;
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

#[tokio::test]
async fn a_fresh_answer_is_stored_and_served_with_age_and_cache_status() {
    let (gw, seen_) = cached("", fixed(200, &[("cache-control", "max-age=60"), ("age", "5")])).await;
    let (first, body) = get(&gw.url("/c/a")).await;
    assert_eq!((first.status.as_u16(), &body[..]), (200, &b"body"[..]));
    assert_eq!(cache_status(&first), "gateway; fwd=miss; stored; ttl=55", "the upstream's Age counts");
    let (second, body) = get(&gw.url("/c/a")).await;
    assert_eq!(&body[..], b"body");
    assert_eq!(seen(&seen_), 1, "the second request is answered from the cache");
    assert!(cache_status(&second).starts_with("gateway; hit; ttl=5"), "{}", cache_status(&second));
    let age: u64 = second.headers["age"].to_str().unwrap().parse().unwrap();
    assert!(age >= 5, "the upstream's Age counts: {age}");
    // Another path is another key.
    get(&gw.url("/c/b")).await;
    assert_eq!(seen(&seen_), 2);
    // The time an entry has been held counts in its Age.
    let (gw, _) = cached("", fixed(200, &[("cache-control", "max-age=60")])).await;
    get(&gw.url("/c/a")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (parts, _) = get(&gw.url("/c/a")).await;
    assert_eq!(parts.headers["age"], "1");
    assert!(cache_status(&parts).starts_with("gateway; hit; ttl=5"), "{}", cache_status(&parts));
}

#[tokio::test]
async fn what_may_not_be_stored_is_not() {
    type Case = (&'static [(&'static str, &'static str)], u16, &'static [(&'static str, &'static str)]);
    let cases: &[Case] = &[
        (&[], 200, &[("cache-control", "max-age=60, no-store")]),
        (&[], 200, &[("cache-control", "max-age=60, private")]),
        (&[], 200, &[("cache-control", "max-age=60"), ("set-cookie", "s=1")]),
        (&[("authorization", "Basic eDp5")], 200, &[("cache-control", "max-age=60")]),
        (&[("cache-control", "no-store")], 200, &[("cache-control", "max-age=60")]),
        (&[], 206, &[("cache-control", "max-age=60"), ("content-range", "bytes 0-3/10")]),
        (&[], 500, &[]),
        (&[], 200, &[]),
        (&[], 200, &[("cache-control", "max-age=60"), ("vary", "*")]),
    ];
    for (i, (request, status, response)) in cases.iter().enumerate() {
        let (gw, seen_) = cached("", fixed(*status, response)).await;
        for _ in 0..2 {
            let (parts, _) = get_with(&gw.url("/c/x"), request).await;
            let want = if i == 4 { "gateway; fwd=bypass" } else { "gateway; fwd=miss" };
            assert_eq!(cache_status(&parts), want, "case {i}");
        }
        assert_eq!(seen(&seen_), 2, "case {i}: both requests go upstream");
    }
}

#[tokio::test]
async fn authorization_is_stored_with_public_s_maxage_or_must_revalidate() {
    for cc in ["public, max-age=60", "s-maxage=60", "max-age=60, must-revalidate"] {
        let handler = move |_| std::future::ready(answer(200, &[("cache-control", cc)], "body"));
        let (gw, seen_) = cached("", handler).await;
        get_with(&gw.url("/c/x"), &[("authorization", "Basic eDp5")]).await;
        get_with(&gw.url("/c/x"), &[("authorization", "Basic eDp5")]).await;
        assert_eq!(seen(&seen_), 1, "{cc}");
    }
}

#[tokio::test]
async fn freshness_comes_from_s_maxage_max_age_expires_or_default_ttl() {
    let expires: &'static str =
        Box::leak(httpdate::fmt_http_date(std::time::SystemTime::now() + Duration::from_secs(60)).into_boxed_str());
    let date: &'static str = Box::leak(httpdate::fmt_http_date(std::time::SystemTime::now()).into_boxed_str());
    let cases: Vec<(&str, Vec<(&'static str, &'static str)>)> = vec![
        ("", vec![("cache-control", "s-maxage=60, max-age=0")]),
        ("", vec![("cache-control", "max-age=60")]),
        ("", vec![("expires", expires), ("date", date)]),
        ("default_ttl = \"60s\"", vec![]),
    ];
    for (cache, headers) in cases {
        let headers: &'static [(&str, &str)] = Box::leak(headers.into_boxed_slice());
        let (gw, seen_) = cached(cache, fixed(200, headers)).await;
        get(&gw.url("/c/x")).await;
        let (parts, _) = get(&gw.url("/c/x")).await;
        assert_eq!(seen(&seen_), 1, "{headers:?} {cache}: {}", cache_status(&parts));
    }
    // A max-age=1 answer with Age: 1 is stale at once.
    let (gw, seen_) = cached("", fixed(200, &[("cache-control", "max-age=1"), ("age", "1")])).await;
    get(&gw.url("/c/x")).await;
    get(&gw.url("/c/x")).await;
    assert_eq!(seen(&seen_), 2, "the upstream's Age counts toward freshness");
}

#[tokio::test]
async fn an_answer_goes_stale_after_its_lifetime() {
    let (gw, seen_) = cached("", fixed(200, &[("cache-control", "max-age=1")])).await;
    get(&gw.url("/c/x")).await;
    get(&gw.url("/c/x")).await;
    assert_eq!(seen(&seen_), 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    get(&gw.url("/c/x")).await;
    assert_eq!(seen(&seen_), 2);
}

#[tokio::test]
async fn vary_keys_on_the_named_request_headers() {
    let handler = |req: Request<Incoming>| {
        let lang = req.headers().get("accept-language").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        std::future::ready(answer(200, &[("cache-control", "max-age=60"), ("vary", "Accept-Language")], lang))
    };
    let (gw, seen_) = cached("", handler).await;
    let (_, en) = get_with(&gw.url("/c/x"), &[("accept-language", "en")]).await;
    let (_, fr) = get_with(&gw.url("/c/x"), &[("accept-language", "fr")]).await;
    let (en2, en_again) = get_with(&gw.url("/c/x"), &[("accept-language", "en")]).await;
    let (_, fr_again) = get_with(&gw.url("/c/x"), &[("accept-language", "fr")]).await;
    assert_eq!((&en[..], &fr[..], &en_again[..], &fr_again[..]), (&b"en"[..], &b"fr"[..], &b"en"[..], &b"fr"[..]));
    assert!(cache_status(&en2).contains("hit"));
    assert_eq!(seen(&seen_), 2, "one upstream request per variant");
}

/// An upstream whose answer has ETag "v1" and max-age=1, answering 304 to
/// a matching If-None-Match; it keeps the last If-None-Match it saw.
fn validating(
    inm: Arc<std::sync::Mutex<Option<String>>>,
) -> impl Fn(Request<Incoming>) -> std::future::Ready<Response<TestBody>> + Clone + Send + Sync + 'static {
    move |req: Request<Incoming>| {
        let got = req.headers().get("if-none-match").map(|v| v.to_str().unwrap().to_owned());
        *inm.lock().unwrap() = got.clone();
        let headers = &[("cache-control", "max-age=1"), ("etag", "\"v1\""), ("x-version", "1")];
        std::future::ready(if got.as_deref() == Some("\"v1\"") {
            answer(304, &[("cache-control", "max-age=60"), ("etag", "\"v1\""), ("x-version", "2")], "")
        } else {
            answer(200, headers, "full body")
        })
    }
}

#[tokio::test]
async fn a_stale_entry_is_revalidated_and_a_304_refreshes_it() {
    let inm = Arc::new(std::sync::Mutex::new(None));
    let (gw, seen_) = cached("", validating(inm.clone())).await;
    get(&gw.url("/c/x")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (parts, body) = get(&gw.url("/c/x")).await;
    assert_eq!(inm.lock().unwrap().as_deref(), Some("\"v1\""), "revalidated with the stored ETag");
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"full body"[..]));
    assert!(cache_status(&parts).starts_with("gateway; fwd=stale; fwd-status=304"), "{}", cache_status(&parts));
    assert_eq!(parts.headers["x-version"], "2", "the 304's headers update the stored head");
    // Fresh again for the 304's max-age=60.
    let (parts, _) = get(&gw.url("/c/x")).await;
    assert!(cache_status(&parts).starts_with("gateway; hit"), "{}", cache_status(&parts));
    assert_eq!(seen(&seen_), 2);
    // The client's no-cache revalidates a fresh entry.
    let (parts, body) = get_with(&gw.url("/c/x"), &[("cache-control", "no-cache")]).await;
    assert_eq!(&body[..], b"full body");
    assert!(cache_status(&parts).starts_with("gateway; fwd=request; fwd-status=304"), "{}", cache_status(&parts));
    assert_eq!(seen(&seen_), 3);
    // A client's max-age older than the entry revalidates it too.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (parts, _) = get_with(&gw.url("/c/x"), &[("cache-control", "max-age=1")]).await;
    assert!(cache_status(&parts).starts_with("gateway; fwd=request; fwd-status=304"), "{}", cache_status(&parts));
    let (parts, _) = get_with(&gw.url("/c/x"), &[("cache-control", "max-age=30")]).await;
    assert!(cache_status(&parts).starts_with("gateway; hit"), "{}", cache_status(&parts));
    assert_eq!(seen(&seen_), 4);
    // ... and its own conditional gets its own 304.
    let (parts, _) = get_with(&gw.url("/c/x"), &[("cache-control", "max-age=0"), ("if-none-match", "\"v1\"")]).await;
    assert_eq!(parts.status, 304);
    assert_eq!(seen(&seen_), 5);
}

#[tokio::test]
async fn client_conditionals_are_answered_from_a_fresh_entry() {
    let (gw, seen_) = cached(
        "",
        fixed(
            200,
            &[("cache-control", "max-age=60"), ("etag", "\"v1\""), ("last-modified", "Wed, 01 Jan 2020 00:00:00 GMT")],
        ),
    )
    .await;
    get(&gw.url("/c/x")).await;
    let (parts, body) = get_with(&gw.url("/c/x"), &[("if-none-match", "\"v1\"")]).await;
    assert_eq!((parts.status.as_u16(), body.len()), (304, 0));
    let (parts, _) = get_with(&gw.url("/c/x"), &[("if-modified-since", "Wed, 01 Jan 2020 00:00:00 GMT")]).await;
    assert_eq!(parts.status, 304);
    let (parts, _) = get_with(&gw.url("/c/x"), &[("if-none-match", "\"v2\"")]).await;
    assert_eq!(parts.status, 200);
    assert_eq!(seen(&seen_), 1, "no conditional went upstream");
}

#[tokio::test]
async fn head_is_answered_from_a_stored_get() {
    let (gw, seen_) = cached("", fixed(200, &[("cache-control", "max-age=60")])).await;
    get(&gw.url("/c/x")).await;
    let (parts, body) = send(Request::head(gw.url("/c/x")).body(full(Bytes::new())).unwrap()).await;
    assert_eq!((parts.status.as_u16(), body.len()), (200, 0));
    assert!(cache_status(&parts).starts_with("gateway; hit"));
    assert_eq!(parts.headers["content-length"], "4");
    assert_eq!(seen(&seen_), 1);
}

#[tokio::test]
async fn a_successful_unsafe_request_invalidates_its_target_and_location() {
    let handler = |req: Request<Incoming>| {
        std::future::ready(if req.method() == http::Method::POST {
            answer(201, &[("location", "/c/other")], "made")
        } else {
            answer(200, &[("cache-control", "max-age=60")], "body")
        })
    };
    let (gw, seen_) = cached("", handler).await;
    get(&gw.url("/c/x")).await;
    get(&gw.url("/c/other")).await;
    get(&gw.url("/c/x")).await;
    assert_eq!(seen(&seen_), 2);
    let (parts, _) = send(Request::post(gw.url("/c/x")).body(full("new")).unwrap()).await;
    assert_eq!(cache_status(&parts), "gateway; fwd=bypass");
    assert_eq!(seen(&seen_), 3);
    get(&gw.url("/c/x")).await;
    get(&gw.url("/c/other")).await;
    assert_eq!(seen(&seen_), 5, "both the target and the Location were invalidated");
}

#[tokio::test]
async fn request_directives_bypass_or_answer_504() {
    let (gw, seen_) = cached("", fixed(200, &[("cache-control", "max-age=60")])).await;
    let (parts, _) = get_with(&gw.url("/c/x"), &[("cache-control", "only-if-cached")]).await;
    assert_eq!(parts.status, 504);
    assert_eq!(seen(&seen_), 0);
    let (parts, _) = get_with(&gw.url("/c/x"), &[("cache-control", "no-store")]).await;
    assert_eq!(cache_status(&parts), "gateway; fwd=bypass");
    get(&gw.url("/c/x")).await;
    assert_eq!(seen(&seen_), 2, "no-store stored nothing");
    let (parts, _) = get_with(&gw.url("/c/x"), &[("cache-control", "only-if-cached")]).await;
    assert_eq!(parts.status, 200);
    let (parts, _) = get_with(&gw.url("/c/x"), &[("pragma", "no-cache")]).await;
    assert_eq!(cache_status(&parts), "gateway; fwd=request; stored; ttl=60", "no validator: fetched again");
    assert_eq!(seen(&seen_), 3);
}

#[tokio::test]
async fn entries_are_evicted_by_size() {
    let handler = |_| std::future::ready(answer(200, &[("cache-control", "max-age=60")], vec![b'x'; 1500]));
    let (gw, seen_) = cached_as("evicted", "max_size = \"8KiB\", max_entry = \"2KiB\"", handler).await;
    for i in 0..30 {
        get(&gw.url(&format!("/evicted/{i}"))).await;
    }
    // moka applies its bound in its housekeeping, which reads and writes drive.
    for _ in 0..3 {
        for i in 0..30 {
            get(&gw.url(&format!("/evicted/{i}"))).await;
        }
    }
    assert!(seen(&seen_) > 30, "not everything fits: {}", seen(&seen_));
    let m = metrics_text(gw.addr).await;
    let evicted = sample(&m, "gateway_cache_evictions_total", &[("cache", "evicted")]).unwrap_or(0.0);
    let bytes = sample(&m, "gateway_cache_bytes", &[("cache", "evicted")]).unwrap();
    assert!(evicted > 0.0, "{m}");
    let entries = sample(&m, "gateway_cache_entries", &[("cache", "evicted")]).unwrap();
    assert!((1.0..=6.0).contains(&entries), "entries held: {entries}");
    assert!(bytes <= 8192.0 + 2048.0, "bytes held: {bytes}");
}

#[tokio::test]
async fn a_large_or_chunked_body_streams_through_and_is_not_stored() {
    let big = Bytes::from(vec![b'y'; 100_000]);
    let b = big.clone();
    let handler = move |req: Request<Incoming>| {
        let b = b.clone();
        async move {
            let mut r = if req.uri().path().ends_with("chunked") {
                let chunks = b
                    .chunks(10_000)
                    .map(|c| Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::copy_from_slice(c))))
                    .collect::<Vec<_>>();
                let stream = futures_util::stream::iter(chunks);
                Response::new(http_body_util::StreamBody::new(stream).map_err(Into::into).boxed())
            } else {
                Response::new(full(b))
            };
            r.headers_mut().insert("cache-control", "max-age=60".parse().unwrap());
            r
        }
    };
    let (gw, seen_) = cached("max_entry = \"16KiB\"", handler).await;
    for path in ["/c/length", "/c/chunked"] {
        for _ in 0..2 {
            let (parts, body) = get(&gw.url(path)).await;
            assert_eq!(body, big, "{path}: the whole body");
            assert!(!cache_status(&parts).contains("hit"), "{path}");
        }
    }
    assert_eq!(seen(&seen_), 4);
}

#[tokio::test]
async fn a_body_streams_to_the_first_client_while_it_is_stored() {
    let release = Arc::new(tokio::sync::Notify::new());
    let r = release.clone();
    let handler = move |_| {
        let r = r.clone();
        async move {
            let stream = futures_util::stream::unfold(0, move |n| {
                let r = r.clone();
                async move {
                    match n {
                        0 => Some((Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(b"first "))), 1)),
                        1 => {
                            r.notified().await;
                            Some((Ok(http_body::Frame::data(Bytes::from_static(b"last"))), 2))
                        }
                        _ => None,
                    }
                }
            });
            let mut resp = Response::new(http_body_util::StreamBody::new(stream).map_err(Into::into).boxed());
            resp.headers_mut().insert("cache-control", "max-age=60".parse().unwrap());
            resp
        }
    };
    let (gw, seen_) = cached("", handler).await;
    let resp = client().request(Request::get(gw.url("/c/x")).body(full(Bytes::new())).unwrap()).await.unwrap();
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(2), body.frame()).await.expect("first bytes before the last");
    assert_eq!(first.unwrap().unwrap().into_data().unwrap(), "first ");
    release.notify_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(rest, "last");
    let (parts, whole) = get(&gw.url("/c/x")).await;
    assert_eq!(&whole[..], b"first last");
    assert!(cache_status(&parts).starts_with("gateway; hit"));
    assert_eq!(seen(&seen_), 1);
}

#[tokio::test]
async fn a_body_cut_short_is_never_stored() {
    let seen_ = Arc::new(AtomicUsize::new(0));
    let s = seen_.clone();
    let addr = raw_upstream(move |mut stream| {
        s.fetch_add(1, Ordering::SeqCst);
        async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 100\r\n\r\nonly half")
                .await;
        }
    })
    .await;
    let gw = TestGateway::from_toml(&proxy_toml(addr, "c", "cache = {}", "")).await;
    for _ in 0..2 {
        let resp = client().request(Request::get(gw.url("/c/x")).body(full(Bytes::new())).unwrap()).await.unwrap();
        assert!(resp.into_body().collect().await.is_err(), "the client's answer is cut short too");
    }
    assert_eq!(seen_.load(Ordering::SeqCst), 2, "nothing was stored");
}

#[test]
fn invalid_cache_settings_exit_64_naming_the_key() {
    let route = |cache: &str| {
        format!(
            "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"a\"\ncache = {{ {cache} }}\n"
        )
    };
    let cases: Vec<(String, &str)> = vec![
        (route("max_size = \"lots\""), "routes[0].cache.max_size"),
        (route("max_size = 0"), "routes[0].cache.max_size"),
        (route("max_entry = \"2MiB\", max_size = \"1MiB\""), "routes[0].cache.max_entry"),
        (route("default_ttl = \"soon\""), "routes[0].cache.default_ttl"),
        (route("stale_while_revalidate = \"-1s\""), "routes[0].cache.stale_while_revalidate"),
        (route("stale_if_error = \"x\""), "routes[0].cache.stale_if_error"),
        (route("colour = 1"), "colour"),
        (
            "[[routes]]\nname = \"r\"\nprefix = \"/r\"\nrespond = { status = 200 }\ncache = {}\n".to_owned(),
            "routes[0].cache",
        ),
    ];
    let cases: Vec<(&str, &str)> = cases.iter().map(|(t, k)| (t.as_str(), *k)).collect();
    assert_refused_by_check(env!("CARGO_BIN_EXE_gateway"), &cases);
}

/// Every answer made from a stored head sets its own `Age`,
/// `Cache-Status` and `X-Request-Id` (the stored head keeps a field for
/// each, whatever the upstream sent): a fresh hit, a HEAD, a 304 to the
/// client's conditional, with request IDs on and off.
#[tokio::test]
async fn answers_from_a_stored_head_carry_their_own_fields() {
    let plain: &'static [(&str, &str)] = &[("cache-control", "max-age=60"), ("etag", "\"v1\"")];
    let with_own: &'static [(&str, &str)] =
        &[("cache-control", "max-age=60"), ("etag", "\"v1\""), ("x-request-id", "upstream-id"), ("age", "2")];
    for (server, ids, stored) in [("", true, plain), ("", true, with_own), ("request_id = false", false, plain)] {
        let (gw, seen_) = cached_with_server(server, fixed(200, stored)).await;
        get(&gw.url("/c/a")).await;
        let min_age = if stored == with_own { 2 } else { 0 };
        let mut given = Vec::new();
        type Ask = (&'static str, &'static [(&'static str, &'static str)], u16);
        let asks: [Ask; 3] = [("GET", &[], 200), ("HEAD", &[], 200), ("GET", &[("if-none-match", "\"v1\"")], 304)];
        for (method, request, status) in asks {
            let mut req = Request::builder().method(method).uri(gw.url("/c/a"));
            for (n, v) in request {
                req = req.header(*n, *v);
            }
            let (parts, _) = send(req.body(full(Bytes::new())).unwrap()).await;
            let case = format!("{server:?} {stored:?} {method} {request:?}");
            assert_eq!(parts.status.as_u16(), status, "{case}");
            assert!(cache_status(&parts).starts_with("gateway; hit; ttl="), "{case}: {}", cache_status(&parts));
            let age: u64 = parts.headers["age"].to_str().unwrap().parse().expect("a number");
            assert!(age >= min_age, "{case}: {age}");
            let id = parts.headers.get_all("x-request-id").iter().map(|v| v.to_str().unwrap()).collect::<Vec<_>>();
            match ids {
                true => {
                    assert_eq!(id.len(), 1, "{case}: {id:?}");
                    assert_eq!(id[0].len(), 32, "{case}: a made ID, not the stored one: {id:?}");
                    given.push(id[0].to_owned());
                }
                false => assert!(id.is_empty(), "{case}: no ID with request IDs off: {id:?}"),
            }
            for (name, value) in &parts.headers {
                assert_ne!(value, "-", "{case}: {name} left as stored");
            }
        }
        given.dedup();
        assert_eq!(given.len(), if ids { 3 } else { 0 }, "each answer its own ID");
        assert_eq!(seen(&seen_), 1, "answered from the cache");
    }
}
