//! Per-request behaviour: request IDs, trace context, header rules,
//! compression and panic isolation, end to end on real sockets; what the
//! upstream and the client each see is checked on their side.

mod common;

use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;

/// Held by the tests that make a file's compressed forms: the count of
/// them (`gateway_file_compressions_total{coding}`) is the process's, so
/// one test's gzip form must not land between another's readings.
static COMPRESSING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// An upstream that records each request's headers and answers with
/// `body` as `content_type`, with `extra` response headers.
async fn recording(
    body: &'static str,
    content_type: &'static str,
    extra: &'static [(&'static str, &'static str)],
) -> (TestUpstream, Arc<Mutex<Vec<HeaderMap>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push(req.headers().clone());
            let mut b = Response::builder().header("content-type", content_type);
            for (k, v) in extra {
                b = b.header(*k, *v);
            }
            b.body(full(body)).unwrap()
        }
    })
    .await;
    (up, seen)
}

fn route(up: SocketAddr, name: &str, extra: &str) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"http://{up}\"\n[[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nupstream = \"{name}\"\n{extra}\n\
         [[routes]]\nname = \"{name}_fixed\"\nprefix = \"/{name}-fixed\"\nrespond = {{ status = 200, body = \"fixed\" }}\n"
    )
}

async fn get_with(url: &str, headers: &[(&str, &str)]) -> (http::response::Parts, Bytes) {
    let mut b = Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(b.body(full(Bytes::new())).unwrap()).await
}

fn ids(h: &HeaderMap) -> Vec<String> {
    h.get_all("x-request-id").iter().map(|v| v.to_str().unwrap().to_owned()).collect()
}

#[tokio::test]
async fn every_request_gets_one_id_that_the_upstream_and_the_client_both_see() {
    // The upstream answers with an ID of its own, which must not reach the client.
    let (up, seen) = recording("ok", "text/plain", &[("x-request-id", "upstream-own")]).await;
    // File routes too, plain and compressed: their cached heads hold a
    // placeholder ID that must always be replaced.
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/config/public/demo.txt");
    let files = format!(
        "[[routes]]\nname = \"f\"\nprefix = \"/rid-file\"\nfile = \"{file}\"\n\
         [[routes]]\nname = \"fz\"\nprefix = \"/rid-zfile\"\nfile = \"{file}\"\ncompress = true\n"
    );
    let gw = TestGateway::from_toml(&format!("{}{files}", route(up.addr, "rid", ""))).await;
    // None sent: one is made, 32 hex digits, the same on both sides.
    let (parts, _) = get(&gw.url("/rid")).await;
    let made = ids(&parts.headers);
    assert_eq!(made.len(), 1, "{made:?}");
    assert!(made[0].len() == 32 && made[0].bytes().all(|b| b.is_ascii_hexdigit()), "{made:?}");
    assert_eq!(ids(&seen.lock().unwrap()[0]), made);
    // A valid one is kept.
    let (parts, _) = get_with(&gw.url("/rid"), &[("x-request-id", "client-123")]).await;
    assert_eq!(ids(&parts.headers), ["client-123"]);
    assert_eq!(ids(&seen.lock().unwrap()[1]), ["client-123"]);
    // Invalid ones are replaced: too long, empty, with a space.
    let long = "a".repeat(129);
    for bad in [long.as_str(), "", "has space"] {
        let (parts, _) = get_with(&gw.url("/rid"), &[("x-request-id", bad)]).await;
        let got = ids(&parts.headers);
        assert_eq!(got.len(), 1);
        assert!(got[0] != bad && got[0].len() == 32, "{bad:?} was kept as {got:?}");
    }
    // Every route kind, errors included, answers with one, made here.
    for path in ["/rid-fixed", "/nowhere", "/rid-file", "/rid-file", "/rid-zfile"] {
        let got = ids(&get(&gw.url(path)).await.0.headers);
        assert!(got.len() == 1 && got[0].len() == 32, "{path}: {got:?}");
        let (parts, _) = get_with(&gw.url(path), &[("x-request-id", "client-9"), ("accept-encoding", "gzip")]).await;
        assert_eq!(ids(&parts.headers), ["client-9"], "{path}");
    }
}

/// A fixed response is written into the request's own header map (see
/// `App::dispatch`): none of the request's fields may be left in it, over
/// HTTP/1.1 or HTTP/2, on its first request or a later one on the
/// connection.
#[tokio::test]
async fn a_fixed_response_carries_none_of_the_requests_fields() {
    let (up, _) = recording("ok", "text/plain", &[]).await;
    let gw = TestGateway::from_toml(&route(up.addr, "echo", "")).await;
    let sent = [("authorization", "Bearer secret-token"), ("cookie", "session=s3cret"), ("x-custom", "mine")];
    let check = |parts: &http::response::Parts, body: &Bytes, how: &str| {
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"fixed"[..]), "{how}");
        for (name, _) in sent {
            assert!(parts.headers.get(name).is_none(), "{how}: {name} came back: {:?}", parts.headers);
        }
        assert_eq!(parts.headers["content-type"], "text/plain; charset=utf-8", "{how}");
    };
    for _ in 0..2 {
        let (parts, body) = get_with(&gw.url("/echo-fixed"), &sent).await;
        check(&parts, &body, "HTTP/1.1");
    }
    let (mut h2, _conn) = h2_client(gw.addr).await;
    for _ in 0..2 {
        let mut req = Request::get(format!("http://{}/echo-fixed", gw.addr));
        for (k, v) in sent {
            req = req.header(k, v);
        }
        let resp = h2.send_request(req.body(full(Bytes::new())).unwrap()).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = http_body_util::BodyExt::collect(body).await.unwrap().to_bytes();
        check(&parts, &body, "HTTP/2");
    }
}

#[tokio::test]
async fn request_ids_can_be_switched_off() {
    // The upstream's own ID reaches the client: the gateway sets none.
    let (up, seen) = recording("ok", "text/plain", &[("x-request-id", "upstream-own")]).await;
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/config/public/demo.txt");
    let gw = TestGateway::from_toml(&format!(
        "[server]\nrequest_id = false\ntrace_context = false\n{}\
         [[routes]]\nname = \"f\"\nprefix = \"/norid-file\"\nfile = \"{file}\"\n",
        route(up.addr, "norid", "")
    ))
    .await;
    let (parts, _) = get(&gw.url("/norid")).await;
    assert_eq!(ids(&parts.headers), ["upstream-own"]);
    for path in ["/norid-file", "/norid-fixed"] {
        assert!(ids(&get(&gw.url(path)).await.0.headers).is_empty(), "{path}");
    }
    let h = &seen.lock().unwrap()[0];
    assert!(ids(h).is_empty() && h.get("traceparent").is_none());
}

fn traceparent(h: &HeaderMap) -> Vec<String> {
    h.get("traceparent").map(|v| v.to_str().unwrap().split('-').map(str::to_owned).collect()).unwrap_or_default()
}

#[tokio::test]
async fn a_valid_traceparent_is_continued_and_anything_else_starts_a_trace() {
    let (up, seen) = recording("ok", "text/plain", &[]).await;
    let gw = TestGateway::from_toml(&route(up.addr, "trace", "")).await;
    let incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    get_with(&gw.url("/trace"), &[("traceparent", incoming), ("tracestate", "vendor=abc")]).await;
    let sent = traceparent(&seen.lock().unwrap()[0]);
    assert_eq!(sent[0], "00");
    assert_eq!(sent[1], "0af7651916cd43dd8448eb211c80319c", "the same trace");
    assert_ne!(sent[2], "b7ad6b7169203331", "a new parent: this hop's span");
    assert_eq!(sent[2].len(), 16);
    assert_eq!(sent[3], "01");
    assert_eq!(seen.lock().unwrap()[0]["tracestate"], "vendor=abc");
    // Missing, or invalid (all-zero trace ID, version ff, upper case): a new
    // trace, and the old state dropped.
    for bad in [
        None,
        Some("00-00000000000000000000000000000000-b7ad6b7169203331-01"),
        Some("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        Some("00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01"),
    ] {
        let mut headers = vec![("tracestate", "vendor=abc")];
        if let Some(b) = bad {
            headers.push(("traceparent", b));
        }
        get_with(&gw.url("/trace"), &headers).await;
        let h = seen.lock().unwrap().last().unwrap().clone();
        let sent = traceparent(&h);
        assert_eq!(sent.len(), 4, "{bad:?}");
        assert!(sent[1] != "0af7651916cd43dd8448eb211c80319c" && sent[1] != "0".repeat(32), "{bad:?}: {sent:?}");
        assert!(h.get("tracestate").is_none(), "{bad:?}: state of a restarted trace must go");
    }
}

#[tokio::test]
async fn header_rules_set_and_remove_both_ways() {
    let (up, seen) =
        recording("ok", "text/plain", &[("x-powered-by", "php"), ("x-version", "1"), ("x-version", "2")]).await;
    let rules = "request_headers = { set = { \"x-env\" = \"prod\" }, remove = [\"x-debug\"] }\n\
                 response_headers = { set = { \"x-version\" = \"gw\", \"x-frame-options\" = \"DENY\" }, remove = [\"x-powered-by\"] }";
    let gw = TestGateway::from_toml(&route(up.addr, "rules", rules)).await;
    let (parts, _) =
        get_with(&gw.url("/rules"), &[("x-env", "dev"), ("x-env", "test"), ("x-debug", "1"), ("x-kept", "yes")]).await;
    let h = seen.lock().unwrap()[0].clone();
    assert_eq!(h.get_all("x-env").iter().collect::<Vec<_>>(), ["prod"]);
    assert!(h.get("x-debug").is_none());
    assert_eq!(h["x-kept"], "yes");
    assert_eq!(parts.headers.get_all("x-version").iter().collect::<Vec<_>>(), ["gw"]);
    assert_eq!(parts.headers["x-frame-options"], "DENY");
    assert!(parts.headers.get("x-powered-by").is_none());
    // A client cannot take a set header away by naming it in Connection,
    // nor the Host by naming that.
    let theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    get_with(
        &gw.url("/rules"),
        &[("connection", "x-env, host, traceparent"), ("x-env", "dev"), ("traceparent", theirs)],
    )
    .await;
    let h = seen.lock().unwrap()[1].clone();
    assert_eq!(h.get_all("x-env").iter().collect::<Vec<_>>(), ["prod"]);
    assert!(h.get("host").is_some(), "{h:?}");
    // The trace is read from the request as the client sent it.
    assert_eq!(traceparent(&h)[1], "0af7651916cd43dd8448eb211c80319c", "{h:?}");
}

fn decode(encoding: &str, body: &[u8]) -> String {
    let mut out = String::new();
    match encoding {
        "gzip" => {
            flate2::read::GzDecoder::new(body).read_to_string(&mut out).unwrap();
        }
        "br" => {
            brotli::Decompressor::new(body, 4096).read_to_string(&mut out).unwrap();
        }
        "zstd" => {
            out = String::from_utf8(zstd::decode_all(body).unwrap()).unwrap();
        }
        other => panic!("unexpected encoding {other}"),
    }
    out
}

const TEXT: &str = "The quick brown fox jumps over the lazy dog. ";

#[tokio::test]
async fn proxied_responses_are_compressed_by_accept_encoding() {
    let text: &'static str = Box::leak(TEXT.repeat(100).into_boxed_str());
    let (up, _) = recording(text, "text/html; charset=utf-8", &[("etag", "\"v1\"")]).await;
    let gw = TestGateway::from_toml(&route(up.addr, "gz", "compress = true")).await;
    for (accept, want) in
        [("gzip", "gzip"), ("br", "br"), ("zstd", "zstd"), ("gzip;q=0.5, br;q=0.9", "br"), ("gzip, zstd;q=0", "gzip")]
    {
        let (parts, body) = get_with(&gw.url("/gz"), &[("accept-encoding", accept)]).await;
        assert_eq!(parts.headers["content-encoding"], want, "{accept}");
        assert_eq!(parts.headers["vary"], "accept-encoding");
        assert!(body.len() < text.len() / 4, "{accept}: {} bytes", body.len());
        assert_eq!(decode(want, &body), text, "{accept}");
        // The upstream's strong ETag named other bytes: weak now.
        assert_eq!(parts.headers["etag"], "W/\"v1\"", "{accept}");
    }
    let (parts, body) = get(&gw.url("/gz")).await;
    assert!(parts.headers.get("content-encoding").is_none());
    assert_eq!(&body[..], text.as_bytes());
}

#[tokio::test]
async fn a_compressed_response_has_a_weak_etag_and_every_form_says_vary() {
    let text: &'static str = Box::leak(TEXT.repeat(100).into_boxed_str());
    let up = TestUpstream::start(move |req: Request<Incoming>| async move {
        let b = Response::builder().header("content-type", "text/html").header("etag", "\"v1\"");
        if req.uri().path().ends_with("/nt") {
            return b.header("cache-control", "public, No-Transform").body(full(text)).unwrap();
        }
        if req.uri().path().ends_with("/png") {
            return Response::builder().status(304).header("content-type", "image/png").body(full("")).unwrap();
        }
        if req.headers().contains_key("if-none-match") {
            return b.status(304).body(full("")).unwrap();
        }
        b.body(full(text)).unwrap()
    })
    .await;
    let gw = TestGateway::from_toml(&route(up.addr, "v", "compress = true")).await;
    let head = Request::head(gw.url("/v")).header("accept-encoding", "gzip").body(full(Bytes::new())).unwrap();
    let cases = [
        ("identity GET", "\"v1\"", get(&gw.url("/v")).await.0),
        ("gzip GET", "W/\"v1\"", get_with(&gw.url("/v"), &[("accept-encoding", "gzip")]).await.0),
        // A HEAD answers the GET's headers: the same coding, so the same tag.
        ("HEAD", "W/\"v1\"", send(head).await.0),
        // A 304 carries the tag its 200 would (RFC 9110 §15.4.5): the
        // weak one to a client that holds the gzip form and asks for it
        // again, the strong one to a client that holds the identity form
        // or accepts no coding.
        (
            "304 to the gzip form",
            "W/\"v1\"",
            get_with(&gw.url("/v"), &[("accept-encoding", "gzip"), ("if-none-match", "W/\"v1\"")]).await.0,
        ),
        (
            "304 to the identity form",
            "\"v1\"",
            get_with(&gw.url("/v"), &[("accept-encoding", "gzip"), ("if-none-match", "\"v0\", \"v1\"")]).await.0,
        ),
        ("304 without a coding", "\"v1\"", get_with(&gw.url("/v"), &[("if-none-match", "W/\"v1\"")]).await.0),
    ];
    for (what, etag, parts) in &cases {
        assert_eq!(parts.headers["etag"], *etag, "{what}");
        assert_eq!(parts.headers.get_all("vary").iter().collect::<Vec<_>>(), ["accept-encoding"], "{what}");
    }
    assert!(cases[3..].iter().all(|(_, _, parts)| parts.status == 304));
    // A 304 of a type never compressed says nothing of codings.
    let (parts, _) = get_with(&gw.url("/v/png"), &[("if-none-match", "\"p\"")]).await;
    assert_eq!(parts.status, 304);
    assert!(parts.headers.get("vary").is_none(), "{:?}", parts.headers);
    // no-transform: left as it is.
    let (parts, body) = get_with(&gw.url("/v/nt"), &[("accept-encoding", "gzip, br")]).await;
    assert!(parts.headers.get("content-encoding").is_none());
    assert_eq!(&body[..], text.as_bytes());
    assert_eq!(parts.headers["etag"], "\"v1\"");
}

/// A request with `If-Match` is answered as the upstream sent it: the
/// upstream compared the tag with its own form's, and a form compressed
/// here has only a weak tag, which `If-Match` never matches (RFC 9110
/// §13.1.1); a 304 to it keeps the strong tag too.
#[tokio::test]
async fn a_request_with_if_match_is_not_compressed() {
    let text: &'static str = Box::leak(TEXT.repeat(100).into_boxed_str());
    let (up, _) = recording(text, "text/html; charset=utf-8", &[("etag", "\"v1\"")]).await;
    let gw = TestGateway::from_toml(&route(up.addr, "m", "compress = true")).await;
    let gz = ("accept-encoding", "gzip");
    let (parts, body) = get_with(&gw.url("/m"), &[gz, ("if-match", "\"v1\"")]).await;
    assert!(parts.headers.get("content-encoding").is_none(), "{:?}", parts.headers);
    assert_eq!(parts.headers["etag"], "\"v1\"");
    assert_eq!(parts.headers["vary"], "accept-encoding");
    assert_eq!(&body[..], text.as_bytes());
    // `*` names no form: compressed as usual.
    let (parts, _) = get_with(&gw.url("/m"), &[gz, ("if-match", "*")]).await;
    assert_eq!(parts.headers["content-encoding"], "gzip");
    assert_eq!(parts.headers["etag"], "W/\"v1\"");
}

/// A HEAD on a compressing route answers the headers its GET would
/// (RFC 9110 §9.3.2): the coding, the tag, no identity Content-Length.
#[tokio::test]
async fn a_head_answers_the_headers_of_its_compressed_get() {
    let _one_at_a_time = COMPRESSING.lock().await;
    let text: &'static str = Box::leak(TEXT.repeat(100).into_boxed_str());
    let (up, _) = recording(text, "text/html; charset=utf-8", &[("etag", "\"h1\"")]).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("page.html"), TEXT.repeat(200)).unwrap();
    let toml = format!(
        "{}[[routes]]\nname = \"hf\"\nprefix = \"/hf\"\ndir = \".\"\ncompress = true\n",
        route(up.addr, "hd", "compress = true")
    );
    let gw = TestGateway::start(config(&toml, dir.path())).await;
    // The file's gzip form is made on first demand: ask until it is there.
    for _ in 0..200 {
        let (parts, _) = get_with(&gw.url("/hf/page.html"), &[("accept-encoding", "gzip")]).await;
        if parts.headers.contains_key("content-encoding") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for path in ["/hd", "/hf/page.html"] {
        let (got, body) = get_with(&gw.url(path), &[("accept-encoding", "gzip")]).await;
        assert_eq!(got.headers["content-encoding"], "gzip", "{path}");
        let head = Request::head(gw.url(path)).header("accept-encoding", "gzip").body(full(Bytes::new())).unwrap();
        let (headed, empty) = send(head).await;
        assert!(empty.is_empty(), "{path}: a HEAD has no body");
        for name in ["content-encoding", "etag", "vary", "content-type"] {
            assert_eq!(headed.headers.get(name), got.headers.get(name), "{path}: {name}");
        }
        let length = |p: &http::response::Parts| p.headers.get("content-length").cloned();
        assert_eq!(length(&headed), length(&got), "{path}: content-length (GET body {} bytes)", body.len());
    }
}

#[tokio::test]
async fn compression_is_skipped_where_it_must_be() {
    let big: &'static str = Box::leak(TEXT.repeat(100).into_boxed_str());
    let (small, _) = recording("tiny", "text/plain", &[]).await;
    let (png, _) = recording(big, "image/png", &[]).await;
    let (encoded, _) = recording(big, "text/plain", &[("content-encoding", "identity-ish")]).await;
    let not_modified = TestUpstream::start(|_r| async {
        Response::builder().status(304).header("content-type", "text/plain").body(full("")).unwrap()
    })
    .await;
    let ranged = TestUpstream::start(move |_r| async move {
        Response::builder()
            .status(206)
            .header("content-type", "text/plain")
            .header("content-range", "bytes 0-999/4500")
            .body(full(&big[..1000]))
            .unwrap()
    })
    .await;
    let toml = [
        ("small", small.addr),
        ("png", png.addr),
        ("enc", encoded.addr),
        ("nm", not_modified.addr),
        ("range", ranged.addr),
    ]
    .iter()
    .map(|(n, a)| route(*a, n, "compress = true"))
    .collect::<String>();
    let gw = TestGateway::from_toml(&toml).await;
    for path in ["/small", "/png", "/enc", "/nm", "/range"] {
        let (parts, _) = get_with(&gw.url(path), &[("accept-encoding", "gzip, br")]).await;
        let ce = parts.headers.get("content-encoding").map(|v| v.to_str().unwrap().to_owned());
        assert!(ce.is_none() || ce.as_deref() == Some("identity-ish"), "{path} was compressed: {ce:?}");
    }
    let (parts, body) =
        send(Request::head(gw.url("/png")).header("accept-encoding", "gzip").body(full(Bytes::new())).unwrap()).await;
    assert!(parts.headers.get("content-encoding").is_none() && body.is_empty());
}

#[tokio::test]
async fn cached_files_are_compressed_once_with_an_etag_per_encoding() {
    let _one_at_a_time = COMPRESSING.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let text = TEXT.repeat(200);
    std::fs::write(dir.path().join("page.html"), &text).unwrap();
    std::fs::write(dir.path().join("logo.png"), vec![7u8; 20_000]).unwrap();
    let toml = "[[routes]]\nname = \"site\"\nprefix = \"/site\"\ndir = \".\"\ncompress = true\n";
    let gw = TestGateway::start(config(toml, dir.path())).await;
    // The counter is the process's: counts read as differences.
    let made = |m: &str, enc: &str| sample(m, "gateway_file_compressions_total", &[("coding", enc)]).unwrap_or(0.0);
    let before = metrics_text(gw.addr).await;
    let (plain, plain_body) = get(&gw.url("/site/page.html")).await;
    assert_eq!(&plain_body[..], text.as_bytes());
    let plain_etag = plain.headers["etag"].to_str().unwrap().to_owned();
    let mut etags = vec![plain_etag.clone()];
    for enc in ["gzip", "br", "zstd"] {
        // The first requests start the form and get the file as it is.
        let mut tries = 0;
        let (parts, body) = loop {
            let (parts, body) = get_with(&gw.url("/site/page.html"), &[("accept-encoding", enc)]).await;
            assert_eq!(parts.headers["vary"], "accept-encoding");
            if parts.headers.contains_key("content-encoding") {
                break (parts, body);
            }
            assert_eq!(&body[..], text.as_bytes());
            tries += 1;
            assert!(tries < 200, "{enc}: never compressed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(parts.headers["content-encoding"], enc);
        assert_eq!(parts.headers["vary"], "accept-encoding");
        assert_eq!(decode(enc, &body), text);
        let etag = parts.headers["etag"].to_str().unwrap().to_owned();
        assert!(!etag.starts_with("W/") && !etags.contains(&etag), "{enc}: {etag} must be its own strong tag");
        etags.push(etag.clone());
        // A conditional request with that encoding's tag: 304.
        let (parts, _) =
            get_with(&gw.url("/site/page.html"), &[("accept-encoding", enc), ("if-none-match", &etag)]).await;
        assert_eq!(parts.status, 304, "{enc}");
        assert_eq!(parts.headers["etag"], etag.as_str());
        assert_eq!(parts.headers["vary"], "accept-encoding");
    }
    // Made once per coding, however many asked.
    let m = metrics_text(gw.addr).await;
    for enc in ["gzip", "br", "zstd"] {
        assert_eq!(made(&m, enc) - made(&before, enc), 1.0, "{enc}");
    }
    // Clients that ask and leave at once do not make the work start over.
    // (Words in a pseudo-random order, near the cache's size limit: slow
    // enough to compress that the leavers arrive while it is made.)
    let words: Vec<&str> = TEXT.split(' ').collect();
    let mut seed = 7u64;
    let mut other = String::new();
    while other.len() < 250_000 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        other.push_str(words[(seed >> 33) as usize % words.len()]);
        other.push(if seed & 0x1000 == 0 { ' ' } else { '\n' });
    }
    std::fs::write(dir.path().join("other.html"), other).unwrap();
    for _ in 0..3 {
        let mut leavers = Vec::new();
        for _ in 0..10 {
            let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
            tokio::io::AsyncWriteExt::write_all(
                &mut s,
                b"GET /site/other.html HTTP/1.1\r\nHost: x\r\nAccept-Encoding: br\r\n\r\n",
            )
            .await
            .unwrap();
            leavers.push(s);
        }
        drop(leavers);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut tries = 0;
    while !get_with(&gw.url("/site/other.html"), &[("accept-encoding", "br")])
        .await
        .0
        .headers
        .contains_key("content-encoding")
    {
        tries += 1;
        assert!(tries < 200, "other.html never compressed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let m = metrics_text(gw.addr).await;
    assert_eq!(made(&m, "br") - made(&before, "br"), 2.0);
    // A file asked for once (a crawl, a churning cache) is not compressed.
    std::fs::write(dir.path().join("once.html"), TEXT.repeat(300)).unwrap();
    get_with(&gw.url("/site/once.html"), &[("accept-encoding", "br")]).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let m = metrics_text(gw.addr).await;
    assert_eq!(made(&m, "br") - made(&before, "br"), 2.0);
    // A client holding a form is answered 304 by a gateway that has not
    // made that form yet (here: a new one).
    let gzip_etag = etags[1].clone();
    let fresh = TestGateway::start(config(toml, dir.path())).await;
    let (parts, _) =
        get_with(&fresh.url("/site/page.html"), &[("accept-encoding", "gzip"), ("if-none-match", gzip_etag.as_str())])
            .await;
    assert_eq!(parts.status, 304);
    assert_eq!(
        (&parts.headers["etag"], &parts.headers["vary"]),
        (&gzip_etag.parse().unwrap(), &"accept-encoding".parse().unwrap())
    );
    // A file never compressed keeps its strong tag and no Vary, 304 too.
    let (parts, _) = get_with(&gw.url("/site/logo.png"), &[("accept-encoding", "gzip")]).await;
    let png_etag = parts.headers["etag"].to_str().unwrap().to_owned();
    let (parts, _) = get_with(&gw.url("/site/logo.png"), &[("if-none-match", png_etag.as_str())]).await;
    assert_eq!((parts.status.as_u16(), parts.headers.get("vary")), (304, None));
    assert_eq!(parts.headers["etag"], png_etag.as_str());
    // A file too large for the cache: its ranges resume with If-Range.
    std::fs::write(dir.path().join("big.txt"), TEXT.repeat(8000)).unwrap();
    let (parts, _) = get_with(&gw.url("/site/big.txt"), &[("range", "bytes=0-9")]).await;
    let big_etag = parts.headers["etag"].to_str().unwrap().to_owned();
    assert!(!big_etag.starts_with("W/"), "{big_etag}");
    let (parts, body) = get_with(
        &gw.url("/site/big.txt"),
        &[("accept-encoding", "gzip"), ("range", "bytes=100-199"), ("if-range", big_etag.as_str())],
    )
    .await;
    assert_eq!((parts.status.as_u16(), body.len()), (206, 100));
    // A range is answered from the identity form.
    let (parts, body) =
        get_with(&gw.url("/site/page.html"), &[("accept-encoding", "gzip"), ("range", "bytes=0-9")]).await;
    assert_eq!(parts.status, 206);
    assert!(parts.headers.get("content-encoding").is_none());
    assert_eq!(&body[..], &text.as_bytes()[..10]);
    // Not for images.
    let (parts, _) = get_with(&gw.url("/site/logo.png"), &[("accept-encoding", "gzip")]).await;
    assert!(parts.headers.get("content-encoding").is_none());
}

#[tokio::test]
async fn a_panic_answers_500_and_the_connection_keeps_serving() {
    let gw = TestGateway::from_toml(
        "[[routes]]\nname = \"boom\"\nprefix = \"/boom\"\nrespond = { status = 200 }\npanic = \"injected for the test\"\n\
         [[routes]]\nname = \"fine\"\nprefix = \"/fine\"\nrespond = { status = 200, body = \"fine\" }\n",
    )
    .await;
    let before = sample(&metrics_text(gw.addr).await, "gateway_panics_total", &[]).unwrap_or(0.0);
    let mut s = tokio::net::TcpStream::connect(gw.addr).await.unwrap();
    for (path, want) in [("/boom", "500"), ("/fine", "200"), ("/boom", "500"), ("/fine", "200")] {
        tokio::io::AsyncWriteExt::write_all(&mut s, format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let r = one_response(&mut s).await;
        assert_eq!(r.status().to_string(), want, "{path}: {}", r.text);
        assert!(!r.closed, "the connection must stay open after a panic");
        assert!(r.text.to_ascii_lowercase().contains("x-request-id: "), "{}", r.text);
    }
    let m = metrics_text(gw.addr).await;
    let after = sample(&m, "gateway_panics_total", &[]).unwrap_or(0.0);
    assert_eq!(after - before, 2.0);
    // Counted as the route's 500s, like any other answer.
    assert_eq!(sample(&m, "http_server_requests_total", &[("route", "boom"), ("status", "500")]), Some(2.0));
}

#[tokio::test]
async fn bad_middleware_configs_name_the_key() {
    let cases: &[(&str, &str)] = &[
        (
            "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"a\"\nrequest_headers = { set = { \"bad name\" = \"x\" } }\n",
            "routes[0].request_headers.set.bad…",
        ),
        (
            "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"a\"\nresponse_headers = { set = { \"x-a\" = \"line\\nbreak\" } }\n",
            "routes[0].response_headers.set.x-a",
        ),
        (
            "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"a\"\nrequest_headers = { remove = [\"connection\"] }\n",
            "routes[0].request_headers.remove[0]",
        ),
        (
            "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"a\"\nrequest_headers = { remove = [\"traceparent\"] }\n",
            "routes[0].request_headers.remove[0]",
        ),
        (
            "[upstreams.a]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nupstream = \"a\"\nresponse_headers = { set = { \"X-Request-Id\" = \"fixed\" } }\n",
            "routes[0].response_headers.set.X-Request-Id",
        ),
        ("[server]\naccess_log_format = \"xml\"\n", "server.access_log_format"),
        ("[tracing]\notlp_endpoint = \"ftp://collector\"\n", "tracing.otlp_endpoint"),
    ];
    assert_refused_by_check(env!("CARGO_BIN_EXE_gateway"), cases);
}

/// Runs the gateway binary with `toml` and JSON logs at debug level; returns
/// it with its stderr lines as they come.
/// A gateway process, killed when dropped (a failing test too, or it would
/// hold the test harness's output open).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_gateway(toml: &str, dir: &std::path::Path) -> (Child, Arc<Mutex<Vec<String>>>, SocketAddr) {
    use std::io::BufRead;
    let port = common::process::free_port();
    let path = dir.join("gw.toml");
    std::fs::write(&path, format!("[server]\nlisten = \"127.0.0.1:{port}\"\naccess_log = true\n{toml}")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--log-format", "json", "--config"])
        .arg(&path)
        .env("RUST_LOG", "debug")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let lines = Arc::new(Mutex::new(Vec::new()));
    let (l, stderr) = (lines.clone(), child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            l.lock().unwrap().push(line);
        }
    });
    (Child(child), lines, SocketAddr::from(([127, 0, 0, 1], port)))
}

async fn wait_for_lines(lines: &Mutex<Vec<String>>, what: &str, count: usize) -> Vec<String> {
    for _ in 0..100 {
        let found: Vec<String> = lines.lock().unwrap().iter().filter(|l| l.contains(what)).cloned().collect();
        if found.len() >= count {
            return found;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("fewer than {count} log lines with {what:?}: {:?}", lines.lock().unwrap());
}

#[tokio::test]
async fn access_log_lines_carry_ids_sizes_and_upstream_timings_and_no_secrets() {
    let (up, _) = recording("upstream-answer", "text/plain", &[("set-cookie", "session=SETCOOKIESECRET")]).await;
    let slow = TestUpstream::start(|_r| async {
        tokio::time::sleep(Duration::from_secs(5)).await;
        Response::new(full("late"))
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let refused = refused_addr().await;
    let toml = format!(
        "[upstreams.app]\nurl = \"http://{}\"\n[upstreams.down]\nurl = \"http://{refused}\"\n\
         [[routes]]\nname = \"app\"\nprefix = \"/app\"\nupstream = \"app\"\n\
         [[routes]]\nname = \"down\"\nprefix = \"/down\"\nupstream = \"down\"\n\
         [[routes]]\nname = \"slow\"\nprefix = \"/slow\"\nupstream = \"slow\"\n\
         [[routes]]\nname = \"fixed\"\nprefix = \"/fixed\"\nrespond = {{ status = 200 }}\n\
         [upstreams.slow]\nurl = \"http://{}\"\n",
        up.addr, slow.addr
    );
    let (child, lines, addr) = spawn_gateway(&toml, dir.path());
    wait_for_lines(&lines, "gateway listening", 1).await;
    let req = Request::post(format!("http://{addr}/app/x?q=1"))
        .header("authorization", "Bearer AUTHSECRET")
        .header("proxy-authorization", "Basic PROXYSECRET")
        .header("cookie", "id=COOKIESECRET")
        .header("user-agent", "test-agent/1.0")
        .header("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        .body(full("twelve bytes"))
        .unwrap();
    let (parts, body) = send(req).await;
    assert_eq!(parts.status, 200);
    let id = parts.headers["x-request-id"].to_str().unwrap().to_owned();
    let (failed, _) = get(&format!("http://{addr}/down")).await;
    assert_eq!(failed.status, 502);
    let failed_id = failed.headers["x-request-id"].to_str().unwrap().to_owned();

    let line = wait_for_lines(&lines, &format!("\"request_id\":\"{id}\""), 1).await.remove(0);
    let json: serde_json::Value = serde_json::from_str(&line).unwrap();
    let f = &json["fields"];
    assert_eq!(f["trace_id"], "0af7651916cd43dd8448eb211c80319c", "{line}");
    assert_eq!(f["client"], "127.0.0.1");
    assert_eq!(f["method"], "POST");
    assert_eq!(f["path"], "/app/x?q=1");
    assert_eq!(f["status"], 200);
    assert_eq!(f["bytes_in"], 12);
    assert_eq!(f["bytes_out"], body.len());
    assert_eq!(f["upstream"], "app");
    assert_eq!(f["upstream_endpoint"], format!("http://{}", up.addr));
    assert!(f["upstream_connect_ms"].as_f64().is_some(), "a connection was opened: {line}");
    assert!(f["upstream_header_ms"].as_f64().unwrap() >= 0.0);
    assert_eq!(f["user_agent"], "test-agent/1.0");
    // The failed upstream call's WARN line names the request.
    let warn = wait_for_lines(&lines, "upstream request failed", 1).await;
    assert!(warn[0].contains(&failed_id), "{warn:?}");
    // A client that leaves before its answer is logged as 499.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut s,
        b"GET /slow/left HTTP/1.1\r\nHost: x\r\nX-Request-Id: left-early\r\n\r\n",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(s);
    let line = wait_for_lines(&lines, "\"request_id\":\"left-early\"", 1).await.remove(0);
    let f = serde_json::from_str::<serde_json::Value>(&line).unwrap()["fields"].clone();
    assert_eq!(
        (f["status"].as_u64(), f["route"].as_str(), f["bytes_out"].as_u64()),
        (Some(499), Some("slow"), Some(0))
    );
    // A route that proxies nothing still logs the trace the client sent.
    let trace = ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
    // A token in the query is not logged.
    let target = format!("http://{addr}/fixed?page=2&access_token=QUERYSECRET");
    get_with(&target, &[("x-request-id", "fixed-1"), trace]).await;
    let line = wait_for_lines(&lines, "\"request_id\":\"fixed-1\"", 1).await.remove(0);
    let f = serde_json::from_str::<serde_json::Value>(&line).unwrap()["fields"].clone();
    assert_eq!(f["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736", "{line}");
    assert_eq!(f["path"], "/fixed?page=2&access_token=<redacted>", "{line}");
    drop(child);
    let all = lines.lock().unwrap().join("\n");
    for secret in ["AUTHSECRET", "PROXYSECRET", "COOKIESECRET", "SETCOOKIESECRET", "QUERYSECRET"] {
        assert!(!all.contains(secret), "{secret} was logged");
    }
}

/// The combined format logs the target and `Referer` with a token in
/// their query redacted, as `/-/config` redacts one.
#[tokio::test]
async fn combined_access_lines_carry_no_token_of_a_query_or_referer() {
    let dir = tempfile::tempdir().unwrap();
    let toml = "access_log_format = \"combined\"\n[[routes]]\nname = \"fixed\"\nprefix = \"/fixed\"\n\
                respond = { status = 200 }\n";
    let (child, lines, addr) = spawn_gateway(toml, dir.path());
    wait_for_lines(&lines, "gateway listening", 1).await;
    let referer = ("referer", "https://site.example/login?next=/&code=REFERERSECRET");
    let target = format!("http://{addr}/fixed?page=2&access_token=QUERYSECRET");
    get_with(&target, &[("x-request-id", "combined-1"), referer]).await;
    let line = wait_for_lines(&lines, "combined-1", 1).await.remove(0);
    assert!(line.contains("GET /fixed?page=2&access_token=<redacted> HTTP/1.1"), "{line}");
    assert!(line.contains("https://site.example/login?next=/&code=<redacted>"), "{line}");
    // A Referer with a byte past UTF-8 in it, or its token in a fragment.
    for (id, referer) in [
        ("combined-2", &b"https://h/x?token=REFERER2SECRET&q=\xc3"[..]),
        ("combined-3", &b"https://h/x?a=1#access_token=REFERER3SECRET"[..]),
    ] {
        let head = [&b"GET /fixed HTTP/1.1\r\nHost: x\r\nX-Request-Id: "[..], id.as_bytes(), b"\r\nReferer: ", referer]
            .concat();
        let r = raw(addr, &[&head[..], b"\r\nConnection: close\r\n\r\n"].concat(), Duration::from_secs(3)).await;
        assert_eq!(r.status(), 200, "{}", r.text);
        let line = wait_for_lines(&lines, id, 1).await.remove(0);
        assert!(line.contains("token=<redacted>"), "{line}");
    }
    drop(child);
    let all = lines.lock().unwrap().join("\n");
    for secret in ["QUERYSECRET", "REFERERSECRET", "REFERER2SECRET", "REFERER3SECRET"] {
        assert!(!all.contains(secret), "{secret}: {all}");
    }
}

/// An OTLP/HTTP receiver: keeps each JSON body posted to /v1/traces.
async fn otlp_receiver() -> (TestUpstream, Arc<Mutex<Vec<serde_json::Value>>>) {
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        let g = g.clone();
        async move {
            assert_eq!(req.uri().path(), "/v1/traces");
            assert_eq!(req.headers()["content-type"], "application/json");
            let body = http_body_util::BodyExt::collect(req.into_body()).await.unwrap().to_bytes();
            g.lock().unwrap().push(serde_json::from_slice(&body).unwrap());
            Response::new(full("{}"))
        }
    })
    .await;
    (up, got)
}

fn attributes(span: &serde_json::Value) -> std::collections::HashMap<String, serde_json::Value> {
    span["attributes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|kv| {
            let v = &kv["value"];
            let v = v.get("stringValue").or_else(|| v.get("intValue")).cloned().unwrap_or_default();
            (kv["key"].as_str().unwrap().to_owned(), v)
        })
        .collect()
}

#[tokio::test]
async fn spans_are_exported_to_the_collector_with_the_trace_the_upstream_saw() {
    let (collector, posted) = otlp_receiver().await;
    let (up, seen) = recording("ok", "text/plain", &[]).await;
    let toml = format!(
        "[tracing]\notlp_endpoint = \"http://{}\"\nservice_name = \"sidecar-test\"\n{}",
        collector.addr,
        route(up.addr, "otel", "")
    );
    let gw = TestGateway::from_toml(&toml).await;
    let (parts, _) =
        get_with(&gw.url("/otel/x?y=1"), &[("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")])
            .await;
    let request_id = parts.headers["x-request-id"].to_str().unwrap().to_owned();
    let upstream_parent = traceparent(&seen.lock().unwrap()[0])[2].clone();
    for _ in 0..60 {
        if !posted.lock().unwrap().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let body = posted.lock().unwrap().first().cloned().expect("a batch within 3 s");
    let rs = &body["resourceSpans"][0];
    assert_eq!(rs["resource"]["attributes"][0]["value"]["stringValue"], "sidecar-test");
    let span = &rs["scopeSpans"][0]["spans"][0];
    assert_eq!(span["traceId"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(span["parentSpanId"], "b7ad6b7169203331");
    assert_eq!(span["spanId"], upstream_parent.as_str(), "the span is the parent the upstream saw");
    assert_eq!(span["kind"], 2, "SPAN_KIND_SERVER");
    let a = attributes(span);
    assert_eq!(a["http.request.method"], "GET");
    assert_eq!(a["http.route"], "otel");
    assert_eq!(a["http.response.status_code"].to_string().trim_matches('"'), "200");
    assert_eq!(a["url.path"], "/otel/x");
    assert_eq!(a["server.address"], "127.0.0.1");
    assert_eq!(a["gateway.request_id"], request_id.as_str());
}

#[tokio::test]
async fn an_unreachable_collector_costs_only_a_counter() {
    let refused = refused_addr().await;
    let (up, _) = recording("ok", "text/plain", &[]).await;
    let toml = format!("[tracing]\notlp_endpoint = \"http://{refused}\"\n{}", route(up.addr, "nocollector", ""));
    let gw = TestGateway::from_toml(&toml).await;
    for _ in 0..20 {
        assert_eq!(get(&gw.url("/nocollector")).await.0.status, 200);
    }
    let mut failures = 0.0;
    for _ in 0..60 {
        failures = sample(&metrics_text(gw.addr).await, "gateway_trace_export_failures_total", &[]).unwrap_or(0.0);
        if failures >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(failures >= 1.0, "the failed export must be counted");
}

#[tokio::test]
async fn only_sampled_traces_are_exported_and_a_shutdown_posts_what_is_queued() {
    let (collector, posted) = otlp_receiver().await;
    let (up, _) = recording("ok", "text/plain", &[]).await;
    let toml = format!("[tracing]\notlp_endpoint = \"http://{}\"\n{}", collector.addr, route(up.addr, "smp", ""));
    let mut gw = TestGateway::from_toml(&toml).await;
    let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
    let sampled = "00-1af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    assert_eq!(get_with(&gw.url("/smp"), &[("traceparent", unsampled)]).await.0.status, 200);
    assert_eq!(get_with(&gw.url("/smp"), &[("traceparent", sampled)]).await.0.status, 200);
    // Shut down at once: the batch (which would wait up to a second for
    // more) is posted before the gateway is done.
    gw.shutdown();
    tokio::time::timeout(Duration::from_secs(10), &mut gw.task).await.unwrap().unwrap();
    let batches = posted.lock().unwrap().clone();
    let traces: Vec<String> = batches
        .iter()
        .flat_map(|b| b["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap().clone())
        .map(|span| span["traceId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(traces, ["1af7651916cd43dd8448eb211c80319c"], "posted before shutdown ended, unsampled left out");
}

#[tokio::test]
async fn with_trace_context_off_the_gateway_neither_continues_nor_sends_a_trace() {
    let (collector, posted) = otlp_receiver().await;
    let (up, seen) = recording("ok", "text/plain", &[]).await;
    let toml = format!(
        "[server]\ntrace_context = false\n[tracing]\notlp_endpoint = \"http://{}\"\n{}",
        collector.addr,
        route(up.addr, "off", "")
    );
    let mut gw = TestGateway::from_toml(&toml).await;
    let theirs = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    get_with(&gw.url("/off"), &[("traceparent", theirs)]).await;
    get(&gw.url("/off")).await;
    let sent = seen.lock().unwrap().clone();
    assert_eq!(traceparent(&sent[0]).join("-"), theirs, "passed on untouched");
    assert!(sent[1].get("traceparent").is_none(), "none made up");
    gw.shutdown();
    tokio::time::timeout(Duration::from_secs(10), &mut gw.task).await.unwrap().unwrap();
    // Its own spans are still exported, each its own trace.
    let spans: Vec<serde_json::Value> = posted
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| b["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap().clone())
        .collect();
    assert_eq!(spans.len(), 2);
    for span in spans {
        assert_ne!(span["traceId"], "0af7651916cd43dd8448eb211c80319c");
        assert!(span.get("parentSpanId").is_none_or(|p| p == ""), "{span}");
    }
}

#[tokio::test]
async fn a_request_cut_off_at_shutdown_is_the_gateways_503_and_its_span_is_sent() {
    let (collector, posted) = otlp_receiver().await;
    let slow = TestUpstream::start(|_r| async {
        tokio::time::sleep(Duration::from_secs(10)).await;
        Response::new(full("late"))
    })
    .await;
    let toml = format!(
        "[server]\nshutdown_timeout = \"300ms\"\nshutdown_delay = \"0s\"\n[tracing]\notlp_endpoint = \"http://{}\"\n{}",
        collector.addr,
        route(slow.addr, "cut", "")
    );
    let mut gw = TestGateway::from_toml(&toml).await;
    let url = gw.url("/cut");
    let client = tokio::spawn(async move { tokio::time::timeout(Duration::from_secs(10), get(&url)).await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    gw.shutdown();
    tokio::time::timeout(Duration::from_secs(10), &mut gw.task).await.unwrap().unwrap();
    // The client is told so, as the log and the span say (it got a closed
    // connection and no answer).
    let answered = client.await.unwrap().expect("answered before the timeout");
    assert_eq!(answered.0.status, 503);
    let statuses: Vec<String> = posted
        .lock()
        .unwrap()
        .iter()
        .flat_map(|b| b["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap().clone())
        .map(|span| attributes(&span)["http.response.status_code"].to_string().trim_matches('"').to_owned())
        .collect();
    assert_eq!(statuses, ["503"], "cut off by the gateway, exported before it exited");
}

/// The `X-Request-Id` values of a raw answer's head.
fn raw_ids(text: &str) -> Vec<String> {
    let head = text.split("\r\n\r\n").next().unwrap_or_default();
    head.split("\r\n")
        .filter_map(|line| line.split_once(':'))
        .filter(|(name, _)| name.eq_ignore_ascii_case("x-request-id"))
        .map(|(_, value)| value.trim().to_owned())
        .collect()
}

fn is_made(ids: &[String]) -> bool {
    ids.len() == 1 && ids[0].len() == 32 && ids[0].bytes().all(|b| b.is_ascii_hexdigit())
}

/// A head the gateway's own HTTP/1.1 connection refuses (400, 414, 431)
/// is answered with an `X-Request-Id` as any other request is: the
/// client's own when the head was read whole and it carries a valid one,
/// else one made here; none with `request_id = false`. Before, these
/// answers carried none.
#[tokio::test]
async fn refused_heads_carry_a_request_id() {
    let (up, seen) = recording("ok", "text/plain", &[]).await;
    // A head may be larger than the longest target the parser takes.
    let gw =
        TestGateway::from_toml(&format!("[server]\nmax_header_size = \"128KiB\"\n{}", route(up.addr, "rid", ""))).await;
    let two_lengths =
        "POST /rid HTTP/1.1\r\nHost: x\r\nX-Request-Id: {ID}\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\n";
    let long_target = format!("GET /rid/{} HTTP/1.1\r\nHost: x\r\nX-Request-Id: {{ID}}\r\n\r\n", "b".repeat(70_000));
    let big_head =
        format!("GET /rid HTTP/1.1\r\nHost: x\r\nX-Request-Id: {{ID}}\r\nX-Big: {}\r\n\r\n", "a".repeat(140_000));
    let bad_line = "GET /rid HTTP/9.9 extra\r\nHost: x\r\nX-Request-Id: {ID}\r\n\r\n";
    // (head, status, whether the client's ID can be read from it)
    let cases: &[(&str, u16, bool)] =
        &[(two_lengths, 400, true), (&long_target, 414, true), (&big_head, 431, false), (bad_line, 400, false)];
    for (head, status, read) in cases {
        let r = raw(gw.addr, head.replace("{ID}", "client-7").as_bytes(), Duration::from_secs(5)).await;
        assert_eq!(r.status(), *status, "{}", r.text);
        let got = raw_ids(&r.text);
        match read {
            true => assert_eq!(got, ["client-7"], "{status}: {}", r.text),
            false => assert!(is_made(&got), "{status}: {}", r.text),
        }
        // An invalid one is replaced, as for any request.
        let r = raw(gw.addr, head.replace("{ID}", "has space").as_bytes(), Duration::from_secs(5)).await;
        assert_eq!(r.status(), *status, "{}", r.text);
        assert!(is_made(&raw_ids(&r.text)), "{status}: {}", r.text);
    }
    assert!(seen.lock().unwrap().is_empty());
    let off = TestGateway::from_toml(&format!("[server]\nrequest_id = false\n{}", route(up.addr, "rid", ""))).await;
    let r = raw(off.addr, two_lengths.replace("{ID}", "client-7").as_bytes(), Duration::from_secs(5)).await;
    assert_eq!((r.status(), raw_ids(&r.text)), (400, vec![]), "{}", r.text);
}

/// The admin listener's answers carry an `X-Request-Id` by the same rule
/// as the main listener's, refusals included, on either HTTP/1.1 server.
/// Before, they carried none.
#[tokio::test]
async fn admin_answers_carry_a_request_id() {
    for http1 in ["gateway", "hyper"] {
        let gw =
            TestGateway::from_toml(&format!("[server]\nhttp1 = \"{http1}\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n"))
                .await;
        let admin = gw.admin.unwrap();
        for (path, host, status) in
            [("/healthz", "127.0.0.1", 200), ("/nothing", "127.0.0.1", 404), ("/metrics", "evil.example", 403)]
        {
            let ask = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
            let r = raw(admin, ask.as_bytes(), Duration::from_secs(5)).await;
            assert_eq!(r.status(), status, "{http1} {path}: {}", r.text);
            assert!(is_made(&raw_ids(&r.text)), "{http1} {path}: {}", r.text);
            let ask =
                format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nX-Request-Id: adm-1\r\nConnection: close\r\n\r\n");
            let r = raw(admin, ask.as_bytes(), Duration::from_secs(5)).await;
            assert_eq!(raw_ids(&r.text), ["adm-1"], "{http1} {path}: {}", r.text);
        }
    }
}
