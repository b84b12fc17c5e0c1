//! Splits and mirrors seen from outside: the admin listener's `/-/routes`
//! (each split's weights and sticky key, each mirror's copies so far,
//! carried over by a reload), `/-/upstreams` (endpoint weights), the
//! metrics, and `/-/status` drawing them in a real (headless) browser.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::Request;
use serde_json::{Value, json};

fn toml(v1: &TestUpstream, v2: &TestUpstream, shadow: &TestUpstream, percent: u32) -> String {
    format!(
        r#"
[metrics]
listen = "127.0.0.1:0"

[upstreams.v1]
endpoints = [{{ url = "http://{v1}", weight = 3 }}]
[upstreams.v2]
url = "http://{v2}"
[upstreams.shadow]
url = "http://{shadow}"

[[routes]]
name = "api"
prefix = "/api"
hosts = ["api.example.com"]
split = [{{ upstream = "v1", weight = 95 }}, {{ upstream = "v2", weight = 5 }}]
sticky = {{ cookie = "gw_v", set = true }}
mirror = {{ upstream = "shadow", percent = {percent} }}

[[routes]]
name = "plain"
prefix = "/"
upstream = "v2"
"#,
        v1 = v1.addr,
        v2 = v2.addr,
        shadow = shadow.addr,
    )
}

async fn json_of(url: &str) -> Value {
    let (parts, body) = get(url).await;
    assert_eq!(
        (parts.status.as_u16(), parts.headers["content-type"].to_str().unwrap()),
        (200, "application/json"),
        "{url}"
    );
    serde_json::from_slice(&body).unwrap()
}

/// Sends `n` requests to the split route.
async fn send_api(gw: &TestGateway, n: usize) {
    for _ in 0..n {
        let req = Request::get(gw.url("/api/x")).header("host", "api.example.com").body(full(Bytes::new())).unwrap();
        assert_eq!(send(req).await.0.status, 200);
    }
}

/// Polls `/-/routes` until the mirror's copies are all answered.
async fn routes_settled(admin: std::net::SocketAddr, answered: u64) -> Value {
    let url = format!("http://{admin}/-/routes");
    for _ in 0..100 {
        let v = json_of(&url).await;
        if v[0]["mirror"]["answered"] == answered {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("copies not all answered: {}", json_of(&url).await);
}

/// The metrics are the process's and both tests send to a route named
/// `api`: one at a time, and counts read as differences, or one's counts
/// land in the other's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn routes_show_splits_and_mirrors_with_their_copies() {
    let _one = SERIAL.lock().await;
    let (v1, _) = counting_upstream().await;
    let (v2, _) = counting_upstream().await;
    let (shadow, _) = counting_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = TestGateway::from_file(dir.path(), &toml(&v1, &v2, &shadow, 100)).await;
    let admin = gw.admin.unwrap();
    let before = metrics_text(admin).await;
    send_api(&gw, 20).await;
    let v = routes_settled(admin, 20).await;
    let api = &v[0];
    // A split route names no single upstream: not `"upstream": "v1"`, its
    // first member, as if all traffic went there.
    assert_eq!(
        (&api["name"], &api["hosts"], &api["prefix"], api.get("upstream")),
        (&json!("api"), &json!(["api.example.com"]), &json!("/api"), None),
        "{v}"
    );
    assert_eq!(
        api["split"],
        json!({ "upstreams": [{ "upstream": "v1", "weight": 95 }, { "upstream": "v2", "weight": 5 }], "sticky": "cookie:gw_v", "sets_cookie": true })
    );
    let mirror = json!({ "upstream": "shadow", "percent": 100.0, "in_flight": 0, "sent": 20, "skipped_in_flight": 0, "skipped_body": 0, "answered": 20, "failed": 0 });
    assert_eq!(api["mirror"], mirror, "{v}");
    assert!(
        api["target"].as_str().unwrap().starts_with("proxy -> split [v1 95, v2 5] sticky cookie:gw_v (set)"),
        "{v}"
    );
    assert_eq!(
        (&v[1]["name"], &v[1]["hosts"], &v[1]["split"], &v[1]["mirror"]),
        (&json!("plain"), &json!([]), &Value::Null, &Value::Null)
    );
    assert_eq!(v[1]["upstream"], "v2", "{v}");

    // The metrics say the same, each request counted on the upstream chosen.
    let m = metrics_text(admin).await;
    let count = |m: &str, name, labels: &[(&str, &str)]| sample(m, name, labels).unwrap_or(0.0);
    let added = |name, labels: &[(&str, &str)]| count(&m, name, labels) - count(&before, name, labels);
    let split = |up| added("gateway_split_requests_total", &[("route", "api"), ("upstream", up)]);
    assert_eq!(split("v1") + split("v2"), 20.0, "{m}");
    assert_eq!(added("gateway_mirror_total", &[("route", "api"), ("result", "sent")]), 20.0, "{m}");

    // A reload that changes the share carries the counts over.
    std::fs::write(dir.path().join("gateway.toml"), toml(&v1, &v2, &shadow, 50)).unwrap();
    gw.app.reload().unwrap();
    let v = json_of(&format!("http://{admin}/-/routes")).await;
    assert_eq!((&v[0]["mirror"]["percent"], &v[0]["mirror"]["sent"]), (&json!(50.0), &json!(20)), "{v}");

    // Endpoint weights, in /-/upstreams.
    let u = json_of(&format!("http://{admin}/-/upstreams")).await;
    let v1_entry = u.as_array().unwrap().iter().find(|u| u["name"] == "v1").unwrap();
    assert_eq!(v1_entry["endpoints"][0]["weight"], 3, "{u}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_draws_splits_and_mirrors_in_a_real_browser() {
    let _one = SERIAL.lock().await;
    let Some(browser) = ["chromium", "chromium-browser"]
        .into_iter()
        .find(|b| std::process::Command::new(b).arg("--version").output().is_ok())
    else {
        assert!(std::env::var_os("CI").is_none(), "CI installs chromium (see .ci/run)");
        eprintln!("skipped: no chromium on this machine (apt-get install chromium)");
        return;
    };
    let (v1, _) = counting_upstream().await;
    let (v2, _) = counting_upstream().await;
    let (shadow, _) = counting_upstream().await;
    let gw = TestGateway::from_toml(&toml(&v1, &v2, &shadow, 100)).await;
    let admin = gw.admin.unwrap();
    send_api(&gw, 3).await;
    routes_settled(admin, 3).await;
    let profile = tempfile::tempdir().unwrap();
    let url = format!("http://{admin}/-/status");
    let dom = tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(browser)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-dev-shm-usage"])
            .args(["--virtual-time-budget=5000", "--dump-dom"])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .output()
            .expect("run chromium");
        assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    })
    .await
    .unwrap();
    assert!(dom.contains(r#"<td data-split="api">v1 95, v2 5; sticky cookie:gw_v (set)</td>"#), "{dom}");
    let mirror = "shadow 100%: 3 sent, 0 in flight, 3 answered, 0 failed, skipped 0 (in flight) 0 (body)";
    assert!(dom.contains(&format!(r#"<td data-mirror="api">{mirror}</td>"#)), "{dom}");
    assert!(dom.contains("<td>api.example.com</td>") && dom.contains("<td>*</td>"), "{dom}");
    assert!(dom.contains(r#"<div id="error"></div>"#), "the refresh failed: {dom}");
}
