//! A route's `mirror` (docs/routing.md#shadow-traffic), end to end: copies
//! marked and carrying the request ID, bounded in flight, bodies skipped,
//! and the client's answer untouched by a shadow that hangs, fails or is
//! slow.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::{TestGateway, counting_upstream, full, metrics_text, raw_upstream, read_head, sample, send};
use http::Request;
use tokio::io::AsyncWriteExt;

/// How a shadow upstream treats each copy.
#[derive(Clone, Copy)]
enum Shadow {
    /// Reads the head and never answers.
    Hangs,
    /// Reads the head and closes without a word.
    Fails,
    /// Answers 200 after a pause.
    Slow,
}

/// A shadow upstream that keeps every request head it reads.
async fn shadow(how: Shadow) -> (std::net::SocketAddr, Arc<Mutex<Vec<String>>>) {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let seen = heads.clone();
    let addr = raw_upstream(move |mut s| {
        let seen = seen.clone();
        async move {
            while let Some(head) = read_head(&mut s).await {
                seen.lock().unwrap().push(String::from_utf8_lossy(&head).to_ascii_lowercase());
                match how {
                    Shadow::Hangs => tokio::time::sleep(Duration::from_secs(3600)).await,
                    Shadow::Fails => return,
                    Shadow::Slow => {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nno").await;
                    }
                }
            }
        }
    })
    .await;
    (addr, heads)
}

/// A route `name` on `/api` to `main`, mirrored to `shadow` (metrics are
/// the process's: each test has a route name of its own).
fn mirrored_toml(name: &str, main: std::net::SocketAddr, shadow: std::net::SocketAddr, percent: u32) -> String {
    format!(
        "[upstreams.main]\nurl = \"http://{main}\"\n[upstreams.shadow]\nurl = \"http://{shadow}\"\n\
         [[routes]]\nname = \"{name}\"\nprefix = \"/api\"\nupstream = \"main\"\ntimeout = \"20s\"\n\
         mirror = {{ upstream = \"shadow\", percent = {percent} }}\n"
    )
}

fn mirror_count(text: &str, route: &str, result: &str) -> f64 {
    sample(text, "gateway_mirror_total", &[("route", route), ("result", result)]).unwrap_or(0.0)
}

#[tokio::test]
async fn the_client_answer_is_untouched_whatever_the_shadow_does() {
    for how in [Shadow::Hangs, Shadow::Fails, Shadow::Slow] {
        let (main, seen) = counting_upstream().await;
        let (shadow_addr, heads) = shadow(how).await;
        let gw = TestGateway::from_toml(&mirrored_toml("untouched", main.addr, shadow_addr, 100)).await;
        for i in 0..20 {
            let req = Request::get(gw.url(&format!("/api/x?i={i}"))).body(full(Bytes::new())).unwrap();
            let (parts, body) = common::bounded(send(req)).await;
            assert_eq!((parts.status.as_u16(), &body[..]), (200, &b"ok"[..]), "the main upstream's answer");
            assert!(parts.headers.get("x-gateway-mirror").is_none());
        }
        assert_eq!(common::cached::seen(&seen), 20);
        // The copies arrive on their own time.
        for _ in 0..100 {
            if heads.lock().unwrap().len() >= 20 || matches!(how, Shadow::Fails) && !heads.lock().unwrap().is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let heads = heads.lock().unwrap().clone();
        assert!(!heads.is_empty(), "copies reach the shadow");
        for head in &heads {
            assert!(head.starts_with("get /api/x?i="), "{head}");
            assert!(head.contains("x-gateway-mirror: 1\r\n"), "{head}");
            assert!(head.contains("x-request-id: "), "{head}");
        }
    }
}

#[tokio::test]
async fn copies_carry_the_clients_request_id_and_skip_bodies() {
    let (main, _) = counting_upstream().await;
    let (shadow_addr, heads) = shadow(Shadow::Slow).await;
    let gw = TestGateway::from_toml(&mirrored_toml("ids", main.addr, shadow_addr, 100)).await;
    let req = Request::get(gw.url("/api/id")).header("x-request-id", "mirror-test-1").body(full(Bytes::new())).unwrap();
    assert_eq!(send(req).await.0.status, 200);
    let req = Request::post(gw.url("/api/body")).body(full("a body")).unwrap();
    assert_eq!(send(req).await.0.status, 200);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(heads[0].contains("x-request-id: mirror-test-1\r\n"), "{}", heads[0]);
    let text = metrics_text(gw.addr).await;
    assert_eq!(mirror_count(&text, "ids", "skipped_body"), 1.0);
    assert_eq!(mirror_count(&text, "ids", "sent"), 1.0);
    assert_eq!(mirror_count(&text, "ids", "answered"), 1.0);
}

#[tokio::test]
async fn copies_in_flight_are_bounded_and_the_rest_skipped() {
    let (main, _) = counting_upstream().await;
    let (shadow_addr, heads) = shadow(Shadow::Hangs).await;
    let gw = TestGateway::from_toml(&mirrored_toml("bounded", main.addr, shadow_addr, 100)).await;
    for _ in 0..150 {
        let req = Request::get(gw.url("/api/x")).body(full(Bytes::new())).unwrap();
        assert_eq!(common::bounded(send(req)).await.0.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = metrics_text(gw.addr).await;
    assert_eq!(mirror_count(&text, "bounded", "sent"), 100.0, "{text}");
    assert_eq!(mirror_count(&text, "bounded", "skipped_in_flight"), 50.0);
    assert!(heads.lock().unwrap().len() <= 100);
}

#[tokio::test]
async fn a_percent_copies_about_that_share() {
    let (main, _) = counting_upstream().await;
    let (shadow_addr, _) = shadow(Shadow::Slow).await;
    let gw = TestGateway::from_toml(&mirrored_toml("share", main.addr, shadow_addr, 10)).await;
    for _ in 0..1000 {
        let req = Request::get(gw.url("/api/x")).body(full(Bytes::new())).unwrap();
        assert_eq!(send(req).await.0.status, 200);
    }
    let sent = mirror_count(&metrics_text(gw.addr).await, "share", "sent");
    assert!((50.0..=150.0).contains(&sent), "about 10% of 1000: {sent}");
}

#[test]
fn a_mirror_is_checked_at_load() {
    let base = "[upstreams.main]\nurl = \"http://127.0.0.1:1\"\n[upstreams.tls]\nurl = \"https://127.0.0.1:2\"\n";
    for (mirror, key) in [
        ("{ upstream = \"ghost\" }", "routes[0].mirror.upstream"),
        ("{ upstream = \"main\", percent = 0 }", "routes[0].mirror.percent"),
        ("{ upstream = \"main\", percent = 101 }", "routes[0].mirror.percent"),
        ("{ upstream = \"tls\" }", "routes[0].mirror.upstream"),
    ] {
        let toml = format!("{base}[[routes]]\nname = \"r\"\nprefix = \"/\"\nupstream = \"main\"\nmirror = {mirror}\n");
        let err =
            gateway::config::load(&gateway::config::Source::Inline { text: toml, base_dir: std::env::temp_dir() })
                .expect_err(mirror)
                .to_string();
        assert!(err.contains(key), "{mirror}: {err}");
    }
}
