//! Hostile tests of the response cache: directives an upstream repeats or
//! quotes, values past what the cache can count, request headers the
//! gateway changes on the way upstream (and the Vary key that must follow
//! what the upstream saw), ranges, conditionals, HEAD, framing, HTTP/2.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::cached::*;
use common::*;
use http::Request;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::AsyncWriteExt;

/// `ttl=` of a `Cache-Status`.
fn ttl(parts: &http::response::Parts) -> Option<u64> {
    cache_status(parts).split("; ").find_map(|p| p.strip_prefix("ttl=")).and_then(|v| v.parse().ok())
}

/// A GET whose headers may hold any bytes (obs-text).
async fn get_bytes(url: &str, headers: &[(&str, &[u8])]) -> (http::response::Parts, Bytes) {
    let mut req = Request::get(url);
    for (n, v) in headers {
        req = req.header(*n, http::HeaderValue::from_bytes(v).unwrap());
    }
    send(req.body(full(Bytes::new())).unwrap()).await
}

/// A raw HTTP/1.1 exchange from the local address `ip` (any of 127/8).
async fn raw_from(ip: &str, to: std::net::SocketAddr, request: &str) -> Raw {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    let mut s = socket.connect(to).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    read_for(&mut s, Duration::from_secs(3)).await
}

fn body_of(raw: &Raw) -> &str {
    raw.text.split_once("\r\n\r\n").map_or("", |(_, b)| b)
}

// ---------------------------------------------------------------- Vary keys

/// A client names the varied header in `Connection`: the gateway strips it
/// (hop-by-hop), so the upstream answers as if it were absent, but the
/// answer must not be stored under the value the client sent, or the next
/// client that sends that value honestly would be served the other variant
/// (RFC 9111 §4.1: the selecting header fields are those of the request
/// that was forwarded and produced the stored response).
#[tokio::test]
async fn a_varied_header_named_in_connection_does_not_poison_its_variant() {
    common::bounded(async {
        let handler = |req: Request<Incoming>| {
            let lang =
                req.headers().get("accept-language").map_or("default".to_owned(), |v| v.to_str().unwrap().to_owned());
            std::future::ready(answer(200, &[("cache-control", "max-age=60"), ("vary", "Accept-Language")], lang))
        };
        let (gw, _) = cached("", handler).await;
        let (_, attacker) =
            get_with(&gw.url("/c/x"), &[("accept-language", "fr"), ("connection", "keep-alive, Accept-Language")])
                .await;
        assert_eq!(&attacker[..], b"default", "the upstream never saw the header named in Connection");
        let (parts, victim) = get_with(&gw.url("/c/x"), &[("accept-language", "fr")]).await;
        assert_eq!(
            std::str::from_utf8(&victim).unwrap(),
            "fr",
            "an honest `Accept-Language: fr` client got the variant made without it ({})",
            cache_status(&parts)
        );
    })
    .await;
}

/// The upstream varies on `X-Forwarded-For`, which the gateway sets from
/// the peer's address for untrusted peers. Two clients that send none get
/// different values upstream, so must not share an answer.
#[tokio::test]
async fn vary_on_a_field_the_gateway_sets_does_not_share_across_clients() {
    common::bounded(async {
        let handler = |req: Request<Incoming>| {
            let xff = req.headers().get("x-forwarded-for").map_or(String::new(), |v| v.to_str().unwrap().to_owned());
            std::future::ready(answer(
                200,
                &[("cache-control", "max-age=60"), ("vary", "X-Forwarded-For")],
                format!("for {xff}"),
            ))
        };
        let (gw, _) = cached("", handler).await;
        let request = "GET /c/geo HTTP/1.1\r\nHost: site.example\r\nConnection: close\r\n\r\n";
        let first = raw_from("127.0.0.1", gw.addr, request).await;
        assert!(body_of(&first).ends_with("for 127.0.0.1"), "{}", first.text);
        let second = raw_from("127.0.0.2", gw.addr, request).await;
        assert_eq!(second.status(), 200, "{}", second.text);
        assert!(
            body_of(&second).ends_with("for 127.0.0.2"),
            "127.0.0.2 was served the answer the upstream made for 127.0.0.1:\n{}",
            second.text
        );
    })
    .await;
}

/// Request values that differ on the wire must not share a Vary key:
/// header values that are not UTF-8 (obs-text) are kept apart.
#[tokio::test]
async fn non_utf8_varied_values_are_not_conflated() {
    common::bounded(async {
        let handler = |req: Request<Incoming>| {
            let v = req.headers().get("x-tenant").map_or(Vec::new(), |v| v.as_bytes().to_vec());
            let hex: String = v.iter().map(|b| format!("{b:02x}")).collect();
            std::future::ready(answer(200, &[("cache-control", "max-age=60"), ("vary", "X-Tenant")], hex))
        };
        let (gw, seen_) = cached("", handler).await;
        let (p1, a) = get_bytes(&gw.url("/c/t"), &[("x-tenant", b"\xe9")]).await;
        assert_eq!(p1.status.as_u16(), 200);
        assert_eq!(&a[..], b"e9");
        let (p2, b) = get_bytes(&gw.url("/c/t"), &[("x-tenant", b"\xe8")]).await;
        assert_eq!(
            std::str::from_utf8(&b).unwrap(),
            "e8",
            "X-Tenant \\xe8 was served the \\xe9 variant ({}; upstream saw {})",
            cache_status(&p2),
            seen(&seen_)
        );
        let (p3, c) = get_with(&gw.url("/c/t"), &[("x-tenant", "")]).await;
        assert_eq!(&c[..], b"", "an empty X-Tenant got another's variant ({})", cache_status(&p3));
    })
    .await;
}

/// Vary names in any case and repeated, and `*` among others.
#[tokio::test]
async fn vary_name_spellings_and_a_star_among_others() {
    common::bounded(async {
        let handler = |req: Request<Incoming>| {
            let ae = req.headers().get("accept-encoding").map_or(String::new(), |v| v.to_str().unwrap().to_owned());
            std::future::ready(answer(
                200,
                &[
                    ("cache-control", "max-age=60"),
                    ("vary", "Accept-Encoding, accept-encoding"),
                    ("vary", "ACCEPT-ENCODING"),
                ],
                ae,
            ))
        };
        let (gw, seen_) = cached("", handler).await;
        get_with(&gw.url("/c/v"), &[("accept-encoding", "gzip")]).await;
        let (_, b) = get_with(&gw.url("/c/v"), &[("accept-encoding", "br")]).await;
        assert_eq!(&b[..], b"br");
        let (p, b) = get_with(&gw.url("/c/v"), &[("accept-encoding", "gzip")]).await;
        assert_eq!((&b[..], seen(&seen_)), (&b"gzip"[..], 2), "{}", cache_status(&p));

        let (gw, seen_) = cached("", fixed(200, &[("cache-control", "max-age=60"), ("vary", "Accept, *")])).await;
        get(&gw.url("/c/s")).await;
        get(&gw.url("/c/s")).await;
        assert_eq!(seen(&seen_), 2, "Vary: * among other names is never stored");
    })
    .await;
}

// -------------------------------------------------------- response directives

/// RFC 9111 §4.2.1: with more than one value for a directive, the first
/// is used or the response is stale, never a later, longer one.
#[tokio::test]
async fn a_repeated_max_age_never_takes_the_later_longer_value() {
    common::bounded(async {
        let cases: [&'static [(&str, &str)]; 2] = [
            &[("cache-control", "max-age=5, max-age=100")],
            &[("cache-control", "max-age=5"), ("cache-control", "max-age=100")],
        ];
        for headers in cases {
            let (gw, _) = cached("", fixed(200, headers)).await;
            let (parts, _) = get(&gw.url("/c/x")).await;
            let t = ttl(&parts);
            assert!(t.is_none_or(|t| t <= 5), "{headers:?}: stored for {t:?}s ({})", cache_status(&parts));
        }
    })
    .await;
}

/// A comma inside a quoted-string argument (RFC 9111 §5.2, RFC 9110 §5.6.4)
/// does not start a directive: an extension's argument is not a freshness.
#[tokio::test]
async fn a_directive_inside_a_quoted_argument_is_not_obeyed() {
    common::bounded(async {
        let (gw, seen_) = cached("", fixed(200, &[("cache-control", "community=\"UCI, max-age=3600\"")])).await;
        let (first, _) = get(&gw.url("/c/q")).await;
        get(&gw.url("/c/q")).await;
        assert_eq!(seen(&seen_), 2, "an answer without a freshness was stored: {}", cache_status(&first));
    })
    .await;
}

/// RFC 9111 §1.2.2: a delta-seconds past what the cache can represent is
/// taken as 2147483648, not as 0.
#[tokio::test]
async fn a_max_age_past_u64_counts_as_2_pow_31() {
    common::bounded(async {
        let (gw, seen_) = cached("", fixed(200, &[("cache-control", "max-age=99999999999999999999")])).await;
        let (first, _) = get(&gw.url("/c/x")).await;
        let (second, _) = get(&gw.url("/c/x")).await;
        assert_eq!(
            (seen(&seen_), ttl(&first)),
            (1, Some(2_147_483_648)),
            "first: {}; second: {}",
            cache_status(&first),
            cache_status(&second)
        );
    })
    .await;
}

/// Panics whose message has "adding durations", anywhere in the process.
static DURATION_PANICS: AtomicUsize = AtomicUsize::new(0);

fn count_duration_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if info.to_string().contains("adding durations") {
                DURATION_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info)
        }));
    });
}

/// A max-age the cache can parse but whose keep time overflows (with a
/// validator, or a stale window) must neither break the fill nor the store:
/// no panic in the fill task (a panic inside moka's insert skips its
/// post-insert steps: expiry and size accounting).
#[tokio::test]
async fn a_max_age_of_u64_max_does_not_break_the_fill() {
    count_duration_panics();
    common::bounded(async {
        let cases: [&'static [(&str, &str)]; 2] = [
            &[("cache-control", "max-age=18446744073709551615"), ("etag", "\"e\"")],
            &[("cache-control", "max-age=18446744073709551615, stale-while-revalidate=10")],
        ];
        for headers in cases {
            let (gw, seen_) = cached("", fixed(200, headers)).await;
            for i in 0..2 {
                let resp = client().request(Request::get(gw.url("/c/x")).body(full(Bytes::new())).unwrap()).await;
                let resp = resp.expect("an answer");
                let status = cache_status_of(resp.headers());
                if i == 0 {
                    assert!(status.contains("stored; ttl=2147483648"), "{headers:?}: {status}");
                }
                let body = resp.into_body().collect().await;
                assert!(body.is_ok(), "{headers:?} request {i}: the body broke ({status}): {:?}", body.err());
                assert_eq!(&body.unwrap().to_bytes()[..], b"body");
            }
            assert_eq!(seen(&seen_), 1, "{headers:?}: the second request is a hit");
            still_serving(&gw).await;
            assert_eq!(DURATION_PANICS.load(Ordering::SeqCst), 0, "{headers:?}: the fill task panicked storing it");
        }
    })
    .await;
}

fn cache_status_of(h: &http::HeaderMap) -> String {
    h.get("cache-status").map_or(String::new(), |v| v.to_str().unwrap().to_owned())
}

/// An upstream `Age` past what the cache can represent counts as
/// 2147483648 (RFC 9111 §1.2.2, §5.1): the answer is stale at once, not
/// fresh as if it had no `Age`.
#[tokio::test]
async fn a_huge_upstream_age_makes_the_answer_stale() {
    common::bounded(async {
        let (gw, seen_) =
            cached("", fixed(200, &[("cache-control", "max-age=600"), ("age", "99999999999999999999")])).await;
        let (first, _) = get(&gw.url("/c/x")).await;
        let (second, _) = get(&gw.url("/c/x")).await;
        assert_eq!(
            seen(&seen_),
            2,
            "an answer 2^31 s old was served fresh: {} then {}",
            cache_status(&first),
            cache_status(&second)
        );
    })
    .await;
}

/// `Expires: 0` and an invalid `Expires` are stale at once (RFC 9111 §5.3):
/// never answered from the store.
#[tokio::test]
async fn invalid_expires_is_stale() {
    common::bounded(async {
        let cases: [&'static [(&str, &str)]; 2] = [&[("expires", "0")], &[("expires", "tomorrow")]];
        for headers in cases {
            let (gw, seen_) = cached("", fixed(200, headers)).await;
            get(&gw.url("/c/x")).await;
            let (p, _) = get(&gw.url("/c/x")).await;
            assert_eq!(seen(&seen_), 2, "{headers:?}: {}", cache_status(&p));
        }
    })
    .await;
}

// ------------------------------------------------------- ranges, conditionals

/// A ranged miss goes upstream as asked and its 206 is not stored; the
/// next plain GET gets the whole body, and a range on a stored 200 is
/// answered with the whole body (a Range may be ignored, RFC 9110 §14.2).
#[tokio::test]
async fn a_ranged_miss_stores_nothing_partial() {
    common::bounded(async {
        let handler = |req: Request<Incoming>| {
            let ranged = req.headers().contains_key("range");
            std::future::ready(if ranged {
                answer(206, &[("cache-control", "max-age=60"), ("content-range", "bytes 0-3/10")], "0123")
            } else {
                answer(200, &[("cache-control", "max-age=60")], "0123456789")
            })
        };
        let (gw, seen_) = cached("", handler).await;
        let (p, b) = get_with(&gw.url("/c/r"), &[("range", "bytes=0-3")]).await;
        assert_eq!((p.status.as_u16(), &b[..]), (206, &b"0123"[..]));
        let (p, b) = get(&gw.url("/c/r")).await;
        assert_eq!((p.status.as_u16(), &b[..]), (200, &b"0123456789"[..]), "{}", cache_status(&p));
        let (p, b) = get_with(&gw.url("/c/r"), &[("range", "bytes=0-3"), ("if-range", "\"nope\"")]).await;
        assert_eq!((p.status.as_u16(), &b[..]), (200, &b"0123456789"[..]), "{}", cache_status(&p));
        assert_eq!(seen(&seen_), 2);
    })
    .await;
}

/// A ranged request that finds a stale entry in its stale-while-revalidate
/// window triggers the background refresh; that refresh must revalidate
/// the entry (a full GET), not go upstream with the client's Range, whose
/// 206 can refresh nothing (RFC 5861 §3).
#[tokio::test]
async fn a_ranged_request_does_not_spoil_the_background_refresh() {
    common::bounded(async {
        let n = Arc::new(AtomicUsize::new(0));
        let ranged_upstream = Arc::new(AtomicUsize::new(0));
        let (n2, r2) = (n.clone(), ranged_upstream.clone());
        let handler = move |req: Request<Incoming>| {
            let i = n2.fetch_add(1, Ordering::SeqCst);
            let cc = [("cache-control", "max-age=1, stale-while-revalidate=30")];
            std::future::ready(if req.headers().contains_key("range") {
                r2.fetch_add(1, Ordering::SeqCst);
                answer(206, &[cc[0], ("content-range", "bytes 0-0/2")], "v")
            } else {
                answer(200, &cc, format!("v{i}"))
            })
        };
        let (gw, _) = cached("", handler).await;
        get(&gw.url("/c/s")).await;
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let (p, b) = get_with(&gw.url("/c/s"), &[("range", "bytes=0-0")]).await;
        assert!(cache_status(&p).contains("stale"), "{}: {b:?}", cache_status(&p));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (p, b) = get(&gw.url("/c/s")).await;
        assert_eq!(
            (&b[..], ranged_upstream.load(Ordering::SeqCst)),
            (&b"v1"[..], 0),
            "the refresh went upstream with the client's Range; now: {}",
            cache_status(&p)
        );
    })
    .await;
}

/// A client's conditional on a miss goes upstream; the 304 it gets back
/// (even with max-age) is not stored for unconditional clients.
#[tokio::test]
async fn a_304_to_a_client_conditional_miss_is_not_stored() {
    common::bounded(async {
        let handler = |req: Request<Incoming>| {
            std::future::ready(if req.headers().contains_key("if-none-match") {
                answer(304, &[("cache-control", "max-age=60"), ("etag", "\"a\"")], "")
            } else {
                answer(200, &[("cache-control", "max-age=60"), ("etag", "\"a\"")], "full")
            })
        };
        let (gw, _) = cached("", handler).await;
        let (p, _) = get_with(&gw.url("/c/n"), &[("if-none-match", "\"a\"")]).await;
        assert_eq!(p.status.as_u16(), 304);
        let (p, b) = get(&gw.url("/c/n")).await;
        assert_eq!((p.status.as_u16(), &b[..]), (200, &b"full"[..]), "{}", cache_status(&p));
    })
    .await;
}

/// HEAD first stores nothing a GET would be answered with.
#[tokio::test]
async fn head_first_then_get_gets_the_body() {
    common::bounded(async {
        let (gw, _) = cached("", fixed(200, &[("cache-control", "max-age=60")])).await;
        let (p, _) = send(Request::head(gw.url("/c/h")).body(full(Bytes::new())).unwrap()).await;
        assert_eq!(p.status.as_u16(), 200);
        let (p, b) = get(&gw.url("/c/h")).await;
        assert_eq!((p.status.as_u16(), &b[..]), (200, &b"body"[..]), "{}", cache_status(&p));
        let (p, b) = get(&gw.url("/c/h")).await;
        assert_eq!(&b[..], b"body", "{}", cache_status(&p));
    })
    .await;
}

// ------------------------------------------------------------- invalidation

/// A failed POST invalidates nothing; a Location to another host does not
/// invalidate the same path on this one; a successful POST with another
/// query invalidates only that URI (RFC 9111 §4.4).
#[tokio::test]
async fn invalidation_only_on_success_and_same_origin() {
    common::bounded(async {
        let handler = |req: Request<Incoming>| {
            let q = req.uri().query().unwrap_or("").to_owned();
            std::future::ready(match (req.method().as_str(), q.as_str()) {
                ("POST", "fail") => answer(500, &[("location", "/c/a")], ""),
                ("POST", "other") => answer(201, &[("location", "http://elsewhere.example/c/a")], ""),
                ("POST", _) => answer(204, &[], ""),
                _ => answer(200, &[("cache-control", "max-age=60")], "a"),
            })
        };
        let (gw, seen_) = cached("", handler).await;
        let post = |q: &str| send(Request::post(gw.url(&format!("/c/a?{q}"))).body(full(Bytes::new())).unwrap());
        get(&gw.url("/c/a")).await;
        post("fail").await;
        post("other").await;
        post("x=1").await;
        let (p, _) = get(&gw.url("/c/a")).await;
        assert!(cache_status(&p).contains("hit"), "{}", cache_status(&p));
        assert_eq!(seen(&seen_), 4);
    })
    .await;
}

// ------------------------------------------------------------------ framing

/// A chunked cacheable answer cut short (no last chunk, then close) is
/// never stored; the next client gets a whole answer.
#[tokio::test]
async fn a_chunked_body_cut_short_is_not_stored() {
    common::bounded(async {
        let n = Arc::new(AtomicUsize::new(0));
        let n2 = n.clone();
        let (addr, _) = scripted::scripted(move |_, _, _| {
            if n2.fetch_add(1, Ordering::SeqCst) == 0 {
                scripted::Answer {
                    close: true,
                    ..scripted::answer(
                        b"HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ntransfer-encoding: chunked\r\n\r\n4\r\nhalf\r\n",
                    )
                }
            } else {
                scripted::answer(b"HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ncontent-length: 5\r\n\r\nwhole")
            }
        })
        .await;
        let gw = scripted::route_to(addr, "cut", "cache = {}").await;
        let resp = client().request(Request::get(gw.url("/h/x")).body(full(Bytes::new())).unwrap()).await.unwrap();
        assert!(resp.into_body().collect().await.is_err(), "the first client's answer is cut short too");
        let (p, b) = get(&gw.url("/h/x")).await;
        assert_eq!((&b[..], n.load(Ordering::SeqCst)), (&b"whole"[..], 2), "{}", cache_status(&p));
    })
    .await;
}

// ------------------------------------------------------------------- HTTP/2

/// HTTP/2 clients get hits of a stored chunked answer whole (no
/// connection-specific field from the stored head), and a HEAD's head.
#[tokio::test]
async fn http2_clients_get_whole_hits_of_a_chunked_answer() {
    common::bounded(async {
        let (addr, _) = scripted::scripted(|_, _, _| {
            scripted::answer(
                b"HTTP/1.1 200 OK\r\ncache-control: max-age=60\r\ntransfer-encoding: chunked\r\n\r\n4\r\nbody\r\n0\r\n\r\n",
            )
        })
        .await;
        let gw = scripted::route_to(addr, "h2c", "cache = {}").await;
        let (mut h2, _conn) = h2_client(gw.addr).await;
        for i in 0..3 {
            let req = Request::get(gw.url("/h/x")).body(full(Bytes::new())).unwrap();
            let resp = h2.send_request(req).await.unwrap_or_else(|e| panic!("request {i}: {e}"));
            let status = cache_status_of(resp.headers());
            assert_eq!(resp.status().as_u16(), 200, "{status}");
            let body = resp.into_body().collect().await.unwrap_or_else(|e| panic!("request {i} ({status}): {e}"));
            assert_eq!(&body.to_bytes()[..], b"body", "request {i} ({status})");
            if i > 0 {
                assert!(status.contains("hit"), "{status}");
            }
        }
        let resp = h2.send_request(Request::head(gw.url("/h/x")).body(full(Bytes::new())).unwrap()).await.unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert!(cache_status_of(resp.headers()).contains("hit"));
    })
    .await;
}
