//! A request refused as malformed or too large is refused before the
//! route's rate limit and auth see it: it takes no token and asks no auth
//! service, and the client learns what is wrong with it (400, 413), not
//! that it is over its rate or lacks credentials. Its declared length is
//! checked after the route's address lists, though: a client they refuse
//! gets 403 and never learns the route's `max_body`.

mod common;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn raw(addr: std::net::SocketAddr, request: &str) -> u16 {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out).await;
    String::from_utf8_lossy(&out).get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0)
}

#[tokio::test]
async fn bad_requests_take_no_token_of_the_rate_limit() {
    let toml = "[[routes]]\nname = \"r\"\nprefix = \"/\"\nrespond = { status = 200 }\nmax_body = \"1KiB\"\n\
                rate_limit = { rate = \"1/m\", burst = 1, key = \"route\" }\n";
    let dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::start(config(toml, dir.path())).await;
    let bad = [
        ("GET http://other.example/ HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
        ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\nConnection: close\r\n\r\n", 413),
    ];
    for (request, status) in bad {
        assert_eq!(raw(gw.addr, request).await, status, "{request:?}");
    }
    let good = "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(gw.addr, good).await, 200, "the one token is still there");
    assert_eq!(raw(gw.addr, good).await, 429);
}

/// A client the route's address lists refuse gets 403 whatever its body's
/// declared length: a 413 would tell it the route's `max_body`. A
/// malformed request is still 400 (that says nothing of the route), and a
/// client the lists admit still gets its 413 before the route's
/// credentials are asked for.
#[tokio::test]
async fn a_denied_client_gets_403_not_the_body_limit() {
    let route = |name: &str, keys: &str| {
        format!(
            "[[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nrespond = {{ status = 200 }}\nmax_body = \"1KiB\"\n{keys}\n"
        )
    };
    let dir = tempfile::tempdir().unwrap();
    // `openssl passwd -5 -salt saltsalt pw-sue`.
    let user = "sue:$5$saltsalt$8bjjZ1/oNJbjiGc16HnqjXfT8RpsPqBD8PEOSVduwU6\n";
    std::fs::write(dir.path().join("users.htpasswd"), user).unwrap();
    let toml = [
        route("denied", "deny = [\"127.0.0.1\"]"),
        route("outside", "allow = [\"10.0.0.0/8\"]"),
        route("inside", "allow = [\"127.0.0.0/8\"]\nauth = { basic = { htpasswd = \"users.htpasswd\" } }"),
    ]
    .concat();
    let gw = TestGateway::start(config(&toml, dir.path())).await;
    let post = |path: &str, length: u32| {
        format!("POST /{path} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n")
    };
    let cases = [
        (post("denied", 5000), 403),
        (post("denied", 10), 403),
        (post("outside", 5000), 403),
        (post("outside", u32::MAX), 403),
        ("GET /denied HTTP/1.1\r\nConnection: close\r\n\r\n".to_owned(), 400),
        (post("inside", 5000), 413),
        (post("inside", 10), 401),
    ];
    for (request, status) in cases {
        assert_eq!(raw(gw.addr, &request).await, status, "{request:?}");
    }
}
