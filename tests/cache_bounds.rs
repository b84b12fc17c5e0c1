//! The cache's memory against hostile clients (issue 37): what a stored
//! entry keeps of the request that filled it, and what a client that never
//! reads its answer holds, counted on this test binary's heap (the gateway
//! runs in it).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use common::cached::*;
use common::counting::{Counting, LIVE, heap_growth};
use common::*;
use tokio::io::AsyncWriteExt;

#[global_allocator]
static ALLOC: Counting = Counting;

/// The tests read one heap: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A field value of about 52 KB: distinct comma-separated items, each an
/// unknown directive to a `Cache-Control` parser.
fn items(prefix: &str) -> String {
    let mut v = String::new();
    let mut i = 0;
    while v.len() < 52_000 {
        if i > 0 {
            v.push(',');
        }
        v.push_str(&format!("{prefix}{i}"));
        i += 1;
    }
    v
}

/// 120 misses, each with a 52 KB request field, on one connection: what
/// the gateway still holds after them, in bytes.
async fn held_after_flood(gw: &TestGateway, route: &str, field: &str, value: &str) -> isize {
    heap_growth(&gw.url(&format!("/{route}/")), Some((field, value)), 10, 120).await
}

/// `max_size` bounds what the entries hold: each entry kept the filling
/// request's `Cache-Control`, `Pragma` and `Authorization` (and a parsed
/// map of its directives) in its policy, which the store's weight did not
/// count. 120 misses with 52 KB of unknown request directives grew a
/// 128 KiB store by about 100 MiB (the store is 512 KiB now); of `Pragma` or `Authorization` (on
/// `public` answers), by about 6 MiB.
#[tokio::test]
async fn large_request_fields_are_not_kept_with_the_entries() {
    let _one = SERIAL.lock().await;
    let floods = [
        ("cc", "cache-control", items("x-unknown-")),
        ("pragma", "pragma", items("p")),
        ("auth", "authorization", format!("Bearer {}", "t".repeat(52_000))),
    ];
    let (mut held_by, mut failed) = (Vec::new(), false);
    for (route, field, value) in floods {
        let (gw, seen_) = cached_as(
            route,
            // Room for every entry (each weighs about 2 KiB with what its
            // fields cost, see `Entry::weight`): the last must be a hit.
            "max_size = \"512KiB\", max_entry = \"16KiB\"",
            fixed(200, &[("cache-control", "public, max-age=600")]),
        )
        .await;
        let held = held_after_flood(&gw, route, field, &value).await;
        assert_eq!(seen(&seen_), 130, "{field}: every request a miss");
        // Stored: the answers are cacheable whatever the request said.
        let (parts, _) = get_with(&gw.url(&format!("/{route}/119")), &[]).await;
        assert!(cache_status(&parts).contains("hit"), "{field}: {}", cache_status(&parts));
        let bytes = sample(&metrics_text(gw.addr).await, "gateway_cache_bytes", &[("cache", route)]);
        assert!(bytes.is_some_and(|b| b <= 524_288.0), "{field}: store weighs {bytes:?}");
        held_by.push(format!("{field}: {} KiB", held >> 10));
        eprintln!("{field} flood: {} KiB held", held >> 10);
        failed |= held >= 2 << 20;
    }
    assert!(!failed, "a 512 KiB store holds more: {held_by:?}");
}

/// Opens a connection whose receive buffer is small, asks for `path` and
/// never reads: what it is sent stays with the gateway.
async fn idle_reader(addr: std::net::SocketAddr, path: &str) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\n\r\n").as_bytes()).await.unwrap();
    s
}

/// A storable answer streamed to its first client through an unbounded
/// channel, whatever that client's pace: 40 clients that never read their
/// distinct 900 KB answers held about 36 MB (a copy of every answer) past
/// `max_size`. The first client of a fill is held back as on the uncached
/// path; the fill goes on for the store within `max_entry`.
#[tokio::test]
async fn a_fill_does_not_buffer_for_a_client_that_never_reads() {
    let _one = SERIAL.lock().await;
    let big = Bytes::from(vec![b'x'; 900_000]);
    let (gw, seen_) = cached_as("idle", "max_size = \"2MiB\", max_entry = \"1MiB\"", move |_| {
        std::future::ready(answer(200, &[("cache-control", "max-age=600")], big.clone()))
    })
    .await;
    // Warm up (buffers, pools) with one reader.
    for i in 0..3 {
        let (_, body) = get(&gw.url(&format!("/idle/warm{i}"))).await;
        assert_eq!(body.len(), 900_000);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = LIVE.load(Ordering::Relaxed);
    let mut idle = Vec::new();
    for i in 0..40 {
        idle.push(idle_reader(gw.addr, &format!("/idle/{i}")).await);
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let held = LIVE.load(Ordering::Relaxed) - before;
    eprintln!("40 idle readers hold {} KiB", held >> 10);
    assert_eq!(seen(&seen_), 43);
    assert!(held < 16 << 20, "40 idle readers hold {} KiB", held >> 10);
    // A reader still gets each answer whole, stored or not.
    let (parts, body) = get(&gw.url("/idle/39")).await;
    assert_eq!((parts.status.as_u16(), body.len()), (200, 900_000), "{}", cache_status(&parts));
    drop(idle);
}

/// What a full store holds on the heap is about its `max_size`: entries
/// were weighed by their fields' and body's bytes alone, and 1,000 small
/// answers (seven fields each) into a 256 KiB store held 2.8 times that
/// on the heap (and a release build's memory, measured from outside, 2.7).
#[tokio::test]
async fn a_full_store_holds_about_its_max_size() {
    let _one = SERIAL.lock().await;
    let (gw, _) = cached_as(
        "full",
        "max_size = \"256KiB\", max_entry = \"16KiB\"",
        fixed(200, &[("cache-control", "max-age=600"), ("x-a", "1"), ("x-b", "2"), ("x-c", "3")]),
    )
    .await;
    let held = heap_growth(&gw.url("/full/"), None, 10, 1000).await;
    let bytes = sample(&metrics_text(gw.addr).await, "gateway_cache_bytes", &[("cache", "full")]);
    eprintln!("held {} KiB, the store weighs {bytes:?}", held >> 10);
    assert!(bytes.is_some_and(|b| b > 200_000.0), "the store is full: {bytes:?}");
    // 334 KiB now (the heap of moka's own tables and the connection's
    // count too), 726 before.
    assert!(held < 384 << 10, "a 256 KiB store holds {} KiB", held >> 10);
}
