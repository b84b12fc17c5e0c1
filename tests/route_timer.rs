//! A route's deadline on one keep-alive connection, whose timer the
//! gateway keeps from one request to the next (src/timer.rs): each request
//! gets its own route's full timeout, whether the timer kept was set later
//! (a longer route before), fired while the connection idled, or was
//! dropped when the connection parked.

mod common;

use std::time::{Duration, Instant};

use common::{TestGateway, TestUpstream, bounded, full, read_responses};
use http::Response;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const SHORT: Duration = Duration::from_millis(400);
const LONG: Duration = Duration::from_secs(3);

/// An upstream that answers `/…/fast` at once and `/…/slow` after 10 s,
/// behind `/t` (timeout `SHORT`) and `/u` (`LONG`).
async fn gateway(park_after: &str) -> TestGateway {
    let up = TestUpstream::start(|req| async move {
        if req.uri().path().ends_with("slow") {
            tokio::time::sleep(Duration::from_secs(10)).await;
        }
        Response::new(full("ok"))
    })
    .await;
    let addr = up.addr;
    std::mem::forget(up);
    TestGateway::from_toml(&format!(
        "[server]\npark_after = \"{park_after}\"\n[upstreams.up]\nurl = \"http://{addr}\"\n\
         [[routes]]\nname = \"t\"\nprefix = \"/t\"\nupstream = \"up\"\ntimeout = \"400ms\"\n\
         [[routes]]\nname = \"u\"\nprefix = \"/u\"\nupstream = \"up\"\ntimeout = \"3s\"\n"
    ))
    .await
}

/// One request on `s`: its status and how long its answer took.
async fn status(s: &mut TcpStream, path: &str) -> (String, Duration) {
    let started = Instant::now();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes()).await.unwrap();
    // Boxed: its 64 KiB buffer, moved about in a debug build's frames,
    // overflowed the test thread's stack.
    let (head, _) = bounded(Box::pin(read_responses(s, &[false]))).await.remove(0);
    (head.split(' ').nth(1).unwrap().to_owned(), started.elapsed())
}

async fn a_route_deadline_is_its_own_on_a_kept_connection(park_after: &str) {
    let gw = gateway(park_after).await;
    let mut s = TcpStream::connect(gw.addr).await.unwrap();
    assert_eq!(status(&mut s, "/t/fast").await.0, "200");
    let (code, took) = status(&mut s, "/t/slow").await;
    assert_eq!(code, "504");
    assert!(took >= SHORT, "timed out after {took:?}, before the route's {SHORT:?}");
    // The timer was set to a later deadline by `/u`: `/t`'s comes first.
    assert_eq!(status(&mut s, "/u/fast").await.0, "200");
    let (code, took) = status(&mut s, "/t/slow").await;
    assert_eq!(code, "504");
    assert!(took >= SHORT && took < LONG - Duration::from_millis(500), "timed out after {took:?}");
    // Idle past the route's timeout: the kept timer fired meanwhile (or
    // was dropped at the park), and times the next request from its start.
    tokio::time::sleep(SHORT + Duration::from_millis(300)).await;
    let (code, took) = status(&mut s, "/t/slow").await;
    assert_eq!(code, "504");
    assert!(took >= SHORT, "timed out after {took:?}, before the route's {SHORT:?}");
    assert_eq!(status(&mut s, "/t/fast").await.0, "200");
}

#[tokio::test]
async fn on_a_connection_that_never_parks() {
    a_route_deadline_is_its_own_on_a_kept_connection("0s").await;
}

#[tokio::test]
async fn on_a_connection_that_parks_between_requests() {
    a_route_deadline_is_its_own_on_a_kept_connection("100ms").await;
}
