//! The response cache end to end under concurrency and failure: coalesced
//! misses, the first client leaving, slow bodies, stale-while-revalidate,
//! stale-if-error, a reload, and cache poisoning.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::cached::*;
use common::*;
use gateway::config::{self, Source};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

#[tokio::test]
async fn concurrent_misses_make_one_upstream_request() {
    let (gw, seen_) =
        cached_as("coalesced", "", slow(Duration::from_millis(300), &[("cache-control", "max-age=60")])).await;
    let url = gw.url("/coalesced/x");
    let all = (0..100).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { get(&url).await })
    });
    let answers = futures_util::future::join_all(all).await;
    for a in answers {
        let (parts, body) = a.unwrap();
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"answer 0"[..]));
    }
    assert_eq!(seen(&seen_), 1, "exactly one upstream request");
    let m = metrics_text(gw.addr).await;
    let coalesced =
        sample(&m, "gateway_cache_requests_total", &[("route", "coalesced"), ("result", "coalesced")]).unwrap();
    assert_eq!(coalesced, 99.0);
}

#[tokio::test]
async fn a_waiter_that_varies_differently_goes_upstream_itself() {
    let n = Arc::new(AtomicUsize::new(0));
    let handler = move |req: Request<Incoming>| {
        n.fetch_add(1, Ordering::SeqCst);
        let lang = req.headers().get("accept-language").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            answer(200, &[("cache-control", "max-age=60"), ("vary", "accept-language")], lang)
        }
    };
    let (gw, seen_) = cached("", handler).await;
    let url = gw.url("/c/x");
    let en = tokio::spawn({
        let url = url.clone();
        async move { get_with(&url, &[("accept-language", "en")]).await.1 }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (_, fr) = get_with(&url, &[("accept-language", "fr")]).await;
    assert_eq!((&en.await.unwrap()[..], &fr[..]), (&b"en"[..], &b"fr"[..]));
    assert_eq!(seen(&seen_), 2);
}

#[tokio::test]
async fn without_coalescing_each_miss_goes_upstream() {
    let (gw, seen_) =
        cached("coalesce = false", slow(Duration::from_millis(300), &[("cache-control", "max-age=60")])).await;
    let url = gw.url("/c/x");
    let all = (0..5).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { get(&url).await })
    });
    futures_util::future::join_all(all).await;
    assert_eq!(seen(&seen_), 5);
}

#[tokio::test]
async fn an_uncacheable_answer_is_not_shared() {
    let (gw, seen_) = cached("", slow(Duration::from_millis(300), &[("cache-control", "private")])).await;
    let url = gw.url("/c/x");
    let all = (0..10).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { get(&url).await.1 })
    });
    let mut bodies: Vec<Bytes> = futures_util::future::join_all(all).await.into_iter().map(Result::unwrap).collect();
    bodies.sort();
    bodies.dedup();
    assert_eq!(bodies.len(), 10, "each client got its own answer");
    assert_eq!(seen(&seen_), 10);
}

/// Once a key's answer could not be stored, its misses go upstream at
/// once rather than wait on one another's fill (Varnish's hit-for-miss):
/// waiting on a fill whose answer is never shared only doubled each
/// waiter's time, and under a route timeout answered 504.
#[tokio::test]
async fn after_an_uncacheable_answer_misses_of_the_key_do_not_wait_on_each_other() {
    let (inflight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (i, m) = (inflight.clone(), most.clone());
    let handler = move |_req: Request<Incoming>| {
        let (i, m) = (i.clone(), m.clone());
        async move {
            m.fetch_max(i.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(500)).await;
            i.fetch_sub(1, Ordering::SeqCst);
            answer(200, &[("cache-control", "private")], "mine")
        }
    };
    let (gw, seen_) = cached("", handler).await;
    let url = gw.url("/c/x");
    get(&url).await;
    most.store(0, Ordering::SeqCst);
    let all = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { get(&url).await.0.status })
    });
    for status in futures_util::future::join_all(all).await {
        assert_eq!(status.unwrap(), 200);
    }
    assert_eq!(seen(&seen_), 5);
    assert_eq!(most.load(Ordering::SeqCst), 4, "the four were upstream together: none waited on another's fill");
}

/// Each variant is remembered on its own: another variant's unstorable
/// answer, or one stored, leaves it as it was (one marker a key was
/// replaced by the next, or dropped by any store).
#[tokio::test]
async fn a_variant_that_could_not_be_stored_stays_remembered_beside_others() {
    let (inflight, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (i, m) = (inflight.clone(), most.clone());
    let handler = move |req: Request<Incoming>| {
        let (i, m) = (i.clone(), m.clone());
        let lang = req.headers().get("accept-language").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        async move {
            m.fetch_max(i.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(500)).await;
            i.fetch_sub(1, Ordering::SeqCst);
            let cc = if lang == "en" { "max-age=60" } else { "private" };
            answer(200, &[("cache-control", cc), ("vary", "accept-language")], lang)
        }
    };
    let (gw, seen_) = cached("", handler).await;
    let url = gw.url("/c/x");
    for lang in ["de", "xx", "en"] {
        get_with(&url, &[("accept-language", lang)]).await;
    }
    most.store(0, Ordering::SeqCst);
    let all = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { get_with(&url, &[("accept-language", "de")]).await.0.status })
    });
    for status in futures_util::future::join_all(all).await {
        assert_eq!(status.unwrap(), 200);
    }
    assert_eq!(seen(&seen_), 7);
    assert_eq!(most.load(Ordering::SeqCst), 4, "the four de misses went upstream together");
}

/// A signed-in client's `private` answer (its `Cookie`), an answer left
/// unstored because of the request (`Authorization`, its own
/// `Cache-Control`, a varied field named in its `Connection`), or another
/// variant's `private` answer says nothing of the key's answer to everyone
/// else: the misses after it still wait on one fill. Remembered as the
/// key's, one such request turned coalescing off for every client, a
/// stampede at the key's next expiry.
#[tokio::test]
async fn one_clients_unstorable_answer_does_not_turn_coalescing_off() {
    let handler = |req: Request<Incoming>| {
        let lang = req.headers().get("accept-language").map(|v| v.to_str().unwrap().to_owned());
        let personal = req.headers().contains_key("cookie") || lang.as_deref() == Some("xx");
        async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let cc = if personal { "private" } else { "max-age=60" };
            answer(200, &[("cache-control", cc), ("vary", "accept-language")], "page")
        }
    };
    let (gw, seen_) = cached("", handler).await;
    let url = gw.url("/c/x");
    let en = ("accept-language", "en");
    let asked: [&[(&str, &str)]; 5] = [
        &[en, ("cookie", "session=ann")],
        &[en, ("authorization", "Bearer x")],
        &[en, ("cache-control", "no-store")],
        &[("accept-language", "xx")],
        // Last: a marker replaces the one before it.
        &[en, ("connection", "accept-language")],
    ];
    for headers in asked {
        get_with(&url, headers).await;
    }
    assert_eq!(seen(&seen_), 5);
    let all = (0..4).map(|_| {
        let url = url.clone();
        tokio::spawn(async move { get_with(&url, &[en]).await.0.status })
    });
    for status in futures_util::future::join_all(all).await {
        assert_eq!(status.unwrap(), 200);
    }
    assert_eq!(seen(&seen_), 6, "the four misses waited on one fill");
}

#[tokio::test]
async fn waiters_obey_the_route_timeout() {
    let seen_ = Arc::new(AtomicUsize::new(0));
    let s = seen_.clone();
    let up = TestUpstream::start(move |_| {
        s.fetch_add(1, Ordering::SeqCst);
        async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            answer(200, &[("cache-control", "max-age=60")], "late")
        }
    })
    .await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "c", "timeout = \"500ms\"\ncache = {}", "")).await;
    let url = gw.url("/c/x");
    let first = tokio::spawn({
        let url = url.clone();
        async move { get(&url).await.0.status }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let (parts, _) = get(&url).await;
    assert_eq!(parts.status, 504);
    // Its deadline is 500 ms; the fill it would wait for takes 3 s.
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert_eq!(first.await.unwrap(), 504);
    // The fill failed: the waiter went upstream itself (within its own
    // deadline), and the key is not left locked: the next request goes too.
    assert_eq!(seen_.load(Ordering::SeqCst), 2);
    get(&url).await;
    assert_eq!(seen_.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn waiters_wait_for_a_slow_body_past_the_route_timeout() {
    let seen_ = Arc::new(AtomicUsize::new(0));
    let s = seen_.clone();
    let up = TestUpstream::start(move |_| {
        s.fetch_add(1, Ordering::SeqCst);
        async {
            let stream = futures_util::stream::unfold(0, |n| async move {
                (n < 3).then_some(())?;
                tokio::time::sleep(Duration::from_millis(300)).await;
                Some((Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from_static(b"part "))), n + 1))
            });
            let mut r = Response::new(http_body_util::StreamBody::new(stream).map_err(Into::into).boxed());
            r.headers_mut().insert("cache-control", "max-age=60".parse().unwrap());
            r
        }
    })
    .await;
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "c", "timeout = \"200ms\"\ncache = {}", "")).await;
    let url = gw.url("/c/x");
    let first = tokio::spawn({
        let url = url.clone();
        async move { get(&url).await.1 }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (parts, body) = get(&url).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"part part part "[..]));
    assert_eq!(&first.await.unwrap()[..], b"part part part ");
    assert_eq!(seen_.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn the_first_client_leaving_does_not_cancel_the_fill() {
    let (gw, seen_) = cached("", slow(Duration::from_millis(500), &[("cache-control", "max-age=60")])).await;
    let url = gw.url("/c/x");
    let leaver = tokio::spawn({
        let url = url.clone();
        async move { tokio::time::timeout(Duration::from_millis(100), get(&url)).await.is_err() }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let (parts, body) = get(&url).await;
    assert!(leaver.await.unwrap(), "the first client left before its answer");
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"answer 0"[..]));
    let (parts, _) = get(&url).await;
    assert!(cache_status(&parts).starts_with("gateway; hit"), "{}", cache_status(&parts));
    assert_eq!(seen(&seen_), 1);
    // Even with nobody waiting the fill finishes and is stored.
    let url_y = gw.url("/c/y");
    let _ = tokio::time::timeout(Duration::from_millis(100), get(&url_y)).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    // On a loaded machine the fill may still be on its way: this request
    // then waits for it rather than going upstream again.
    get(&url_y).await;
    let (parts, _) = get(&url_y).await;
    assert!(cache_status(&parts).starts_with("gateway; hit"), "{}", cache_status(&parts));
    assert_eq!(seen(&seen_), 2, "the fill the client left was cancelled");
}

#[tokio::test]
async fn stale_if_error_serves_the_stale_entry_when_the_upstream_fails() {
    let failing = Arc::new(AtomicBool::new(false));
    let f = failing.clone();
    let handler = move |_| {
        let fail = f.load(Ordering::SeqCst);
        std::future::ready(if fail {
            answer(503, &[], "down")
        } else {
            answer(200, &[("cache-control", "max-age=1")], "good")
        })
    };
    let (gw, seen_) = cached("stale_if_error = \"60s\"", handler).await;
    get(&gw.url("/c/x")).await;
    failing.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (parts, body) = get(&gw.url("/c/x")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"good"[..]));
    assert_eq!(cache_status(&parts), "gateway; fwd=stale; fwd-status=503; detail=stale");
    assert_eq!(seen(&seen_), 2);
    // Without the window the error goes through.
    let (gw, _) = cached("", move |_| std::future::ready(answer(503, &[], "down"))).await;
    let (parts, _) = get(&gw.url("/c/x")).await;
    assert_eq!(parts.status, 503);
}

#[tokio::test]
async fn stale_if_error_with_the_upstream_down_and_a_reload_keeps_entries() {
    let dir = tempfile::tempdir().unwrap();
    let up = TestUpstream::start(|_| std::future::ready(answer(200, &[("cache-control", "max-age=1")], "good"))).await;
    let write = |addr: std::net::SocketAddr, cache: &str| {
        std::fs::write(dir.path().join("gw.toml"), proxy_toml(addr, "c", &format!("cache = {{ {cache} }}"), ""))
            .unwrap();
    };
    write(up.addr, "stale_if_error = \"60s\"");
    let mut c = config::load(&Source::File(dir.path().join("gw.toml"))).unwrap();
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    let gw = TestGateway::start(c).await;
    get(&gw.url("/c/x")).await;
    // The same cache settings, the upstream moved to where nothing listens.
    write(refused_addr().await, "stale_if_error = \"60s\"");
    gw.app.reload().unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (parts, body) = get(&gw.url("/c/x")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"good"[..]), "kept across the reload, served on error");
    // Changed settings: a new, empty store.
    write(refused_addr().await, "stale_if_error = \"30s\"");
    gw.app.reload().unwrap();
    let (parts, _) = get(&gw.url("/c/x")).await;
    assert_eq!(parts.status, 502);
}

#[tokio::test]
async fn stale_while_revalidate_serves_at_once_and_refreshes_once() {
    // The first answer at once, the refresh's after 3 s.
    let n = Arc::new(AtomicUsize::new(0));
    let handler = move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        async move {
            if i > 0 {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
            answer(200, &[("cache-control", "max-age=1")], format!("answer {i}"))
        }
    };
    let (gw, seen_) = cached("stale_while_revalidate = \"60s\"", handler).await;
    get(&gw.url("/c/x")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let started = std::time::Instant::now();
    // A HEAD starts the refresh: it asks for the whole GET answer.
    let (parts, _) = send(Request::head(gw.url("/c/x")).body(full(Bytes::new())).unwrap()).await;
    assert_eq!(cache_status(&parts), "gateway; hit; detail=stale");
    for _ in 0..4 {
        let (parts, body) = get(&gw.url("/c/x")).await;
        assert_eq!(&body[..], b"answer 0");
        assert_eq!(cache_status(&parts), "gateway; hit; detail=stale");
    }
    // The refresh takes the upstream 3 s; the stale answers did not wait for it.
    assert!(started.elapsed() < Duration::from_millis(2500), "served at once: {:?}", started.elapsed());
    // The stale answer until the refresh is stored, then the fresh one.
    let parts = bounded(async {
        loop {
            let (parts, body) = get(&gw.url("/c/x")).await;
            if &body[..] == b"answer 1" {
                break parts;
            }
            assert_eq!(&body[..], b"answer 0");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert_eq!(seen(&seen_), 2, "one background refresh");
    assert!(cache_status(&parts).starts_with("gateway; hit; ttl="), "{}", cache_status(&parts));
}

#[tokio::test]
async fn an_untrusted_x_forwarded_host_cannot_poison_the_cache() {
    let handler = |req: Request<Incoming>| {
        let xfh = req.headers().get("x-forwarded-host").map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
        std::future::ready(answer(200, &[("cache-control", "max-age=60")], format!("links to {xfh}")))
    };
    let (gw, _) = cached("", handler).await;
    let (_, attacker) =
        get_with(&gw.url("/c/x"), &[("host", "site.example"), ("x-forwarded-host", "evil.example")]).await;
    assert_eq!(&attacker[..], b"links to site.example", "the gateway sets X-Forwarded-Host for untrusted peers");
    let (parts, body) = get_with(&gw.url("/c/x"), &[("host", "site.example")]).await;
    assert!(cache_status(&parts).contains("hit"));
    assert_eq!(&body[..], b"links to site.example");
    // Another Host is another key.
    let (_, other) = get_with(&gw.url("/c/x"), &[("host", "other.example")]).await;
    assert_eq!(&other[..], b"links to other.example");
}
