//! A Redis outage as the operator sees it in the gateway binary's log: one
//! WARN when `[rate_limit_store]` starts failing and one INFO when it
//! answers again, however many requests `on_error` decided meanwhile; the
//! next outage logs again. Redis refusing (killed) and hanging (SIGSTOP).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis_server::Redis;
use common::*;

const FAILED: &str = "rate limit store failed";
const ANSWERS: &str = "rate limit store answers again";

/// The gateway binary, its stderr collected line by line; SIGTERM on drop.
struct Gateway {
    child: Child,
    addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Gateway {
    /// A gateway on a free port whose one route `name` answers 200 under a
    /// rate limit shared through the Redis at `url`; `on_error = "deny"`:
    /// a 429 says on_error decided, a 200 that Redis did.
    fn shared(dir: &std::path::Path, name: &str, url: &str) -> Gateway {
        let addr = common::process::free_addr();
        let toml = format!(
            "[server]\nlisten = \"{addr}\"\n[[routes]]\nname = \"{name}\"\nprefix = \"/\"\n\
             respond = {{ status = 200 }}\n\
             rate_limit = {{ rate = \"1000/s\", burst = 1000, key = \"route\", shared = \"redis\" }}\n\
             [rate_limit_store]\nurl = \"{url}\"\ntimeout = \"200ms\"\non_error = \"deny\"\n"
        );
        Gateway::start(dir, &toml, addr)
    }

    fn start(dir: &std::path::Path, toml: &str, addr: String) -> Gateway {
        let path = dir.join("gateway.toml");
        std::fs::write(&path, toml).unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_gateway"))
            .args(["--config", path.to_str().unwrap()])
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let (stderr, lines) = (child.stderr.take().unwrap(), log.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let gw = Gateway { child, addr, log };
        assert!(process_status_becomes(&gw.addr, "/healthz", 200), "the gateway came up:\n{}", gw.log());
        gw
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn lines_with(&self, needle: &str) -> usize {
        self.log.lock().unwrap().iter().filter(|l| l.contains(needle)).count()
    }

    /// Waits (up to 2 s: stderr is read on a thread) for `n` lines with
    /// `needle`, then a little longer for any more; how many there were.
    fn settled_count(&self, needle: &str, n: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.lines_with(needle) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
        self.lines_with(needle)
    }

    /// `n` requests from 10 threads at once: their statuses.
    fn burst(&self, n: usize) -> Vec<u16> {
        let per_thread = n / 10;
        std::thread::scope(|s| {
            let threads: Vec<_> = (0..10)
                .map(|_| s.spawn(|| (0..per_thread).map(|_| process_status(&self.addr, "/")).collect::<Vec<_>>()))
                .collect();
            threads.into_iter().flat_map(|t| t.join().unwrap()).map(|s| s.unwrap_or(0)).collect()
        })
    }

    /// Requests until one is allowed (Redis decides again), for up to 5 s.
    fn until_allowed(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if process_status(&self.addr, "/") == Some(200) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    fn metrics(&self) -> String {
        let mut s = TcpStream::connect(&self.addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

#[test]
fn a_redis_outage_is_logged_once_each_way_not_per_request() {
    let Some(mut redis) = Redis::start() else { return };
    redis.kill();
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::shared(dir.path(), "rl_outage", &redis.url());

    // Refused: nothing listens on Redis's port.
    assert_eq!(gw.burst(50), [429; 50], "on_error = \"deny\" decides while Redis refuses");
    std::thread::sleep(Duration::from_secs(1)); // four failed probes
    assert_eq!(gw.settled_count(FAILED, 1), 1, "one WARN for 50 requests:\n{}", gw.log());
    assert_eq!(gw.lines_with(ANSWERS), 0, "failed probes say nothing:\n{}", gw.log());

    redis.spawn();
    assert!(gw.until_allowed(), "decisions by Redis resume:\n{}", gw.log());
    assert_eq!(gw.burst(50), [200; 50], "Redis decides every request again");
    assert_eq!(gw.settled_count(ANSWERS, 1), 1, "one INFO when it answers again:\n{}", gw.log());
    assert_eq!(gw.lines_with(FAILED), 1, "{}", gw.log());
    let m = gw.metrics();
    let by_redis = sample(
        &m,
        "gateway_rate_limit_decisions_total",
        &[("route", "rl_outage"), ("store", "redis"), ("result", "allowed")],
    );
    assert!(by_redis >= Some(51.0), "decided by Redis: {by_redis:?}");

    // Hanging: 50 requests meet the timeout together, or find the store down.
    redis.signal("-STOP");
    assert_eq!(gw.burst(50), [429; 50], "on_error decides while Redis hangs");
    assert_eq!(gw.settled_count(FAILED, 2), 2, "the second outage: one more WARN:\n{}", gw.log());
    redis.signal("-CONT");
    assert!(gw.until_allowed(), "decisions by Redis resume after SIGCONT:\n{}", gw.log());
    assert_eq!(gw.settled_count(ANSWERS, 2), 2, "and one more INFO:\n{}", gw.log());
    assert_eq!(gw.lines_with(FAILED), 2, "{}", gw.log());
}

/// A Redis that answers PING but refuses the script (here a read-only
/// replica: `READONLY`; `maxmemory` or an ACL do the same): one WARN that
/// names Redis's error code, and no INFO until the script decides again,
/// however many probes run meanwhile.
#[test]
fn a_redis_that_answers_ping_but_refuses_the_script_is_down_until_it_decides() {
    let Some(redis) = Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::shared(dir.path(), "rl_readonly", &redis.url());
    assert_eq!(gw.burst(10), [200; 10], "Redis decides");

    redis.cmd(&["REPLICAOF", "127.0.0.1", "1"]).expect("a replica of nothing");
    assert_eq!(gw.burst(50), [429; 50], "on_error decides while the script is refused");
    std::thread::sleep(Duration::from_secs(2)); // eight probes
    assert_eq!(gw.burst(50), [429; 50], "still down: PING answers, the script does not");
    assert_eq!(gw.settled_count(FAILED, 1), 1, "one WARN:\n{}", gw.log());
    assert_eq!(gw.lines_with(ANSWERS), 0, "no INFO while the script is refused:\n{}", gw.log());
    let warn = gw.log.lock().unwrap().iter().find(|l| l.contains(FAILED)).cloned().unwrap();
    assert!(warn.contains("READONLY"), "the WARN names Redis's error: {warn}");

    redis.cmd(&["REPLICAOF", "NO", "ONE"]).expect("a primary again");
    assert!(gw.until_allowed(), "decisions by Redis resume:\n{}", gw.log());
    assert_eq!(gw.settled_count(ANSWERS, 1), 1, "one INFO when it decides again:\n{}", gw.log());
    assert_eq!(gw.lines_with(FAILED), 1, "{}", gw.log());
}

/// The store connects and loads its script at start: the first request
/// finds both done rather than paying for them within its `timeout`.
#[test]
fn the_store_is_ready_before_the_first_request() {
    let Some(redis) = Redis::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let scripts = || {
        let info = match redis.cmd(&["INFO", "memory"])? {
            redis::Value::BulkString(b) => String::from_utf8_lossy(&b).into_owned(),
            redis::Value::VerbatimString { text, .. } => text,
            _ => return None,
        };
        info.lines().find_map(|l| l.strip_prefix("number_of_cached_scripts:")?.trim().parse::<u32>().ok())
    };
    assert_eq!(scripts(), Some(0), "no script before the gateway starts");
    let _gw = Gateway::shared(dir.path(), "rl_warm", &redis.url());
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while scripts() != Some(1) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(scripts(), Some(1), "the script loaded with no request sent");
}
