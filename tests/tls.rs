//! TLS both ways, with certificates made in the
//! test (rcgen): `https://` upstreams (private CA, SNI override, mutual TLS,
//! resumed sessions, each certificate failure a 502 `kind="tls"` that says
//! what failed) and `[server.tls]` on the listener (HTTP/1.1 and h2 by ALPN,
//! `X-Forwarded-Proto: https`, client certificates, handshake timeouts).

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::pki::Pki;
use common::*;
use gateway::config::{self, Source};
use gateway::upstream::connect::{TlsTarget, connect_stream};
use http::{Request, Response, Version};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::HandshakeKind;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

#[path = "discovery/dns.rs"]
mod dns;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// What a TLS upstream saw: per connection the SNI and whether the
/// handshake resumed a session; per request its Host and
/// X-Forwarded-Proto.
#[derive(Default)]
struct Seen {
    handshakes: Vec<(Option<String>, Option<HandshakeKind>)>,
    requests: Vec<String>,
}

/// An HTTPS upstream with the certificate `stem`; with `client_ca` it
/// requires a client certificate the test CA issued.
async fn tls_upstream(pki: &Pki, stem: &str, client_ca: bool) -> (SocketAddr, Arc<Mutex<Seen>>) {
    let builder =
        rustls::ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions().unwrap();
    let builder = if client_ca {
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(pki.roots()), provider())
            .build()
            .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = builder.with_single_cert(pki.certs(stem), pki.key(stem)).unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, log) = (acceptor.clone(), log.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let conn = tls.get_ref().1;
                log.lock().unwrap().handshakes.push((conn.server_name().map(str::to_owned), conn.handshake_kind()));
                let svc = service_fn(move |req: Request<Incoming>| {
                    let header =
                        |n: &str| req.headers().get(n).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default();
                    let line = format!("{} host={} proto={}", req.uri(), header("host"), header("x-forwarded-proto"));
                    log.lock().unwrap().requests.push(line);
                    async { Ok::<_, Infallible>(Response::new(full("tls ok"))) }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    });
    (addr, seen)
}

fn upstream_toml(url: &str, tls_keys: &str) -> String {
    named_upstream_toml("app", url, tls_keys)
}

/// The metrics are the process's: a test that counts uses its own name.
fn named_upstream_toml(name: &str, url: &str, tls_keys: &str) -> String {
    format!(
        "[server]\n[upstreams.{name}]\nurl = \"{url}\"\npool_max_idle_per_host = 0\n{tls_keys}\n\
         [[routes]]\nname = \"{name}\"\nprefix = \"/app\"\nupstream = \"{name}\"\nhost = \"upstream\"\n"
    )
}

#[tokio::test]
async fn an_https_upstream_with_a_private_ca_is_reached_and_its_sessions_resumed() {
    let pki = Pki::new();
    pki.issue("server", &["localhost", "127.0.0.1"], false);
    let (up, seen) = tls_upstream(&pki, "server", false).await;
    let toml = upstream_toml(&format!("https://{up}"), "tls_ca_file = \"ca.pem\"");
    let gw = TestGateway::start(config(&toml, pki.dir.path())).await;
    for _ in 0..3 {
        let (parts, body) = get(&gw.url("/app/x")).await;
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"tls ok"[..]));
    }
    let seen = seen.lock().unwrap();
    // No pooling here (pool_max_idle_per_host = 0): a handshake per request.
    let kinds: Vec<_> = seen.handshakes.iter().map(|(_, k)| *k).collect();
    assert_eq!(kinds.len(), 3, "{kinds:?}");
    assert_eq!(kinds[0], Some(HandshakeKind::Full));
    assert!(kinds[1..].iter().all(|k| *k == Some(HandshakeKind::Resumed)), "later handshakes resume: {kinds:?}");
    // An IP address is not sent as SNI (RFC 6066 §3); Host is the URL's.
    assert_eq!(seen.handshakes[0].0, None);
    assert_eq!(seen.requests[0], format!("/app/x host={up} proto=http"));
}

#[tokio::test]
async fn tls_server_name_sets_sni_and_the_name_verified() {
    let pki = Pki::new();
    pki.issue("server", &["upstream.internal"], false);
    let (up, seen) = tls_upstream(&pki, "server", false).await;
    let keys = "tls_ca_file = \"ca.pem\"\ntls_server_name = \"upstream.internal\"";
    let gw = TestGateway::start(config(&upstream_toml(&format!("https://{up}"), keys), pki.dir.path())).await;
    let (parts, _) = get(&gw.url("/app/y")).await;
    assert_eq!(parts.status, 200);
    assert_eq!(seen.lock().unwrap().handshakes[0].0.as_deref(), Some("upstream.internal"));
}

/// A discovered `https` upstream: the certificate is checked for the name
/// (sent as SNI and as Host), not for the address the name resolved to.
#[tokio::test]
async fn a_discovered_https_upstream_is_checked_for_its_name() {
    let pki = Pki::new();
    pki.issue("server", &["app.test"], false);
    let (up, seen) = tls_upstream(&pki, "server", false).await;
    let dns = dns::TestDns::start().await;
    dns.addresses("app.test", &["127.0.0.1"], 5);
    let toml = format!(
        "[server]\n[resolver]\nnameservers = [\"{}\"]\n\
         [upstreams.disc]\ndiscover = {{ dns = \"app.test:{}\", scheme = \"https\" }}\ntls_ca_file = \"ca.pem\"\n\
         [[routes]]\nname = \"disc\"\nprefix = \"/app\"\nupstream = \"disc\"\nhost = \"upstream\"\n",
        dns.addr,
        up.port()
    );
    let gw = TestGateway::start(config(&toml, pki.dir.path())).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (parts, body) = get(&gw.url("/app/x")).await;
        if parts.status == 200 {
            assert_eq!(&body[..], b"tls ok");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never served: {}", parts.status);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let seen = seen.lock().unwrap();
    assert_eq!(seen.handshakes[0].0.as_deref(), Some("app.test"), "SNI is the name");
    assert_eq!(seen.requests[0], format!("/app/x host=app.test:{} proto=http", up.port()));
}

/// Connects to the upstream of `toml` as the gateway would; the error text.
async fn connect_error(pki: &Pki, toml: &str) -> String {
    let source = Source::Inline { text: toml.to_owned(), base_dir: pki.dir.path().to_path_buf() };
    let config = config::load(&source).unwrap();
    let up = &config.upstreams[0];
    let tls = TlsTarget::new(&up.endpoints[0], up).expect("an https endpoint");
    match connect_stream(&up.endpoints[0].address, Some(&tls), Duration::from_secs(5)).await {
        Ok(_) => "connected".into(),
        Err(e) => e.to_string(),
    }
}

#[tokio::test]
async fn each_certificate_failure_is_a_502_tls_that_says_what_failed() {
    let pki = Pki::new();
    pki.issue("good", &["localhost", "127.0.0.1"], false);
    pki.issue("expired", &["localhost", "127.0.0.1"], true);
    let (good, _) = tls_upstream(&pki, "good", false).await;
    let (expired, _) = tls_upstream(&pki, "expired", false).await;
    let cases = [
        // webpki's public roots do not know the test CA.
        (format!("https://{good}"), "", "unknown issuer"),
        (format!("https://{expired}"), "tls_ca_file = \"ca.pem\"", "certificate expired"),
        (format!("https://{good}"), "tls_ca_file = \"ca.pem\"\ntls_server_name = \"other.example\"", "name mismatch"),
        (format!("https://{good}"), "tls_ca_file = \"ca.pem\"", "connected"),
    ];
    let mut gateways = Vec::new();
    for (url, keys, want) in &cases {
        let toml = named_upstream_toml("certs", url, keys);
        let got = connect_error(&pki, &toml).await;
        assert!(got.contains(want), "{keys}: want {want:?}, got {got:?}");
        let gw = TestGateway::start(config(&toml, pki.dir.path())).await;
        let (parts, body) = get(&gw.url("/app/z")).await;
        gateways.push(gw);
        if *want == "connected" {
            assert_eq!(parts.status, 200);
            continue;
        }
        assert_eq!(parts.status, 502, "{keys}");
        assert_eq!(&body[..], b"bad gateway: upstream TLS handshake failed\n");
    }
    let text = metrics_text(gateways[0].addr).await;
    assert_eq!(sample(&text, "gateway_upstream_errors_total", &[("upstream", "certs"), ("kind", "tls")]), Some(3.0));
}

#[tokio::test]
async fn mutual_tls_to_the_upstream() {
    let pki = Pki::new();
    pki.issue("server", &["127.0.0.1"], false);
    pki.issue("client", &["gateway.client"], false);
    let (up, _) = tls_upstream(&pki, "server", true).await;
    let url = format!("https://{up}");
    let toml = named_upstream_toml("mtls", &url, "tls_ca_file = \"ca.pem\"");
    let without = TestGateway::start(config(&toml, pki.dir.path())).await;
    assert_eq!(get(&without.url("/app/m")).await.0.status, 502, "the upstream wants a client certificate");
    // TLS 1.3 refuses the missing certificate after the client's side of
    // the handshake: still a TLS failure, not a reset.
    let text = metrics_text(without.addr).await;
    assert_eq!(sample(&text, "gateway_upstream_errors_total", &[("upstream", "mtls"), ("kind", "tls")]), Some(1.0));
    assert_eq!(sample(&text, "gateway_upstream_errors_total", &[("upstream", "mtls"), ("kind", "reset")]), Some(0.0));
    let keys = "tls_ca_file = \"ca.pem\"\ntls_client_cert = \"client.pem\"\ntls_client_key = \"client.key\"";
    let with = TestGateway::start(config(&upstream_toml(&url, keys), pki.dir.path())).await;
    let (parts, body) = get(&with.url("/app/m")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"tls ok"[..]));
}

/// A gateway with `[server.tls]` in front of a plain upstream that echoes
/// the X-Forwarded-Proto it got.
async fn tls_gateway(pki: &Pki, extra_tls: &str, extra_server: &str) -> TestGateway {
    let up = TestUpstream::start(|req: Request<Incoming>| async move {
        let proto = req.headers().get("x-forwarded-proto").map(|v| v.to_str().unwrap().to_owned());
        Response::new(full(format!("proto={}", proto.unwrap_or_default())))
    })
    .await;
    let toml = format!(
        "[server]\n{extra_server}\n[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n{extra_tls}\n\
         [upstreams.app]\nurl = \"http://{}\"\n[[routes]]\nname = \"app\"\nprefix = \"/app\"\nupstream = \"app\"\n",
        up.addr
    );
    TestGateway::start(config(&toml, pki.dir.path())).await
}

/// A TLS connection to `addr` offering `alpn`, with a client certificate
/// when `client` names one.
async fn tls_connect(
    pki: &Pki,
    addr: SocketAddr,
    alpn: &[u8],
    client: Option<&str>,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(pki.roots());
    let mut config = match client {
        Some(stem) => builder.with_client_auth_cert(pki.certs(stem), pki.key(stem)).unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![alpn.to_vec()];
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(Arc::new(config)).connect(ServerName::try_from("localhost").unwrap(), tcp).await
}

/// `GET /app/x` over `tls`, HTTP/1.1 or h2 by what ALPN chose.
async fn get_over(tls: tokio_rustls::client::TlsStream<TcpStream>) -> Result<(Version, String), hyper::Error> {
    let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
    let io = TokioIo::new(tls);
    let req = Request::get("https://localhost/app/x").body(Empty::<Bytes>::new()).unwrap();
    let resp = if h2 {
        let (mut send, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
        tokio::spawn(conn);
        send.send_request(req).await?
    } else {
        let (mut send, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(conn);
        let mut req = req;
        *req.uri_mut() = "/app/x".parse().unwrap();
        req.headers_mut().insert("host", "localhost".parse().unwrap());
        send.send_request(req).await?
    };
    let version = resp.version();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((version, String::from_utf8_lossy(&body).into_owned()))
}

#[tokio::test]
async fn the_tls_listener_serves_http1_and_h2_and_forwards_https() {
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    let gw = tls_gateway(&pki, "", "").await;
    for (alpn, version) in [(&b"http/1.1"[..], Version::HTTP_11), (&b"h2"[..], Version::HTTP_2)] {
        let tls = tls_connect(&pki, gw.addr, alpn, None).await.expect("handshake");
        let (got, body) = get_over(tls).await.expect("request over TLS");
        assert_eq!((got, body.as_str()), (version, "proto=https"));
    }
}

/// Tests that count `tls_handshake` rejections (the metrics are the
/// process's) run one at a time.
static HANDSHAKES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn with_client_ca_the_listener_wants_a_client_certificate() {
    let _serial = HANDSHAKES.lock().await;
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    pki.issue("client", &["someone"], false);
    let gw = tls_gateway(&pki, "client_ca = \"ca.pem\"", "").await;
    // TLS 1.3: the client learns of the refusal at its first read.
    let refused = match tls_connect(&pki, gw.addr, b"http/1.1", None).await {
        Err(_) => true,
        Ok(tls) => get_over(tls).await.is_err(),
    };
    assert!(refused, "a client without a certificate must not be served");
    let tls = tls_connect(&pki, gw.addr, b"http/1.1", Some("client")).await.expect("handshake with a certificate");
    assert_eq!(get_over(tls).await.unwrap().1, "proto=https");
}

#[tokio::test]
async fn silent_and_plaintext_clients_on_the_tls_listener_are_closed_and_counted() {
    let _serial = HANDSHAKES.lock().await;
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    let gw = tls_gateway(&pki, "", "header_read_timeout = \"300ms\"").await;
    let text = metrics_text_tls(&pki, &gw).await;
    let before = (rejected(&text, "", "header_timeout"), rejected(&text, "", "tls_handshake"));
    // A connect-and-close (a TCP health probe) tried no handshake.
    drop(TcpStream::connect(gw.addr).await.unwrap());
    tokio::time::sleep(Duration::from_millis(100)).await;
    let text = metrics_text_tls(&pki, &gw).await;
    assert_eq!(rejected(&text, "", "tls_handshake"), before.1, "a bare connect is no failed handshake");
    let mut silent = TcpStream::connect(gw.addr).await.unwrap();
    let r = read_for(&mut silent, Duration::from_secs(3)).await;
    assert!(r.closed, "a client that never starts its handshake is closed");
    let mut plain = TcpStream::connect(gw.addr).await.unwrap();
    plain.write_all(b"GET /app/x HTTP/1.1\r\nHost: h\r\n\r\n").await.unwrap();
    let r = read_for(&mut plain, Duration::from_secs(3)).await;
    assert!(r.closed && !r.text.contains("proto="), "plaintext is not served: {:?}", r.text);
    let text = metrics_text_tls(&pki, &gw).await;
    assert_eq!(rejected(&text, "", "header_timeout"), before.0 + 1.0);
    assert_eq!(rejected(&text, "", "tls_handshake"), before.1 + 1.0, "the plaintext client");
}

/// `/metrics` of a gateway whose only listener has TLS.
async fn metrics_text_tls(pki: &Pki, gw: &TestGateway) -> String {
    let tls = tls_connect(pki, gw.addr, b"http/1.1", None).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await.unwrap();
    tokio::spawn(conn);
    let req = Request::get("/metrics").header("host", "localhost").body(Empty::<Bytes>::new()).unwrap();
    let body = send.send_request(req).await.unwrap().into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(body.to_vec()).unwrap()
}

#[test]
fn tls_settings_are_checked_at_load() {
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    std::fs::write(pki.path("junk.pem"), "not a certificate").unwrap();
    let load = |toml: &str| {
        let source = Source::Inline { text: toml.to_owned(), base_dir: pki.dir.path().to_path_buf() };
        config::load(&source).err().map(|e| e.to_string()).unwrap_or_default()
    };
    let https = |keys: &str| upstream_toml("https://127.0.0.1:1", keys);
    let cases = [
        (
            upstream_toml("http://127.0.0.1:1", "tls_ca_file = \"ca.pem\""),
            "upstreams.app.tls_ca_file",
            "only applies to https://",
        ),
        (https("tls_ca_file = \"missing.pem\""), "upstreams.app.tls_ca_file", "cannot read"),
        (https("tls_ca_file = \"junk.pem\""), "upstreams.app.tls_ca_file", "holds no PEM certificate"),
        (https("tls_client_cert = \"server.pem\""), "upstreams.app.tls_client_key", "required with tls_client_cert"),
        (
            https("tls_client_cert = \"server.pem\"\ntls_client_key = \"ca.pem\""),
            "upstreams.app.tls_client_key",
            "private key",
        ),
        (https("tls_server_name = \"bad name!\""), "upstreams.app.tls_server_name", "not a DNS name"),
        ("[server.tls]\ncert = \"server.pem\"\n".to_owned(), "server.tls.key", "required"),
        (
            "[server.tls]\ncert = \"/dev/zero\"\nkey = \"server.key\"\n".to_owned(),
            "server.tls.cert",
            "not a regular file",
        ),
        (
            https("tls_client_cert = \"server.pem\"\ntls_client_key = \"nope.key\""),
            "upstreams.app.tls_client_key",
            "nope.key",
        ),
        ("[server.tls]\ncert = \"server.pem\"\nkey = \"nope.key\"\n".to_owned(), "server.tls.key", "nope.key"),
    ];
    for (toml, key, want) in &cases {
        let err = load(toml);
        assert!(err.contains(key) && err.contains(want), "want {key}: …{want}…, got {err:?}\n{toml}");
    }
}

#[tokio::test]
async fn a_reload_serves_a_renewed_listener_certificate() {
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    let gw = tls_gateway(&pki, "", "").await;
    let served =
        |tls: &tokio_rustls::client::TlsStream<TcpStream>| tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    let old = served(&tls_connect(&pki, gw.addr, b"http/1.1", None).await.unwrap());
    assert_eq!(old, pki.certs("server")[0]);
    pki.issue("server", &["localhost"], false);
    gw.app.reload().expect("reload");
    let new = served(&tls_connect(&pki, gw.addr, b"http/1.1", None).await.unwrap());
    assert_ne!(new, old, "a new connection must get the renewed certificate");
    assert_eq!(new, pki.certs("server")[0]);
}

#[tokio::test]
async fn a_pooled_tls_connection_closed_without_close_notify_is_resent_on_a_new_one() {
    let pki = Pki::new();
    pki.issue("server", &["127.0.0.1"], false);
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(pki.certs("server"), pki.key("server"))
        .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(server));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    // Answers one request per connection, then, when the next arrives,
    // drops the connection without close_notify (as a server whose
    // keep-alive timed out just then does).
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else { return };
                if read_head(&mut tls).await.is_none() {
                    return;
                }
                let mut buf = vec![0u8; 4096];
                let _ = tls.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
                let _ = tls.flush().await;
                let _ = tls.read(&mut buf).await;
                // Dropped: the TCP connection closes, no close_notify.
            });
        }
    });
    let toml = format!(
        "[server]\n[upstreams.stale]\nurl = \"https://{up}\"\ntls_ca_file = \"ca.pem\"\n\
         [[routes]]\nname = \"stale\"\nprefix = \"/app\"\nupstream = \"stale\"\n"
    );
    let gw = TestGateway::start(config(&toml, pki.dir.path())).await;
    for i in 0..4 {
        let (parts, body) = get(&gw.url("/app/x")).await;
        assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"ok"[..]), "request {i}");
    }
    let text = metrics_text(gw.addr).await;
    assert_eq!(sample(&text, "gateway_upstream_retries_total", &[("upstream", "stale")]), Some(3.0));
}

/// Log lines written by this test's thread (a current-thread runtime runs
/// the gateway's tasks on it too).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_health_check_failing_on_tls_says_why_in_the_log() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let pki = Pki::new();
    pki.issue("expired", &["127.0.0.1"], true);
    let (up, _) = tls_upstream(&pki, "expired", false).await;
    let health = "tls_ca_file = \"ca.pem\"\n[upstreams.app.health]\npath = \"/health\"\ninterval = \"100ms\"";
    let gw = TestGateway::start(config(&upstream_toml(&format!("https://{up}"), health), pki.dir.path())).await;
    let mut log = String::new();
    for _ in 0..50 {
        log = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
        if log.contains("endpoint unhealthy") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let line =
        log.lines().find(|l| l.contains("endpoint unhealthy")).unwrap_or_else(|| panic!("no unhealthy line: {log}"));
    assert!(line.contains("certificate expired"), "the line must say what failed: {line}");
    drop(gw);
}

/// A TLS acceptor with `stem`'s certificate that offers only `alpn`.
fn acceptor_offering(pki: &Pki, stem: &str, alpn: &[u8]) -> TlsAcceptor {
    let mut server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(pki.certs(stem), pki.key(stem))
        .unwrap();
    server.alpn_protocols = vec![alpn.to_vec()];
    TlsAcceptor::from(Arc::new(server))
}

/// An HTTPS upstream that offers `h2` by ALPN and speaks only HTTP/2;
/// answers with the version it got.
async fn h2_tls_upstream(pki: &Pki, stem: &str) -> SocketAddr {
    let acceptor = acceptor_offering(pki, stem, b"h2");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let svc = service_fn(|req: Request<Incoming>| async move {
                    Ok::<_, Infallible>(Response::new(full(format!("{:?} {}", req.version(), req.uri()))))
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn protocol_auto_speaks_what_alpn_chose() {
    let pki = Pki::new();
    pki.issue("server", &["127.0.0.1"], false);
    let h2 = h2_tls_upstream(&pki, "server").await;
    let (h1, seen) = tls_upstream(&pki, "server", false).await;
    let keys = "tls_ca_file = \"ca.pem\"\nprotocol = \"auto\"";
    let over_h2 = TestGateway::start(config(&upstream_toml(&format!("https://{h2}"), keys), pki.dir.path())).await;
    let (parts, body) = get(&over_h2.url("/app/x")).await;
    assert_eq!(parts.status, 200);
    assert_eq!(String::from_utf8_lossy(&body), format!("HTTP/2.0 https://{h2}/app/x"));
    let over_h1 = TestGateway::start(config(&upstream_toml(&format!("https://{h1}"), keys), pki.dir.path())).await;
    let (parts, body) = get(&over_h1.url("/app/y")).await;
    assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"tls ok"[..]), "no h2 offered: HTTP/1.1");
    assert_eq!(seen.lock().unwrap().requests.len(), 1);
}

/// An HTTPS upstream whose ALPN answer changes, as a backend's does during
/// a rolling upgrade: while `h2` is set, new connections are offered `h2`
/// only and served HTTP/2, else `http/1.1` only and served HTTP/1.1. Answers
/// with the version, target and Host it got. `cut` closes every open
/// connection (from the upstream's side). Says too how many lines of the
/// fields the gateway adds it got.
struct SwitchingUpstream {
    addr: SocketAddr,
    h2: Arc<std::sync::atomic::AtomicBool>,
    conns: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl SwitchingUpstream {
    async fn start(pki: &Pki, stem: &str) -> SwitchingUpstream {
        let (over_h2, over_h1) = (acceptor_offering(pki, stem, b"h2"), acceptor_offering(pki, stem, b"http/1.1"));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let h2 = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (flag, tasks) = (h2.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let h2 = flag.load(std::sync::atomic::Ordering::SeqCst);
                let acceptor = if h2 { over_h2.clone() } else { over_h1.clone() };
                let task = tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(stream).await else { return };
                    let svc = service_fn(|req: Request<Incoming>| async move {
                        let host = req.headers().get("host").map(|v| v.to_str().unwrap().to_owned());
                        // The lines of the fields the gateway adds: one each.
                        let added = ["x-forwarded-for", "x-forwarded-proto", "x-forwarded-host", "via"]
                            .into_iter()
                            .chain(["x-request-id", "traceparent"])
                            .map(|name| req.headers().get_all(name).iter().count())
                            .sum::<usize>();
                        let line = format!(
                            "{:?} {} host={} added={added}",
                            req.version(),
                            req.uri(),
                            host.unwrap_or_default()
                        );
                        Ok::<_, Infallible>(Response::new(full(line)))
                    });
                    let io = TokioIo::new(tls);
                    if h2 {
                        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                            .serve_connection(io, svc)
                            .await;
                    } else {
                        let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
                    }
                });
                tasks.lock().unwrap().push(task.abort_handle());
            }
        });
        SwitchingUpstream { addr, h2, conns }
    }

    /// From now on, new connections get `h2` (or `http/1.1`); the open ones
    /// are closed.
    async fn switch(&self, h2: bool) {
        self.h2.store(h2, std::sync::atomic::Ordering::SeqCst);
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
        // Until the gateway has seen the close.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// `auto` follows each new connection's ALPN: an upstream that stops
/// offering `h2` is spoken to in HTTP/1.1 on its next connection, and back.
#[tokio::test]
async fn protocol_auto_follows_an_upstream_whose_alpn_changes() {
    let pki = Pki::new();
    pki.issue("server", &["127.0.0.1"], false);
    let up = SwitchingUpstream::start(&pki, "server").await;
    // Health checks too: a probe that spoke HTTP/2 to an `http/1.1`
    // connection would fail, and the endpoint be taken out.
    let keys = "tls_ca_file = \"ca.pem\"\nprotocol = \"auto\"\n[upstreams.app.health]\npath = \"/health\"\n\
                interval = \"50ms\"\ntimeout = \"500ms\"\nunhealthy_after = 2\nhealthy_after = 1";
    let gw = TestGateway::start(config(&upstream_toml(&format!("https://{}", up.addr), keys), pki.dir.path())).await;
    let text = |(parts, body): (http::response::Parts, Bytes)| {
        (parts.status.as_u16(), String::from_utf8_lossy(&body).into_owned())
    };
    let at = up.addr;
    assert_eq!(text(get(&gw.url("/app/a")).await), (200, format!("HTTP/2.0 https://{at}/app/a host= added=6")));
    up.switch(false).await;
    for path in ["/app/b", "/app/c"] {
        assert_eq!(text(get(&gw.url(path)).await), (200, format!("HTTP/1.1 {path} host={at} added=6")), "{path}");
    }
    up.switch(true).await;
    assert_eq!(text(get(&gw.url("/app/d")).await), (200, format!("HTTP/2.0 https://{at}/app/d host= added=6")));
}

#[tokio::test]
async fn a_reload_does_not_turn_listener_tls_off() {
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    let path = pki.path("gateway.toml");
    let with_tls = "[server]\nlisten = \"127.0.0.1:0\"\n[server.tls]\ncert = \"server.pem\"\nkey = \"server.key\"\n";
    std::fs::write(&path, with_tls).unwrap();
    let mut c = config::load(&Source::File(path.clone())).unwrap();
    c.server.listen = "127.0.0.1:0".parse().unwrap();
    let gw = TestGateway::start(c).await;
    std::fs::write(&path, "[server]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let not_applied = gw.app.reload().unwrap();
    assert!(not_applied.iter().any(|s| s.starts_with("server.tls")), "{not_applied:?}");
    assert!(tls_connect(&pki, gw.addr, b"http/1.1", None).await.is_ok(), "still TLS until a restart");
}

/// A reload that reads the same certificate files keeps the `https://`
/// upstream as it is: its pool (no new handshake) and so its admission and
/// health state.
#[tokio::test]
async fn a_reload_of_unchanged_certificate_files_keeps_the_https_upstream() {
    let pki = Pki::new();
    pki.issue("server", &["127.0.0.1"], false);
    let (up, seen) = tls_upstream(&pki, "server", false).await;
    let toml = format!(
        "[server]\n[upstreams.tls_kept]\nurl = \"https://{up}\"\ntls_ca_file = \"ca.pem\"\n\
         [[routes]]\nname = \"tls_kept\"\nprefix = \"/app\"\nupstream = \"tls_kept\"\n"
    );
    let gw = TestGateway::start(config(&toml, pki.dir.path())).await;
    assert_eq!(get(&gw.url("/app/x")).await.0.status, 200);
    gw.app.reload().expect("reload");
    assert_eq!(get(&gw.url("/app/y")).await.0.status, 200);
    let text = metrics_text(gw.addr).await;
    let opened = sample(&text, "gateway_upstream_connections_opened_total", &[("upstream", "tls_kept")]);
    assert_eq!(opened, Some(1.0), "the reload rebuilt the upstream and its pool");
    assert_eq!(seen.lock().unwrap().handshakes.len(), 1);
}

/// A client that chose `h2` by ALPN must speak HTTP/2 (RFC 9113 §3.3,
/// RFC 7301 §3.2). An HTTP/1.1 request on such a connection was served
/// (hyper-util's `auto` connection looked at the bytes, not at ALPN); now
/// the connection fails, on either HTTP/2 server.
#[tokio::test]
async fn http1_after_alpn_chose_h2_is_not_served() {
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    for server in ["", "http2 = \"gateway\""] {
        let gw = tls_gateway(&pki, "", server).await;
        let mut tls = tls_connect(&pki, gw.addr, b"h2", None).await.expect("handshake");
        assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
        tls.write_all(b"GET /app/x HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tls.read_to_end(&mut out)).await;
        assert!(!out.starts_with(b"HTTP/1.1"), "{server:?}: {}", String::from_utf8_lossy(&out));
        // The same client offering http/1.1 is served.
        let tls = tls_connect(&pki, gw.addr, b"http/1.1", None).await.expect("handshake");
        assert_eq!(get_over(tls).await.expect("request").0, Version::HTTP_11, "{server:?}");
    }
}
