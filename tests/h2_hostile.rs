//! A hostile review of the gateway's own client-facing HTTP/2 connection
//! (`server.http2 = "gateway"`) against hyper's on the same input: what a
//! client or an upstream can do to a stream the gateway serves.

mod common;
#[path = "h2_hostile/raw.rs"]
mod raw;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::{TestGateway, bounded, proxy_toml};
use gateway::config::Http2Server;
use http::Request;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use raw::*;

/// A gateway with the given HTTP/2 connection in front of `up`.
async fn gateway(up: std::net::SocketAddr, http2: Http2Server) -> TestGateway {
    let mut config = common::config(&proxy_toml(up, "d", "", ""), Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http2 = http2;
    TestGateway::start(config).await
}

fn req(gw: &TestGateway, method: &str, path: &str) -> Request<()> {
    Request::builder().method(method).uri(format!("http://{}{path}", gw.addr)).body(()).unwrap()
}

/// The interim answers before the final one, and the final status.
async fn interims_then_status(gw: &TestGateway) -> (Vec<http::Response<()>>, u16) {
    let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
    let (mut answer, _) = client.send_request(req(gw, "GET", "/d/x"), true).unwrap();
    let mut got = Vec::new();
    while let Some(interim) = std::future::poll_fn(|cx| answer.poll_informational(cx)).await {
        got.push(interim.unwrap());
    }
    (got, answer.await.unwrap().status().as_u16())
}

/// An upstream that answers a flood of 103s before its answer: the
/// number an HTTP/2 client is sent is bounded (h2 queues a HEADERS frame
/// for each, outside flow control, so an unbounded number held for a
/// client that does not read would grow the gateway without end).
#[tokio::test]
async fn a_flood_of_early_hints_reaches_the_client_bounded() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            // One at a time, each read before the next: none is lost to
            // the queue between the upstream and the client's stream.
            for _ in 0..100 {
                let _ = s.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n").await;
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    })
    .await;
    let gw = gateway(up, Http2Server::Gateway).await;
    let (interims, status) = bounded(interims_then_status(&gw)).await;
    assert_eq!(status, 200);
    assert!(!interims.is_empty() && interims.len() <= 16, "{} interim answers forwarded", interims.len());
}

/// A 103's `Connection` field, `Keep-Alive` and the fields `Connection`
/// names are the upstream connection's own (RFC 9110 §7.6.1): none of
/// them reaches an HTTP/2 client, the `Link` fields do.
#[tokio::test]
async fn early_hints_lose_the_fields_their_connection_field_names() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            let hints = b"HTTP/1.1 103 Early Hints\r\nConnection: X-Hint, keep-alive\r\nKeep-Alive: 5\r\n\
                          X-Hint: private\r\nLink: </a.css>; rel=preload\r\n\r\n";
            let _ = s.write_all(hints).await;
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    })
    .await;
    let gw = gateway(up, Http2Server::Gateway).await;
    let (interims, status) = bounded(interims_then_status(&gw)).await;
    assert_eq!((status, interims.len()), (200, 1));
    let fields = interims[0].headers();
    assert_eq!(fields.get("link").unwrap(), "</a.css>; rel=preload");
    for gone in ["connection", "keep-alive", "x-hint"] {
        assert!(fields.get(gone).is_none(), "{gone} forwarded: {fields:?}");
    }
}

/// An upstream that answers every request head at once.
async fn ok_upstream() -> std::net::SocketAddr {
    common::raw_upstream(|mut s: TcpStream| async move {
        while common::read_head(&mut s).await.is_some() {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        }
    })
    .await
}

/// Malformed requests (RFC 9113 §8.1.1, §8.2, §8.3) and bodies at odds
/// with their `Content-Length` meet the same end on both connections: a
/// stream reset (the app's 400 for a `CONNECT` without `:authority`, which
/// the h2 crate lets through, and for a `Host` unlike `:authority`), never
/// an answer from the upstream.
#[tokio::test]
async fn malformed_requests_end_as_on_hyper() {
    let up = ok_upstream().await;
    let base = [(":method", "GET"), (":scheme", "http"), (":path", "/d/x"), (":authority", "127.0.0.1")];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut f = base.to_vec();
        f.extend_from_slice(extra);
        f
    };
    let post = |length: &'static str| {
        vec![
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/d/x"),
            (":authority", "a"),
            ("content-length", length),
        ]
    };
    let data = frame(DATA, END_STREAM, 1, b"12345");
    type Case = (&'static str, Vec<(&'static str, &'static str)>, bool, Vec<Vec<u8>>);
    let cases: Vec<Case> = vec![
        ("valid", with(&[]), true, vec![]),
        ("te: trailers", with(&[("te", "trailers")]), true, vec![]),
        ("host unlike :authority", with(&[("host", "other")]), true, vec![]),
        ("uppercase name", with(&[("X-Up", "1")]), true, vec![]),
        ("connection", with(&[("connection", "keep-alive")]), true, vec![]),
        ("keep-alive", with(&[("keep-alive", "5")]), true, vec![]),
        ("transfer-encoding", with(&[("transfer-encoding", "chunked")]), true, vec![]),
        ("upgrade", with(&[("upgrade", "h2c")]), true, vec![]),
        ("te: gzip", with(&[("te", "gzip")]), true, vec![]),
        ("unknown pseudo", with(&[(":foo", "x")]), true, vec![]),
        ("no :path", base.iter().copied().filter(|(n, _)| *n != ":path").collect(), true, vec![]),
        ("empty :path", vec![base[0], base[1], (":path", ""), base[3]], true, vec![]),
        ("two :path", with(&[(":path", "/d/y")]), true, vec![]),
        ("pseudo after a field", vec![base[0], base[1], ("x", "1"), base[2], base[3]], true, vec![]),
        ("CONNECT without :authority", vec![(":method", "CONNECT")], true, vec![]),
        ("body short of its length", post("10"), false, vec![data.clone()]),
        ("body past its length", post("3"), false, vec![data.clone()]),
        ("a length but no body", post("5"), true, vec![]),
    ];
    let (own, hyper) = (gateway(up, Http2Server::Gateway).await, gateway(up, Http2Server::Hyper).await);
    for (name, fields, end, more) in cases {
        let mine = raw_exchange(&own, &fields, end, &more).await;
        let theirs = raw_exchange(&hyper, &fields, end, &more).await;
        assert_eq!(mine, theirs, "{name}");
        // 0x88: `:status 200` from HPACK's static table, the upstream's answer.
        let upstream_answered = mine == Outcome::Answered(vec![0x88]);
        let valid = ["valid", "te: trailers"].contains(&name);
        assert_eq!(upstream_answered, valid, "{name}: {mine:?}");
    }
}

/// Floods a client can send on one connection (rapid reset, CVE-2023-44487;
/// a header list in endless CONTINUATION frames, CVE-2024-27316; PINGs
/// and SETTINGS that each ask for an answer) end the same way on both
/// connections where the end does not hang on timing, and the gateway
/// goes on serving other connections.
#[tokio::test]
async fn floods_end_as_on_hyper_and_others_are_served() {
    let up = ok_upstream().await;
    let (rapid_reset, continuation, pings, settings) = {
        let (mut rr, mut cont, mut pings, mut settings) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..5_000u32 {
            rr.extend(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, &get_block()));
            rr.extend(frame(RST_STREAM, 0, 2 * i + 1, &8u32.to_be_bytes()));
        }
        cont.extend(frame(HEADERS, END_STREAM, 1, &get_block()));
        let mut pad = Vec::new();
        field(&mut pad, "x-pad", &"p".repeat(100));
        for _ in 0..20_000 {
            cont.extend(frame(CONTINUATION, 0, 1, &pad));
        }
        for i in 0..20_000u64 {
            pings.extend(frame(PING, 0, 0, &i.to_be_bytes()));
            settings.extend(frame(SETTINGS, 0, 0, &[0, 3, 0, 0, 0, 100]));
        }
        (rr, cont, pings, settings)
    };
    let (own, hyper) = (gateway(up, Http2Server::Gateway).await, gateway(up, Http2Server::Hyper).await);
    for (name, frames, compared) in [
        ("rapid reset", rapid_reset, false),
        ("continuation", continuation, true),
        ("ping", pings, true),
        ("settings", settings, true),
    ] {
        let mine = flood(&own, frames.clone()).await;
        let theirs = flood(&hyper, frames).await;
        if compared {
            assert_eq!(mine, theirs, "{name}");
        }
        for gw in [&own, &hyper] {
            let fresh = raw_exchange(
                gw,
                &[(":method", "GET"), (":scheme", "http"), (":path", "/d/x"), (":authority", "a")],
                true,
                &[],
            )
            .await;
            assert_eq!(fresh, Outcome::Answered(vec![0x88]), "{name}: another connection is served");
        }
    }
}

/// A client that resets its stream while the request waits on the
/// upstream, or closes its connection: the upstream's request is dropped
/// (its connection closed) on both connections.
#[tokio::test]
async fn a_reset_while_the_upstream_thinks_drops_the_upstream_request() {
    let (tx, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let up = common::raw_upstream(move |mut s: TcpStream| {
        let tx = tx.clone();
        async move {
            let _ = common::read_head(&mut s).await;
            let mut buf = [0u8; 64];
            // Never answers; tells when the gateway lets go.
            while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
            let _ = tx.send(());
        }
    })
    .await;
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let gw = gateway(up, http2).await;
        let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
        let (answer, mut stream) = client.send_request(req(&gw, "GET", "/d/x"), true).unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        stream.send_reset(h2::Reason::CANCEL);
        assert_eq!(bounded(closed.recv()).await, Some(()), "{http2:?}");
        drop(answer);
        // And a client that closes its connection instead.
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &get_block())).await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(s);
        assert_eq!(bounded(closed.recv()).await, Some(()), "{http2:?}: closed connection");
    }
}

/// A client that gives no window while the upstream sends a large body:
/// what the gateway takes from the upstream meanwhile is bounded (the
/// send buffer and the sockets'), as with hyper's connection.
#[tokio::test]
async fn a_client_that_gives_no_window_holds_the_upstream_back() {
    let (tx, mut taken) = tokio::sync::mpsc::unbounded_channel();
    let up = common::raw_upstream(move |mut s: TcpStream| {
        let tx = tx.clone();
        async move {
            let _ = common::read_head(&mut s).await;
            let total = 256u64 << 20;
            let _ = s.write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {total}\r\n\r\n").as_bytes()).await;
            let chunk = vec![b'x'; 64 * 1024];
            let mut sent = 0u64;
            // Until the gateway stops taking bytes for a while.
            while sent < total {
                match tokio::time::timeout(Duration::from_millis(500), s.write_all(&chunk)).await {
                    Ok(Ok(())) => sent += chunk.len() as u64,
                    _ => break,
                }
            }
            let _ = tx.send(sent);
        }
    })
    .await;
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let gw = gateway(up, http2).await;
        let (mut client, _ping) = common::raw_h2(gw.addr, 0).await;
        let (answer, _) = client.send_request(req(&gw, "GET", "/d/big"), true).unwrap();
        let response = bounded(answer).await.unwrap();
        assert_eq!(response.status(), 200);
        let sent = tokio::time::timeout(Duration::from_secs(30), taken.recv()).await.unwrap().unwrap();
        assert!(sent < 32 << 20, "{http2:?}: the gateway took {sent} bytes for a client that takes none");
        drop(response);
    }
}

/// Answers that carry no body (to HEAD, 204, 304, an empty 200) have the
/// same head and no DATA on both connections: a HEAD's `Content-Length`
/// kept, no body invented.
#[tokio::test]
async fn bodiless_answers_are_alike_on_both() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        while let Some(head) = common::read_head(&mut s).await {
            let text = String::from_utf8_lossy(&head).into_owned();
            let answer: &[u8] = if text.starts_with("HEAD") {
                b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n"
            } else if text.contains("/d/204") {
                b"HTTP/1.1 204 No Content\r\n\r\n"
            } else if text.contains("/d/304") {
                b"HTTP/1.1 304 Not Modified\r\netag: \"x\"\r\ncontent-length: 50\r\n\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n"
            };
            let _ = s.write_all(answer).await;
        }
    })
    .await;
    let cases = [("HEAD", "/d/x"), ("GET", "/d/204"), ("GET", "/d/304"), ("GET", "/d/empty"), ("HEAD", "/alive")];
    let mut seen = Vec::new();
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let gw = gateway(up, http2).await;
        let mut got = Vec::new();
        for (method, path) in cases {
            let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
            let (answer, _) = client.send_request(req(&gw, method, path), true).unwrap();
            let (head, mut body) = bounded(answer).await.unwrap().into_parts();
            let ended = body.is_end_stream();
            let data = bounded(body.data()).await.map(|d| d.unwrap().len());
            let length = head.headers.get("content-length").map(|v| v.to_str().unwrap().to_owned());
            got.push((method, path, head.status.as_u16(), length, ended, data));
        }
        seen.push(got);
    }
    assert_eq!(seen[0], seen[1]);
}

/// Streams past the 200 a connection takes at once are refused
/// (REFUSED_STREAM) on both connections, the rest wait on the upstream.
#[tokio::test]
async fn streams_past_the_concurrency_limit_are_refused_alike() {
    let up = common::raw_upstream(|mut s: TcpStream| async move {
        let _ = common::read_head(&mut s).await;
        // Never answers.
        tokio::time::sleep(Duration::from_secs(10)).await;
    })
    .await;
    let mut frames = Vec::new();
    for i in 0..250u32 {
        frames.extend(frame(HEADERS, END_HEADERS | END_STREAM, 2 * i + 1, &get_block()));
    }
    let mut refused = Vec::new();
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let gw = gateway(up, http2).await;
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        s.write_all(&frames).await.unwrap();
        let mut resets = 0;
        let read = async {
            loop {
                let mut head = [0u8; 9];
                s.read_exact(&mut head).await.unwrap();
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let mut payload = vec![0u8; len];
                s.read_exact(&mut payload).await.unwrap();
                if head[3] == RST_STREAM && payload == 7u32.to_be_bytes() {
                    resets += 1;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
        refused.push(resets);
    }
    assert_eq!(refused, [50, 50]);
}

/// Trailer fields both ways, alike on both connections: the upstream's
/// reach the client (with no `TE: trailers`, as HTTP/2 allows), a
/// client's declared in its `Trailer` field reach the upstream.
#[tokio::test]
async fn trailers_pass_both_ways_alike() {
    let (tx, mut upstream_saw) = tokio::sync::mpsc::unbounded_channel();
    let up = common::raw_upstream(move |mut s: TcpStream| {
        let tx = tx.clone();
        async move {
            let Some(mut got) = common::read_head(&mut s).await else { return };
            let mut buf = [0u8; 4096];
            while !got.ends_with(b"\r\n\r\n") || !got.windows(3).any(|w| w == b"\n0\r") {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let _ = tx.send(String::from_utf8_lossy(&got).to_ascii_lowercase().contains("x-req-t: 1"));
            let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-res-t\r\n\r\n\
                           2\r\nok\r\n0\r\nx-res-t: 2\r\n\r\n";
            let _ = s.write_all(answer).await;
        }
    })
    .await;
    let mut seen = Vec::new();
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let gw = gateway(up, http2).await;
        let (mut client, _ping) = common::raw_h2(gw.addr, 65_535).await;
        let mut post = req(&gw, "POST", "/d/t");
        post.headers_mut().insert("trailer", "x-req-t".parse().unwrap());
        let (answer, mut body) = client.send_request(post, false).unwrap();
        body.send_data(Bytes::from_static(b"abc"), false).unwrap();
        let mut trailers = http::HeaderMap::new();
        trailers.insert("x-req-t", "1".parse().unwrap());
        body.send_trailers(trailers).unwrap();
        let (_, mut got) = bounded(answer).await.unwrap().into_parts();
        let data = bounded(got.data()).await.map(|d| d.unwrap());
        let trailers = bounded(got.trailers()).await.unwrap();
        let sent_on = bounded(upstream_saw.recv()).await.unwrap();
        seen.push((sent_on, data, trailers.and_then(|t| t.get("x-res-t").cloned())));
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].2.as_ref().map(|v| v.as_bytes()), Some(&b"2"[..]), "{seen:?}");
    assert!(seen[0].0, "{seen:?}");
}

/// A connection idle past `server.idle_timeout` after its streams are
/// answered gets a GOAWAY (NO_ERROR) and is closed, alike on both.
#[tokio::test]
async fn an_idle_connection_is_sent_goaway_and_closed_alike() {
    let up = ok_upstream().await;
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let toml = proxy_toml(up, "d", "", "idle_timeout = \"300ms\"\nheader_read_timeout = \"300ms\"");
        let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
        config.server.http2 = http2;
        let gw = TestGateway::start(config).await;
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &get_block())).await.unwrap();
        let (mut goaway, mut answered) = (None, false);
        let read = async {
            loop {
                let mut head = [0u8; 9];
                if s.read_exact(&mut head).await.is_err() {
                    return;
                }
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let mut payload = vec![0u8; len];
                if s.read_exact(&mut payload).await.is_err() {
                    return;
                }
                match head[3] {
                    SETTINGS if head[4] & 1 == 0 => s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap(),
                    DATA if head[4] & END_STREAM != 0 => answered = true,
                    GOAWAY => goaway = Some(u32::from_be_bytes(payload[4..8].try_into().unwrap())),
                    _ => {}
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read).await.expect("closed after idling");
        assert_eq!((answered, goaway), (true, Some(0)), "{http2:?}");
    }
}

/// A graceful shutdown with two streams in flight, read frame by frame:
/// the same GOAWAYs on both connections, the first naming the largest
/// stream id, the last the last stream taken (one opened between the
/// two is taken and answered), and a stream opened after the last never
/// reaches the upstream.
#[tokio::test]
async fn a_shutdown_sends_the_same_goaways_as_hyper() {
    let (tx, mut heads) = tokio::sync::mpsc::unbounded_channel();
    let up = common::raw_upstream(move |mut s: TcpStream| {
        let tx = tx.clone();
        async move {
            while let Some(head) = common::read_head(&mut s).await {
                let _ = tx.send(String::from_utf8_lossy(&head).lines().next().unwrap_or("").to_owned());
                tokio::time::sleep(Duration::from_millis(500)).await;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\ndone").await;
            }
        }
    })
    .await;
    let mut seen = Vec::new();
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let mut gw = gateway(up, http2).await;
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        for id in [1, 3] {
            s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, id, &get_block())).await.unwrap();
        }
        for _ in 0..2 {
            bounded(heads.recv()).await.unwrap();
        }
        gw.shutdown();
        let (mut goaways, mut ended) = (Vec::new(), Vec::new());
        let read = async {
            loop {
                let mut head = [0u8; 9];
                if s.read_exact(&mut head).await.is_err() {
                    return;
                }
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
                let mut payload = vec![0u8; len];
                if s.read_exact(&mut payload).await.is_err() {
                    return;
                }
                match head[3] {
                    SETTINGS if head[4] & 1 == 0 => s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap(),
                    PING if head[4] & 1 == 0 => s.write_all(&frame(PING, 1, 0, &payload)).await.unwrap(),
                    DATA if head[4] & END_STREAM != 0 => ended.push(stream),
                    GOAWAY => {
                        let word = |at: usize| u32::from_be_bytes(payload[at..at + 4].try_into().unwrap());
                        goaways.push((word(0) & 0x7fff_ffff, word(4)));
                        // After the first (the stream id's maximum) a stream
                        // may still be taken (RFC 9113 §6.8); after the
                        // last, none.
                        if goaways.len() <= 2 {
                            let late =
                                frame(HEADERS, END_HEADERS | END_STREAM, 3 + 2 * goaways.len() as u32, &get_block());
                            let _ = s.write_all(&late).await;
                        }
                    }
                    _ => {}
                }
            }
        };
        bounded(read).await;
        ended.sort();
        assert!(heads.recv().await.is_some_and(|line| line.starts_with("GET")), "{http2:?}: stream 5");
        assert!(heads.try_recv().is_err(), "{http2:?}: stream 7, after the last GOAWAY, reached the upstream");
        seen.push((goaways, ended));
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].0, [(0x7fff_ffff, 0), (5, 0)], "{seen:?}");
    assert_eq!(seen[0].1, [1, 3, 5], "{seen:?}");
}

/// An answer given before the request body is read (a path no route
/// takes), while the client is still sending: the frames stream 1 gets
/// (the answer, then how the unread body is ended) alike on both.
#[tokio::test]
async fn an_early_answer_to_an_unfinished_body_ends_alike() {
    let up = ok_upstream().await;
    let mut seen = Vec::new();
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let gw = gateway(up, http2).await;
        let mut block = Vec::new();
        for (n, v) in [(":method", "POST"), (":scheme", "http"), (":path", "/nope"), (":authority", "a")] {
            field(&mut block, n, v);
        }
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
        s.write_all(&frame(HEADERS, END_HEADERS, 1, &block)).await.unwrap();
        s.write_all(&frame(DATA, 0, 1, &[b'x'; 1000])).await.unwrap();
        let mut frames = Vec::new();
        let read = async {
            loop {
                let mut head = [0u8; 9];
                s.read_exact(&mut head).await.unwrap();
                let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
                let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]);
                let mut payload = vec![0u8; len];
                s.read_exact(&mut payload).await.unwrap();
                match (head[3], stream) {
                    (SETTINGS, 0) if head[4] & 1 == 0 => s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap(),
                    (RST_STREAM, 1) => frames.push((RST_STREAM, u32::from_be_bytes(payload[..4].try_into().unwrap()))),
                    (kind @ (HEADERS | DATA), 1) => frames.push((kind, u32::from(head[4] & END_STREAM))),
                    _ => {}
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), read).await;
        seen.push(frames);
    }
    assert_eq!(seen[0], seen[1]);
    // The answer, then RST_STREAM(NO_ERROR): the rest of the body is not wanted.
    assert_eq!(seen[0], [(HEADERS, 0), (DATA, 1), (RST_STREAM, 0)]);
}

/// A client that keeps PINGing a connection with no stream in flight (each
/// PING answered, a write) is not kept open by it without end: the writes
/// after the last stream extend its idle time by `server.send_timeout` at
/// most (the time its last answer may take to drain), alike on both.
#[tokio::test]
async fn pings_do_not_keep_an_idle_connection_open() {
    let up = ok_upstream().await;
    for http2 in [Http2Server::Gateway, Http2Server::Hyper] {
        let server = "idle_timeout = \"300ms\"\nsend_timeout = \"300ms\"\nheader_read_timeout = \"300ms\"";
        let mut config = common::config(&proxy_toml(up, "d", "", server), Path::new(env!("CARGO_MANIFEST_DIR")));
        config.server.http2 = http2;
        let gw = TestGateway::start(config).await;
        let (mut client, mut ping) = common::raw_h2(gw.addr, 65_535).await;
        let (answer, _) =
            client.send_request(Request::get(format!("http://{}/d/a", gw.addr)).body(()).unwrap(), true).unwrap();
        assert_eq!(bounded(answer).await.unwrap().status(), 200, "{http2:?}");
        // A PING every 50 ms, for 10 s at most: each one's answer is a write.
        let mut answered = 0;
        while answered < 200 && ping.ping(h2::Ping::opaque()).await.is_ok() {
            answered += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(answered < 200, "{http2:?}: still open after {answered} PINGs");
    }
}
