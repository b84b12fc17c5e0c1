//! Helpers for tests that run the gateway binary as a process: a free
//! address (outside the kernel's ephemeral range), waiting until one
//! accepts, a plain HTTP/1.1 GET, and a child killed on drop. Included by
//! path (`#[path = "common/process.rs"]`) by tests that need none of the
//! in-process helpers, and as `common::process` by those that do.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Child;
use std::time::{Duration, Instant};

/// A loopback address free a moment ago, on a [`free_port`].
pub fn free_addr() -> String {
    format!("127.0.0.1:{}", free_port())
}

/// A loopback port free a moment ago, for a process started next to listen
/// on. Chosen below the kernel's ephemeral range (`ip_local_port_range`,
/// from 32768 by default): the kernel hands ports of that range to `:0`
/// listeners and to outgoing connections as their own, so one probed there
/// and given to a child could be taken by another test's connection before
/// the child binds it. Below the range, only another test that picked the
/// same port at random can take it. Where the range starts too low for
/// that, a port the kernel chooses.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    const LOW: u16 = 12000;
    // The documentation's examples use 28000-28099; kept clear of them.
    let high = ephemeral_start().unwrap_or(32768).min(28000);
    if high < LOW + 1000 {
        return TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    }
    for _ in 0..1000 {
        let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
        let port = LOW + (random % u64::from(high - LOW)) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {LOW}..{high}");
}

/// The first port of the kernel's ephemeral range.
fn ephemeral_start() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    range.split_whitespace().next()?.parse().ok()
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
