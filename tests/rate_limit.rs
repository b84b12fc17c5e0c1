//! Per-route rate limits end to end: 429 with `Retry-After`, `RateLimit-Policy`
//! and `RateLimit` for the client over its rate while others go on; bursts;
//! `header:` keys; the trusted-proxies rule; limits shared by two gateways
//! through a real `redis-server` (started here on a free loopback port), what
//! `on_error` does while Redis is stopped, Redis restarted; reloads.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::limits::*;
use common::redis_server::Redis;
use common::*;
use gateway::config::{self, Source};
use http::Request;
use sha2::Digest;

fn header<'a>(h: &'a http::HeaderMap, name: &str) -> &'a str {
    h.get(name).and_then(|v| v.to_str().ok()).unwrap_or("")
}

const TRUSTING: &str = "trusted_proxies = [\"127.0.0.1\"]";

#[tokio::test]
async fn a_client_over_its_rate_gets_429_with_the_fields_while_another_goes_on() {
    let (up, seen) = counting_upstream().await;
    let limit = "rate_limit = { rate = \"1/m\", burst = 3, key = \"client\", headers = true }";
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "rl_client", limit, TRUSTING)).await;
    let url = gw.url("/rl_client/x");
    let a = [("x-forwarded-for", "198.51.100.1")];
    for remaining in [2, 1, 0] {
        let (status, h) = get_with(&url, &a).await;
        assert_eq!(status, 200);
        assert!(header(&h, "ratelimit").starts_with(&format!("\"rl_client\";r={remaining};t=")), "{h:?}");
    }
    let (status, h) = get_with(&url, &a).await;
    assert_eq!(status, 429);
    let retry: u64 = header(&h, "retry-after").parse().expect("a Retry-After in seconds");
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(header(&h, "ratelimit-policy"), "\"rl_client\";q=1;w=60");
    assert_eq!(header(&h, "ratelimit"), format!("\"rl_client\";r=0;t={retry}"));
    assert_eq!(seen.load(Ordering::SeqCst), 3, "the refused request never reached the upstream");
    let (status, _) = get_with(&url, &[("x-forwarded-for", "198.51.100.2")]).await;
    assert_eq!(status, 200, "another client has its own bucket");
    let m = metrics_text(gw.addr).await;
    assert_eq!(metric(&m, "gateway_rate_limited_total", &[("route", "rl_client")]), 1.0);
    assert_eq!(rejected(&m, "rl_client", "rate_limited"), 1.0);
    let decided = |result| {
        metric(
            &m,
            "gateway_rate_limit_decisions_total",
            &[("route", "rl_client"), ("store", "local"), ("result", result)],
        )
    };
    assert_eq!((decided("allowed"), decided("refused")), (4.0, 1.0));
}

#[tokio::test]
async fn a_burst_is_let_through_at_once_then_the_rate() {
    // 2/s: one allowance comes back every 500 ms.
    let limit = "rate_limit = { rate = \"2/s\", burst = 5, key = \"route\" }";
    let gw = TestGateway::from_toml(&format!(
        "[server]\n[[routes]]\nname = \"rl_burst\"\nprefix = \"/\"\nrespond = {{ status = 200 }}\n{limit}\n"
    ))
    .await;
    let url = gw.url("/");
    // Allowed in a run of `n` requests, and what the rate allows in the time
    // the run took (the machine is noisy: the bound follows the time).
    let run = |n: usize| {
        let url = url.clone();
        async move {
            let start = Instant::now();
            let mut allowed = 0;
            for _ in 0..n {
                let (status, h) = get_with(&url, &[]).await;
                assert!(status == 200 || status == 429, "{status}");
                assert!(status == 429 || h.get("ratelimit").is_none(), "headers = false: no RateLimit when allowed");
                allowed += usize::from(status == 200);
            }
            (allowed, (start.elapsed().as_secs_f64() * 2.0).ceil() as usize)
        }
    };
    let (allowed, refilled) = run(20).await;
    assert!((5..=5 + refilled).contains(&allowed), "the burst of 5, plus {refilled} come back: {allowed}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (later, refilled) = run(10).await;
    assert!((2..=3 + refilled).contains(&later), "1.1 s at 2/s brings back 2: {later}");
}

#[tokio::test]
async fn header_keys_count_each_value_and_say_what_a_request_without_one_does() {
    let shared = "rate_limit = { rate = \"1/m\", burst = 1, key = \"header:X-Api-Key\" }";
    let toml = format!(
        "[server]\n[[routes]]\nname = \"rl_key\"\nprefix = \"/key\"\nrespond = {{ status = 200 }}\n{shared}\n\
         [[routes]]\nname = \"rl_key_refuse\"\nprefix = \"/strict\"\nrespond = {{ status = 200 }}\n\
         rate_limit = {{ rate = \"1/m\", key = \"header:X-Api-Key\", missing_key = \"refuse\" }}\n"
    );
    let gw = TestGateway::from_toml(&toml).await;
    let url = gw.url("/key");
    assert_eq!(get_with(&url, &[("x-api-key", "k1")]).await.0, 200);
    assert_eq!(get_with(&url, &[("x-api-key", "k1")]).await.0, 429, "k1's bucket is empty");
    assert_eq!(get_with(&url, &[("x_api_key", "k1")]).await.0, 429, "the underscore spelling is the same key");
    assert_eq!(get_with(&url, &[("x-api-key", "k2")]).await.0, 200, "k2 has its own bucket");
    assert_eq!(get_with(&url, &[]).await.0, 200, "without the header: one shared bucket");
    assert_eq!(get_with(&url, &[]).await.0, 429, "and it is shared");
    let strict = gw.url("/strict");
    let (status, h) = get_with(&strict, &[]).await;
    assert_eq!(status, 429, "missing_key = \"refuse\"");
    assert!(h.get("retry-after").is_none(), "waiting would not help: no Retry-After");
    assert_eq!(get_with(&strict, &[("x-api-key", "k1")]).await.0, 200);
}

#[tokio::test]
async fn a_spoofed_forwarded_for_from_an_untrusted_peer_changes_nothing() {
    // No trusted_proxies: the peer (127.0.0.1) is the client, whatever it claims.
    let limit = "rate_limit = { rate = \"1/m\", burst = 2 }";
    let gw = TestGateway::from_toml(&format!(
        "[server]\n[[routes]]\nname = \"rl_spoof\"\nprefix = \"/\"\nrespond = {{ status = 200 }}\n{limit}\n"
    ))
    .await;
    let statuses: Vec<u16> = futures_util::future::join_all((1..=4).map(|i| {
        let url = gw.url("/");
        async move { get_with(&url, &[("x-forwarded-for", &format!("203.0.113.{i}"))]).await.0 }
    }))
    .await;
    let allowed = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(allowed, 2, "four claimed clients are one peer: {statuses:?}");
}

#[tokio::test]
async fn a_reload_that_changes_the_rate_applies_it_and_one_that_does_not_keeps_the_buckets() {
    let dir = tempfile::tempdir().unwrap();
    let toml = |burst: u32| {
        format!(
            "[server]\n[[routes]]\nname = \"rl_reload\"\nprefix = \"/\"\nrespond = {{ status = 200 }}\n\
             rate_limit = {{ rate = \"1/m\", burst = {burst}, key = \"route\" }}\n"
        )
    };
    let gw = TestGateway::from_file(dir.path(), &toml(1)).await;
    let url = gw.url("/");
    assert_eq!(get_with(&url, &[]).await.0, 200);
    assert_eq!(get_with(&url, &[]).await.0, 429);
    gw.app.reload().expect("the same file reloads");
    assert_eq!(get_with(&url, &[]).await.0, 429, "an unchanged limit keeps its buckets across a reload");
    std::fs::write(dir.path().join("gateway.toml"), toml(3)).unwrap();
    gw.app.reload().expect("a new burst reloads");
    let mut got = Vec::new();
    for _ in 0..4 {
        got.push(get_with(&url, &[]).await.0);
    }
    assert_eq!(got, [200, 200, 200, 429], "the new limit, from a fresh bucket");
}

#[test]
fn bad_rate_limits_are_refused_at_load_naming_the_key() {
    let route =
        |rl: &str| format!("[server]\n[[routes]]\nname = 'r'\nprefix = '/'\nrespond = {{ status = 200 }}\n{rl}\n");
    let cases = [
        (route("rate_limit = { rate = '100' }"), "routes[0].rate_limit.rate"),
        (route("rate_limit = { rate = '10/s', burst = 0 }"), "routes[0].rate_limit.burst"),
        (route("rate_limit = { rate = '10/s', key = 'cookie' }"), "routes[0].rate_limit.key"),
        (route("rate_limit = { rate = '10/s', shared = 'redis' }"), "routes[0].rate_limit.shared"),
        (route("rate_limit = { rate = '10/s', colour = 'red' }"), "colour"),
        (
            format!("{}[rate_limit_store]\nurl = 'redis://127.0.0.1:1'\non_error = 'maybe'\n", route("")),
            "rate_limit_store.on_error",
        ),
        (format!("{}[rate_limit_store]\nurl = 'http://127.0.0.1:1'\n", route("")), "rate_limit_store.url"),
    ];
    let cases: Vec<(&str, &str)> = cases.iter().map(|(t, k)| (t.as_str(), *k)).collect();
    assert_refused_by_check(env!("CARGO_BIN_EXE_gateway"), &cases);
}

// ---------------------------------------------------------------------------
// Shared through a real Redis.

/// Sends requests to `addr` from `loops` connections until `until`; counts
/// the 200s.
async fn hammer(addr: SocketAddr, loops: usize, until: tokio::time::Instant) -> usize {
    let allowed = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..loops)
        .map(|_| {
            let allowed = allowed.clone();
            tokio::spawn(async move {
                let client = client();
                while tokio::time::Instant::now() < until {
                    let req = Request::get(format!("http://{addr}/")).body(full(Bytes::new())).unwrap();
                    let resp = client.request(req).await.expect("the gateway answers");
                    if resp.status() == 200 {
                        allowed.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    allowed.load(Ordering::Relaxed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_one_redis_enforce_one_limit() {
    let Some(redis) = Redis::start() else { return };
    let toml = shared_toml("rl_two", "rate = \"20/s\", burst = 10, key = \"route\"", &redis.url(), "timeout = \"1s\"");
    let (a, b) = (TestGateway::from_toml(&toml).await, TestGateway::from_toml(&toml).await);
    let start = Instant::now();
    let until = tokio::time::Instant::now() + Duration::from_secs(2);
    let (from_a, from_b) = tokio::join!(hammer(a.addr, 2, until), hammer(b.addr, 2, until));
    let secs = start.elapsed().as_secs_f64();
    let expected = 10.0 + 20.0 * secs;
    let total = (from_a + from_b) as f64;
    assert!(from_a > 0 && from_b > 0, "both gateways let some through: {from_a} + {from_b}");
    assert!(
        (total - expected).abs() <= 3.0 + expected * 0.1,
        "{from_a} + {from_b} = {total} allowed in {secs:.2} s; one limit allows {expected:.0}"
    );
    let m = metrics_text(a.addr).await;
    let decided = metric(&m, "gateway_rate_limit_decisions_total", &[("route", "rl_two"), ("store", "redis")]);
    assert!(decided > 0.0, "decided by Redis");
    let ttl = redis.cmd(&["PTTL", "gateway:rl:rl_two:-"]);
    assert!(matches!(ttl, Some(redis::Value::Int(ms)) if ms > 0 && ms <= 1000), "the bucket's key expires: {ttl:?}");
}

/// Three gateways on one Redis, one per `on_error`; Redis is stopped
/// (SIGSTOP: it hangs, so each request meets the timeout) then continued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_redis_hangs_on_error_decides_and_no_request_waits_past_the_timeout() {
    let Some(redis) = Redis::start() else { return };
    let timeout = Duration::from_millis(200);
    let limit = "rate = \"1/m\", burst = 2, key = \"route\"";
    let gateway = |name: &'static str, on_error: &str| {
        let toml = shared_toml(name, limit, &redis.url(), &format!("timeout = \"200ms\"\non_error = \"{on_error}\""));
        async move { TestGateway::from_toml(&toml).await }
    };
    let local = gateway("rl_err_local", "local").await;
    let allow = gateway("rl_err_allow", "allow").await;
    let deny = gateway("rl_err_deny", "deny").await;
    // Redis takes the first of each bucket.
    for gw in [&local, &allow, &deny] {
        assert_eq!(get_with(&gw.url("/"), &[]).await.0, 200);
    }
    redis.signal("-STOP");
    let timed = |gw: &TestGateway| {
        let url = gw.url("/");
        async move {
            let start = Instant::now();
            let status = get_with(&url, &[]).await.0;
            let took = start.elapsed();
            // Generous: the machine is noisy, but never a wait on Redis itself.
            assert!(took < timeout + Duration::from_millis(800), "{url} waited {took:?}");
            status
        }
    };
    let mut seen = Vec::new();
    for gw in [&local, &allow, &deny] {
        let mut statuses = Vec::new();
        for _ in 0..4 {
            statuses.push(timed(gw).await);
        }
        seen.push(statuses);
    }
    assert_eq!(seen[0], [200, 200, 429, 429], "local: this gateway's own bucket (burst 2) decides");
    assert_eq!(seen[1], [200; 4], "allow: every request passes");
    assert_eq!(seen[2], [429; 4], "deny: every request is refused");
    let m = metrics_text(local.addr).await;
    assert!(metric(&m, "gateway_rate_limit_store_errors_total", &[("kind", "timeout")]) >= 3.0, "counted");
    assert!(metric(&m, "gateway_rate_limit_store_errors_total", &[("kind", "down")]) >= 3.0, "not asked while down");
    let deny_m = metrics_text(deny.addr).await;
    let on_error = metric(
        &deny_m,
        "gateway_rate_limit_decisions_total",
        &[("route", "rl_err_deny"), ("store", "on_error"), ("result", "refused")],
    );
    assert_eq!(on_error, 4.0);
    // Continued: Redis decides again (its bucket for rl_err_allow has one left).
    redis.signal("-CONT");
    let resumed = wait_for_redis_decision(&allow, "rl_err_allow").await;
    assert!(resumed, "decisions by Redis resume after it answers again");
}

/// Requests `gw` until one is decided by Redis (its metric moves), for up to 5 s.
async fn wait_for_redis_decision(gw: &TestGateway, route: &str) -> bool {
    let by_redis = |m: &str| {
        metric(m, "gateway_rate_limit_decisions_total", &[("route", route), ("store", "redis"), ("result", "allowed")])
            + metric(
                m,
                "gateway_rate_limit_decisions_total",
                &[("route", route), ("store", "redis"), ("result", "refused")],
            )
    };
    let before = by_redis(&metrics_text(gw.addr).await);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        get_with(&gw.url("/"), &[]).await;
        if by_redis(&metrics_text(gw.addr).await) > before {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_resume_after_the_scripts_are_flushed_and_after_redis_restarts() {
    let Some(mut redis) = Redis::start() else { return };
    let limit = "rate = \"1/m\", burst = 3, key = \"header:X-Api-Key\"";
    let gw = TestGateway::from_toml(&shared_toml("rl_restart", limit, &redis.url(), "timeout = \"500ms\"")).await;
    let url = gw.url("/");
    let k = [("x-api-key", "k")];
    assert_eq!(get_with(&url, &k).await.0, 200);
    assert_eq!(redis.cmd(&["SCRIPT", "FLUSH"]), Some(redis::Value::Okay));
    assert_eq!(get_with(&url, &k).await.0, 200, "NOSCRIPT: the script is loaded again");
    let m = metrics_text(gw.addr).await;
    let by_redis = metric(
        &m,
        "gateway_rate_limit_decisions_total",
        &[("route", "rl_restart"), ("store", "redis"), ("result", "allowed")],
    );
    assert_eq!(by_redis, 2.0, "both decided by Redis, the second after the flush");
    // A new process on the same port: no scripts, no buckets.
    redis.kill();
    let start = Instant::now();
    assert_eq!(get_with(&url, &k).await.0, 200, "refused connections: on_error (local, a fresh bucket) decides");
    assert!(start.elapsed() < Duration::from_millis(1500), "within the timeout: {:?}", start.elapsed());
    let m = metrics_text(gw.addr).await;
    let fallback = metric(
        &m,
        "gateway_rate_limit_decisions_total",
        &[("route", "rl_restart"), ("store", "local"), ("result", "allowed")],
    );
    assert_eq!(fallback, 1.0, "decided by this gateway's own bucket");
    redis.spawn();
    assert!(wait_for_redis_decision(&gw, "rl_restart").await, "decisions by Redis resume after a restart");
    assert_eq!(get_with(&url, &k).await.0, 200, "a fresh bucket in the new Redis");
    // X-Api-Key names a secret: its values are kept as their SHA-256.
    let digest: String = sha2::Sha256::digest(b"k").iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        redis.cmd(&["EXISTS", &format!("gateway:rl:rl_restart:d:{digest}")]),
        Some(redis::Value::Int(1)),
        "kept in the new Redis"
    );
}

/// The commented examples in config/gateway.toml, uncommented, load.
#[test]
fn the_documented_examples_load() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    let text = std::fs::read_to_string(dir.join("gateway.toml")).unwrap();
    // The rate_limit line, and [rate_limit_store] with the four keys under it.
    let (mut store_lines, mut uncommented) = (0usize, 0);
    let text: String = text
        .lines()
        .map(|line| {
            if line == "# [rate_limit_store]" {
                store_lines = 5;
            }
            if store_lines > 0 || line.starts_with("# rate_limit = ") {
                store_lines = store_lines.saturating_sub(1);
                uncommented += 1;
                // A variable every test process has stands in for the password's.
                return format!("{}\n", line[2..].replace("REDIS_PASSWORD", "PATH"));
            }
            format!("{line}\n")
        })
        .collect();
    assert_eq!(uncommented, 6, "the examples are where this test looks for them");
    let c = config::load(&Source::Inline { text, base_dir: dir }).unwrap_or_else(|e| panic!("{e}"));
    let store = c.rate_limit_store.expect("[rate_limit_store]");
    assert_eq!((store.timeout, store.on_error), (Duration::from_millis(50), config::OnStoreError::Local));
    let limited = c.routes.iter().find_map(|r| r.rate_limit.as_ref()).expect("a route with rate_limit");
    assert_eq!((limited.rate.count, limited.burst, limited.key.clone()), (100, 50, config::RateLimitKey::Client));
}

/// `password_env`: the password comes from the environment. `PATH`, which
/// every test process has, stands in for a real secret's variable (setting
/// one here would race the other tests' threads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_from_the_environment_opens_a_redis_that_requires_one() {
    let password = std::env::var("PATH").expect("PATH is set");
    let Some(redis) = Redis::start_with(Some(password)) else { return };
    let limit = "rate = \"1/m\", burst = 1, key = \"route\"";
    let with = |route: &str, env: &str| {
        shared_toml(route, limit, &redis.url(), &format!("timeout = \"500ms\"\npassword_env = \"{env}\""))
    };
    let gw = TestGateway::from_toml(&with("rl_pw", "PATH")).await;
    assert_eq!(get_with(&gw.url("/"), &[]).await.0, 200);
    assert_eq!(get_with(&gw.url("/"), &[]).await.0, 429);
    let m = metrics_text(gw.addr).await;
    let by_redis = |m: &str, route: &str| {
        metric(m, "gateway_rate_limit_decisions_total", &[("route", route), ("store", "redis"), ("result", "allowed")])
            + metric(
                m,
                "gateway_rate_limit_decisions_total",
                &[("route", route), ("store", "redis"), ("result", "refused")],
            )
    };
    assert_eq!(by_redis(&m, "rl_pw"), 2.0, "both decided by Redis, authenticated");
    // Another variable: the wrong password; on_error (local) decides.
    let wrong = TestGateway::from_toml(&with("rl_pw_wrong", "CARGO_PKG_NAME")).await;
    assert_eq!(get_with(&wrong.url("/"), &[]).await.0, 200);
    let m = metrics_text(wrong.addr).await;
    assert_eq!(by_redis(&m, "rl_pw_wrong"), 0.0, "a refused login decides nothing");
}
