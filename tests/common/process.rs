//! Helpers for tests that run the gateway binary as a process: a free
//! address, waiting until one accepts, a plain HTTP/1.1 GET, and a child
//! killed on drop. Included by path (`#[path = "common/process.rs"]`), so
//! that these tests need none of the in-process helpers.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

/// A loopback address free a moment ago.
pub fn free_addr() -> String {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string()
}

/// Waits (10 s at most) until `addr` accepts a connection.
pub fn wait_for(addr: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "{addr} never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A GET of `path` on a new connection to `addr`: the whole answer, head
/// and body, once the server closes.
pub fn http_get(addr: &str, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// A child process, killed on drop if the test did not stop it (a failed
/// assertion leaves nothing running).
pub struct Running(pub Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
