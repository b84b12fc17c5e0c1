//! A client still sending its request body when the gateway's own HTTP/1.1
//! connection answers early (a route that never reads it, a 413 over
//! `max_body`, a 403 from `allow`) and closes: the connection reads and
//! drops what the client still sends for a while (a lingering close, as
//! nginx's `lingering_close`), so that closing does not reset a socket
//! with the client's bytes unread, which loses the answer. And how that
//! while is bounded: by a client that stops, one that never does, one
//! that trickles, and the gateway's shutdown. Real sockets on 127.0.0.1.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::pki::Pki;
use common::{TestGateway, raw_upstream, sample};
use gateway::config::Http1Server;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// The declared body of the uploads: larger than the socket buffers on
/// both sides hold, so a close that drops it unread resets the connection.
const UPLOAD: u64 = 20_000_000;

/// How long any exchange here may take before the test gives up on it.
const PATIENCE: Duration = Duration::from_secs(60);

/// One test at a time: the connection gauge read here is the process's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The body of `/large`'s fixed answer: more than a small receive window
/// takes, less than the gateway's send queue holds.
const LARGE: usize = 300_000;

/// Routes that answer without reading a body: `/fixed` (a fixed 200),
/// `/large` (a fixed 200 of [`LARGE`] bytes),
/// `/small` (a 1 KiB `max_body`), `/denied` (loopback not allowed),
/// `/early` (an upstream that answers [`ANSWER`] bytes at once, see
/// [`early_upstream`]), `/limited` (an upstream that reads the body, behind
/// a 1 KiB `max_body`).
fn routes(extra_server: &str, early: SocketAddr, reading: SocketAddr) -> String {
    format!(
        "[server]\n{extra_server}\n[upstreams.early]\nurl = \"http://{early}\"\n\
         [upstreams.reading]\nurl = \"http://{reading}\"\n\
         [[routes]]\nname = \"early\"\nprefix = \"/early\"\nupstream = \"early\"\nmax_body = \"1GiB\"\n\
         [[routes]]\nname = \"limited\"\nprefix = \"/limited\"\nupstream = \"reading\"\nmax_body = \"1KiB\"\n\
         [[routes]]\nname = \"fixed\"\nprefix = \"/fixed\"\nrespond = {{ status = 200, body = \"fixed\" }}\nmax_body = \"1GiB\"\n\
         [[routes]]\nname = \"small\"\nprefix = \"/small\"\nrespond = {{ status = 200 }}\nmax_body = \"1KiB\"\n\
         [[routes]]\nname = \"denied\"\nprefix = \"/denied\"\nrespond = {{ status = 200 }}\nallow = [\"10.0.0.0/8\"]\nmax_body = \"1GiB\"\n\
         [[routes]]\nname = \"large\"\nprefix = \"/large\"\nrespond = {{ status = 200, body = \"{large}\" }}\nmax_body = \"1GiB\"\n\
         [[routes]]\nname = \"alive\"\nprefix = \"/alive\"\nrespond = {{ status = 200, body = \"alive\" }}\n",
        large = "l".repeat(LARGE)
    )
}

/// A gateway with [`routes`] served by its own HTTP/1.1 connection.
async fn gateway(extra_server: &str) -> TestGateway {
    let (reading, _) = common::counting_upstream().await;
    let toml = routes(extra_server, early_upstream().await, reading.addr);
    let mut config = common::config(&toml, Path::new(env!("CARGO_MANIFEST_DIR")));
    config.server.http1 = Http1Server::Gateway;
    TestGateway::start(config).await
}

/// The body of `/early`'s answer: more than the socket buffers between
/// the gateway and a client that reads slowly hold.
const ANSWER: usize = 8 << 20;

/// An upstream that answers each request head at once with [`ANSWER`]
/// bytes, reading and dropping the request body meanwhile.
async fn early_upstream() -> SocketAddr {
    raw_upstream(|mut s: TcpStream| async move {
        if common::read_head(&mut s).await.is_none() {
            return;
        }
        let (mut rd, mut wr) = s.into_split();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            while rd.read(&mut buf).await.is_ok_and(|n| n > 0) {}
        });
        let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {ANSWER}\r\n\r\n");
        let _ = wr.write_all(head.as_bytes()).await;
        let _ = wr.write_all(&vec![b'a'; ANSWER]).await;
        // Kept open: the gateway's side ends it.
        let _ = wr.shutdown().await;
        std::future::pending::<()>().await;
    })
    .await
}

/// What a client that sent a head and then body bytes saw.
#[derive(Debug)]
struct Seen {
    /// What it read up to the end of the answer's head (or the stream's).
    head: String,
    /// Why its reading ended early, if it did.
    read_error: Option<String>,
    /// Body bytes it wrote.
    wrote: u64,
    /// Why its writing stopped, if not at the end of the body.
    write_error: Option<String>,
}

impl Seen {
    fn status(&self) -> &str {
        self.head.get(9..12).unwrap_or("none")
    }
}

/// How a client sends its body after the head.
#[derive(Clone, Copy)]
enum Sending {
    /// `n` bytes as fast as the socket takes them.
    All(u64),
    /// A byte every `Duration`, without end.
    Trickle(Duration),
}

/// Sends `head` on `io`, then the body as `sending` says while reading the
/// answer, as curl does; the writer's outcome is waited for (up to
/// [`PATIENCE`]) after the answer's head is read.
async fn send_while_reading<S>(io: S, head: &str, sending: Sending) -> Seen
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(io);
    let head = head.to_owned();
    let writer = tokio::spawn(async move {
        if let Err(e) = wr.write_all(head.as_bytes()).await {
            return (0, Some(e.to_string()));
        }
        write_body(&mut wr, sending).await
    });
    let (head, read_error) = read_head(&mut rd).await;
    // The rest of the answer is read too, as a client does.
    let rest = tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        while rd.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    });
    let (wrote, write_error) =
        tokio::time::timeout(PATIENCE, writer).await.expect("the upload ends").expect("the writer ran");
    rest.abort();
    Seen { head, read_error, wrote, write_error }
}

/// Writes a body as `sending` says; the bytes written and why it stopped.
async fn write_body<W: AsyncWrite + Unpin>(wr: &mut W, sending: Sending) -> (u64, Option<String>) {
    let chunk = vec![b'x'; 64 * 1024];
    let mut wrote = 0u64;
    loop {
        let piece = match sending {
            Sending::All(n) if wrote >= n => return (wrote, None),
            Sending::All(n) => &chunk[..chunk.len().min((n - wrote) as usize)],
            Sending::Trickle(every) => {
                tokio::time::sleep(every).await;
                &chunk[..1]
            }
        };
        match wr.write_all(piece).await.and(wr.flush().await) {
            Ok(()) => wrote += piece.len() as u64,
            Err(e) => return (wrote, Some(e.to_string())),
        }
    }
}

/// Reads up to the end of a response head; what came, and the read error
/// that ended it first, if one did.
async fn read_head<R: AsyncRead + Unpin>(rd: &mut R) -> (String, Option<String>) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read = async {
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            match rd.read(&mut buf).await {
                Ok(0) => return Some("end of stream".to_owned()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Some(e.to_string()),
            }
        }
        None
    };
    let error = tokio::time::timeout(PATIENCE, read).await.expect("an answer or an end");
    (String::from_utf8_lossy(&got).into_owned(), error)
}

fn post(path: &str, version: &str, fields: &str) -> String {
    format!("POST {path} HTTP/{version}\r\nHost: t\r\nContent-Length: {UPLOAD}\r\n{fields}\r\n")
}

/// Each early answer reaches a client still sending its body, and the
/// client may send all of it: the gateway reads it to the end and drops it.
#[tokio::test]
async fn an_early_answer_reaches_a_client_still_sending_its_body() {
    let _one = SERIAL.lock().await;
    let gw = gateway("").await;
    let cases = [
        ("/fixed", "1.1", "", "200"),
        ("/small", "1.1", "", "413"),
        ("/denied", "1.1", "", "403"),
        ("/fixed", "1.1", "Connection: close\r\n", "200"),
        ("/small", "1.0", "", "413"),
        ("/small", "1.1", "Expect: 100-continue\r\n", "413"),
    ];
    for (path, version, fields, status) in cases {
        let s = TcpStream::connect(gw.addr).await.unwrap();
        let seen = send_while_reading(s, &post(path, version, fields), Sending::All(UPLOAD)).await;
        let case = format!("{path} HTTP/{version} {fields:?}: {seen:?}");
        assert_eq!((seen.status(), seen.read_error.as_deref()), (status, None), "{case}");
        let closes = seen.head.to_ascii_lowercase().contains("connection: close");
        assert!(closes || version == "1.0", "{case}");
        assert_eq!((seen.wrote, seen.write_error.as_deref()), (UPLOAD, None), "{case}");
    }
    // A chunked body (one chunk, as long as the uploads) refused past
    // `max_body` as it streams to the upstream.
    let s = TcpStream::connect(gw.addr).await.unwrap();
    let head = format!("POST /limited HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n{UPLOAD:x}\r\n");
    let seen = send_while_reading(s, &head, Sending::All(UPLOAD)).await;
    assert_eq!((seen.status(), seen.read_error.as_deref()), ("413", None), "chunked: {seen:?}");
    assert_eq!((seen.wrote, seen.write_error.as_deref()), (UPLOAD, None), "chunked: {seen:?}");
    still_serving_own(&gw).await;
}

/// A client that sends its whole body before it reads (as simple clients
/// do) gets the 413 that was written before its body was read.
#[tokio::test]
async fn a_client_that_reads_only_after_sending_gets_its_413() {
    let _one = SERIAL.lock().await;
    let gw = gateway("").await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(post("/small", "1.1", "").as_bytes()).await.unwrap();
    let (wrote, write_error) = write_body(&mut s, Sending::All(UPLOAD)).await;
    let (head, read_error) = read_head(&mut s).await;
    let seen = format!("wrote {wrote} ({write_error:?}), read {head:?} ({read_error:?})");
    assert!(head.starts_with("HTTP/1.1 413 "), "{seen}");
    assert_eq!((wrote, write_error.as_deref()), (UPLOAD, None), "the body is taken whole: {seen}");
}

/// An upstream's early answer, larger than the socket buffers hold, read
/// slowly by a client still sending its body: the gateway has written the
/// answer's end to the socket, not yet sent, when it closes; a reset
/// there would drop it.
#[tokio::test]
async fn a_large_early_answer_reaches_a_slow_reader_whole() {
    let _one = SERIAL.lock().await;
    let gw = gateway("").await;
    let s = TcpStream::connect(gw.addr).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let head = post("/early", "1.1", "");
    // The write half is handed back, not dropped: its drop would shut the
    // client's side, and a client gone is not answered further.
    let writer = tokio::spawn(async move {
        wr.write_all(head.as_bytes()).await.unwrap();
        (write_body(&mut wr, Sending::All(UPLOAD)).await, wr)
    });
    let (head, read_error) = read_head(&mut rd).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head:?} {read_error:?}");
    let body_start = head.find("\r\n\r\n").unwrap() + 4;
    let mut got = head.len() - body_start;
    let mut buf = vec![0u8; 16 * 1024];
    let ended = loop {
        if got >= ANSWER {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        match tokio::time::timeout(PATIENCE, rd.read(&mut buf)).await.expect("the answer goes on") {
            Ok(0) => break Some("end of stream".to_owned()),
            Ok(n) => got += n,
            Err(e) => break Some(e.to_string()),
        }
    };
    assert_eq!((got, ended), (ANSWER, None), "the answer's body whole");
    let ((wrote, write_error), _wr) = tokio::time::timeout(PATIENCE, writer).await.expect("the upload ends").unwrap();
    assert_eq!((wrote, write_error.as_deref()), (UPLOAD, None));
}

/// Over TLS (ALPN `http/1.1`) too.
#[tokio::test]
async fn an_early_answer_over_tls_reaches_a_client_still_sending() {
    let _one = SERIAL.lock().await;
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    let keys = "[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n";
    let toml = routes(keys, early_upstream().await, common::refused_addr().await);
    let mut config = common::config(&toml, pki.dir.path());
    config.server.http1 = Http1Server::Gateway;
    let gw = TestGateway::start(config).await;
    let mut client = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(pki.roots())
        .with_no_client_auth();
    client.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tcp = TcpStream::connect(gw.addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client)).connect(name, tcp).await.unwrap();
    let seen = send_while_reading(tls, &post("/small", "1.1", ""), Sending::All(UPLOAD)).await;
    assert_eq!(seen.status(), "413", "{seen:?}");
    assert_eq!((seen.wrote, seen.write_error.as_deref()), (UPLOAD, None), "{seen:?}");
}

/// A client that never stops sending is cut off (by the bytes a lingering
/// close reads at most), its answer read first.
#[tokio::test]
async fn a_client_that_never_stops_sending_is_cut_off() {
    let _one = SERIAL.lock().await;
    let gw = gateway("").await;
    let s = TcpStream::connect(gw.addr).await.unwrap();
    let head = "POST /small HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000000000\r\n\r\n";
    let seen = send_while_reading(s, head, Sending::All(u64::MAX)).await;
    assert_eq!(seen.status(), "413", "{seen:?}");
    assert!(seen.write_error.is_some(), "cut off: {seen:?}");
    still_serving_own(&gw).await;
}

/// A client that sends a byte now and then, never pausing long, is cut
/// off all the same (by the time a lingering close takes at most, never
/// more than the idle timeout).
#[tokio::test]
async fn a_client_that_trickles_is_cut_off() {
    let _one = SERIAL.lock().await;
    let gw = gateway("idle_timeout = \"2s\"").await;
    let s = TcpStream::connect(gw.addr).await.unwrap();
    let seen = send_while_reading(s, &post("/fixed", "1.1", ""), Sending::Trickle(Duration::from_millis(50))).await;
    assert_eq!(seen.status(), "200", "{seen:?}");
    assert!(seen.write_error.is_some(), "cut off: {seen:?}");
}

/// A client that stops sending, and keeps its connection open, has it
/// closed once it has been silent for a while.
#[tokio::test]
async fn a_client_that_stops_sending_has_its_connection_closed() {
    let _one = SERIAL.lock().await;
    let gw = gateway("").await;
    // (Those of the test before may be on their way out.)
    assert!(active_becomes(0.0, PATIENCE).await, "no connection left open");
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(post("/small", "1.1", "").as_bytes()).await.unwrap();
    s.write_all(&[b'x'; 100_000]).await.unwrap();
    let (head, _) = read_head(&mut s).await;
    assert!(head.starts_with("HTTP/1.1 413 "), "{head:?}");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(PATIENCE, s.read_to_end(&mut rest)).await.expect("the gateway's end");
    assert!(read.is_ok(), "the answer ends and its stream with it, no reset: {read:?}");
    assert!(active_becomes(0.0, PATIENCE).await, "the silent connection is closed (the client's is open)");
    drop(s);
}

/// A graceful shutdown lets a lingering close go on, as it lets a request
/// finish: a client that reads its answer only after the signal still
/// gets all of it. Ended at the signal, the socket was closed with the
/// client's bytes unread and reset, and the end of the answer still in
/// its send queue was lost (the client read 264 KB of 300 KB).
#[tokio::test]
async fn a_shutdown_lets_a_lingering_close_deliver_the_answer() {
    let _one = SERIAL.lock().await;
    let mut gw = gateway("").await;
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    // A small window: most of the answer waits in the gateway's send queue.
    socket.set_recv_buffer_size(4096).unwrap();
    let (mut rd, mut wr) = socket.connect(gw.addr).await.unwrap().into_split();
    wr.write_all(post("/large", "1.1", "").as_bytes()).await.unwrap();
    let writer = tokio::spawn(async move { (write_body(&mut wr, Sending::All(UPLOAD)).await, wr) });
    // The answer is written and the linger under way before the signal.
    assert!(active_becomes(1.0, PATIENCE).await);
    tokio::time::sleep(Duration::from_millis(300)).await;
    gw.shutdown();
    let mut got = Vec::new();
    let read = tokio::time::timeout(PATIENCE, rd.read_to_end(&mut got)).await.expect("the answer ends");
    let text = String::from_utf8_lossy(&got);
    assert!(read.is_ok() && text.starts_with("HTTP/1.1 200 "), "{read:?} {}", &text[..text.len().min(200)]);
    assert_eq!(got.len() - text.find("\r\n\r\n").unwrap() - 4, LARGE, "the answer's body whole");
    writer.abort();
    let ended = tokio::time::timeout(PATIENCE, &mut gw.task).await;
    assert!(ended.is_ok(), "the gateway shut down once the client left");
}

/// The shutdown timeout ends a lingering close: a client that trickles
/// bytes (never silent, long within the time a lingering close takes at
/// most) does not hold the gateway's shutdown up past it.
#[tokio::test]
async fn the_shutdown_timeout_ends_a_lingering_close() {
    let _one = SERIAL.lock().await;
    let mut gw = gateway("shutdown_timeout = \"1s\"").await;
    let s = TcpStream::connect(gw.addr).await.unwrap();
    let (mut rd, mut wr) = tokio::io::split(s);
    wr.write_all(post("/fixed", "1.1", "").as_bytes()).await.unwrap();
    let trickle = tokio::spawn(async move { write_body(&mut wr, Sending::Trickle(Duration::from_millis(50))).await });
    let (head, _) = read_head(&mut rd).await;
    assert!(head.starts_with("HTTP/1.1 200 "), "{head:?}");
    gw.shutdown();
    // The linger's own bound is 30 s.
    let ended = tokio::time::timeout(Duration::from_secs(20), &mut gw.task).await;
    assert!(ended.is_ok(), "the gateway shut down with the lingering connection open");
    let (_, write_error) = tokio::time::timeout(PATIENCE, trickle).await.expect("cut off").unwrap();
    assert!(write_error.is_some());
}

/// The process's open client connections.
fn active() -> f64 {
    sample(&gateway::metrics::install().render(), "gateway_connections_active", &[]).unwrap_or(0.0)
}

/// Waits up to `within` for the open client connections to be `want`.
async fn active_becomes(want: f64, within: Duration) -> bool {
    let until = std::time::Instant::now() + within;
    while std::time::Instant::now() < until {
        if active() == want {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// The gateway still answers a plain request.
async fn still_serving_own(gw: &TestGateway) {
    let r = common::raw(gw.addr, b"GET /alive HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", PATIENCE).await;
    assert!(r.text.starts_with("HTTP/1.1 200 ") && r.text.ends_with("alive"), "{}", r.text);
}
