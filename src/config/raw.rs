//! The raw (serde) shape of the configuration file. Unknown keys are refused
//! so a typo is an error, not a silently ignored setting. Durations and sizes
//! stay strings here; `validate` parses them so that an error names its full
//! key path (`routes[1].timeout`), which serde adapters' errors do not carry
//! through the `config` crate.
//!
//! Every type's `expecting` says what it accepts in the file's words, so a
//! value of the wrong shape is never answered with a Rust type's name
//! (serde's "invalid type: ..., expected" goes before it). A value of more
//! than one form (`RawSize`, `RawSticky`, ...) is read by hand in `either`.

use std::collections::BTreeMap;

use serde::Deserialize;

mod either;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (the whole file)")]
pub(super) struct RawConfig {
    pub server: RawServer,
    pub metrics: RawMetrics,
    #[serde(default)]
    pub tracing: RawTracing,
    #[serde(default)]
    pub resolver: RawResolver,
    #[serde(default)]
    pub upstreams: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    pub routes: Vec<RawRoute>,
    pub rate_limit_store: Option<super::ratelimit::RawRateLimitStore>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ([server])")]
pub(super) struct RawServer {
    pub listen: String,
    pub worker_threads: usize,
    pub header_read_timeout: String,
    pub idle_timeout: String,
    pub send_timeout: String,
    pub park_after: String,
    pub tcp_keepalive: String,
    pub shutdown_timeout: String,
    pub shutdown_delay: String,
    pub max_connections: usize,
    pub access_log: bool,
    pub max_header_size: RawSize,
    pub max_uri_length: RawSize,
    pub max_body: RawSize,
    pub request_buffer_total: RawSize,
    pub drop_underscore_headers: bool,
    pub merge_slashes: bool,
    pub reject_encoded_slash: bool,
    pub request_id: bool,
    pub trace_context: bool,
    pub access_log_format: Option<String>,
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    pub tls: Option<RawServerTls>,
    pub watch_config: bool,
    pub via: Option<String>,
    pub http1: Option<String>,
    pub http2: Option<String>,
}

/// `[resolver]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ([resolver])")]
pub(super) struct RawResolver {
    pub nameservers: Option<Vec<String>>,
    pub timeout: Option<String>,
    pub attempts: Option<usize>,
}

/// `[upstreams.NAME] discover = { ... }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (discover = { dns = \"name:port\" })")]
pub(super) struct RawDiscover {
    pub dns: Option<String>,
    pub srv: Option<String>,
    pub scheme: Option<String>,
    pub interval: Option<String>,
    pub min_ttl: Option<String>,
    pub max_ttl: Option<String>,
}

/// `[server.tls]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ([server.tls])")]
pub(super) struct RawServerTls {
    pub cert: Option<String>,
    pub key: Option<String>,
    pub client_ca: Option<String>,
}

/// A size: a plain integer (bytes) or a string such as "64KiB".
#[derive(Debug, Clone)]
pub(super) enum RawSize {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ([tracing])")]
pub(super) struct RawTracing {
    pub otlp_endpoint: Option<String>,
    pub service_name: Option<String>,
}

/// `{ set = { name = value, ... }, remove = [name, ...] }`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ({ set = { \"x-env\" = \"prod\" }, remove = [\"x-debug\"] })")]
pub(super) struct RawHeaderRules {
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ([metrics])")]
pub(super) struct RawMetrics {
    pub path: String,
    pub listen: Option<String>,
    pub max_connections: usize,
    /// The admin listener's client address list.
    pub allow: Option<Vec<String>>,
    /// Host names the admin listener answers besides IP addresses and
    /// `localhost`.
    pub hosts: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ([upstreams.NAME])")]
pub(super) struct RawUpstream {
    pub url: Option<String>,
    pub endpoints: Option<Vec<RawEndpoint>>,
    pub discover: Option<RawDiscover>,
    pub balance: Option<String>,
    pub connect_timeout: Option<String>,
    pub pool_max_idle_per_host: Option<usize>,
    pub pool_idle_timeout: Option<String>,
    pub max_requests: Option<RawMaxRequests>,
    pub auto_min: Option<usize>,
    pub auto_max: Option<usize>,
    pub queue: Option<usize>,
    pub queue_timeout: Option<String>,
    pub health: Option<RawHealth>,
    pub outlier: Option<RawOutlier>,
    pub retry_budget: Option<RawRetryBudget>,
    pub tls_ca_file: Option<String>,
    pub tls_server_name: Option<String>,
    pub tls_client_cert: Option<String>,
    pub tls_client_key: Option<String>,
    pub protocol: Option<String>,
    pub max_connections: Option<usize>,
}

/// `max_requests`: a number, or `"auto"`.
#[derive(Debug, Clone)]
pub(super) enum RawMaxRequests {
    Count(u64),
    Text(String),
}

/// An entry of `endpoints`: a URL (weight 1) or `{ url, weight }`.
#[derive(Debug, Clone)]
pub(super) enum RawEndpoint {
    Url(String),
    Weighted(RawWeighted),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ({ url = \"http://host:port\", weight = 2 })")]
pub(super) struct RawWeighted {
    pub url: String,
    pub weight: Option<u32>,
}

impl RawEndpoint {
    pub fn url(&self) -> &String {
        match self {
            RawEndpoint::Url(url) | RawEndpoint::Weighted(RawWeighted { url, .. }) => url,
        }
    }

    pub fn weight(&self) -> Option<u32> {
        match self {
            RawEndpoint::Url(_) => None,
            RawEndpoint::Weighted(w) => w.weight,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (health = { path = \"/healthz\" })")]
pub(super) struct RawHealth {
    pub path: Option<String>,
    pub interval: Option<String>,
    pub timeout: Option<String>,
    pub unhealthy_after: Option<u32>,
    pub healthy_after: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (outlier = { consecutive_failures = 5 })")]
pub(super) struct RawOutlier {
    pub consecutive_failures: Option<u32>,
    pub ejection_time: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (retry_budget = { ratio = 0.2 })")]
pub(super) struct RawRetryBudget {
    pub ratio: Option<f64>,
    pub min_per_second: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ([[routes]])")]
pub(super) struct RawRoute {
    pub name: Option<String>,
    pub prefix: Option<String>,
    /// Matchers besides the prefix (see `validate::routing`).
    pub hosts: Option<Vec<String>>,
    pub headers: Option<BTreeMap<String, RawWant>>,
    pub query: Option<BTreeMap<String, RawWant>>,
    pub upstream: Option<String>,
    /// Weighted upstreams instead of one (see `router::split`).
    pub split: Option<Vec<RawSplit>>,
    pub sticky: Option<RawSticky>,
    pub mirror: Option<RawMirror>,
    pub file: Option<String>,
    pub dir: Option<String>,
    /// A `dir` route serves files and directories whose names start with a
    /// dot (`.git`, `.env`); default no (404), `.well-known` always.
    pub dotfiles: Option<bool>,
    pub respond: Option<RawRespond>,
    pub redirect: Option<RawRedirect>,
    pub rewrite: Option<String>,
    pub timeout: Option<String>,
    pub methods: Option<Vec<String>>,
    pub host: Option<String>,
    pub max_body: Option<RawSize>,
    pub request_buffer: Option<RawSize>,
    pub max_concurrent: Option<usize>,
    pub body_timeout: Option<String>,
    pub retries: Option<u32>,
    pub retry_on: Option<Vec<String>>,
    pub upgrade: Option<bool>,
    pub upgrade_idle_timeout: Option<String>,
    pub request_headers: Option<RawHeaderRules>,
    pub response_headers: Option<RawHeaderRules>,
    pub compress: Option<bool>,
    pub cache: Option<RawCache>,
    pub rate_limit: Option<super::ratelimit::RawRateLimit>,
    /// Access control (see `raw_access`).
    pub allow: Option<Vec<String>>,
    pub deny: Option<Vec<String>>,
    pub auth: Option<super::raw_access::RawAuth>,
    pub forward_credentials: Option<bool>,
    /// Debug builds only: the route panics (for the panic-isolation tests).
    pub panic: Option<String>,
}

/// A route's `mirror = { upstream, percent }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (mirror = { upstream = \"NAME\", percent = 10 })")]
pub(super) struct RawMirror {
    pub upstream: String,
    pub percent: Option<f64>,
}

/// A split's `sticky`: `"header:NAME"`, `"cookie:NAME"`, or a table
/// `{ header = "NAME" }` / `{ cookie = "NAME", set = true, max_age = "30d" }`.
#[derive(Debug, Clone)]
pub(super) enum RawSticky {
    Text(String),
    Table(RawStickyTable),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ({ cookie = \"NAME\" })")]
pub(super) struct RawStickyTable {
    pub header: Option<String>,
    pub cookie: Option<String>,
    pub set: Option<bool>,
    pub max_age: Option<String>,
}

/// One upstream of a route's `split`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ({ upstream = \"NAME\", weight = 1 })")]
pub(super) struct RawSplit {
    pub upstream: String,
    pub weight: u32,
}

/// A `headers` or `query` condition: a text to equal (`"*"`: present),
/// `true` (present), `false` (absent), or `{ regex = "..." }`.
#[derive(Debug, Clone)]
pub(super) enum RawWant {
    Flag(bool),
    Text(String),
    Pattern(RawPattern),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table ({ regex = \"...\" })")]
pub(super) struct RawPattern {
    pub regex: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (redirect = { location = \"https://...\" })")]
pub(super) struct RawRedirect {
    pub status: Option<u16>,
    pub location: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (respond = { status = 200, body = \"...\" })")]
pub(super) struct RawRespond {
    pub status: Option<u16>,
    pub body: Option<String>,
}

/// A proxy route's `cache = { ... }`; every key has a default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (cache = { max_size = \"64MiB\" })")]
pub(super) struct RawCache {
    pub max_size: Option<RawSize>,
    pub max_entry: Option<RawSize>,
    pub default_ttl: Option<String>,
    pub coalesce: Option<bool>,
    pub stale_while_revalidate: Option<String>,
    pub stale_if_error: Option<String>,
    pub targeted: Option<Vec<String>>,
}
