//! Configuration: loading (built-in defaults, then the TOML file, then
//! `GATEWAY__SECTION__KEY` environment overrides) and validation into the
//! runtime types the server uses.
//!
//! Loading and validation happen before any socket is bound. Every error names
//! the source (the file, or the embedded default), the key and what is wrong,
//! so `gateway` can print it and exit with status 64 (EX_USAGE).
//!
//! `raw` holds the serde shape of the file, `validate` turns it into the
//! runtime types below (an upstream's in `upstream`), one function per
//! section.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use ipnet::IpNet;

use crate::headers::rules::HeaderRules;

/// The configuration the gateway runs with when given no file: the bundled
/// `config/gateway.toml`, whose relative paths resolve against a folder
/// holding the demo's files (see `demo::files`).
pub const EMBEDDED_DEFAULT: &str = include_str!("../../config/gateway.toml");

/// Route timeout when a proxy route does not set one.
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(30);

/// Body idle timeout when a proxy route does not set one (as nginx's
/// `proxy_read_timeout` and `client_body_timeout`).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Request body bytes read ahead before a proxied request takes an
/// upstream slot, when the route does not say (see `body::request`).
pub const DEFAULT_REQUEST_BUFFER: usize = 64 * 1024;
/// A tunnel (an upgraded connection) silent both ways for this long is
/// closed (as nginx's `proxy_read_timeout` does to a WebSocket, but longer:
/// WebSocket apps often ping only every minute or so).
pub const DEFAULT_UPGRADE_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// Where a configuration comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A TOML file on disk; relative paths in it resolve against its folder.
    File(PathBuf),
    /// A TOML text with the folder its relative paths resolve against.
    Inline { text: String, base_dir: PathBuf },
}

impl Source {
    /// The embedded default configuration, its relative paths resolved
    /// against `base_dir` (which holds `demo::FILES`).
    pub fn embedded(base_dir: PathBuf) -> Self {
        Source::Inline { text: EMBEDDED_DEFAULT.to_owned(), base_dir }
    }

    fn name(&self) -> String {
        match self {
            Source::File(p) => p.display().to_string(),
            Source::Inline { .. } => "embedded default".to_owned(),
        }
    }

    fn base_dir(&self) -> PathBuf {
        match self {
            Source::File(p) => p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map(Path::to_path_buf)
                .unwrap_or_else(|| PathBuf::from(".")),
            Source::Inline { base_dir, .. } => base_dir.clone(),
        }
    }
}

pub mod access;
mod effective;
mod listener;
pub use listener::{Http1Server, Http2Server, ListenerTls};
mod errors;
pub use errors::ConfigError;
mod files;
pub use files::named_files;
mod ratelimit;
mod raw;
mod target;
pub use target::MirrorConfig;
mod raw_access;
mod redact;
pub use redact::{REDACTED, names_secret, redact_condition, redact_url, refused_name, refused_value};
mod server;
pub use server::AccessLogFormat;
mod upstream;
mod validate;
pub use validate::methods::unregistered as unregistered_method;

pub use ratelimit::{
    MissingKey, OnStoreError, Rate, RateLimitConfig, RateLimitKey, RateLimitStoreConfig, StoreCa, StoreKind,
};
pub use upstream::{
    Address, Admission, AutoBounds, Balance, Discover, DiscoverName, EndpointConfig, HealthConfig, MaxRequests,
    OutlierConfig, Protocol, RetryBudget, UpstreamConfig, UpstreamTls,
};

use raw::RawConfig;

// ---------------------------------------------------------------------------
// Runtime types.

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was loaded from, for messages.
    pub source_name: String,
    /// Where it was loaded from, to load it again (reload).
    pub source: Option<Source>,
    pub server: ServerConfig,
    pub metrics: MetricsConfig,
    pub tracing: TracingConfig,
    /// `[resolver]`: how discovered upstreams' names are resolved.
    pub resolver: ResolverSettings,
    /// Upstreams, in name order; routes refer to them by index.
    pub upstreams: Vec<UpstreamConfig>,
    /// Routes, in file order.
    pub routes: Vec<RouteConfig>,
    /// `[rate_limit_store]`, for routes whose rate limit is shared.
    pub rate_limit_store: Option<RateLimitStoreConfig>,
    /// The configuration as loaded, defaults included (those validation
    /// gives routes and upstreams too), with secrets redacted (the admin
    /// listener's `/-/config`).
    pub effective: std::sync::Arc<serde_json::Value>,
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Address of the main listener.
    pub listen: SocketAddr,
    /// Runtime worker threads; 0 means one per CPU.
    pub worker_threads: usize,
    /// How long a client may take to send a complete request head: from
    /// accepting the connection (HTTP version detection included) for the
    /// first request, from its first byte for later ones.
    pub header_read_timeout: Duration,
    /// A connection with no request in flight for this long is closed
    /// (HTTP/2 with GOAWAY).
    pub idle_timeout: Duration,
    /// A client that accepts no bytes of a response for this long has its
    /// connection closed.
    pub send_timeout: Duration,
    /// An idle plain-TCP HTTP/1.1 connection (the gateway's own) gives its
    /// task up after this long with no request; `None` ("0s") never.
    pub park_after: Option<Duration>,
    /// TCP keepalive idle time on accepted sockets; `None` leaves it off.
    pub tcp_keepalive: Option<Duration>,
    /// How long in-flight requests may run on after SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
    /// After SIGTERM/SIGINT, `/readyz` answers 503 while the gateway keeps
    /// accepting and serving for this long, before it stops accepting.
    pub shutdown_delay: Duration,
    /// Connections served at once; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// One log event per request when true.
    pub access_log: bool,
    /// Largest request head (request line and headers); past it, 431.
    pub max_header_size: u64,
    /// Longest request target; past it, 414.
    pub max_uri_length: u64,
    /// Default request body limit for routes; past it, 413.
    pub max_body: u64,
    /// Bytes of request bodies read ahead by all requests at once (see
    /// `ProxyTarget::request_buffer`); past it, bodies stream.
    pub request_buffer_total: u64,
    /// Request headers whose names hold `_` are dropped (nginx's
    /// `underscores_in_headers off`), instead of being treated as the
    /// `-` spelling by the header rules.
    pub drop_underscore_headers: bool,
    /// Repeated slashes in request paths are merged before routing.
    pub merge_slashes: bool,
    /// Paths with an encoded `/` or `\` (`%2F`, `%5C`) are refused with 400.
    pub reject_encoded_slash: bool,
    /// Peers whose `X-Forwarded-Proto`, `X-Forwarded-Host` and `Forwarded`
    /// are kept; from any other peer they are replaced.
    pub trusted_proxies: Vec<IpNet>,
    /// Every request carries an `X-Request-Id` (made when missing or invalid).
    pub request_id: bool,
    /// W3C `traceparent` continued, or a trace started.
    pub trace_context: bool,
    /// The access log's format; `None` follows `--log-format`.
    pub access_log_format: Option<AccessLogFormat>,
    /// TLS on the main listener (`[server.tls]`).
    pub tls: Option<ListenerTls>,
    /// The configuration file is reloaded when it changes on disk
    /// (`--watch` sets it too).
    pub watch_config: bool,
    /// The name in the gateway's `Via` entries (`server.via`, or a random
    /// one per process), by which it knows a request it passed already.
    pub via: crate::headers::Via,
    /// Which HTTP/1.1 connection serves clients.
    pub http1: Http1Server,
    /// Which HTTP/2 connection serves clients.
    pub http2: Http2Server,
}

/// `[tracing]`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TracingConfig {
    /// OTLP/HTTP base URL; spans are posted to `/v1/traces` under it.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of exported spans.
    pub service_name: String,
}

/// `[resolver]`: the DNS servers that discovered upstreams' names are
/// asked, and how patiently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolverSettings {
    /// Empty: the system's (`/etc/resolv.conf`).
    pub nameservers: Vec<SocketAddr>,
    /// Per query and server.
    pub timeout: Duration,
    /// Queries per lookup before it fails.
    pub attempts: usize,
}

/// `[metrics]`.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    /// Path the Prometheus text is served at.
    pub path: String,
    /// A separate admin listener for metrics and health; `None` serves them on
    /// the main listener.
    pub listen: Option<SocketAddr>,
    /// Connections the admin listener serves at once.
    pub max_connections: usize,
    /// With any entry, the admin listener answers only clients inside them
    /// (403 to others).
    pub allow: Vec<IpNet>,
    /// Host names (lower case, no port) the admin listener answers besides
    /// IP addresses and `localhost`: any other `Host` is refused, so a web
    /// page whose name was rebound to the admin address cannot read it.
    pub hosts: Vec<String>,
}

/// Failures a route may retry on (`retry_on`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetryOn {
    /// The connection could not be made: nothing was sent, any method.
    pub connect: bool,
    /// The connection closed before the response head: bodiless
    /// idempotent requests only.
    pub reset: bool,
    /// The upstream answered 503: bodiless idempotent requests only.
    pub unavailable: bool,
}

/// One `[[routes]]` entry.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    /// Normalised prefix: starts with `/`, no trailing `/` unless it is `/`.
    pub prefix: String,
    /// The hosts it serves; empty: any (see `crate::router`).
    pub hosts: Vec<crate::router::HostPattern>,
    /// Its `headers` and `query` conditions, when it has any.
    pub conditions: Option<Arc<crate::router::Conditions>>,
    /// Allowed methods; `None` allows all (file routes allow GET and HEAD).
    pub methods: Option<Vec<Method>>,
    pub target: Target,
    /// Request body limit (the route's `max_body`, else `server.max_body`).
    pub max_body: u64,
    /// Requests handled at once before the route sheds load with 503;
    /// `None` is unlimited.
    pub max_concurrent: Option<usize>,
    /// Header rules for requests on their way in, and responses out.
    pub request_headers: HeaderRules,
    pub response_headers: HeaderRules,
    /// Compress responses (gzip, br, zstd) when the client accepts it.
    pub compress: bool,
    /// Requests per client (or key) the route takes; `None` is unlimited.
    pub rate_limit: Option<RateLimitConfig>,
    /// Debug builds only: panic with this message (tests of panic isolation).
    pub panic: Option<String>,
    /// Who may come in (`allow`, `deny`, `auth`); `None` lets everyone.
    pub access: Option<Arc<access::AccessConfig>>,
}

/// What a route does with a request.
#[derive(Debug, Clone)]
pub enum Target {
    Proxy(ProxyTarget),
    /// Serve one file, whatever the rest of the path.
    File(PathBuf),
    /// Serve a directory tree; the route prefix is stripped. Names that
    /// start with a dot are served only with `dotfiles` (see
    /// `files::sanitize::hidden`).
    Dir {
        root: PathBuf,
        dotfiles: bool,
    },
    /// A fixed response.
    Respond {
        status: StatusCode,
        body: Bytes,
    },
    /// A redirect to a location made from the request.
    Redirect(crate::router::redirect::Redirect),
}

/// A proxy route's settings.
#[derive(Debug, Clone)]
pub struct ProxyTarget {
    /// Index into [`Config::upstreams`] (with `split`, its first member's).
    pub upstream: usize,
    /// `split`: the upstreams a request may go to, by weight.
    pub split: Option<Arc<crate::router::split::Split>>,
    /// `mirror`: a share of requests copied to another upstream.
    pub mirror: Option<MirrorConfig>,
    /// Replaces the matched prefix; `None` keeps the path as it is.
    pub rewrite: Option<String>,
    /// Bound from request arrival to the upstream's response head.
    pub timeout: Duration,
    /// Longest pause allowed while streaming a request or response body.
    pub body_timeout: Duration,
    /// Bytes of the request body read before the request takes an upstream
    /// slot (0: none; the body streams from the start).
    pub request_buffer: usize,
    /// `server.drop_underscore_headers`: request headers whose names hold
    /// `_` do not reach the upstream.
    pub drop_underscore_headers: bool,
    /// Names a client's request trailers may not carry, in any spelling of
    /// `-` and `_`: those the gateway sets, those the route's request
    /// rules set or remove, and those its `auth` sets or decides on (an
    /// upstream that merges trailers into headers would otherwise take them
    /// from the client).
    pub guarded_trailers: Arc<[http::HeaderName]>,
    /// `server.via`: the gateway's `Via` entries, and the name that tells
    /// a request that came round again.
    pub via: crate::headers::Via,
    pub host: HostMode,
    /// Attempts after the first, on another endpoint where there is one.
    pub retries: u32,
    pub retry_on: RetryOn,
    /// The route's response cache (`cache = { ... }`); `None`: off.
    pub cache: Option<CacheConfig>,
    /// HTTP/1.1 upgrades (WebSocket) are tunnelled, closed after this long
    /// with no byte either way; `None` (`upgrade = false`) strips the
    /// upgrade headers.
    pub upgrade: Option<Duration>,
}

/// A proxy route's response cache: its own store, sized in bytes (head +
/// body), and the windows the gateway applies itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// Bytes the store holds at most (heads and bodies).
    pub max_size: u64,
    /// The largest response stored; a larger one streams through unbuffered.
    pub max_entry: u64,
    /// Freshness of a storable response that states none; zero: such a
    /// response is not stored.
    pub default_ttl: Duration,
    /// Concurrent misses for one key wait for the first one's response.
    pub coalesce: bool,
    /// How long past its freshness an entry is served while it is refreshed
    /// in the background.
    pub stale_while_revalidate: Duration,
    /// How long past its freshness an entry is served when the upstream fails.
    pub stale_if_error: Duration,
    /// The targeted cache-control fields obeyed (RFC 9213), first first:
    /// the first a response has with a valid value replaces its
    /// `Cache-Control` and `Expires` for the cache.
    pub targeted: std::sync::Arc<[http::HeaderName]>,
}

/// The longest name `cache.targeted` takes (the name goes into every
/// `Cache-Status` of an entry it decided).
pub const MAX_TARGETED_NAME: usize = 64;

/// `cache.max_size` when not set.
pub const DEFAULT_CACHE_MAX_SIZE: u64 = 64 << 20;
/// `cache.max_entry` when not set.
pub const DEFAULT_CACHE_MAX_ENTRY: u64 = 1 << 20;

/// Which `Host` the upstream sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMode {
    /// The client's `Host`.
    Preserve,
    /// The upstream URL's authority.
    Upstream,
}

/// Built-in defaults: everything in `[server]` and `[metrics]` has one.
const DEFAULTS: &[(&str, &str)] = &[
    ("server.listen", "127.0.0.1:8080"),
    ("server.header_read_timeout", "10s"),
    ("server.idle_timeout", "60s"),
    ("server.send_timeout", "60s"),
    ("server.park_after", "100ms"),
    ("server.tcp_keepalive", "60s"),
    ("server.shutdown_timeout", "30s"),
    ("server.shutdown_delay", "0s"),
    ("metrics.path", "/metrics"),
    ("server.max_header_size", "64KiB"),
    ("server.max_uri_length", "8KiB"),
    ("server.max_body", "10MiB"),
    ("server.request_buffer_total", "32MiB"),
];

/// Loads `source`, applies environment overrides, and validates.
pub fn load(source: &Source) -> Result<Config, ConfigError> {
    load_from(source, None, None)
}

/// [`load`] of the file at `path` with `text` as its bytes, as read by
/// whoever checked them (the watcher), so that what is applied is what was
/// checked, not what a later read finds.
pub fn load_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
    load_from(&Source::File(path.to_owned()), Some(text), None)
}

/// [`load`] (of `text` as the file's bytes when given) for a reload: the
/// file's `[server]` is checked and returned as it is, but its routes take
/// their defaults and checks from `running` (a route's `max_body`, the
/// fields request IDs and trace context reserve, underscore headers), as
/// `[server]` runs on with its old values until a restart.
pub fn load_again(source: &Source, text: Option<&str>, running: &ServerConfig) -> Result<Config, ConfigError> {
    load_from(source, text, Some(running))
}

fn load_from(source: &Source, text: Option<&str>, running: Option<&ServerConfig>) -> Result<Config, ConfigError> {
    let name = source.name();
    let text = read(source, text)?;
    let built = built(source, &text)?;
    // Read before validation consumes it; a tree that does not convert
    // (it always does: TOML values are JSON values) is shown as null.
    let effective = built.clone().try_deserialize::<serde_json::Value>().map(redact::redacted).unwrap_or_default();
    let raw: RawConfig = built.try_deserialize().map_err(|e| located(&name, &text, errors::from_crate(e)))?;
    let mut config =
        validate::config(raw, &source.base_dir(), running).map_err(|problem| located(&name, &text, problem))?;
    config.source_name = name;
    config.source = Some(source.clone());
    config.effective = std::sync::Arc::new(effective::with_defaults(effective, &config));
    Ok(config)
}

/// The text of `source`: `given` when the caller read it already.
fn read(source: &Source, given: Option<&str>) -> Result<String, ConfigError> {
    match (source, given) {
        (_, Some(text)) => Ok(text.to_owned()),
        (Source::Inline { text, .. }, None) => Ok(text.clone()),
        (Source::File(path), None) => {
            let cannot = |why: String| ConfigError::new(source.name(), "", format!("cannot read the file: {why}"));
            if !path.is_file() {
                return Err(cannot("not found or not a file".into()));
            }
            std::fs::read_to_string(path).map_err(|e| cannot(e.to_string()))
        }
    }
}

/// An error about `key` of the file `name` whose bytes are `text`, told
/// where it is: the environment variable that set the key or a key under
/// it (when the file does not hold the key, or a list was at stake), else
/// the key's line in the file.
fn located(name: &str, text: &str, (key, message): (String, String)) -> ConfigError {
    let vars = || std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)));
    let (line, held) = errors::walk(text, &key);
    let list = errors::wants_a_list(&message);
    // The first table on the key's path the file lacks was made by a
    // variable, if one sets a key in it; and a variable under the key
    // itself made it a table.
    let missing: Vec<&str> = key.split('.').take(held + 1).collect();
    let made = || errors::variable_under(&missing.join("."), vars());
    let var = errors::variable_for(&key, vars()).or_else(|| errors::variable_under(&key, vars())).or_else(made);
    if let Some(var) = var {
        let message = if list { errors::NO_LIST_FROM_VARIABLES.to_owned() } else { message };
        return ConfigError::new(format!("environment variable {var}"), key, message);
    }
    let message = errors::quote_dotted_name(&key, message, text);
    ConfigError { line, ..ConfigError::new(name, key, message) }
}

/// The defaults, the file's `text` and the environment's overrides,
/// merged: what [`load`] validates, and what
/// [`named_files`](files::named_files) reads its paths from.
fn built(source: &Source, text: &str) -> Result<config::Config, ConfigError> {
    let name = source.name();
    if let Some(e) = errors::syntax(&name, text) {
        return Err(e);
    }
    let mut builder = config::Config::builder();
    for (k, v) in DEFAULTS {
        builder = builder.set_default(*k, *v).expect("valid default key");
    }
    builder = builder
        .set_default("server.worker_threads", 0)
        .and_then(|b| b.set_default("server.max_connections", 10_000))
        .and_then(|b| b.set_default("server.access_log", false))
        .and_then(|b| b.set_default("server.merge_slashes", true))
        .and_then(|b| b.set_default("server.drop_underscore_headers", false))
        .and_then(|b| b.set_default("server.reject_encoded_slash", false))
        .and_then(|b| b.set_default("metrics.max_connections", 64))
        .and_then(|b| b.set_default("server.request_id", true))
        .and_then(|b| b.set_default("server.trace_context", true))
        .and_then(|b| b.set_default("server.watch_config", false))
        .expect("valid default key");
    builder = builder.add_source(config::File::from_str(text, config::FileFormat::Toml));
    builder = builder.add_source(
        config::Environment::with_prefix("GATEWAY").prefix_separator("__").separator("__").try_parsing(true),
    );
    builder.build().map_err(|e| located(&name, text, errors::from_crate(e)))
}

#[cfg(test)]
mod tests;
