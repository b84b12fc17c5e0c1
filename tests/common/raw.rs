//! Raw exchanges with a gateway over a plain socket: what comes back,
//! read for a while, as whole responses, or until the gateway closes.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What a raw exchange returned: the bytes, and whether the server closed.
pub struct Raw {
    pub text: String,
    pub closed: bool,
}

impl Raw {
    pub fn status(&self) -> u16 {
        self.text.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0)
    }
}

/// Writes `bytes`, then reads until the server closes or `wait` passes.
pub async fn raw(addr: SocketAddr, bytes: &[u8], wait: Duration) -> Raw {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    read_for(&mut s, wait).await
}

pub async fn read_for(s: &mut TcpStream, wait: Duration) -> Raw {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + wait;
    let closed = loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => break false,
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    };
    Raw { text: String::from_utf8_lossy(&out).into_owned(), closed }
}

/// Reads one whole response to a request that is not `HEAD` (its head
/// and a `Content-Length` or chunked body; a 1xx is read as part of it)
/// from a connection kept open, for up to ten seconds, or until the
/// gateway closes. Unlike [`read_for`] with a short wait, it does not
/// cut an answer that a loaded machine is late with.
pub async fn one_response(s: &mut TcpStream) -> Raw {
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if whole_response(&out) {
            return Raw { text: String::from_utf8_lossy(&out).into_owned(), closed: false };
        }
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => panic!("no whole response in 10 s: {:?}", String::from_utf8_lossy(&out)),
            Ok(Ok(0)) | Ok(Err(_)) => return Raw { text: String::from_utf8_lossy(&out).into_owned(), closed: true },
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Whether `got` holds a final response whole (see [`one_response`]).
fn whole_response(mut got: &[u8]) -> bool {
    loop {
        let mut fields = [httparse::EMPTY_HEADER; 64];
        let mut head = httparse::Response::new(&mut fields);
        let Ok(httparse::Status::Complete(end)) = head.parse(got) else { return false };
        let code = head.code.unwrap_or(0);
        let field = |name: &str| {
            head.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).map(|h| String::from_utf8_lossy(h.value))
        };
        let chunked = field("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let length = field("content-length").and_then(|v| v.trim().parse::<usize>().ok());
        let body = &got[end..];
        match code {
            100..=199 if code != 101 => got = body,
            204 | 304 | 101 => return true,
            _ if chunked => return body.windows(5).any(|w| w == b"0\r\n\r\n"),
            _ => return body.len() >= length.unwrap_or(0),
        }
    }
}

/// Reads `n` responses with `Content-Length` (none for a HEAD, as listed
/// in `heads`) from `s`; their raw heads and bodies.
pub async fn read_responses(s: &mut TcpStream, heads: &[bool]) -> Vec<(String, Vec<u8>)> {
    let mut got = Vec::new();
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    for is_head in heads {
        let (head, length) = loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&got[..end + 4]).into_owned();
                got.drain(..end + 4);
                let length = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned))
                    .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                break (head, if *is_head { 0 } else { length });
            }
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early; responses so far: {out:?}");
            got.extend_from_slice(&buf[..n]);
        };
        while got.len() < length {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed in a body");
            got.extend_from_slice(&buf[..n]);
        }
        let body: Vec<u8> = got.drain(..length).collect();
        out.push((head, body));
    }
    out
}

/// Waits until `s` is closed by the gateway (EOF or reset), up to `within`;
/// returns how long that took, or `None` if it stayed open.
pub async fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let started = std::time::Instant::now();
    let mut buf = [0u8; 65536];
    loop {
        let left = within.checked_sub(started.elapsed())?;
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
        }
    }
}
