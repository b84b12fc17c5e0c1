//! A request refused as malformed or too large is refused before the
//! route's rate limit and auth see it: it takes no token and asks no auth
//! service, and the client learns what is wrong with it (400, 413), not
//! that it is over its rate or lacks credentials.

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
