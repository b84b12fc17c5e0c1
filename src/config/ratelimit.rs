//! A route's `rate_limit` and the top-level `[rate_limit_store]`: their
//! runtime types and the raw (serde) shape they are read from. Validation is
//! in `validate::ratelimit`; the limiter itself in `crate::ratelimit`.

use std::path::PathBuf;
use std::time::Duration;

use http::HeaderName;
use serde::Deserialize;

/// A route's `rate_limit = { rate, burst, key, ... }`.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitConfig {
    /// The sustained rate: `count` requests per `period`.
    pub rate: Rate,
    /// Requests a fresh key may send at once (the bucket's size).
    pub burst: u32,
    /// What one bucket is kept for.
    pub key: RateLimitKey,
    /// Allowed responses carry the `RateLimit` header too.
    pub headers: bool,
    /// Where the buckets are kept.
    pub store: StoreKind,
    /// Keys the local buckets hold at most; at it, the keys asked for least
    /// often are evicted.
    pub max_keys: usize,
}

/// `count` requests per `period` (`"100/s"`, `"600/m"`, `"10/5s"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub count: u32,
    pub period: Duration,
}

impl Rate {
    /// The time one request's allowance takes to come back (GCRA's `T`).
    pub fn interval(&self) -> Duration {
        self.period / self.count
    }
}

/// The bucket a request is counted in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitKey {
    /// The client's address, with the `server.trusted_proxies` rule for
    /// `X-Forwarded-For`.
    Client,
    /// The value of a request header (in either spelling of `-` and `_`).
    Header { name: HeaderName, missing: MissingKey },
    /// One bucket for the whole route.
    Route,
}

/// What a `header:` key does with a request without the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingKey {
    /// Such requests share one bucket (the default).
    Share,
    /// Such requests are refused with 429.
    Refuse,
}

/// Where a route's buckets are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// In this gateway's memory.
    Local,
    /// In `[rate_limit_store]`, shared by every gateway using it.
    Redis,
}

/// `[rate_limit_store]`: the Redis that `shared = "redis"` routes use.
#[derive(Debug, Clone, PartialEq)]
pub struct RateLimitStoreConfig {
    /// `redis://` or `rediss://` URL (a password in it is not logged).
    pub url: String,
    /// The password, read at load from the variable `password_env` names.
    pub password: Option<String>,
    /// The longest a request waits for a decision from Redis.
    pub timeout: Duration,
    /// What decides while Redis is slower than `timeout` or down.
    pub on_error: OnStoreError,
    /// `ca_file` (`rediss://` only): the CAs Redis's certificate must chain
    /// to, instead of webpki's roots.
    pub ca_file: Option<StoreCa>,
}

/// `[rate_limit_store] ca_file`, read and checked at load.
#[derive(Clone, PartialEq)]
pub struct StoreCa {
    /// The file, relative paths taken from the config's folder.
    pub path: PathBuf,
    /// Its PEM text, as the `redis` crate takes it; compared by a reload,
    /// so that a renewed CA makes a new connection.
    pub pem: Vec<u8>,
}

impl std::fmt::Debug for StoreCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreCa").field("path", &self.path).field("pem", &self.pem.len()).finish()
    }
}

/// `on_error`: who decides while Redis cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnStoreError {
    /// This gateway's own limiter, with the route's rate (the default).
    Local,
    /// Every request is allowed.
    Allow,
    /// Every request is refused with 429.
    Deny,
}

impl OnStoreError {
    pub fn as_str(self) -> &'static str {
        match self {
            OnStoreError::Local => "local",
            OnStoreError::Allow => "allow",
            OnStoreError::Deny => "deny",
        }
    }
}

/// The raw `rate_limit` of a route.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (rate_limit = { rate = \"100/s\" })")]
pub(super) struct RawRateLimit {
    pub rate: Option<String>,
    pub burst: Option<u32>,
    pub key: Option<String>,
    pub missing_key: Option<String>,
    pub headers: Option<bool>,
    pub shared: Option<String>,
    pub max_keys: Option<usize>,
}

/// The raw `[rate_limit_store]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ([rate_limit_store])")]
pub(super) struct RawRateLimitStore {
    pub url: Option<String>,
    pub password_env: Option<String>,
    pub timeout: Option<String>,
    pub on_error: Option<String>,
    pub ca_file: Option<String>,
}
