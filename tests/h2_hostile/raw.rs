//! Raw HTTP/2 frames as a hostile client writes them (no client library
//! would send most of these), and what became of them.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::common::TestGateway;

/// An HPACK field, literal without indexing, its name new (RFC 7541
/// §6.2.2): any bytes at all, as a hostile client sends them.
pub fn field(out: &mut Vec<u8>, name: &str, value: &str) {
    assert!(name.len() < 127 && value.len() < 127);
    out.push(0);
    out.push(name.len() as u8);
    out.extend_from_slice(name.as_bytes());
    out.push(value.len() as u8);
    out.extend_from_slice(value.as_bytes());
}

pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    f.extend_from_slice(&[kind, flags]);
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

pub const DATA: u8 = 0;
pub const HEADERS: u8 = 1;
pub const RST_STREAM: u8 = 3;
pub const SETTINGS: u8 = 4;
pub const GOAWAY: u8 = 7;
pub const END_STREAM: u8 = 1;
pub const END_HEADERS: u8 = 4;

/// What the server did with stream 1.
#[derive(Debug, PartialEq)]
pub enum Outcome {
    /// A final answer's head, by its status's HPACK bytes.
    Answered(Vec<u8>),
    Reset(u32),
    GoAway(u32),
    Nothing,
}

/// A request's fields on stream 1 (the pseudo-fields among them), then
/// `more` frames; what became of the stream.
pub async fn raw_exchange(gw: &TestGateway, fields: &[(&str, &str)], end: bool, more: &[Vec<u8>]) -> Outcome {
    let mut block = Vec::new();
    for (n, v) in fields {
        field(&mut block, n, v);
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(frame(HEADERS, END_HEADERS | if end { END_STREAM } else { 0 }, 1, &block));
    for f in more {
        out.extend_from_slice(f);
    }
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    s.write_all(&out).await.unwrap();
    let read = async {
        loop {
            let mut head = [0u8; 9];
            if s.read_exact(&mut head).await.is_err() {
                return Outcome::Nothing;
            }
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            if s.read_exact(&mut payload).await.is_err() {
                return Outcome::Nothing;
            }
            let code = |at: usize| u32::from_be_bytes(payload[at..at + 4].try_into().unwrap());
            match (head[3], stream) {
                (SETTINGS, 0) if head[4] & 1 == 0 => s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap(),
                (HEADERS, 1) => {
                    let status = match payload[0] {
                        b if b & 0x80 != 0 => vec![b],
                        _ => payload[..2 + usize::from(payload[1] & 0x7f)].to_vec(),
                    };
                    return Outcome::Answered(status);
                }
                (RST_STREAM, 1) => return Outcome::Reset(code(0)),
                (GOAWAY, 0) if code(4) != 0 => return Outcome::GoAway(code(4)),
                _ => {}
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(3), read).await.unwrap_or(Outcome::Nothing)
}

pub const PING: u8 = 6;
pub const CONTINUATION: u8 = 9;

/// Writes the preface and `frames` while reading what comes back; the
/// code of the connection error the server sent (`None`: none, the
/// connection left open or closed without one).
pub async fn flood(gw: &TestGateway, frames: Vec<u8>) -> Option<u32> {
    let (mut rx, mut tx) = TcpStream::connect(gw.addr).await.unwrap().into_split();
    tokio::spawn(async move {
        let _ = tx.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        let _ = tx.write_all(&frame(SETTINGS, 0, 0, &[])).await;
        let _ = tx.write_all(&frames).await;
        // Held open: the server decides when it ends.
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let read = async {
        loop {
            let mut head = [0u8; 9];
            rx.read_exact(&mut head).await.ok()?;
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            rx.read_exact(&mut payload).await.ok()?;
            if head[3] == GOAWAY && len >= 8 {
                let code = u32::from_be_bytes(payload[4..8].try_into().unwrap());
                if code != 0 {
                    return Some(code);
                }
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(3), read).await.ok().flatten()
}

pub fn get_block() -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in [(":method", "GET"), (":scheme", "http"), (":path", "/d/x"), (":authority", "a")] {
        field(&mut block, n, v);
    }
    block
}
