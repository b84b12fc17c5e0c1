//! The admin listener's status endpoints: `/-/upstreams` tells what the
//! gateway thinks of each endpoint, `/-/config` shows the effective
//! configuration with its secrets redacted, `/-/status` renders them in a
//! real (headless) browser; none of them answers on the main listener.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use http::{Request, Response, StatusCode};
use serde_json::Value;

/// Two endpoints with health checks: one whose `/healthz` passes, one
/// whose `/healthz` answers 503.
async fn two_endpoints() -> (TestUpstream, TestUpstream, String) {
    let answer = |health: u16| {
        move |req: Request<hyper::body::Incoming>| async move {
            let status = if req.uri().path() == "/healthz" { health } else { 200 };
            Response::builder().status(status).body(full("ok")).unwrap()
        }
    };
    let good = TestUpstream::start(answer(200)).await;
    let bad = TestUpstream::start(answer(503)).await;
    let toml = format!(
        r#"
[metrics]
listen = "127.0.0.1:0"

[upstreams.app]
endpoints = ["http://{good}", "http://{bad}"]
max_requests = 4
queue = 7
[upstreams.app.health]
path = "/healthz"
interval = "100ms"
timeout = "1s"
unhealthy_after = 1
healthy_after = 1

[upstreams.other]
url = "http://{refused}"
[upstreams.other.outlier]
consecutive_failures = 1
ejection_time = "60s"

[[routes]]
name = "other"
prefix = "/other"
upstream = "other"

[[routes]]
name = "app"
prefix = "/app"
upstream = "app"
request_headers = {{ set = {{ "authorization" = "Bearer sekrit-token", "x-env" = "prod", "x-callback" = "https://user:hunter2@cb.example/done" }} }}
"#,
        good = good.addr,
        bad = bad.addr,
        refused = refused_addr().await,
    );
    (good, bad, toml)
}

async fn json(url: &str) -> Value {
    let (parts, body) = get(url).await;
    assert_eq!(parts.status, 200, "{url}");
    assert_eq!(parts.headers["content-type"], "application/json");
    assert_eq!(parts.headers["cache-control"], "no-store");
    serde_json::from_slice(&body).unwrap_or_else(|e| panic!("{url}: {e}: {body:?}"))
}

/// Polls `/-/upstreams` until `check` holds (health checks run on their own
/// schedule), for at most a few seconds.
async fn upstreams_until(admin: std::net::SocketAddr, check: impl Fn(&Value) -> bool) -> Value {
    let url = format!("http://{admin}/-/upstreams");
    for _ in 0..100 {
        let v = json(&url).await;
        if check(&v) {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never held: {}", json(&url).await);
}

fn endpoint<'a>(v: &'a Value, upstream: &str, address: &str) -> &'a Value {
    let u = v.as_array().unwrap().iter().find(|u| u["name"] == upstream).expect("upstream listed");
    u["endpoints"].as_array().unwrap().iter().find(|e| e["address"] == address).expect("endpoint listed")
}

#[tokio::test]
async fn upstreams_tell_each_endpoints_state() {
    let (good, bad, toml) = two_endpoints().await;
    let gw = TestGateway::from_toml(&toml).await;
    let admin = gw.admin.unwrap();
    let (good_url, bad_url) = (format!("http://{}", good.addr), format!("http://{}", bad.addr));
    let v = upstreams_until(admin, |v| {
        endpoint(v, "app", &bad_url)["last_check"].is_object()
            && endpoint(v, "app", &good_url)["last_check"].is_object()
    })
    .await;
    let (g, b) = (endpoint(&v, "app", &good_url), endpoint(&v, "app", &bad_url));
    assert_eq!(g["healthy"], true, "{v}");
    assert_eq!(g["last_check"]["passed"], true, "{v}");
    assert_eq!(b["healthy"], false, "{v}");
    assert_eq!(b["last_check"]["passed"], false, "{v}");
    assert_eq!(b["last_check"]["detail"], "answered 503 Service Unavailable", "{v}");
    assert_eq!(b["ejected"], false, "{v}");
    let app = v.as_array().unwrap().iter().find(|u| u["name"] == "app").unwrap();
    assert_eq!(app["source"], "static");
    assert_eq!(app["ready"], true, "one endpoint passes: {v}");
    assert_eq!(app["queue"], serde_json::json!({ "waiting": 0, "size": 7 }));
    let other = v.as_array().unwrap().iter().find(|u| u["name"] == "other").unwrap();
    assert_eq!(other["queue"], Value::Null);
    assert_eq!(other["endpoints"][0]["last_check"], Value::Null, "no checks configured");
    assert_eq!(other["endpoints"][0]["ejected"], false);

    // A connect failure ejects the endpoint that refuses, until a time to come.
    assert_eq!(get(&gw.url("/other")).await.0.status, 502);
    let v = json(&format!("http://{admin}/-/upstreams")).await;
    let ejected = &v.as_array().unwrap().iter().find(|u| u["name"] == "other").unwrap()["endpoints"][0];
    assert_eq!(ejected["ejected"], true, "{v}");
    let until = humantime::parse_rfc3339(ejected["ejected_until"].as_str().unwrap()).unwrap();
    let left = until.duration_since(std::time::SystemTime::now()).expect("in the future");
    assert!(left > Duration::from_secs(50) && left <= Duration::from_secs(60), "{left:?}");

    // A request keeps a connection to the good endpoint open and idle.
    assert_eq!(get(&gw.url("/app/x")).await.0.status, 200);
    let v = upstreams_until(admin, |v| endpoint(v, "app", &good_url)["connections"]["idle"] == 1).await;
    assert_eq!(endpoint(&v, "app", &good_url)["connections"]["open"], 1, "{v}");
    assert_eq!(endpoint(&v, "app", &good_url)["in_flight"], 0, "{v}");
}

#[tokio::test]
async fn config_is_shown_with_its_secrets_redacted() {
    let (_good, _bad, toml) = two_endpoints().await;
    let gw = TestGateway::from_toml(&toml).await;
    let admin = gw.admin.unwrap();
    let (_, raw) = get(&format!("http://{admin}/-/config")).await;
    let text = String::from_utf8_lossy(&raw);
    for secret in ["hunter2", "sekrit-token"] {
        assert!(!text.contains(secret), "{secret} shown: {text}");
    }
    let v = json(&format!("http://{admin}/-/config")).await;
    let set = &v["routes"][1]["request_headers"]["set"];
    assert_eq!(set["x-callback"], "https://user:<redacted>@cb.example/done", "{v}");
    assert_eq!(set["authorization"], "<redacted>", "{v}");
    assert_eq!(set["x-env"], "prod", "{v}");
    // Defaults are part of the effective configuration: the server's, and
    // those routes and upstreams take when the file leaves a key out,
    // beside what the file set.
    assert!(v["server"]["max_connections"].is_number(), "{v}");
    let (route, app, other) = (&v["routes"][0], &v["upstreams"]["app"], &v["upstreams"]["other"]);
    assert_eq!(route["timeout"], "30s", "{v}");
    assert_eq!(route["body_timeout"], "1m", "{v}");
    assert_eq!(route["retries"], 0, "{v}");
    assert_eq!(route["retry_on"], serde_json::json!(["connect"]), "{v}");
    assert_eq!(route["max_body"], 10 << 20, "{v}");
    assert_eq!(app["queue"], 7, "{v}");
    assert_eq!(app["queue_timeout"], "5s", "{v}");
    assert_eq!(app["health"]["interval"], "100ms", "{v}");
    assert_eq!(app["connect_timeout"], "1s", "{v}");
    assert_eq!(other["health"], serde_json::Value::Null, "no checks where none are set: {v}");
    assert_eq!(other["outlier"]["ejection_time"], "60s", "{v}");
    assert_eq!(other["pool_idle_timeout"], "50s", "{v}");
    assert_eq!(v["resolver"]["attempts"], 2, "{v}");
}

#[tokio::test]
async fn none_of_it_is_served_on_the_main_listener() {
    let (_good, _bad, toml) = two_endpoints().await;
    let gw = TestGateway::from_toml(&toml).await;
    for path in ["/-/upstreams", "/-/routes", "/-/config", "/-/status"] {
        assert_eq!(get(&gw.url(path)).await.0.status, StatusCode::NOT_FOUND, "{path}");
    }
    // Without an admin listener there is no place they are served.
    let solo = TestGateway::from_toml("[[routes]]\nname = \"r\"\nprefix = \"/\"\nrespond = { status = 200 }\n").await;
    assert!(solo.admin.is_none());
    assert_eq!(get(&solo.url("/-/upstreams")).await.0.status, 200, "the route answers it, not the status");
    let post = Request::post(format!("http://{}/-/upstreams", gw.admin.unwrap())).body(full("")).unwrap();
    assert_eq!(send(post).await.0.status, 405);
}

#[tokio::test]
async fn a_name_rebound_to_the_admin_address_is_refused() {
    let (_good, _bad, toml) = two_endpoints().await;
    let toml = toml.replace("listen = \"127.0.0.1:0\"\n", "listen = \"127.0.0.1:0\"\nhosts = [\"gw-admin.test\"]\n");
    let gw = TestGateway::from_toml(&toml).await;
    let admin = gw.admin.unwrap();
    let port = admin.port();
    for (host, want) in [
        (format!("127.0.0.1:{port}"), 200),
        (format!("localhost:{port}"), 200),
        (format!("GW-ADMIN.test:{port}"), 200),
        // What a browser sends after its page's name was rebound to here.
        (format!("evil.example:{port}"), 403),
        (format!("127.0.0.1.evil.example:{port}"), 403),
    ] {
        for path in ["/-/config", "/-/upstreams", "/-/routes", "/metrics"] {
            let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
            let got = raw(admin, req.as_bytes(), Duration::from_secs(5)).await;
            assert_eq!(got.status(), want, "Host {host} {path}: {}", got.text);
            if want == 403 {
                assert!(!got.text.contains("gw-admin.test") && !got.text.contains("gateway_"), "{}", got.text);
            }
        }
    }
}

/// The same over HTTP/2 (prior knowledge), where the name is `:authority`:
/// a rebound name is refused, a `Host` that contradicts `:authority` is
/// malformed (RFC 9113 §8.3.1) and answered 400, and a reload from another
/// origin is refused.
#[tokio::test]
async fn over_http2_the_admin_listener_checks_the_authority() {
    let (_good, _bad, toml) = two_endpoints().await;
    let toml = toml.replace("listen = \"127.0.0.1:0\"\n", "listen = \"127.0.0.1:0\"\nhosts = [\"gw-admin.test\"]\n");
    let gw = TestGateway::from_toml(&toml).await;
    let admin = gw.admin.unwrap();
    let port = admin.port();
    // A connection each: a refused one is ended (GOAWAY).
    let ask = async |req: Request<TestBody>| {
        let (mut h2, _conn) = h2_client(admin).await;
        let resp = h2.send_request(req).await.expect("an answer over h2");
        assert_eq!(resp.version(), http::Version::HTTP_2);
        let status = resp.status().as_u16();
        (status, http_body_util::BodyExt::collect(resp.into_body()).await.unwrap().to_bytes())
    };
    for (authority, want) in [
        (format!("127.0.0.1:{port}"), 200),
        (format!("GW-ADMIN.test:{port}"), 200),
        (format!("evil.example:{port}"), 403),
        (format!("127.0.0.1.evil.example:{port}"), 403),
    ] {
        for path in ["/-/config", "/-/upstreams", "/metrics"] {
            let req = Request::get(format!("http://{authority}{path}")).body(full("")).unwrap();
            let (status, body) = ask(req).await;
            assert_eq!(status, want, ":authority {authority} {path}: {body:?}");
            if want == 403 {
                let text = String::from_utf8_lossy(&body);
                assert!(!text.contains("gw-admin.test") && !text.contains("gateway_"), "{text}");
            }
        }
    }
    let contradicted = Request::get(format!("http://127.0.0.1:{port}/metrics"))
        .header("host", format!("evil.example:{port}"))
        .body(full(""))
        .unwrap();
    let (status, body) = ask(contradicted).await;
    assert_eq!(status, 400, "a Host beside a different :authority: {body:?}");
    let forged = Request::post(format!("http://127.0.0.1:{port}/-/reload"))
        .header("origin", "http://evil.example")
        .body(full(""))
        .unwrap();
    assert_eq!(ask(forged).await.0, 403, "a reload from another origin");
}

/// The browser to render the page with: Debian's `chromium`.
fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"].into_iter().find(|b| Command::new(b).arg("--version").output().is_ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_shows_an_unhealthy_endpoint_in_a_real_browser() {
    let Some(browser) = chromium() else {
        assert!(std::env::var_os("CI").is_none(), "CI installs chromium (see .ci/run)");
        eprintln!("skipped: no chromium on this machine (apt-get install chromium)");
        return;
    };
    let (good, bad, toml) = two_endpoints().await;
    let gw = TestGateway::from_toml(&toml).await;
    let admin = gw.admin.unwrap();
    let bad_url = format!("http://{}", bad.addr);
    upstreams_until(admin, |v| endpoint(v, "app", &bad_url)["healthy"] == false).await;
    let (parts, _) = get(&format!("http://{admin}/-/status")).await;
    assert_eq!(parts.headers["content-type"], "text/html; charset=utf-8");
    assert!(parts.headers["content-security-policy"].to_str().unwrap().contains("default-src 'none'"));

    let profile = tempfile::tempdir().unwrap();
    let url = format!("http://{admin}/-/status");
    let dom = tokio::task::spawn_blocking(move || dump_dom(browser, profile.path(), &url)).await.unwrap();
    // The page renders from /-/upstreams after loading: each endpoint's
    // state cell carries its address and state.
    let cell = |address: &str, state: &str| format!(r#"data-endpoint="{address}" data-state="{state}""#);
    assert!(dom.contains(&cell(&bad_url, "unhealthy")), "bad endpoint not shown unhealthy: {dom}");
    assert!(dom.contains(&cell(&format!("http://{}", good.addr), "healthy")), "good endpoint not shown healthy: {dom}");
    assert!(dom.contains("class=\"unhealthy\""), "{dom}");
    assert!(dom.contains("<td>/app</td>"), "routes listed: {dom}");
    assert!(dom.contains("max_requests 4, queue 0 / 7"), "the limit shown: {dom}");
    assert!(dom.contains(r#"<div id="error"></div>"#), "the refresh failed: {dom}");
}

/// The page's DOM once its scripts have run, from headless chromium.
fn dump_dom(browser: &str, profile: &Path, url: &str) -> String {
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-dev-shm-usage",
            // Lets the page's fetches and first render finish before the
            // DOM is dumped.
            "--virtual-time-budget=5000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("a DOM is text")
}
