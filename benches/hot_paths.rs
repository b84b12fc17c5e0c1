//! Micro-benchmarks of the pure pieces on the per-request path: route
//! matching at 10, 100 and 1000 routes (and by host: 3 routes, or 1000
//! over 100 hosts), path rewriting, the header rules,
//! request screening, and the copy of a request head kept for a
//! stale-connection resend.
//! Run with `cargo bench --bench hot_paths`.

use std::net::{IpAddr, Ipv4Addr};

use divan::{Bencher, black_box};
use gateway::headers::{add_forwarding, strip_hop_by_hop};
use gateway::router::{HostPattern, RouteKey, Router, rewrite_path};
use http::{HeaderMap, HeaderValue, Version};

fn main() {
    divan::main();
}

/// `n` routes two segments deep (`/svc17/v1`), plus a catch-all.
fn prefixes(n: usize) -> Vec<String> {
    let mut p: Vec<String> = (0..n).map(|i| format!("/svc{i}/v1")).collect();
    p.push("/".to_owned());
    p
}

#[divan::bench(args = [10, 100, 1000])]
fn route_match(bencher: Bencher, n: usize) {
    let prefixes = prefixes(n);
    let router = Router::new(prefixes.iter().map(String::as_str));
    let paths: Vec<String> = (0..64).map(|i| format!("/svc{}/v1/items/{i}", (i * 7919) % n)).collect();
    let mut i = 0;
    bencher.bench_local(|| {
        i = (i + 1) % paths.len();
        black_box(router.find_path(black_box(&paths[i])))
    });
}

#[divan::bench(args = [10, 100, 1000])]
fn route_miss_to_catch_all(bencher: Bencher, n: usize) {
    let prefixes = prefixes(n);
    let router = Router::new(prefixes.iter().map(String::as_str));
    bencher.bench_local(|| black_box(router.find_path(black_box("/nowhere/deep/path/x"))));
}

/// A table of `n` routes over `n / 10` hosts (at least one), each route
/// `/svcI/v1` on host `hJ.example`, with a catch-all and one wildcard;
/// the request carries the headers of `request_headers`.
#[divan::bench(args = [3, 1000])]
fn route_by_host(bencher: Bencher, n: usize) {
    let hosts: Vec<Vec<HostPattern>> = (0..n)
        .map(|i| vec![HostPattern::parse(&format!("h{}.example", i % (n / 10).max(1))).unwrap()])
        .chain([vec![HostPattern::parse("*.wild.example").unwrap()], vec![]])
        .collect();
    let prefixes: Vec<String> = (0..n).map(|i| format!("/svc{i}/v1")).chain(["/w".into(), "/".into()]).collect();
    let router =
        Router::build((0..n + 2).map(|i| RouteKey { hosts: &hosts[i], prefix: &prefixes[i], conditions: None }));
    let requests: Vec<(http::Uri, HeaderMap)> = (0..64)
        .map(|i| {
            let route = (i * 7919) % n;
            let mut headers = request_headers();
            let host = format!("h{}.example:8080", route % (n / 10).max(1));
            headers.insert(http::header::HOST, HeaderValue::from_str(&host).unwrap());
            (format!("/svc{route}/v1/items/{i}").parse().unwrap(), headers)
        })
        .collect();
    let mut i = 0;
    bencher.bench_local(|| {
        i = (i + 1) % requests.len();
        let (uri, headers) = &requests[i];
        black_box(router.find(black_box(uri), black_box(headers)))
    });
}

#[divan::bench]
fn rewrite(bencher: Bencher) {
    bencher.bench_local(|| black_box(rewrite_path(black_box("/b/items/42"), Some("q=1&r=2"), "/b", "/a")));
}

/// A typical browser-ish request head arriving at the gateway.
fn request_headers() -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in [
        ("host", "app.example:8080"),
        ("user-agent", "Mozilla/5.0 (X11; Linux x86_64)"),
        ("accept", "text/html,application/xhtml+xml"),
        ("accept-encoding", "gzip, deflate, br"),
        ("connection", "keep-alive, x-hop"),
        ("x-hop", "1"),
        ("keep-alive", "timeout=5"),
        ("x-request-id", "6f1c2a"),
    ] {
        h.insert(http::HeaderName::from_static(k), HeaderValue::from_static(v));
    }
    h
}

#[divan::bench]
fn request_header_rules(bencher: Bencher) {
    let template = request_headers();
    let host = HeaderValue::from_static("app.example:8080");
    let client = gateway::headers::forwarded_for(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)));
    let via = gateway::headers::Via::default();
    bencher.with_inputs(|| template.clone()).bench_local_values(|mut h| {
        strip_hop_by_hop(&mut h);
        let mut stamp = gateway::headers::Stamp::default();
        let looped = add_forwarding(&mut h, &client, Some(&host), &via, Version::HTTP_11, false, false, &mut stamp);
        (h, stamp, looped)
    });
}

#[divan::bench]
fn response_header_rules(bencher: Bencher) {
    let mut template = HeaderMap::new();
    template.insert("content-type", HeaderValue::from_static("text/plain"));
    template.insert("content-length", HeaderValue::from_static("2"));
    template.insert("date", HeaderValue::from_static("Mon, 30 Nov 2026 06:50:22 GMT"));
    let via = gateway::headers::Via::default();
    bencher.with_inputs(|| template.clone()).bench_local_values(|mut h| {
        strip_hop_by_hop(&mut h);
        gateway::headers::append_via(&mut h, &via, Version::HTTP_11);
        h
    });
}

/// Screening a request head (framing, Host, target, limits) before it is
/// routed: the browser-ish head above, as the client sent it.
#[divan::bench]
fn screen(bencher: Bencher) {
    let headers = request_headers();
    let (method, uri) = (http::Method::GET, http::Uri::from_static("/svc1/v1/items/42?q=1"));
    bencher.bench_local(|| {
        black_box(gateway::limits::screen(&method, black_box(&uri), Version::HTTP_11, black_box(&headers), 8192))
            .and_then(|declared| declared.within(1 << 20))
            .is_ok()
    });
}

/// Path normalisation: an already normal path (the common case: one scan,
/// no allocation) and one that needs decoding, merging and dot removal.
#[divan::bench(args = ["/api/v1/items/12345/details", "/api//v1/./items/%7e12345/../details"])]
fn path_normalize(bencher: Bencher, path: &str) {
    let opts = gateway::path::Options { merge_slashes: true, reject_encoded_slash: false };
    bencher.bench_local(|| black_box(gateway::path::normalize(black_box(path), opts).is_ok()));
}

/// A proxied request as it goes upstream: the client's headers with the
/// forwarding headers added, bodiless.
fn upstream_request() -> http::Request<gateway::upstream::pool::SendBody> {
    let mut req = http::Request::new(http_body_util::Either::Right(http_body_util::Empty::new()));
    *req.uri_mut() = "/api/v1/items/12345?expand=details".parse().unwrap();
    let mut h = request_headers();
    let client = gateway::headers::forwarded_for(IpAddr::V4(Ipv4Addr::new(10, 1, 2, 3)));
    strip_hop_by_hop(&mut h);
    let mut stamp = gateway::headers::Stamp::default();
    let looped = add_forwarding(
        &mut h,
        &client,
        Some(&HeaderValue::from_static("app.example:8080")),
        &gateway::headers::Via::default(),
        Version::HTTP_11,
        false,
        false,
        &mut stamp,
    );
    assert!(!looped);
    // As an HTTP/2 upstream gets them: in the map.
    stamp.insert_into(&mut h);
    *req.headers_mut() = h;
    req
}

/// The copy of a bodiless request kept to resend it on a stale pooled
/// connection, made (and dropped) for every such request:
/// [`HeadCopy`](gateway::upstream::retry::HeadCopy), against cloning the
/// head as before issue 13 (which also kept the client's read buffer alive).
#[divan::bench(args = ["head_copy", "clone"])]
fn stale_resend_copy(bencher: Bencher, how: &str) {
    let req = upstream_request();
    match how {
        "head_copy" => bencher.bench_local(|| black_box(gateway::upstream::retry::HeadCopy::of(black_box(&req)))),
        _ => bencher.bench_local(|| {
            let mut copy = http::Request::new(());
            *copy.method_mut() = req.method().clone();
            *copy.uri_mut() = req.uri().clone();
            *copy.headers_mut() = req.headers().clone();
            black_box(copy)
        }),
    }
}
