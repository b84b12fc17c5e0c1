//! Rate limits at their edges, end to end: a Redis that closes idle
//! connections (`timeout`, `CLIENT KILL`), store URLs the Redis client
//! refuses, one bucket per credential however it is spelt, HTTP/2 cookie
//! crumbs and `:authority`, the keys kept at `max_keys`, the `RateLimit`
//! fields' figures and lists, and the bound on `burst`.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::limits::*;
use common::redis_server::Redis;
use common::*;
use http::Request;

fn by_redis(m: &str, route: &str) -> f64 {
    let decided = |result| {
        metric(m, "gateway_rate_limit_decisions_total", &[("route", route), ("store", "redis"), ("result", result)])
    };
    decided("allowed") + decided("refused")
}

/// Redis closes a connection idle past its `timeout` (or one `CLIENT KILL`
/// names): the next request is still decided by Redis, on a new
/// connection, not by `on_error` (`deny` here, which would answer 429).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_redis_closed_is_replaced_without_counting_the_store_down() {
    let Some(redis) = Redis::start() else { return };
    assert_eq!(redis.cmd(&["CONFIG", "SET", "timeout", "1"]), Some(redis::Value::Okay));
    let limit = "rate = \"100/s\", burst = 100, key = \"route\"";
    let store = "timeout = \"1s\"\non_error = \"deny\"";
    let gw = TestGateway::from_toml(&shared_toml("rl_idle", limit, &redis.url(), store)).await;
    let url = gw.url("/");
    assert_eq!(get_with(&url, &[]).await.0, 200);
    for idle in 0..2 {
        // Past Redis's `timeout 1` (checked ten times a second).
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(get_with(&url, &[]).await.0, 200, "after idle period {idle}");
    }
    assert!(redis.cmd(&["CLIENT", "KILL", "TYPE", "normal"]).is_some());
    assert_eq!(get_with(&url, &[]).await.0, 200, "after CLIENT KILL");
    let m = metrics_text(gw.addr).await;
    assert_eq!(by_redis(&m, "rl_idle"), 4.0, "every request decided by Redis");
    let errors: f64 = ["timeout", "connection", "reply", "down"]
        .iter()
        .map(|kind| metric(&m, "gateway_rate_limit_store_errors_total", &[("kind", kind)]))
        .sum();
    assert_eq!(errors, 0.0, "the store never counted as down");
}

fn respond_toml(route: &str, limit: &str) -> String {
    format!(
        "[server]\n[[routes]]\nname = \"{route}\"\nprefix = \"/\"\nrespond = {{ status = 200 }}\n\
         rate_limit = {{ {limit} }}\n"
    )
}

/// `key = "header:authorization"` counts the credential as `auth` reads it:
/// each spelling of one (the scheme in any case, any run of blanks before
/// the token) takes from its one bucket.
#[tokio::test]
async fn each_spelling_of_one_credential_takes_from_one_bucket() {
    let limit = "rate = \"1/m\", burst = 1, key = \"header:authorization\"";
    let gw = TestGateway::from_toml(&respond_toml("rl_cred", limit)).await;
    let url = gw.url("/");
    // base64("alice:pw")
    let basic = ["Basic YWxpY2U6cHc=", "basic YWxpY2U6cHc=", "BASIC   YWxpY2U6cHc=", "bAsIc \t YWxpY2U6cHc="];
    let bearer = ["Bearer tok.en.1", "bearer  tok.en.1", "BEARER\t\ttok.en.1", "Bearer tok.en.1 "];
    for spellings in [basic, bearer] {
        let statuses: Vec<u16> = {
            let mut got = Vec::new();
            for s in spellings {
                got.push(get_with(&url, &[("authorization", s)]).await.0);
            }
            got
        };
        assert_eq!(statuses, [200, 429, 429, 429], "{spellings:?}");
    }
    assert_eq!(get_with(&url, &[("authorization", "Bearer TOK.EN.1")]).await.0, 200, "tokens keep their case");
    assert_eq!(get_with(&url, &[("authorization", "Basic Ym9iOnB3")]).await.0, 200, "another credential");
}

/// An HTTP/2 GET to `uri` with `headers` (each its own field), over `sender`.
async fn h2_get(
    sender: &mut hyper::client::conn::http2::SendRequest<TestBody>,
    uri: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let mut req = Request::get(uri).version(http::Version::HTTP_2);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    let resp = sender.send_request(req.body(full(Bytes::new())).unwrap()).await.expect("an answer");
    resp.status().as_u16()
}

/// HTTP/2: the cookie crumbs of a request are one key, joined as the
/// upstream gets them; `key = "header:host"` reads `:authority`.
#[tokio::test]
async fn http2_cookie_crumbs_are_one_key_and_host_is_the_authority() {
    let cookie = "rate = \"1/m\", burst = 1, key = \"header:cookie\", missing_key = \"refuse\"";
    let host = "rate = \"1/m\", burst = 1, key = \"header:host\", missing_key = \"refuse\"";
    let toml = format!(
        "[server]\n[[routes]]\nname = \"rl_cookie\"\nprefix = \"/cookie\"\nrespond = {{ status = 200 }}\n\
         rate_limit = {{ {cookie} }}\n\
         [[routes]]\nname = \"rl_host\"\nprefix = \"/host\"\nrespond = {{ status = 200 }}\n\
         rate_limit = {{ {host} }}\n"
    );
    let gw = TestGateway::from_toml(&toml).await;
    let (mut h2, _conn) = h2_client(gw.addr).await;
    let at = |path: &str| format!("http://{}{path}", gw.addr);
    let crumbs = [("cookie", "a=1"), ("cookie", "b=2")];
    assert_eq!(h2_get(&mut h2, &at("/cookie"), &crumbs).await, 200, "two crumbs are one key");
    assert_eq!(h2_get(&mut h2, &at("/cookie"), &[("cookie", "a=1; b=2")]).await, 429, "the same cookie, one field");
    assert_eq!(h2_get(&mut h2, &at("/cookie"), &crumbs).await, 429, "and its bucket is empty");
    assert_eq!(h2_get(&mut h2, &at("/cookie"), &[("cookie", "a=1"), ("cookie", "b=3")]).await, 200, "another");
    let port = gw.addr.port();
    let host = |name: &str| format!("http://{name}:{port}/host");
    assert_eq!(h2_get(&mut h2, &host("a.example"), &[]).await, 200, ":authority is the host");
    assert_eq!(h2_get(&mut h2, &host("A.Example"), &[]).await, 429, "in any case");
    assert_eq!(h2_get(&mut h2, &host("b.example"), &[]).await, 200, "another host, another bucket");
}

/// A store URL the Redis client refuses is refused at load, naming the key,
/// and `gateway check` says so (exit 64); before, the gateway started with
/// each gateway's own buckets whatever `on_error` said.
#[test]
fn store_urls_the_redis_client_refuses_are_refused_at_load() {
    let with = |url: &str| {
        format!(
            "{}[rate_limit_store]\nurl = '{url}'\non_error = 'deny'\n",
            respond_toml("r", "rate = '1/s', shared = 'redis'")
        )
    };
    let cases =
        [with("redis://127.0.0.1:99999"), with("redis://127.0.0.1:6379/keys"), with("rediss://127.0.0.1:6380#frag")];
    let cases: Vec<(&str, &str)> = cases.iter().map(|t| (t.as_str(), "rate_limit_store.url")).collect();
    assert_refused_by_check(env!("CARGO_BIN_EXE_gateway"), &cases);
}

/// `headers = true`: the route's `RateLimit-Policy` and `RateLimit` items
/// are appended to the upstream's own lists, never in their place.
#[tokio::test]
async fn the_routes_items_are_appended_to_the_upstreams_lists() {
    let up = TestUpstream::start(|req: Request<hyper::body::Incoming>| async move {
        let mut resp = http::Response::new(full(Bytes::from_static(b"ok")));
        if req.uri().path().ends_with("/fields") {
            let h = resp.headers_mut();
            h.insert("ratelimit-policy", http::HeaderValue::from_static("\"api\";q=100;w=60"));
            h.insert("ratelimit", http::HeaderValue::from_static("\"api\";r=42;t=30"));
        }
        resp
    })
    .await;
    let limit = "rate_limit = { rate = \"10/m\", burst = 5, key = \"route\", headers = true }";
    let gw = TestGateway::from_toml(&proxy_toml(up.addr, "rl_list", limit, "")).await;
    let (status, h) = get_with(&gw.url("/rl_list/fields"), &[]).await;
    assert_eq!(status, 200);
    let all = |name: &str| h.get_all(name).iter().map(|v| v.to_str().unwrap().to_owned()).collect::<Vec<_>>();
    assert_eq!(all("ratelimit-policy"), ["\"api\";q=100;w=60, \"rl_list\";q=10;w=60"]);
    assert_eq!(all("ratelimit"), ["\"api\";r=42;t=30, \"rl_list\";r=4;t=6"]);
    let (_, h) = get_with(&gw.url("/rl_list/plain"), &[]).await;
    assert_eq!(h.get("ratelimit-policy").unwrap(), "\"rl_list\";q=10;w=60", "the route's alone");
    assert!(h.get("ratelimit").unwrap().to_str().unwrap().starts_with("\"rl_list\";r=3;t="));
}

/// `RateLimit`'s `t` on a local limit is the time until the bucket is full
/// again, exactly (rounded up to a second), not a whole number of
/// intervals: 10/m, a second request 3 s after the first is full 9 s later.
#[tokio::test]
async fn a_local_limits_t_is_the_time_until_the_bucket_is_full() {
    let limit = "rate = \"10/m\", key = \"route\", headers = true";
    let gw = TestGateway::from_toml(&respond_toml("rl_t", limit)).await;
    let url = gw.url("/");
    let t = |h: &http::HeaderMap| -> u64 {
        let v = h.get("ratelimit").expect("RateLimit").to_str().unwrap();
        v.rsplit_once(";t=").expect("t").1.parse().unwrap()
    };
    let a0 = std::time::Instant::now();
    let (_, first) = get_with(&url, &[]).await;
    let a1 = std::time::Instant::now();
    assert_eq!(t(&first), 6, "one interval");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b0 = std::time::Instant::now();
    let (_, second) = get_with(&url, &[]).await;
    let b1 = std::time::Instant::now();
    // The two decisions were between (b0 - a1) and (b1 - a0) apart; the
    // bucket is full two intervals after the first.
    let ceil = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
    let (soonest, latest) = (ceil(Duration::from_secs(12) - (b1 - a0)), ceil(Duration::from_secs(12) - (b0 - a1)));
    assert!((soonest..=latest).contains(&t(&second)), "t = {}, not in {soonest}..={latest}", t(&second));
}

/// A `burst` that would take past the bound to refill is refused at load,
/// naming the key (it overflowed the buckets' nanoseconds: `1/d` with
/// `burst = 213510` let 6 through, then refused); the bound itself works.
#[tokio::test]
async fn a_burst_past_the_bound_is_refused_and_the_bound_works() {
    let too_big = respond_toml("r", "rate = \"1/d\", burst = 213510");
    let also = respond_toml("r", "rate = \"1/d\", burst = 36501");
    assert_refused_by_check(
        env!("CARGO_BIN_EXE_gateway"),
        &[(&too_big, "routes[0].rate_limit.burst"), (&also, "routes[0].rate_limit.burst")],
    );
    let gw = TestGateway::from_toml(&respond_toml("rl_most", "rate = \"1/d\", burst = 36500, headers = true")).await;
    let url = gw.url("/");
    for remaining in [36499, 36498] {
        let (status, h) = get_with(&url, &[]).await;
        assert_eq!(status, 200);
        let want = format!("\"rl_most\";r={remaining};t={}", 86_400 * (36_500 - remaining));
        assert_eq!(h.get("ratelimit").unwrap(), want.as_str());
    }
}

/// `max_keys`: a key that keeps asking keeps its bucket while one-off keys
/// flood the store, whatever the fill level (with moka's TinyLFU, which
/// counts no frequencies until the store has been half full, an exhausted
/// key that asked 15 times was pushed out by 300 one-off keys and came back
/// to a fresh bucket).
#[tokio::test]
async fn a_key_that_keeps_asking_is_not_pushed_out_by_one_off_keys() {
    let limit = "rate = \"1/m\", burst = 1, key = \"header:x-key\", max_keys = 200";
    let gw = TestGateway::from_toml(&respond_toml("rl_keep", limit)).await;
    let url = gw.url("/");
    let busy = [("x-key", "busy")];
    let mut allowed = 0;
    for _ in 0..15 {
        allowed += usize::from(get_with(&url, &busy).await.0 == 200);
    }
    assert_eq!(allowed, 1, "burst 1");
    for i in 0..300 {
        let key = format!("one-off-{i}");
        assert_eq!(get_with(&url, &[("x-key", &key)]).await.0, 200, "a one-off key has a bucket of its own");
    }
    // The local buckets are counted (moka's pending evictions applied) every 5 s.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    let m = metrics_text(gw.addr).await;
    let evicted = metric(&m, "gateway_rate_limit_keys_evicted_total", &[("route", "rl_keep")]);
    assert!(evicted >= 100.0, "the store went past max_keys: {evicted} evicted");
    assert_eq!(get_with(&url, &busy).await.0, 429, "the busy key kept its empty bucket");
}
