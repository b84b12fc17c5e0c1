//! What a rate limit's bucket is kept for, end to end: the local buckets
//! at `max_keys` under a flood of distinct keys; header values that are
//! credentials or long, locally and in a real `redis-server`.

mod auth_common;
mod common;

use bytes::Bytes;
use common::redis_server::Redis;
use common::*;
use http::Request;

/// A GET with `headers`: the status.
async fn status(url: &str, headers: &[(&str, &str)]) -> u16 {
    let mut req = Request::get(url);
    for (n, v) in headers {
        req = req.header(*n, *v);
    }
    send(req.body(full(Bytes::new())).unwrap()).await.0.status.as_u16()
}

fn respond_route(name: &str, limit: &str) -> String {
    format!("[server]\n[[routes]]\nname = \"{name}\"\nprefix = \"/\"\nrespond = {{ status = 200 }}\n{limit}\n")
}

#[tokio::test]
async fn at_max_keys_a_new_key_still_gets_its_own_burst_and_a_busy_one_stays_limited() {
    let limit = "rate_limit = { rate = \"1/m\", burst = 3, key = \"header:X-Key\", max_keys = 50 }";
    let gw = TestGateway::from_toml(&respond_route("rl_full", limit)).await;
    let url = gw.url("/");
    // The flood: many more one-off keys than the store holds.
    for i in 0..400 {
        status(&url, &[("x-key", &format!("flood-{i}"))]).await;
    }
    let mut fresh = Vec::new();
    for _ in 0..4 {
        fresh.push(status(&url, &[("x-key", "fresh")]).await);
    }
    assert_eq!(fresh, [200, 200, 200, 429], "a new key has its own bucket (burst 3), not one shared by the flood");
    let mut busy = Vec::new();
    for _ in 0..12 {
        busy.push(status(&url, &[("x-key", "busy")]).await);
    }
    let allowed = busy.iter().filter(|s| **s == 200).count();
    assert!((3..=5).contains(&allowed) && busy[6..].iter().all(|s| *s == 429), "a key that keeps asking: {busy:?}");
    let m = metrics_text(gw.addr).await;
    let evicted = sample(&m, "gateway_rate_limit_keys_evicted_total", &[("route", "rl_full")]).unwrap_or(0.0);
    assert!(evicted >= 300.0, "the keys let go at max_keys are counted: {evicted}");
}

/// `key = "header:authorization"` (and any header value through Redis): a
/// credential never becomes part of a Redis key, nor does a long value;
/// both are kept as their SHA-256 and still count per value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_or_a_long_value_is_never_a_redis_key() {
    let Some(redis) = Redis::start() else { return };
    let route = |name: &str, header: &str| {
        format!(
            "[[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nrespond = {{ status = 200 }}\n\
             rate_limit = {{ rate = \"1/m\", burst = 1, key = \"header:{header}\", shared = \"redis\" }}\n"
        )
    };
    let toml = format!(
        "[server]\n{}{}[rate_limit_store]\nurl = \"{}\"\ntimeout = \"1s\"\n",
        route("rl_cred", "Authorization"),
        route("rl_tenant", "X-Tenant"),
        redis.url()
    );
    let gw = TestGateway::from_toml(&toml).await;
    let (cred, url) = ("Basic YW5uOnNlY3JldC1wYXNzd29yZA==", gw.url("/rl_cred"));
    assert_eq!(status(&url, &[("authorization", cred)]).await, 200);
    assert_eq!(status(&url, &[("authorization", cred)]).await, 429, "the credential's own bucket");
    assert_eq!(status(&url, &[("authorization", "Basic b3RoZXI6b25l")]).await, 200, "another's");
    let long = "t".repeat(4000);
    let url = gw.url("/rl_tenant");
    for (value, want) in [(long.as_str(), 200), (long.as_str(), 429), ("short", 200)] {
        assert_eq!(status(&url, &[("x-tenant", value)]).await, want);
    }
    let keys = redis.cmd(&["KEYS", "gateway:rl:*"]).expect("KEYS");
    let keys: Vec<String> = redis::from_redis_value(keys).unwrap();
    let shown: Vec<&str> = keys.iter().map(|k| &k[..k.len().min(60)]).collect();
    assert_eq!(keys.len(), 4, "{shown:?}");
    assert!(keys.iter().all(|k| !k.contains("YW5u") && !k.contains("Basic") && k.len() < 100), "{shown:?}");
    assert!(
        keys.contains(&"gateway:rl:rl_tenant:h:short".to_owned()),
        "a short value of a header that names no secret stays readable"
    );
}

/// `key = "header:authorization"` on a route with Basic `auth`: the limit
/// reads the header before the credentials are checked (and removed), so
/// each credential has its own bucket.
#[tokio::test]
async fn a_limit_keyed_on_authorization_counts_each_credential() {
    let dir = tempfile::tempdir().unwrap();
    auth_common::htpasswd(dir.path(), 4);
    let limited = "respond = { status = 200 }\nauth = { basic = { htpasswd = \"users.htpasswd\" } }\n\
                   rate_limit = { rate = \"1/m\", burst = 2, key = \"header:Authorization\", missing_key = \"refuse\" }";
    let toml = format!("[server]\n[[routes]]\nname = \"rl_cred_local\"\nprefix = \"/\"\n{limited}\n");
    let gw = TestGateway::start(config(&toml, dir.path())).await;
    let url = gw.url("/");
    for user in ["ann", "bob"] {
        let credential = auth_common::basic(user, &format!("pw-{user}"));
        let mut statuses = Vec::new();
        for _ in 0..3 {
            statuses.push(status(&url, &[("authorization", &credential)]).await);
        }
        assert_eq!(statuses, [200, 200, 429], "{user}: a bucket of its own");
    }
    assert_eq!(status(&url, &[]).await, 429, "no credential: missing_key = \"refuse\"");
}

/// One function decides the client for a route's `allow` and for its rate
/// limit. Behind a trusted proxy, an empty `X-Forwarded-For` element (which
/// RFC 9110 §5.6.1 says to ignore) names the same client for both; an
/// IPv4-mapped address is the IPv4 one for both; a broken chain is refused.
#[tokio::test]
async fn address_lists_and_the_rate_limit_read_one_client() {
    let route = "allow = [\"198.51.100.0/24\"]\nrate_limit = { rate = \"1/m\", burst = 1 }";
    let toml = format!(
        "[server]\ntrusted_proxies = [\"127.0.0.1\"]\n[[routes]]\nname = \"rl_one\"\nprefix = \"/\"\n\
         respond = {{ status = 200 }}\n{route}\n"
    );
    let gw = TestGateway::from_toml(&toml).await;
    let url = gw.url("/");
    for forwarded in ["198.51.100.1,", "198.51.100.2, ,", "::ffff:198.51.100.3"] {
        let xff = [("x-forwarded-for", forwarded)];
        assert_eq!(status(&url, &xff).await, 200, "{forwarded}: admitted, with a bucket of its own");
        assert_eq!(status(&url, &xff).await, 429, "{forwarded}: and that bucket is spent");
    }
    assert_eq!(status(&url, &[("x-forwarded-for", "198.51.100.3")]).await, 429, "the mapped address was this one");
    assert_eq!(status(&url, &[("x-forwarded-for", "bogus")]).await, 403, "a broken chain is refused");
}
