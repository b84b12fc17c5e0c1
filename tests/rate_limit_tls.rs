//! Limits shared through Redis over TLS (`rediss://`): a real `redis-server`
//! speaking TLS only, with a certificate from a CA made in the test. With
//! `ca_file` naming that CA, two gateways share one limit; without it
//! (webpki's roots) the handshake fails and `on_error` decides. A bad
//! `ca_file` is refused at load.

mod common;

use bytes::Bytes;
use common::redis_server::Redis;
use common::*;
use http::Request;

async fn status(gw: &TestGateway) -> u16 {
    let (parts, _) = send(Request::get(gw.url("/")).body(full(Bytes::new())).unwrap()).await;
    parts.status.as_u16()
}

fn decided(m: &str, route: &str, store: &str) -> f64 {
    ["allowed", "refused"]
        .iter()
        .map(|result| {
            let labels = [("route", route), ("store", store), ("result", *result)];
            sample(m, "gateway_rate_limit_decisions_total", &labels).unwrap_or(0.0)
        })
        .sum()
}

/// A route `route` with one bucket of 3 (a minute to refill) in the TLS
/// Redis; `store` is the rest of `[rate_limit_store]`.
fn toml(route: &str, redis: &Redis, store: &str) -> String {
    format!(
        "[server]\n[[routes]]\nname = \"{route}\"\nprefix = \"/\"\nrespond = {{ status = 200 }}\n\
         rate_limit = {{ rate = \"1/m\", burst = 3, key = \"route\", shared = \"redis\" }}\n\
         [rate_limit_store]\nurl = \"{}\"\ntimeout = \"2s\"\n{store}\n",
        redis.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_private_ca_in_ca_file_two_gateways_share_one_limit_over_tls() {
    let Some(redis) = Redis::start_tls() else { return };
    let pki = redis.tls.as_ref().expect("TLS");
    // Relative to the config's folder, which holds the test CA's ca.pem.
    let toml = toml("rl_tls", &redis, "ca_file = \"ca.pem\"\non_error = \"allow\"");
    let a = TestGateway::start(config(&toml, pki.dir.path())).await;
    let b = TestGateway::start(config(&toml, pki.dir.path())).await;
    let got = [status(&a).await, status(&a).await, status(&b).await, status(&b).await];
    assert_eq!(got, [200, 200, 200, 429], "one bucket of 3 for both gateways");
    // One process, one metrics registry: the two gateways' decisions together.
    assert_eq!(decided(&metrics_text(a.addr).await, "rl_tls", "redis"), 4.0, "all four decided by Redis");
    assert_eq!(redis.cmd(&["EXISTS", "gateway:rl:rl_tls:-"]), Some(redis::Value::Int(1)), "the bucket is in Redis");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_ca_file_the_handshake_fails_and_on_error_decides() {
    let Some(redis) = Redis::start_tls() else { return };
    let gw = TestGateway::from_toml(&toml("rl_tls_webpki", &redis, "on_error = \"deny\"")).await;
    assert_eq!(status(&gw).await, 429, "on_error = \"deny\"");
    assert_eq!(status(&gw).await, 429, "and again, without asking Redis");
    let m = metrics_text(gw.addr).await;
    assert_eq!(decided(&m, "rl_tls_webpki", "redis"), 0.0, "Redis's certificate is not trusted: no decision");
    assert_eq!(decided(&m, "rl_tls_webpki", "on_error"), 2.0);
    let errors = |kind| sample(&m, "gateway_rate_limit_store_errors_total", &[("kind", kind)]).unwrap_or(0.0);
    assert!(errors("connection") >= 1.0, "the failed handshake is a connection error:\n{m}");
    assert_eq!(redis.cmd(&["EXISTS", "gateway:rl:rl_tls_webpki:-"]), Some(redis::Value::Int(0)));
}

#[test]
fn a_bad_ca_file_is_refused_at_load_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "not a certificate").unwrap();
    let with = |url: &str, ca: &str| {
        format!(
            "[server]\n[[routes]]\nname = 'r'\nprefix = '/'\nrespond = {{ status = 200 }}\n\
             [rate_limit_store]\nurl = '{url}'\nca_file = '{ca}'\n"
        )
    };
    let cases = [
        with("rediss://127.0.0.1:1", "absent.pem"),
        with("rediss://127.0.0.1:1", &junk.display().to_string()),
        with("redis://127.0.0.1:1", &junk.display().to_string()),
    ];
    let cases: Vec<(&str, &str)> = cases.iter().map(|t| (t.as_str(), "rate_limit_store.ca_file")).collect();
    assert_refused_by_check(env!("CARGO_BIN_EXE_gateway"), &cases);
}
