//! A reload against the gateway's own HTTP/1.1 connections as they are
//! when it happens: parked, busy (a request waiting on its upstream),
//! pipelined, over TLS, and many at once through many reloads. Raw
//! clients and upstreams on loopback; the parked gauge is the process's,
//! so the tests run one at a time, each once the last one's connections
//! have gone (`common::parked::one_at_a_time`).

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::counting::{Counting, LIVE};
use common::parked::{parked, parked_become};
use common::pki::Pki;
use common::{TestGateway, TestUpstream, bounded, closed_within, counting_upstream, full, read_responses, send};
use http::{Request, Response};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsConnector;

#[global_allocator]
static ALLOC: Counting = Counting;

const WAIT: Duration = Duration::from_secs(5);

/// A configuration file: `[server]` on port 0 with `server`, then `rest`.
fn file(server: &str, rest: &str) -> String {
    format!("[server]\nlisten = \"127.0.0.1:0\"\n{server}\n{rest}")
}

fn respond(name: &str, prefix: &str, body: &str) -> String {
    format!("[[routes]]\nname = \"{name}\"\nprefix = \"{prefix}\"\nrespond = {{ status = 200, body = \"{body}\" }}\n")
}

fn proxy(name: &str, upstream: &str, extra: &str) -> String {
    format!("[[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nupstream = \"{upstream}\"\n{extra}\n")
}

fn upstream(name: &str, addr: SocketAddr) -> String {
    format!("[upstreams.{name}]\nurl = \"http://{addr}\"\n")
}

/// Writes `toml` over the gateway's file and reloads it.
fn reload(gw: &TestGateway, dir: &Path, toml: &str) -> Vec<&'static str> {
    std::fs::write(dir.join("gateway.toml"), toml).unwrap();
    gw.app.reload().expect("a valid file reloads")
}

fn get(path: &str, extra: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n")
}

/// One response's status and body off `s`. Boxed: the reader's buffer
/// would otherwise sit in each test's frame once per call (debug builds).
async fn answer(s: &mut TcpStream) -> (u16, String) {
    let (head, body) = bounded(Box::pin(read_responses(s, &[false]))).await.remove(0);
    (head[9..12].parse().unwrap(), String::from_utf8(body).unwrap())
}

async fn ask(s: &mut TcpStream, path: &str) -> (u16, String) {
    s.write_all(get(path, "").as_bytes()).await.unwrap();
    answer(s).await
}

/// An upstream that answers `name` once the test lets it (a permit per
/// request); counts the requests it got.
async fn held_upstream(name: &'static str) -> (TestUpstream, Arc<Semaphore>, Arc<AtomicUsize>) {
    let (gate, seen) = (Arc::new(Semaphore::new(0)), Arc::new(AtomicUsize::new(0)));
    let (g, n) = (gate.clone(), seen.clone());
    let up = TestUpstream::start(move |_req: Request<hyper::body::Incoming>| {
        let (g, n) = (g.clone(), n.clone());
        async move {
            n.fetch_add(1, Ordering::SeqCst);
            g.acquire().await.unwrap().forget();
            Response::new(full(name))
        }
    })
    .await;
    (up, gate, seen)
}

async fn seen_become(seen: &AtomicUsize, want: usize) {
    let until = Instant::now() + WAIT;
    while seen.load(Ordering::SeqCst) != want {
        assert!(Instant::now() < until, "the upstream saw {} requests, not {want}", seen.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

const PARKING: &str = "park_after = \"200ms\"\nidle_timeout = \"30s\"";

/// A route's new respond body and upstream reach a parked connection's
/// next request; requests in flight across the reload (one alone, one
/// with a request pipelined behind it) finish on the old upstream, and
/// what follows them is served by the new table. A file refused after
/// that changes nothing for the parked connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_busy_and_pipelined_connections_cross_a_reload() {
    let _one = common::parked::one_at_a_time().await;
    let (a, gate, seen) = held_upstream("old upstream").await;
    let (b, _) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let ups = format!("{}{}", upstream("a", a.addr), upstream("b", b.addr));
    let v1 = file(PARKING, &format!("{ups}{}{}", respond("r", "/r", "one"), proxy("up", "a", "")));
    let gw = TestGateway::from_file(dir.path(), &v1).await;
    let base = parked();
    let mut idle = TcpStream::connect(gw.addr).await.unwrap();
    assert_eq!(ask(&mut idle, "/r").await, (200, "one".into()));
    let mut busy = TcpStream::connect(gw.addr).await.unwrap();
    busy.write_all(get("/up/1", "").as_bytes()).await.unwrap();
    seen_become(&seen, 1).await;
    let mut piped = TcpStream::connect(gw.addr).await.unwrap();
    piped.write_all(format!("{}{}", get("/up/2", ""), get("/r", "")).as_bytes()).await.unwrap();
    seen_become(&seen, 2).await;
    assert_eq!(parked_become(base + 1.0, WAIT).await - base, 1.0, "the idle connection did not park");

    let v2 = file(PARKING, &format!("{ups}{}{}", respond("r", "/r", "two"), proxy("up", "b", "")));
    assert!(reload(&gw, dir.path(), &v2).is_empty());
    assert_eq!(ask(&mut idle, "/r").await, (200, "two".into()), "a parked connection woke into the old routes");
    assert_eq!(ask(&mut idle, "/up/3").await, (200, "ok".into()), "a parked connection woke into the old upstream");
    gate.add_permits(2);
    assert_eq!(answer(&mut busy).await, (200, "old upstream".into()), "a request in flight moved");
    let both: Vec<_> = bounded(Box::pin(read_responses(&mut piped, &[false, false]))).await;
    let bodies: Vec<_> = both.iter().map(|(_, b)| String::from_utf8_lossy(b)).collect();
    assert_eq!(bodies, ["old upstream", "two"], "pipelined: the first finishes on the old, the next is new");
    assert_eq!(ask(&mut busy, "/up/4").await, (200, "ok".into()));
    assert_eq!(seen.load(Ordering::SeqCst), 2, "the old upstream got a request after the reload");

    assert_eq!(parked_become(base + 3.0, WAIT).await - base, 3.0, "all three park again");
    std::fs::write(dir.path().join("gateway.toml"), "[[routes]]\nname = \"r\"\nupstream = \"nowhere\"\n").unwrap();
    gw.app.reload().expect_err("an unknown upstream is refused");
    assert_eq!(parked() - base, 3.0, "a refused file woke or closed parked connections");
    assert_eq!(ask(&mut idle, "/r").await, (200, "two".into()), "a refused file changed the routes");
}

fn watch_reloads() -> f64 {
    let text = gateway::metrics::install().render();
    common::sample(&text, "gateway_config_reloads_total", &[("result", "ok"), ("trigger", "watch")]).unwrap_or(0.0)
}

/// With `watch_config`, a file saved while a connection is parked is
/// reloaded without waking it, and its next request takes the new route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_file_saved_while_a_connection_is_parked() {
    let _one = common::parked::one_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let v = |body: &str| file(&format!("{PARKING}\nwatch_config = true"), &respond("r", "/r", body));
    let gw = TestGateway::from_file(dir.path(), &v("one")).await;
    let base = parked();
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    assert_eq!(ask(&mut s, "/r").await, (200, "one".into()));
    assert_eq!(parked_become(base + 1.0, WAIT).await - base, 1.0);
    let before = watch_reloads();
    std::fs::write(dir.path().join("gateway.toml"), v("two")).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while watch_reloads() == before {
        assert!(Instant::now() < until, "the saved file was not reloaded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(parked() - base, 1.0, "the reload woke or closed the parked connection");
    assert_eq!(ask(&mut s, "/r").await, (200, "two".into()));
}

/// A reload that removes the route a parked connection last used, and one
/// that adds `max_concurrent`, `rate_limit` and `cache` to routes parked
/// connections last used: each applies from their next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removed_and_newly_limited_routes_reach_parked_connections() {
    let _one = common::parked::one_at_a_time().await;
    let (slow, gate, seen) = held_upstream("slow").await;
    let (b, hits) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let ups = format!("{}{}", upstream("slow", slow.addr), upstream("b", b.addr));
    let routes = |lim: &str, cache: &str, conc: &str| {
        format!("{}{}{}", proxy("lim", "b", lim), proxy("cached", "b", cache), proxy("one", "slow", conc))
    };
    let v1 = file(PARKING, &format!("{ups}{}{}", respond("gone", "/gone", "here"), routes("", "", "")));
    let gw = TestGateway::from_file(dir.path(), &v1).await;
    let base = parked();
    let mut conns = Vec::new();
    for path in ["/gone", "/lim/1", "/cached/1"] {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        assert_eq!(ask(&mut s, path).await.0, 200, "{path}");
        conns.push(s);
    }
    let mut held = TcpStream::connect(gw.addr).await.unwrap();
    held.write_all(get("/one/1", "").as_bytes()).await.unwrap();
    seen_become(&seen, 1).await;
    assert_eq!(parked_become(base + 3.0, WAIT).await - base, 3.0);

    let limited =
        routes("rate_limit = { rate = \"1/m\", burst = 1 }", "cache = { default_ttl = \"60s\" }", "max_concurrent = 1");
    assert!(reload(&gw, dir.path(), &file(PARKING, &format!("{ups}{limited}"))).is_empty());
    let [gone, lim, cached] = &mut conns[..] else { unreachable!() };
    assert_eq!(ask(gone, "/gone").await.0, 404, "a removed route still answered a parked connection");
    assert_eq!(ask(lim, "/lim/2").await.0, 200);
    assert_eq!(ask(lim, "/lim/3").await.0, 429, "the added rate limit did not apply");
    let before = hits.load(Ordering::SeqCst);
    assert_eq!(ask(cached, "/cached/2").await, (200, "ok".into()));
    assert_eq!(ask(cached, "/cached/2").await, (200, "ok".into()));
    assert_eq!(hits.load(Ordering::SeqCst) - before, 1, "the added cache did not store");
    // The same cache settings, the upstream's URL moved (to one that
    // would hold the request): the entries stay, for the parked connection
    // that stored one.
    let moved = format!("{}{}", upstream("slow", slow.addr), upstream("b", slow.addr));
    assert_eq!(parked_become(base + 3.0, WAIT).await - base, 3.0);
    assert!(reload(&gw, dir.path(), &file(PARKING, &format!("{moved}{limited}"))).is_empty());
    let kept = tokio::time::timeout(WAIT, ask(cached, "/cached/2")).await;
    assert_eq!(kept.ok(), Some((200, "ok".into())), "the kept cache lost its entry");
    // The request held since before the reload took no slot of a limit
    // the route did not have: the next takes the one slot, and the one
    // after is refused.
    gone.write_all(get("/one/2", "").as_bytes()).await.unwrap();
    seen_become(&seen, 2).await;
    assert_eq!(ask(lim, "/one/3").await.0, 503, "max_concurrent let a second request through");
    gate.add_permits(2);
    assert_eq!(answer(&mut held).await, (200, "slow".into()));
    assert_eq!(answer(gone).await, (200, "slow".into()));
}

/// A reload that changes a route's `max_concurrent` keeps counting the
/// requests it admitted: lowered below those in flight, it refuses a
/// parked connection's next request; raised, it admits only the
/// difference.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_max_concurrent_keeps_counting_for_parked_connections() {
    let _one = common::parked::one_at_a_time().await;
    let (slow, gate, seen) = held_upstream("slow").await;
    let dir = tempfile::tempdir().unwrap();
    let v = |max: usize| {
        let routes = format!("{}{}", respond("r", "/r", "r"), proxy("one", "slow", &format!("max_concurrent = {max}")));
        file(PARKING, &format!("{}{routes}", upstream("slow", slow.addr)))
    };
    let gw = TestGateway::from_file(dir.path(), &v(2)).await;
    let base = parked();
    let mut waking = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        assert_eq!(ask(&mut s, "/r").await.0, 200);
        waking.push(s);
    }
    let mut held = Vec::new();
    for i in 0..2 {
        let mut s = TcpStream::connect(gw.addr).await.unwrap();
        s.write_all(get(&format!("/one/{i}"), "").as_bytes()).await.unwrap();
        held.push(s);
    }
    seen_become(&seen, 2).await;
    assert_eq!(parked_become(base + 2.0, WAIT).await - base, 2.0);

    assert!(reload(&gw, dir.path(), &v(1)).is_empty());
    let refused = tokio::time::timeout(WAIT, ask(&mut waking[0], "/one/2")).await.ok().map(|a| a.0);
    let through = seen.load(Ordering::SeqCst);
    assert_eq!(refused, Some(503), "a lowered max_concurrent admitted a third request ({through} at the upstream)");
    assert!(reload(&gw, dir.path(), &v(3)).is_empty());
    waking[0].write_all(get("/one/3", "").as_bytes()).await.unwrap();
    seen_become(&seen, 3).await;
    let refused = tokio::time::timeout(WAIT, ask(&mut waking[1], "/one/4")).await.ok().map(|a| a.0);
    let through = seen.load(Ordering::SeqCst);
    assert_eq!(refused, Some(503), "a raised max_concurrent admitted past it ({through} at the upstream)");
    gate.add_permits(3);
    for s in held.iter_mut().chain(&mut waking[..1]) {
        assert_eq!(answer(s).await, (200, "slow".into()));
    }
}

const RUNNING: &str = "park_after = \"200ms\"\nidle_timeout = \"5s\"\nheader_read_timeout = \"20s\"";
const CHANGED: &str = "park_after = \"0s\"\nidle_timeout = \"60s\"\nheader_read_timeout = \"300ms\"\n\
    max_connections = 1\nmax_header_size = \"8KiB\"";

/// Waits for `s` to close; how long it had been idle then (since `from`).
async fn closes_after_idle(s: &mut TcpStream, from: Instant, which: &str) -> Duration {
    closed_within(s, Duration::from_secs(10)).await.unwrap_or_else(|| panic!("the {which} connection never closed"));
    from.elapsed()
}

/// `[server]`'s `idle_timeout`, `park_after`, `header_read_timeout`,
/// `max_connections` and `max_header_size` changed in the file: reported,
/// not applied, to connections parked before the reload or opened after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_keys_changed_by_a_reload_do_not_reach_parked_or_new_connections() {
    let _one = common::parked::one_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let routes = respond("r", "/r", "one");
    let gw = TestGateway::from_file(dir.path(), &file(RUNNING, &routes)).await;
    let base = parked();
    let mut before = TcpStream::connect(gw.addr).await.unwrap();
    // Taken before the request: the connection's idle time starts after it.
    let before_idle = Instant::now();
    assert_eq!(ask(&mut before, "/r").await.0, 200);
    assert_eq!(parked_become(base + 1.0, WAIT).await - base, 1.0);
    assert_eq!(reload(&gw, dir.path(), &file(CHANGED, &routes)), vec!["server"]);

    // max_connections = 1: three at once are still served. max_header_size
    // = 8KiB and header_read_timeout = 300ms: a 16 KiB head sent over a
    // second still answers.
    let addr = gw.addr;
    let opened: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let head = get("/r", &format!("X-Big: {}\r\n", "b".repeat(16 * 1024)));
                s.write_all(&head.as_bytes()[..10]).await.unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
                let sent = Instant::now();
                s.write_all(&head.as_bytes()[10..]).await.unwrap();
                assert_eq!(answer(&mut s).await.0, 200, "a new connection under the file's [server]");
                (s, sent)
            })
        })
        .collect();
    let mut after = Vec::new();
    for o in opened {
        after.push(o.await.expect("a new connection served"));
    }
    // park_after = 0s would park none.
    assert_eq!(parked_become(base + 4.0, WAIT).await - base, 4.0, "new connections did not park");
    // idle_timeout: the running 5 s, not the file's 60 s.
    let idle = closes_after_idle(&mut before, before_idle, "parked").await;
    assert!(idle >= Duration::from_millis(4995), "closed after {idle:?} idle");
    for (s, idle_from) in &mut after {
        let idle = closes_after_idle(s, *idle_from, "new").await;
        assert!(idle >= Duration::from_millis(4995), "closed after {idle:?} idle");
    }
    assert_eq!(parked_become(base, WAIT).await, base);
}

/// A TLS client that speaks HTTP/1.1 by ALPN (the gateway's own
/// connection takes it): the certificate it was served and its sender.
async fn tls_client(
    pki: &Pki,
    addr: SocketAddr,
) -> (Vec<u8>, hyper::client::conn::http1::SendRequest<common::TestBody>) {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(pki.roots())
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(addr).await.unwrap();
    let tls = TlsConnector::from(Arc::new(config)).connect(ServerName::try_from("localhost").unwrap(), tcp).await;
    let tls = tls.expect("a TLS handshake");
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let cert = tls.get_ref().1.peer_certificates().unwrap()[0].as_ref().to_vec();
    let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    (cert, send)
}

async fn tls_get(send: &mut hyper::client::conn::http1::SendRequest<common::TestBody>) -> String {
    let req = Request::get("/r").header("host", "localhost").body(full("")).unwrap();
    let body = bounded(send.send_request(req)).await.expect("an answer").into_body();
    String::from_utf8(body.collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

/// TLS connections keep their tasks (they never park); a certificate
/// renewed by a reload is served to new handshakes, and a connection
/// idle across the reload goes on with the new routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_reaches_new_handshakes_and_idle_tls_connections_go_on() {
    let _one = common::parked::one_at_a_time().await;
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    let tls = "[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n";
    let v = |body: &str| file(PARKING, &format!("{tls}{}", respond("r", "/r", body)));
    let gw = TestGateway::from_file(pki.dir.path(), &v("one")).await;
    let base = parked();
    let (old, mut idle) = tls_client(&pki, gw.addr).await;
    assert_eq!(tls_get(&mut idle).await, "one");
    // Five looks of the listener: a TLS connection would have parked.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(parked() - base, 0.0, "a TLS connection parked");

    pki.issue("server", &["localhost"], false);
    assert!(reload(&gw, pki.dir.path(), &v("two")).is_empty());
    let (new, mut fresh) = tls_client(&pki, gw.addr).await;
    assert!(new != old, "a new handshake got the old certificate");
    assert_eq!(tls_get(&mut fresh).await, "two");
    assert_eq!(tls_get(&mut idle).await, "two", "the idle TLS connection did not go on with the new routes");
    // A certificate file that is not one: the reload is refused and the
    // running certificate stays.
    std::fs::write(pki.path("server.pem"), "not a certificate").unwrap();
    std::fs::write(pki.dir.path().join("gateway.toml"), v("three")).unwrap();
    gw.app.reload().expect_err("an unreadable certificate is refused");
    let (kept, mut third) = tls_client(&pki, gw.addr).await;
    assert!(kept == new, "a refused reload changed the certificate");
    assert_eq!(tls_get(&mut third).await, "two");
    assert_eq!(tls_get(&mut idle).await, "two");
}

/// Connections that each ask, then wait a while (some park, some not).
/// Every answer is a whole version's (`v<N>`), and a connection's
/// versions never go back. Returns once each has seen `last`.
async fn clients(addr: SocketAddr, n: usize, last: usize) -> Vec<TcpStream> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                let (mut seen, mut round) = (0, 0);
                while seen != last {
                    let (status, body) = ask(&mut s, "/v").await;
                    let version: usize = body.strip_prefix('v').and_then(|v| v.parse().ok()).unwrap_or(usize::MAX);
                    assert!(status == 200 && version <= last, "connection {i}: {status} {body:?}");
                    assert!(version >= seen, "connection {i} went back from v{seen} to v{version}");
                    seen = version;
                    round += 1;
                    tokio::time::sleep(Duration::from_millis(((i * 37 + round * 53) % 400) as u64)).await;
                }
                s
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("a connection was lost"));
    }
    out
}

fn versioned(k: usize) -> String {
    let server = "park_after = \"100ms\"\nidle_timeout = \"60s\"\n[metrics]\nlisten = \"127.0.0.1:0\"";
    file(server, &format!("{}{}", respond("v", "/v", &format!("v{k}")), respond("w", "/w", "w")))
}

async fn admin_reload(admin: SocketAddr) {
    let (parts, _) = send(Request::post(format!("http://{admin}/-/reload")).body(full("")).unwrap()).await;
    assert_eq!(parts.status, 200);
}

/// 50 reloads, by the application and by the admin endpoint in turn,
/// while 200 connections park and wake: none is lost, no answer comes
/// from half a configuration, the parked count returns to its base, and
/// 50 more reloads leave the heap as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_reloads_while_many_connections_park_and_wake() {
    let _one = common::parked::one_at_a_time().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::from_file(dir.path(), &versioned(0)).await;
    let admin = gw.admin.expect("an admin listener");
    let base = parked();
    const RELOADS: usize = 50;
    let running = tokio::spawn(clients(gw.addr, 200, RELOADS));
    for k in 1..=RELOADS {
        std::fs::write(dir.path().join("gateway.toml"), versioned(k)).unwrap();
        if k % 2 == 0 {
            admin_reload(admin).await;
        } else {
            assert!(gw.app.reload().expect("a valid file").is_empty());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let conns = tokio::time::timeout(Duration::from_secs(60), running).await.expect("clients done").unwrap();
    assert_eq!(parked_become(base + 200.0, Duration::from_secs(10)).await - base, 200.0, "not all parked");
    drop(conns);
    assert_eq!(parked_become(base, Duration::from_secs(10)).await, base, "the parked count did not return");

    let (first, second) = (reloads_heap(&gw, dir.path()).await, reloads_heap(&gw, dir.path()).await);
    let grown = second - first;
    assert!(grown < 64 * 1024, "50 reloads grew the heap by {grown} bytes");
}

/// The heap after 50 reloads of unchanged route names.
async fn reloads_heap(gw: &TestGateway, dir: &Path) -> isize {
    for k in 0..50 {
        std::fs::write(dir.join("gateway.toml"), versioned(k)).unwrap();
        gw.app.reload().unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    LIVE.load(Ordering::Relaxed)
}
