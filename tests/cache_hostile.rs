//! A hostile review of the response cache (issue 37, items 3-10): each test
//! failed before its fix, end to end on real sockets.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use common::cached::*;
use common::scripted::{self, route_to};
use common::*;
use http::Request;
use hyper::body::Incoming;

fn header<'a>(parts: &'a http::response::Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).map(|v| v.to_str().unwrap())
}

/// Every `Cache-Status` line, joined as one list.
fn statuses(parts: &http::response::Parts) -> String {
    let lines: Vec<&str> = parts.headers.get_all("cache-status").iter().map(|v| v.to_str().unwrap()).collect();
    lines.join(", ")
}

/// RFC 9111 §3.5: an answer to a request with `Authorization` is stored
/// only when its own directives say `public`, `must-revalidate` or
/// `s-maxage`. A `public` inside another directive's quoted argument was
/// found by a comma split: Alice's answer was served to Bob and to an
/// anonymous client.
#[tokio::test]
async fn public_inside_a_quoted_argument_does_not_share_an_authorized_answer() {
    let handler = |req: Request<Incoming>| {
        let cc = match req.uri().path() {
            "/c/quoted" => "max-age=60, note=\", public, x\"",
            "/c/quoted-sq" => "max-age=60, note=\"a \\\" public\"",
            _ => "max-age=60, s-maxage=60",
        };
        let who = req.headers().get("authorization").map_or("anonymous".to_owned(), |v| v.to_str().unwrap().into());
        std::future::ready(answer(200, &[("cache-control", cc)], format!("page of {who}")))
    };
    let (gw, seen_) = cached("", handler).await;
    for path in ["/c/quoted", "/c/quoted-sq"] {
        get_with(&gw.url(path), &[("authorization", "Bearer alice-token")]).await;
        let (bob, body) = get_with(&gw.url(path), &[("authorization", "Bearer bob-token")]).await;
        assert_eq!(&body[..], b"page of Bearer bob-token", "{path}: {}", cache_status(&bob));
        let (anon, body) = get_with(&gw.url(path), &[]).await;
        assert_eq!(&body[..], b"page of anonymous", "{path}: {}", cache_status(&anon));
    }
    assert_eq!(seen(&seen_), 6);
    // s-maxage allows it.
    get_with(&gw.url("/c/shared"), &[("authorization", "Bearer alice-token")]).await;
    let (hit, _) = get_with(&gw.url("/c/shared"), &[]).await;
    assert!(cache_status(&hit).contains("hit"), "{}", cache_status(&hit));
}

/// RFC 9111 §4.3.4: a 304 updates the stored head, `Vary` included, and
/// what the entry varies on follows it. After a 304 with `Vary: X-Role`
/// (revalidated for `X-Role: user`), an admin got the user's page as a
/// fresh hit.
#[tokio::test]
async fn a_304_with_a_new_vary_keys_the_entry_by_it() {
    let handler = |req: Request<Incoming>| {
        let role = req.headers().get("x-role").map_or("none", |v| v.to_str().unwrap()).to_owned();
        std::future::ready(if req.headers().get("if-none-match").is_some_and(|v| v == "\"v1\"") {
            answer(304, &[("etag", "\"v1\""), ("vary", "X-Role"), ("cache-control", "max-age=60")], "")
        } else {
            answer(200, &[("etag", "\"v1\""), ("cache-control", "max-age=0")], format!("page for {role}"))
        })
    };
    let (gw, _) = cached("", handler).await;
    let user = [("x-role", "user")];
    get_with(&gw.url("/c/p"), &user).await;
    let (revalidated, body) = get_with(&gw.url("/c/p"), &user).await;
    assert_eq!(&body[..], b"page for user", "{}", cache_status(&revalidated));
    let (admin, body) = get_with(&gw.url("/c/p"), &[("x-role", "admin")]).await;
    assert_eq!(&body[..], b"page for admin", "{}", cache_status(&admin));
}

/// RFC 9111 §4.3.4: a 304 whose strong `ETag` matches no stored answer
/// updates none. The old body was served under the new tag, and a later
/// `If-None-Match` with the new tag was answered 304 from it. The answer is
/// fetched again without conditionals.
#[tokio::test]
async fn a_304_with_another_strong_etag_updates_nothing() {
    let n = Arc::new(AtomicUsize::new(0));
    let handler = move |req: Request<Incoming>| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        std::future::ready(if req.headers().contains_key("if-none-match") {
            answer(304, &[("etag", "\"v2\""), ("cache-control", "max-age=60")], "")
        } else if i == 0 {
            answer(200, &[("etag", "\"v1\""), ("cache-control", "max-age=0")], "v1 body")
        } else {
            answer(200, &[("etag", "\"v2\""), ("cache-control", "max-age=60")], "v2 body")
        })
    };
    let (gw, seen_) = cached("", handler).await;
    get(&gw.url("/c/x")).await;
    let (parts, body) = get(&gw.url("/c/x")).await;
    assert_eq!((header(&parts, "etag"), &body[..]), (Some("\"v2\""), &b"v2 body"[..]), "{}", statuses(&parts));
    assert_eq!(seen(&seen_), 3, "the 304, then the answer again");
    let (hit, body) = get(&gw.url("/c/x")).await;
    assert_eq!(&body[..], b"v2 body", "{}", statuses(&hit));
    let (not_modified, _) = get_with(&gw.url("/c/x"), &[("if-none-match", "\"v2\"")]).await;
    assert_eq!(not_modified.status, 304);
    assert_eq!(seen(&seen_), 3);
}

/// RFC 9111 §4.3.4, §4.2.4: a 304 that adds `must-revalidate` forbids
/// serving the entry stale from then on. The stale windows were copied
/// from the old entry: the upstream's 503 was hidden by a stale answer.
#[tokio::test]
async fn a_304_adding_must_revalidate_ends_the_stale_windows() {
    let n = Arc::new(AtomicUsize::new(0));
    let handler = move |req: Request<Incoming>| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        std::future::ready(match i {
            0 => answer(200, &[("etag", "\"v1\""), ("cache-control", "max-age=0")], "v1"),
            1 if req.headers().contains_key("if-none-match") => {
                answer(304, &[("etag", "\"v1\""), ("cache-control", "max-age=1, must-revalidate")], "")
            }
            _ => answer(503, &[], "down"),
        })
    };
    let (gw, _) = cached("stale_if_error = \"60s\", stale_while_revalidate = \"60s\"", handler).await;
    get(&gw.url("/c/m")).await;
    let (revalidated, _) = get(&gw.url("/c/m")).await;
    assert_eq!(revalidated.status, 200, "{}", statuses(&revalidated));
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (after, body) = get(&gw.url("/c/m")).await;
    assert_eq!(after.status, 503, "{} {body:?}", statuses(&after));
}

/// RFC 9110 §6.6.1: an answer without `Date` gets its receipt time. It was
/// stored without one, so each hit carried the hit time as `Date` beside
/// its `Age`: a downstream cache counts the age twice.
#[tokio::test]
async fn an_answer_without_date_keeps_its_receipt_time() {
    let (up, _) = scripted::scripted(|_, _, _| {
        scripted::answer(b"HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 4\r\n\r\nbody")
    })
    .await;
    let gw = route_to(up, "nodate", "cache = {}").await;
    let received = SystemTime::now();
    get(&gw.url("/h/x")).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (hit, _) = get(&gw.url("/h/x")).await;
    assert!(cache_status(&hit).contains("hit"), "{}", cache_status(&hit));
    let date = httpdate::parse_http_date(header(&hit, "date").unwrap()).unwrap();
    let age: u64 = header(&hit, "age").unwrap().parse().unwrap();
    assert!(age >= 2, "age {age}");
    assert!(date <= received + Duration::from_secs(1), "Date is the hit's time, beside Age {age}");
}

/// RFC 9211 §2: `Cache-Status` is a list, each cache appending its member.
/// The gateway's replaced the upstream's.
#[tokio::test]
async fn cache_status_appends_to_the_upstreams() {
    let (gw, _) =
        cached("", fixed(200, &[("cache-control", "max-age=60"), ("cache-status", "origin; fwd=uri-miss")])).await;
    let (miss, _) = get(&gw.url("/c/s")).await;
    let (hit, _) = get(&gw.url("/c/s")).await;
    for (parts, ours) in [(&miss, "gateway; fwd=miss; stored"), (&hit, "gateway; hit")] {
        let all = statuses(parts);
        assert!(all.starts_with("origin; fwd=uri-miss, ") && all.contains(ours), "{all}");
    }
}

/// RFC 9211 §2.1-2.3: a stale answer served because the upstream failed
/// was forwarded: `fwd=stale` with the status the upstream gave, not `hit`.
#[tokio::test]
async fn stale_on_error_says_it_was_forwarded() {
    let n = Arc::new(AtomicUsize::new(0));
    let handler = move |_| {
        let i = n.fetch_add(1, Ordering::SeqCst);
        std::future::ready(if i == 0 {
            answer(200, &[("cache-control", "max-age=1")], "v1")
        } else {
            answer(503, &[], "")
        })
    };
    let (gw, _) = cached("stale_if_error = \"60s\"", handler).await;
    get(&gw.url("/c/e")).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (stale, body) = get(&gw.url("/c/e")).await;
    assert_eq!((stale.status.as_u16(), &body[..]), (200, &b"v1"[..]));
    assert_eq!(cache_status(&stale), "gateway; fwd=stale; fwd-status=503; detail=stale");
}

/// RFC 9111 §5.1: a list-valued `Age` counts its first member (the public
/// suite's `age-parse-suffix`). `Age: 7200, 0` was read as no age at all,
/// and an answer two hours old served as fresh.
#[tokio::test]
async fn a_list_valued_age_is_not_fresh() {
    let (gw, seen_) = cached("", fixed(200, &[("cache-control", "max-age=3600"), ("age", "7200, 0")])).await;
    get(&gw.url("/c/a")).await;
    let (second, _) = get(&gw.url("/c/a")).await;
    assert!(!cache_status(&second).contains("hit"), "{}", cache_status(&second));
    assert_eq!(seen(&seen_), 2);
}

/// Behind a trusted proxy, `X-Forwarded-Host` and `X-Forwarded-Proto` (and
/// `Forwarded`) reach the upstream as the proxy sent them, and an answer
/// may depend on them: a link to the forwarded host, a redirect to `https`
/// for a client that came over `http`. They were not in the key: one
/// client's `X-Forwarded-Host: evil.example` page was served to the
/// others, and the `http` clients' redirect to every `https` client, which
/// then went round in a loop. From an untrusted peer they are the
/// gateway's own, the same for every client with that `Host`, and one
/// entry serves them all.
#[tokio::test]
async fn forwarding_fields_a_trusted_proxy_passes_on_are_in_the_key() {
    let handler = |req: Request<Incoming>| {
        let field = |name: &str| req.headers().get(name).map_or("-".to_owned(), |v| v.to_str().unwrap().to_owned());
        let body = format!(
            "host={} proto={} fwd={} prefix={} ssl={}",
            field("x-forwarded-host"),
            field("x-forwarded-proto"),
            field("forwarded"),
            field("x-forwarded-prefix"),
            field("x_forwarded_ssl")
        );
        std::future::ready(answer(200, &[("cache-control", "max-age=600")], body))
    };
    let (gw, seen_) = cached_with_server("trusted_proxies = [\"127.0.0.1/32\"]", handler).await;
    let ask = |fields: &'static [(&'static str, &'static str)]| {
        let url = gw.url("/c/page");
        async move { get_with(&url, fields).await }
    };
    let evil: &[(&str, &str)] = &[("x-forwarded-host", "evil.example"), ("x-forwarded-proto", "https")];
    let good: &[(&str, &str)] = &[("x-forwarded-host", "shop.example"), ("x-forwarded-proto", "https")];
    let plain: &[(&str, &str)] = &[("x-forwarded-host", "shop.example"), ("x-forwarded-proto", "http")];
    let fwd: &[(&str, &str)] = &[("forwarded", "proto=http;host=shop.example")];
    for (fields, want) in [
        (evil, "host=evil.example proto=https"),
        (good, "host=shop.example proto=https"),
        (plain, "host=shop.example proto=http"),
        (&[][..], "host=127.0.0.1"),
        (fwd, "fwd=proto=http;host=shop.example"),
        // And those only a proxy may send, which it passes on too.
        (&[("x-forwarded-prefix", "/evil")], "prefix=/evil ssl=-"),
        (&[("x_forwarded_ssl", "on")], "prefix=- ssl=on"),
    ] {
        for round in 0..2 {
            let (parts, body) = ask(fields).await;
            let body = String::from_utf8_lossy(&body).into_owned();
            assert!(body.contains(want), "{fields:?} round {round}: {body} ({})", cache_status(&parts));
            // The second time, from the entry of its own fields.
            assert_eq!(cache_status(&parts).contains("hit"), round == 1, "{fields:?}: {}", cache_status(&parts));
        }
    }
    assert_eq!(seen(&seen_), 7);
}

/// RFC 9111 §4.1: a request matches a stored `Vary` answer only when its
/// fields differ by what their own syntax makes equal. Runs of whitespace
/// were made one space in every field, so a `User-Agent: x  y` answer
/// (the upstream may tell the two apart) was a hit for `User-Agent: x y`.
/// A list field's members still match however they are spaced.
#[tokio::test]
async fn a_vary_value_is_normalised_only_as_its_syntax_allows() {
    let handler = |req: Request<Incoming>| {
        let field = |name: &str| req.headers().get(name).map_or("-".to_owned(), |v| v.to_str().unwrap().to_owned());
        let body = format!("ua=[{}] lang=[{}]", field("user-agent"), field("accept-language"));
        std::future::ready(answer(
            200,
            &[("cache-control", "max-age=600"), ("vary", "User-Agent, Accept-Language")],
            body,
        ))
    };
    let (gw, seen_) = cached("", handler).await;
    let ask = |fields: &'static [(&'static str, &'static str)]| {
        let url = gw.url("/c/page");
        async move { get_with(&url, fields).await }
    };
    let (_, body) = ask(&[("user-agent", "x  y"), ("accept-language", "en,fr")]).await;
    assert_eq!(&body[..], b"ua=[x  y] lang=[en,fr]");
    let (parts, body) = ask(&[("user-agent", "x y"), ("accept-language", "en,fr")]).await;
    assert_eq!(&body[..], b"ua=[x y] lang=[en,fr]", "{}", cache_status(&parts));
    let (parts, body) = ask(&[("user-agent", "x y"), ("accept-language", " en , fr")]).await;
    assert_eq!(&body[..], b"ua=[x y] lang=[en,fr]", "{}", cache_status(&parts));
    assert!(cache_status(&parts).contains("hit"), "{}", cache_status(&parts));
    assert_eq!(seen(&seen_), 2);
}

/// An HTTP/1 request's `Cookie` lines reach the upstream joined into one
/// line, so two lines are the same request as one line holding both, and
/// the key takes them as one. (When the lines went on apart, the key kept
/// them apart, or an answer made from the first line only would have been
/// served for the one line: hostile review.)
#[tokio::test]
async fn two_cookie_lines_are_one_line_upstream_and_in_a_vary_key() {
    let handler = |req: Request<Incoming>| {
        let lines: Vec<&str> = req.headers().get_all("cookie").iter().map(|v| v.to_str().unwrap()).collect();
        let body = format!("lines={}", lines.join("|"));
        std::future::ready(answer(200, &[("cache-control", "max-age=600"), ("vary", "Cookie")], body))
    };
    let (gw, seen_) = cached("", handler).await;
    let (_, body) = get_with(&gw.url("/c/page"), &[("cookie", "lang=fr"), ("cookie", "theme=dark")]).await;
    assert_eq!(&body[..], b"lines=lang=fr; theme=dark");
    let (parts, body) = get_with(&gw.url("/c/page"), &[("cookie", "lang=fr; theme=dark")]).await;
    assert_eq!(&body[..], b"lines=lang=fr; theme=dark", "{}", cache_status(&parts));
    assert!(cache_status(&parts).contains("hit"), "{}", cache_status(&parts));
    let (_, body) = get_with(&gw.url("/c/page"), &[("cookie", "lang=fr")]).await;
    assert_eq!(&body[..], b"lines=lang=fr");
    assert_eq!(seen(&seen_), 2);
}
