//! Per-route rate limits: how many requests each client (or API key, or the
//! whole route) may send, decided before a request reaches the upstream, its
//! queue or the route's concurrency limit.
//!
//! - `local`: the buckets in this gateway's memory (GCRA as the Redis store's, each
//!   key's state in two moka caches bounded at `max_keys` together);
//! - `redis`: the buckets shared through Redis, and what happens while
//!   Redis cannot decide (`on_error`).
//!
//! A refusal is [`GatewayError::RateLimited`]: 429 with `Retry-After` and
//! the `RateLimit-Policy` and `RateLimit` fields of
//! draft-ietf-httpapi-ratelimit-headers-10 (structured fields: a policy
//! named after the route, `q` requests per `w` seconds; `r` remaining and
//! `t` seconds until the bucket is full again, or until the next request is
//! allowed when `r` is 0).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Request};
use ipnet::IpNet;
use sha2::{Digest, Sha256};

use crate::config::{MissingKey, OnStoreError, RateLimitConfig, RateLimitKey, StoreKind};
use crate::error::GatewayError;
use crate::request::Peer;

mod keys;
pub mod local;
pub mod metrics;
pub mod redis;
mod segments;

use local::{Key, Local};
use metrics::LimiterMetrics;
pub use redis::RedisStore;

/// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10 §3).
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
/// `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10 §4).
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The longest header value a bucket is kept for as sent; a longer one (up
/// to `server.max_header_size`) is kept as its SHA-256, so that neither a
/// local key nor a Redis key grows with what a client sends.
const LONGEST_KEPT: usize = 64;

/// One decision on one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    /// Requests the bucket would still allow at once.
    pub remaining: u32,
    /// For a refusal: until the next request would be allowed.
    pub retry_after: Duration,
    /// Until the bucket is full again.
    pub reset: Duration,
}

/// A route's rate limit with its buckets.
pub struct RouteLimiter {
    pub config: RateLimitConfig,
    route: String,
    local: Local,
    shared: Option<Arc<RedisStore>>,
    /// The `RateLimit-Policy` value, the same on every answer.
    policy: HeaderValue,
    /// A `header:` key's header names a secret (the `/-/config` rule):
    /// its values are kept only as digests.
    secret_values: bool,
    metrics: LimiterMetrics,
}

impl RouteLimiter {
    /// The limiter of route `route`; `store` is the shared store, for a
    /// `shared = "redis"` limit. Starts the count of its local keys.
    pub fn new(route: &str, config: &RateLimitConfig, store: Option<Arc<RedisStore>>) -> Arc<RouteLimiter> {
        let shared = if config.store == StoreKind::Redis { store } else { None };
        let policy = format!("\"{route}\";q={};w={}", config.rate.count, config.rate.period.as_secs());
        let metrics = LimiterMetrics::new(route);
        let secret_values =
            matches!(&config.key, RateLimitKey::Header { name, .. } if crate::config::names_secret(name.as_str()));
        let limiter = Arc::new(RouteLimiter {
            config: config.clone(),
            route: route.to_owned(),
            local: Local::new(config, metrics.removals()),
            shared,
            policy: HeaderValue::from_str(&policy).expect("route names are tokens"),
            secret_values,
            metrics,
        });
        local::spawn_counter(&limiter, |l: &RouteLimiter| &l.local, |l, held| l.metrics.counted(held));
        limiter
    }

    /// Whether this limiter can go on serving `config` on the route of the
    /// same name after a reload (its buckets are kept).
    pub fn same_settings(&self, config: &RateLimitConfig, store: Option<&Arc<RedisStore>>) -> bool {
        let same_store = match (&self.shared, store) {
            (None, _) => config.store == StoreKind::Local,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (Some(_), None) => false,
        };
        self.config == *config && same_store
    }

    /// The request header it is keyed by, if any.
    pub fn key_header(&self) -> Option<&HeaderName> {
        match &self.config.key {
            RateLimitKey::Header { name, .. } => Some(name),
            _ => None,
        }
    }

    /// Counts the request in its bucket: `Ok` with the fields for the
    /// response when `headers = true`, or the refusal.
    pub async fn admit<B>(
        &self,
        req: &Request<B>,
        peer: &Peer,
        trusted: &[IpNet],
    ) -> Result<Option<Fields>, GatewayError> {
        let Some(key) = self.key(req, peer, trusted) else {
            self.metrics.decided("local", false);
            return Err(GatewayError::RateLimited {
                retry_after: None,
                policy: self.policy.clone(),
                state: self.state(0, Duration::ZERO),
            });
        };
        let decision = match &self.shared {
            None => self.local_decision(&key),
            // Boxed: only shared routes pay for the future's size.
            Some(store) => Box::pin(self.shared(store, &key)).await,
        };
        if decision.allowed {
            return Ok(self.config.headers.then(|| Fields {
                policy: self.policy.clone(),
                state: self.state(decision.remaining, decision.reset),
            }));
        }
        Err(GatewayError::RateLimited {
            retry_after: Some(ceil_secs(decision.retry_after).max(1)),
            policy: self.policy.clone(),
            state: self.state(0, decision.retry_after),
        })
    }

    /// Redis's decision, or `on_error`'s while Redis cannot give one.
    async fn shared(&self, store: &RedisStore, key: &Key) -> Decision {
        let redis_key = redis_key(&self.route, key);
        match store.decide(&redis_key, self.config.rate.interval(), self.config.burst).await {
            Ok(d) => {
                self.metrics.decided("redis", d.allowed);
                d
            }
            Err(e) => {
                metrics::rate_limit_store_error(e.kind());
                let d = match store.config.on_error {
                    OnStoreError::Local => return self.local_decision(key),
                    OnStoreError::Allow => Decision {
                        allowed: true,
                        remaining: self.config.burst,
                        retry_after: Duration::ZERO,
                        reset: Duration::ZERO,
                    },
                    OnStoreError::Deny => Decision {
                        allowed: false,
                        remaining: 0,
                        retry_after: redis::PROBE_EVERY,
                        reset: redis::PROBE_EVERY,
                    },
                };
                self.metrics.decided("on_error", d.allowed);
                d
            }
        }
    }

    fn local_decision(&self, key: &Key) -> Decision {
        let d = self.local.decide(key);
        self.metrics.decided("local", d.allowed);
        d
    }

    /// The bucket of a request; `None` when it has no key and such requests
    /// are refused.
    fn key<B>(&self, req: &Request<B>, peer: &Peer, trusted: &[IpNet]) -> Option<Key> {
        match &self.config.key {
            RateLimitKey::Route => Some(Key::Shared),
            // Past a broken X-Forwarded-For chain, the last address believed
            // (a trusted proxy's): such requests share that proxy's bucket.
            RateLimitKey::Client => {
                Some(Key::Client(keys::client_block(peer.client(req.headers(), trusted).believed())))
            }
            RateLimitKey::Header { name, missing } => match keys::header_value(req, name) {
                Some(value) => Some(value_key(&value, self.secret_values)),
                None if *missing == MissingKey::Share => Some(Key::Shared),
                None => None,
            },
        }
    }

    /// A `RateLimit` value.
    fn state(&self, remaining: u32, reset: Duration) -> HeaderValue {
        let value = format!("\"{}\";r={remaining};t={}", self.route, ceil_secs(reset));
        HeaderValue::from_str(&value).expect("route names are tokens")
    }
}

/// The `RateLimit-Policy` and `RateLimit` items of an answer to a request
/// the limit let through (`headers = true`).
#[derive(Debug, Clone)]
pub struct Fields {
    pub policy: HeaderValue,
    pub state: HeaderValue,
}

impl Fields {
    /// Appends the gateway's items after the upstream's own: both fields
    /// are lists (draft-ietf-httpapi-ratelimit-headers-10 §3, §4), and the
    /// upstream's limits are the client's to know as well.
    pub fn append_to(&self, headers: &mut HeaderMap) {
        append_item(headers, RATELIMIT_POLICY, &self.policy);
        append_item(headers, RATELIMIT, &self.state);
    }
}

/// `name`'s field lines and `item` as one list (RFC 9651 §3.1), empty
/// lines left out; `item` alone when there are none.
fn append_item(headers: &mut HeaderMap, name: HeaderName, item: &HeaderValue) {
    let mut joined = Vec::new();
    for line in headers.get_all(&name) {
        let line = line.as_bytes().trim_ascii();
        if !line.is_empty() {
            joined.extend_from_slice(line);
            joined.extend_from_slice(b", ");
        }
    }
    let value = if joined.is_empty() {
        item.clone()
    } else {
        joined.extend_from_slice(item.as_bytes());
        HeaderValue::from_bytes(&joined).unwrap_or_else(|_| item.clone())
    };
    headers.insert(name, value);
}

/// The bucket of a header's value: as sent, or its SHA-256 when it is
/// longer than [`LONGEST_KEPT`] or `secret` (a credential is then neither
/// held in memory nor written to Redis).
fn value_key(value: &[u8], secret: bool) -> Key {
    if secret || value.len() > LONGEST_KEPT {
        Key::Digest(Sha256::digest(value).into())
    } else {
        Key::Value(value.into())
    }
}

/// The Redis key of a bucket: the route's name and what it is kept for.
fn redis_key(route: &str, key: &Key) -> Vec<u8> {
    let mut out = format!("gateway:rl:{route}:").into_bytes();
    match key {
        Key::Client(ip) => out.extend_from_slice(format!("c:{ip}").as_bytes()),
        Key::Value(v) => {
            out.extend_from_slice(b"h:");
            out.extend_from_slice(v);
        }
        Key::Digest(d) => {
            out.extend_from_slice(b"d:");
            for b in d {
                let _ = write!(out, "{b:02x}");
            }
        }
        Key::Shared => out.push(b'-'),
    }
    out
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Rate;

    fn limiter(key: RateLimitKey, headers: bool) -> Arc<RouteLimiter> {
        let config = RateLimitConfig {
            rate: Rate { count: 2, period: Duration::from_secs(10) },
            burst: 2,
            key,
            headers,
            store: StoreKind::Local,
            max_keys: 100,
        };
        RouteLimiter::new("api", &config, None)
    }

    fn peer(ip: [u8; 4]) -> Peer {
        Peer::new(ip.into(), false, false)
    }

    #[tokio::test]
    async fn refusals_carry_the_fields_and_retry_after() {
        let l = limiter(RateLimitKey::Client, true);
        let h = Request::new(());
        let first = l.admit(&h, &peer([192, 0, 2, 1]), &[]).await.unwrap();
        let first = first.unwrap();
        assert_eq!(
            (first.policy.to_str().unwrap(), first.state.to_str().unwrap()),
            ("\"api\";q=2;w=10", "\"api\";r=1;t=5")
        );
        assert!(l.admit(&h, &peer([192, 0, 2, 1]), &[]).await.is_ok());
        match l.admit(&h, &peer([192, 0, 2, 1]), &[]).await {
            Err(GatewayError::RateLimited { retry_after: Some(5), policy, state }) => {
                assert_eq!(policy, "\"api\";q=2;w=10");
                assert_eq!(state, "\"api\";r=0;t=5");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(l.admit(&h, &peer([192, 0, 2, 2]), &[]).await.is_ok(), "another client has its own bucket");
    }

    #[test]
    fn a_client_key_is_the_right_most_untrusted_address_or_the_last_believed() {
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        let proxy: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        let outsider: std::net::IpAddr = "203.0.113.9".parse().unwrap();
        let cases: &[(std::net::IpAddr, &[&str], &str)] = &[
            // An untrusted peer: its own address, whatever it claims.
            (outsider, &["198.51.100.1"], "203.0.113.9"),
            (outsider, &[], "203.0.113.9"),
            // A trusted peer without the header: the peer.
            (proxy, &[], "10.0.0.1"),
            // A trusted peer: the right-most address that is not a proxy.
            (proxy, &["198.51.100.1"], "198.51.100.1"),
            (proxy, &["1.1.1.1, 198.51.100.1, 10.0.0.7"], "198.51.100.1"),
            (proxy, &["1.1.1.1, 198.51.100.1", "10.0.0.7"], "198.51.100.1"),
            // Every entry a proxy: the left-most one.
            (proxy, &["10.0.0.3, 10.0.0.7"], "10.0.0.3"),
            // Garbage ends the walk at the last address believed.
            (proxy, &["1.1.1.1, bogus, 10.0.0.7"], "10.0.0.7"),
            (proxy, &["bogus"], "10.0.0.1"),
            // Ports and IPv6 brackets, as some proxies write them.
            (proxy, &["198.51.100.1:4711"], "198.51.100.1"),
            (proxy, &["[2001:db8::1]:443"], "2001:db8::1"),
            (proxy, &["::ffff:198.51.100.1"], "198.51.100.1"),
            ("::1".parse().unwrap(), &["2001:db8::2"], "2001:db8::2"),
        ];
        for (ip, values, want) in cases {
            let mut headers = http::HeaderMap::new();
            for v in *values {
                headers.append(crate::headers::X_FORWARDED_FOR, HeaderValue::from_str(v).unwrap());
            }
            let peer = Peer::new(*ip, trusted.iter().any(|n| n.contains(ip)), false);
            let got = peer.client(&headers, &trusted).believed();
            assert_eq!(got, want.parse::<std::net::IpAddr>().unwrap(), "{ip} {values:?}");
        }
    }

    #[tokio::test]
    async fn requests_without_the_header_share_a_bucket_or_are_refused() {
        let name = HeaderName::from_static("x-api-key");
        let share = limiter(RateLimitKey::Header { name: name.clone(), missing: MissingKey::Share }, false);
        let refuse = limiter(RateLimitKey::Header { name, missing: MissingKey::Refuse }, false);
        let h = Request::new(());
        for ip in [[192, 0, 2, 1], [192, 0, 2, 2]] {
            assert!(share.admit(&h, &peer(ip), &[]).await.is_ok());
        }
        assert!(share.admit(&h, &peer([192, 0, 2, 3]), &[]).await.is_err(), "one bucket for all without a key");
        assert!(matches!(
            refuse.admit(&h, &peer([192, 0, 2, 1]), &[]).await,
            Err(GatewayError::RateLimited { retry_after: None, .. })
        ));
    }

    #[test]
    fn a_long_value_or_a_secret_is_kept_as_its_digest() {
        let short = [b'k'; LONGEST_KEPT];
        let long = [b'k'; LONGEST_KEPT + 1];
        assert_eq!(value_key(&short, false), Key::Value(short[..].into()));
        assert_eq!(value_key(&long, false), Key::Digest(Sha256::digest(long).into()));
        assert_eq!(value_key(b"Basic YTpi", true), Key::Digest(Sha256::digest(b"Basic YTpi").into()));
        assert_ne!(value_key(&long, false), value_key(&[b'k'; LONGEST_KEPT + 2], false));
        assert_eq!(format!("{:?}", value_key(b"Basic YTpi", true)), "Digest");
        assert_eq!(format!("{:?}", value_key(b"tenant-7", false)), "Value(8 bytes)", "never the value itself");
        let limiter = |name: &'static str| {
            let key = RateLimitKey::Header { name: HeaderName::from_static(name), missing: MissingKey::Share };
            limiter(key, false).secret_values
        };
        assert!(
            limiter("authorization") && limiter("cookie") && limiter("x-api-key") && limiter("proxy-authorization")
        );
        assert!(!limiter("x-tenant"));
    }

    #[test]
    fn the_gateways_items_follow_the_upstreams() {
        let item = HeaderValue::from_static("\"gw\";r=1;t=5");
        let cases: &[(&[&str], &str)] = &[
            (&[], "\"gw\";r=1;t=5"),
            (&["\"up\";r=9;t=1"], "\"up\";r=9;t=1, \"gw\";r=1;t=5"),
            (&["\"a\";r=1, \"b\";r=2", "\"c\";r=3"], "\"a\";r=1, \"b\";r=2, \"c\";r=3, \"gw\";r=1;t=5"),
            (&["", " "], "\"gw\";r=1;t=5"),
        ];
        for (lines, want) in cases {
            let mut h = HeaderMap::new();
            for l in *lines {
                h.append(RATELIMIT, HeaderValue::from_str(l).unwrap());
            }
            append_item(&mut h, RATELIMIT, &item);
            assert_eq!(h.get_all(RATELIMIT).iter().collect::<Vec<_>>(), [*want], "{lines:?}");
        }
    }

    #[test]
    fn redis_keys() {
        assert_eq!(redis_key("api", &Key::Client([192, 0, 2, 1].into())), b"gateway:rl:api:c:192.0.2.1");
        assert_eq!(redis_key("api", &Key::Value(b"k1"[..].into())), b"gateway:rl:api:h:k1");
        assert_eq!(redis_key("api", &Key::Shared), b"gateway:rl:api:-");
        let digest = redis_key("api", &Key::Digest([0xab; 32]));
        assert_eq!(digest, format!("gateway:rl:api:d:{}", "ab".repeat(32)).as_bytes());
        assert_eq!((ceil_secs(Duration::from_millis(1)), ceil_secs(Duration::from_secs(2))), (1, 2));
    }
}
