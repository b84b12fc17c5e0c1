//! The fields an answer made from a stored head carries: `Age`,
//! `Cache-Status` and (with request IDs on) `X-Request-Id` once each, and
//! never the placeholder a stored head keeps for them, whichever way the
//! answer is made (hit, HEAD, 304, stale, revalidated, coalesced, HTTP/2)
//! and across a reload. Loopback only, each test bounded in time.

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::cached::*;
use common::*;
use http::Request;
use hyper::body::Incoming;

/// The values of `name` in a response head.
fn values(parts: &http::response::Parts, name: &str) -> Vec<String> {
    parts.headers.get_all(name).iter().map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()).collect()
}

/// No field of the answer is a stored placeholder.
fn no_placeholder(parts: &http::response::Parts, case: &str) {
    for (name, value) in &parts.headers {
        assert_ne!(value, "-", "{case}: {name}: a placeholder reached the client ({:?})", parts.headers);
    }
}

/// `server.request_id` is a `[server]` key: a reload that changes it is
/// logged as needing a restart and the old value runs on, in the routes
/// built from the new file too (their caches' stored heads keep no field
/// for an ID the answers do not carry).
#[tokio::test]
async fn a_reload_that_turns_request_ids_on_does_not_leak_the_id_placeholder() {
    bounded(async {
        let up = TestUpstream::start(|_req: Request<Incoming>| async {
            answer(200, &[("cache-control", "max-age=60")], "body")
        })
        .await;
        let toml = |ids: bool| {
            format!(
                "[server]\nlisten = \"127.0.0.1:0\"\nrequest_id = {ids}\n[upstreams.rid]\nurl = \"http://{}\"\n\
                 [[routes]]\nname = \"rid\"\nprefix = \"/rid\"\nupstream = \"rid\"\ncache = {{}}\n",
                up.addr
            )
        };
        let dir = tempfile::tempdir().unwrap();
        let gw = TestGateway::from_file(dir.path(), &toml(false)).await;
        std::fs::write(dir.path().join("gateway.toml"), toml(true)).unwrap();
        let restart = gw.app.reload().expect("a valid file");
        assert_eq!(restart, vec!["server"], "request_id needs a restart: the old value runs on");
        get(&gw.url("/rid/a")).await;
        let (hit, _) = get(&gw.url("/rid/a")).await;
        assert!(cache_status(&hit).starts_with("gateway; hit"), "{}", cache_status(&hit));
        assert_eq!(values(&hit, "x-request-id"), Vec::<String>::new(), "IDs are still off: no X-Request-Id");
    })
    .await;
}

/// Every way an answer is made from an entry, with IDs on and off: no
/// placeholder reaches the client, and Age, the gateway's Cache-Status
/// member (and the ID) are there once.
#[tokio::test]
async fn no_answer_from_an_entry_carries_a_placeholder() {
    bounded(async {
        // (server, route cache settings, upstream fields)
        type Case = (&'static str, &'static str, &'static [(&'static str, &'static str)]);
        let cases: &[Case] = &[
            ("", "", &[("cache-control", "max-age=60")]),
            ("request_id = false", "", &[("cache-control", "max-age=60")]),
            ("", "", &[("cache-control", "max-age=60"), ("age", "1"), ("age", "2")]),
            ("", "", &[("cache-control", "max-age=60"), ("cache-status", "up; hit"), ("cache-status", "up2; hit")]),
            ("", "", &[("cache-control", "max-age=60"), ("x-request-id", "a"), ("x-request-id", "b")]),
            ("", "", &[("cache-control", "max-age=60"), ("vary", "accept-language")]),
            ("request_id = false", "", &[("cache-control", "max-age=60"), ("age", "-"), ("x-request-id", "-")]),
        ];
        for (server, cache, fields) in cases {
            let case = format!("{server:?} {cache:?} {fields:?}");
            let (gw, seen_) = cached_with_server(server, fixed(200, fields)).await;
            let ids = server.is_empty();
            for (method, extra) in [
                ("GET", &[][..]),
                ("GET", &[("accept-language", "de")][..]),
                ("HEAD", &[][..]),
                ("GET", &[("if-none-match", "*")][..]),
                ("GET", &[("accept-language", "de")][..]),
            ] {
                let mut req = Request::builder().method(method).uri(gw.url("/c/x"));
                for (n, v) in extra {
                    req = req.header(*n, *v);
                }
                let (parts, _) = send(req.body(full(Bytes::new())).unwrap()).await;
                let case = format!("{case} {method} {extra:?}");
                // The gateway's member after the upstream's (RFC 9211 §2).
                let statuses = values(&parts, "cache-status");
                // An answer from the entry (not the upstream's own) has one Age.
                if !statuses.last().is_some_and(|s| s.contains("fwd=")) {
                    assert_eq!(values(&parts, "age").len(), 1, "{case}");
                }
                let upstream = fields.iter().filter(|(n, _)| *n == "cache-status").count();
                assert_eq!(statuses.len(), upstream + 1, "{case}");
                assert!(statuses.last().is_some_and(|s| s.starts_with("gateway")), "{case}");
                if ids {
                    assert_eq!(values(&parts, "x-request-id").len(), 1, "{case}");
                }
                if !fields.contains(&("age", "-")) {
                    no_placeholder(&parts, &case);
                }
            }
            assert!(seen(&seen_) <= 2, "{case}");
        }
    })
    .await;
}

/// A 304 revalidation that brings Age, Cache-Status and X-Request-Id of
/// its own; stale-while-revalidate; stale-if-error; coalesced waiters;
/// an HTTP/2 client; a rate-limited route.
#[tokio::test]
async fn revalidated_stale_and_coalesced_answers_carry_no_placeholder() {
    bounded(async {
        let failing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let fails = failing.clone();
        let up = TestUpstream::start(move |req: Request<Incoming>| {
            let down = fails.load(Ordering::SeqCst);
            async move {
                tokio::time::sleep(Duration::from_millis(150)).await;
                let inm = req.headers().get("if-none-match").is_some();
                match (down, inm) {
                    (true, _) => answer(503, &[], "down"),
                    (_, true) => answer(
                        304,
                        &[
                            ("cache-control", "max-age=1, stale-while-revalidate=30, stale-if-error=30"),
                            ("etag", "\"v\""),
                            ("age", "0"),
                            ("cache-status", "up; fwd=miss"),
                            ("x-request-id", "from-304"),
                        ],
                        "",
                    ),
                    _ => answer(
                        200,
                        &[
                            ("cache-control", "max-age=1, stale-while-revalidate=30, stale-if-error=30"),
                            ("etag", "\"v\""),
                        ],
                        "body",
                    ),
                }
            }
        })
        .await;
        let toml = proxy_toml(
            up.addr,
            "rv",
            "cache = {}\nrate_limit = { rate = \"1000/s\", burst = 1000, key = \"client\", headers = true }",
            "",
        );
        let gw = TestGateway::from_toml(&toml).await;
        let check = |parts: &http::response::Parts, case: &str| {
            eprintln!("{case}");
            no_placeholder(parts, case);
            assert_eq!(values(parts, "x-request-id").len(), 1, "{case}");
            assert_ne!(values(parts, "x-request-id"), vec!["from-304"], "{case}");
        };
        // Coalesced: five at once on an empty key.
        let all: Vec<_> = (0..5).map(|_| tokio::spawn(get(gw.url("/rv/a").leak()))).collect();
        for (i, j) in all.into_iter().enumerate() {
            let (parts, _) = j.await.unwrap();
            check(&parts, &format!("coalesced {i}: {}", cache_status(&parts)));
        }
        tokio::time::sleep(Duration::from_millis(1200)).await;
        // Stale: answered at once, refreshed in the background by a 304.
        let (parts, _) = get(&gw.url("/rv/a")).await;
        check(&parts, &format!("stale-while-revalidate: {}", cache_status(&parts)));
        tokio::time::sleep(Duration::from_millis(400)).await;
        for case in ["after a background 304", "again"] {
            let (parts, _) = get(&gw.url("/rv/a")).await;
            check(&parts, &format!("{case}: {}", cache_status(&parts)));
        }
        // A client's no-cache: revalidated in the foreground, a 304.
        let (parts, _) = get_with(&gw.url("/rv/a"), &[("cache-control", "no-cache")]).await;
        check(&parts, &format!("foreground 304: {}", cache_status(&parts)));
        // HTTP/2.
        let (mut h2, _conn) = h2_client(gw.addr).await;
        let req = Request::get(gw.url("/rv/a")).version(http::Version::HTTP_2).body(full(Bytes::new())).unwrap();
        let parts = h2.send_request(req).await.unwrap().into_parts().0;
        check(&parts, &format!("h2: {}", cache_status(&parts)));
        // Stale-if-error: fill /rv/err, let it go stale, the upstream fails.
        get(&gw.url("/rv/err")).await;
        tokio::time::sleep(Duration::from_millis(1200)).await;
        failing.store(true, Ordering::SeqCst);
        let (parts, _) = get_with(&gw.url("/rv/err"), &[("cache-control", "no-cache")]).await;
        check(&parts, &format!("stale-if-error: {} {}", parts.status, cache_status(&parts)));
        assert_eq!(parts.status, 200, "served stale on error");
        // Coalesced waiters of a failing revalidation get the stale entry too.
        let all: Vec<_> = (0..4).map(|_| tokio::spawn(get(gw.url("/rv/a").leak()))).collect();
        for (i, j) in all.into_iter().enumerate() {
            let (parts, _) = j.await.unwrap();
            check(&parts, &format!("stale-if-error, coalesced {i}: {} {}", parts.status, cache_status(&parts)));
        }
    })
    .await;
}
