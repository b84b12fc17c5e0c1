//! Configuration: loading (built-in defaults, then the TOML file, then
//! `GATEWAY__SECTION__KEY` environment overrides) and validation into the
//! runtime types the server uses.
//!
//! Loading and validation happen before any socket is bound. Every error names
//! the source (the file, or the embedded default), the key and what is wrong,
//! so `gateway` can print it and exit with status 64 (EX_USAGE).
//!
//! Durations and sizes are read as strings and parsed here (with `humantime`
//! and `bytesize`) rather than through serde adapters, so that a bad value is
//! reported with its full key path (`routes[1].timeout`), which the serde
//! adapters' errors do not carry through the `config` crate.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use http::uri::{Authority, Scheme};
use http::{Method, StatusCode, Uri};
use serde::Deserialize;

/// The configuration the gateway runs with when given no file: the bundled
/// `config/gateway.toml`, whose relative paths resolve against the bundled
/// `config/` folder.
pub const EMBEDDED_DEFAULT: &str = include_str!("../config/gateway.toml");

/// Folder the embedded default's relative paths resolve against.
pub const EMBEDDED_BASE_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/config");

/// Route timeout when a proxy route does not set one.
pub const DEFAULT_ROUTE_TIMEOUT: Duration = Duration::from_secs(30);

/// Body idle timeout when a proxy route does not set one (as nginx's
/// `proxy_read_timeout` and `client_body_timeout`).
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(60);

/// A configuration error: where it came from, which key, and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{source_name}: {key}: {message}")]
pub struct ConfigError {
    /// The config file's path, or `embedded default`.
    pub source_name: String,
    /// The offending key, e.g. `routes[1].timeout`.
    pub key: String,
    /// What is wrong with it.
    pub message: String,
}

/// Where a configuration comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// A TOML file on disk; relative paths in it resolve against its folder.
    File(PathBuf),
    /// A TOML text with the folder its relative paths resolve against.
    Inline { text: String, base_dir: PathBuf },
}

impl Source {
    /// The embedded default configuration.
    pub fn embedded() -> Self {
        Source::Inline { text: EMBEDDED_DEFAULT.to_owned(), base_dir: PathBuf::from(EMBEDDED_BASE_DIR) }
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

// ---------------------------------------------------------------------------
// Raw (serde) shape of the file. Unknown keys are refused so a typo is an
// error, not a silently ignored setting.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    server: RawServer,
    metrics: RawMetrics,
    #[serde(default)]
    upstreams: BTreeMap<String, RawUpstream>,
    #[serde(default)]
    routes: Vec<RawRoute>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: String,
    worker_threads: usize,
    header_read_timeout: String,
    shutdown_timeout: String,
    max_connections: usize,
    access_log: bool,
    max_header_size: RawSize,
    max_uri_length: RawSize,
    max_body: RawSize,
}

/// A size: a plain integer (bytes) or a string such as "64KiB".
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum RawSize {
    Bytes(u64),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    path: String,
    listen: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    url: String,
    connect_timeout: Option<String>,
    pool_max_idle_per_host: Option<usize>,
    pool_idle_timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    name: Option<String>,
    prefix: Option<String>,
    upstream: Option<String>,
    file: Option<String>,
    dir: Option<String>,
    respond: Option<RawRespond>,
    rewrite: Option<String>,
    timeout: Option<String>,
    methods: Option<Vec<String>>,
    host: Option<String>,
    max_body: Option<RawSize>,
    max_concurrent: Option<usize>,
    body_timeout: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRespond {
    status: Option<u16>,
    body: Option<String>,
}

// ---------------------------------------------------------------------------
// Runtime types.

/// The validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was loaded from, for messages.
    pub source_name: String,
    pub server: ServerConfig,
    pub metrics: MetricsConfig,
    /// Upstreams, in name order; routes refer to them by index.
    pub upstreams: Vec<UpstreamConfig>,
    /// Routes, in file order.
    pub routes: Vec<RouteConfig>,
}

/// `[server]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Address of the main listener.
    pub listen: SocketAddr,
    /// Runtime worker threads; 0 means one per CPU.
    pub worker_threads: usize,
    /// How long a client may take to send a complete request head.
    pub header_read_timeout: Duration,
    /// How long in-flight requests may run on after SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
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
}

/// `[metrics]`.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Path the Prometheus text is served at.
    pub path: String,
    /// A separate admin listener for metrics and health; `None` serves them on
    /// the main listener.
    pub listen: Option<SocketAddr>,
}

/// `[upstreams.NAME]`.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub name: String,
    /// Always `http`.
    pub scheme: Scheme,
    pub authority: Authority,
    /// Time allowed to establish a TCP connection.
    pub connect_timeout: Duration,
    /// Idle keep-alive connections kept per host.
    pub pool_max_idle_per_host: usize,
    /// How long an idle pooled connection is kept; keep it below the
    /// upstream's own keep-alive timeout.
    pub pool_idle_timeout: Duration,
}

/// One `[[routes]]` entry.
#[derive(Debug, Clone)]
pub struct RouteConfig {
    pub name: String,
    /// Normalised prefix: starts with `/`, no trailing `/` unless it is `/`.
    pub prefix: String,
    /// Allowed methods; `None` allows all (file routes allow GET and HEAD).
    pub methods: Option<Vec<Method>>,
    pub target: Target,
    /// Request body limit (the route's `max_body`, else `server.max_body`).
    pub max_body: u64,
    /// Requests handled at once before the route sheds load with 503;
    /// `None` is unlimited.
    pub max_concurrent: Option<usize>,
}

/// What a route does with a request.
#[derive(Debug, Clone)]
pub enum Target {
    Proxy(ProxyTarget),
    /// Serve one file, whatever the rest of the path.
    File(PathBuf),
    /// Serve a directory tree; the route prefix is stripped.
    Dir(PathBuf),
    /// A fixed response.
    Respond {
        status: StatusCode,
        body: Bytes,
    },
}

/// A proxy route's settings.
#[derive(Debug, Clone)]
pub struct ProxyTarget {
    /// Index into [`Config::upstreams`].
    pub upstream: usize,
    /// Replaces the matched prefix; `None` keeps the path as it is.
    pub rewrite: Option<String>,
    /// Bound from request arrival to the upstream's response head.
    pub timeout: Duration,
    /// Longest pause allowed while streaming a request or response body.
    pub body_timeout: Duration,
    pub host: HostMode,
}

/// Which `Host` the upstream sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMode {
    /// The client's `Host`.
    Preserve,
    /// The upstream URL's authority.
    Upstream,
}

impl Target {
    /// Short name of the target kind, for `gateway check`.
    pub fn describe(&self, upstreams: &[UpstreamConfig]) -> String {
        match self {
            Target::Proxy(p) => {
                let up = &upstreams[p.upstream];
                let rewrite = p.rewrite.as_deref().map(|r| format!(" rewrite {r}")).unwrap_or_default();
                format!(
                    "proxy -> {} ({}://{}){rewrite} timeout {}",
                    up.name,
                    up.scheme,
                    up.authority,
                    humantime::format_duration(p.timeout)
                )
            }
            Target::File(p) => format!("file {}", p.display()),
            Target::Dir(p) => format!("dir {}", p.display()),
            Target::Respond { status, body } => {
                format!("respond {} ({} bytes)", status.as_u16(), body.len())
            }
        }
    }
}

/// Built-in defaults: everything in `[server]` and `[metrics]` has one.
const DEFAULTS: &[(&str, &str)] = &[
    ("server.listen", "127.0.0.1:8080"),
    ("server.header_read_timeout", "10s"),
    ("server.shutdown_timeout", "30s"),
    ("metrics.path", "/metrics"),
    ("server.max_header_size", "64KiB"),
    ("server.max_uri_length", "8KiB"),
    ("server.max_body", "10MiB"),
];

/// Loads `source`, applies environment overrides, and validates.
pub fn load(source: &Source) -> Result<Config, ConfigError> {
    let name = source.name();
    let err = |key: &str, message: String| ConfigError { source_name: name.clone(), key: key.to_owned(), message };
    let mut builder = config::Config::builder();
    for (k, v) in DEFAULTS {
        builder = builder.set_default(*k, *v).expect("valid default key");
    }
    builder = builder
        .set_default("server.worker_threads", 0)
        .and_then(|b| b.set_default("server.max_connections", 10_000))
        .and_then(|b| b.set_default("server.access_log", false))
        .expect("valid default key");
    builder = match source {
        Source::File(path) => {
            if !path.is_file() {
                return Err(err("-", "cannot read the file: not found or not a file".into()));
            }
            builder.add_source(config::File::from(path.as_path()).format(config::FileFormat::Toml))
        }
        Source::Inline { text, .. } => builder.add_source(config::File::from_str(text, config::FileFormat::Toml)),
    };
    builder = builder.add_source(
        config::Environment::with_prefix("GATEWAY").prefix_separator("__").separator("__").try_parsing(true),
    );
    let raw: RawConfig = builder.build().and_then(|c| c.try_deserialize()).map_err(|e| config_crate_error(&name, e))?;
    let mut config = validate(raw, &name, &source.base_dir())?;
    config.source_name = name;
    Ok(config)
}

/// Turns a `config` crate error into ours, keeping its key where it has one.
fn config_crate_error(source_name: &str, e: config::ConfigError) -> ConfigError {
    let (key, message) = match &e {
        config::ConfigError::Type { key: Some(key), unexpected, expected, .. } => {
            (key.clone(), format!("invalid type: {unexpected}, expected {expected}"))
        }
        config::ConfigError::NotFound(key) => (key.clone(), "missing".to_owned()),
        other => ("-".to_owned(), other.to_string()),
    };
    ConfigError { source_name: source_name.to_owned(), key, message }
}

fn parse_duration(key: &str, value: &str) -> Result<Duration, (String, String)> {
    humantime::parse_duration(value.trim())
        .map_err(|e| (key.to_owned(), format!("invalid duration {value:?}: {e} (use e.g. \"250ms\", \"2s\")")))
}

fn parse_size(key: &str, value: &RawSize) -> Result<u64, (String, String)> {
    match value {
        RawSize::Bytes(n) => Ok(*n),
        RawSize::Text(t) => t.trim().parse::<bytesize::ByteSize>().map(|b| b.as_u64()).map_err(|e| {
            (key.to_owned(), format!("invalid size {t:?}: {e} (use e.g. \"64KiB\", \"10MiB\" or a number of bytes)"))
        }),
    }
}

fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, (String, String)> {
    value
        .parse()
        .map_err(|e| (key.to_owned(), format!("invalid socket address {value:?}: {e} (use e.g. \"127.0.0.1:8080\")")))
}

/// Validates the raw file into runtime types. Pure apart from checking that
/// file roots exist.
fn validate(raw: RawConfig, source_name: &str, base_dir: &Path) -> Result<Config, ConfigError> {
    validate_inner(raw, base_dir).map_err(|(key, message)| ConfigError {
        source_name: source_name.to_owned(),
        key,
        message,
    })
}

fn validate_inner(raw: RawConfig, base_dir: &Path) -> Result<Config, (String, String)> {
    let s = &raw.server;
    let server = ServerConfig {
        listen: parse_addr("server.listen", &s.listen)?,
        worker_threads: s.worker_threads,
        header_read_timeout: parse_duration("server.header_read_timeout", &s.header_read_timeout)?,
        shutdown_timeout: parse_duration("server.shutdown_timeout", &s.shutdown_timeout)?,
        max_connections: s.max_connections,
        access_log: s.access_log,
        max_header_size: parse_size("server.max_header_size", &s.max_header_size)?,
        max_uri_length: parse_size("server.max_uri_length", &s.max_uri_length)?,
        max_body: parse_size("server.max_body", &s.max_body)?,
    };
    // hyper's read buffer cannot be smaller than 8 KiB.
    if server.max_header_size < 8192 {
        return Err(("server.max_header_size".into(), "must be at least 8KiB".into()));
    }
    if server.max_connections == 0 {
        return Err(("server.max_connections".into(), "must be at least 1".into()));
    }
    if !raw.metrics.path.starts_with('/') {
        return Err(("metrics.path".into(), format!("{:?} must start with '/'", raw.metrics.path)));
    }
    let metrics = MetricsConfig {
        path: raw.metrics.path.clone(),
        listen: raw.metrics.listen.as_deref().map(|l| parse_addr("metrics.listen", l)).transpose()?,
    };

    let mut upstreams = Vec::new();
    let mut upstream_index = HashMap::new();
    for (name, up) in &raw.upstreams {
        let key = |k: &str| format!("upstreams.{name}.{k}");
        let (scheme, authority) = parse_upstream_url(&up.url).map_err(|m| (key("url"), m))?;
        let cfg = UpstreamConfig {
            name: name.clone(),
            scheme,
            authority,
            connect_timeout: parse_duration(&key("connect_timeout"), up.connect_timeout.as_deref().unwrap_or("1s"))?,
            pool_max_idle_per_host: up.pool_max_idle_per_host.unwrap_or(1024),
            pool_idle_timeout: parse_duration(
                &key("pool_idle_timeout"),
                up.pool_idle_timeout.as_deref().unwrap_or("50s"),
            )?,
        };
        upstream_index.insert(name.clone(), upstreams.len());
        upstreams.push(cfg);
    }

    let mut routes: Vec<RouteConfig> = Vec::new();
    let mut seen_names = HashMap::new();
    let mut seen_prefixes: HashMap<String, String> = HashMap::new();
    for (i, r) in raw.routes.into_iter().enumerate() {
        let key = |k: &str| format!("routes[{i}].{k}");
        let name = r.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| (key("name"), "missing".into()))?;
        if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.') {
            return Err((key("name"), format!("{name:?}: use letters, digits, '_', '-' or '.'")));
        }
        if name == "unmatched" {
            return Err((key("name"), "\"unmatched\" is reserved for requests that match no route".into()));
        }
        if let Some(prev) = seen_names.insert(name.clone(), i) {
            return Err((key("name"), format!("duplicate route name {name:?} (also routes[{prev}])")));
        }
        let prefix = normalize_prefix(r.prefix.as_deref().ok_or_else(|| (key("prefix"), "missing".into()))?)
            .map_err(|m| (key("prefix"), m))?;
        if let Some(other) = seen_prefixes.insert(prefix.clone(), name.clone()) {
            return Err((key("prefix"), format!("{prefix:?} is already the prefix of route {other:?}")));
        }
        let methods = r
            .methods
            .as_ref()
            .map(|ms| {
                ms.iter()
                    .map(|m| {
                        Method::from_bytes(m.to_ascii_uppercase().as_bytes())
                            .map_err(|_| (key("methods"), format!("invalid method {m:?}")))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .transpose()?;

        let targets = [r.upstream.is_some(), r.file.is_some(), r.dir.is_some(), r.respond.is_some()];
        let count = targets.iter().filter(|t| **t).count();
        if count != 1 {
            return Err((
                key("upstream"),
                format!("route {name:?} has {count} targets; set exactly one of upstream, file, dir, respond"),
            ));
        }
        let only_for_proxy = [
            ("rewrite", r.rewrite.is_some()),
            ("timeout", r.timeout.is_some()),
            ("host", r.host.is_some()),
            ("body_timeout", r.body_timeout.is_some()),
        ];
        if r.upstream.is_none()
            && let Some((k, _)) = only_for_proxy.iter().find(|(_, set)| *set)
        {
            return Err((key(k), "only applies to routes with an upstream".into()));
        }
        let target = if let Some(up) = &r.upstream {
            let upstream = *upstream_index.get(up).ok_or_else(|| {
                let known: Vec<_> = upstream_index.keys().map(String::as_str).collect();
                (key("upstream"), format!("unknown upstream {up:?} (known: {})", known.join(", ")))
            })?;
            let rewrite =
                r.rewrite.as_deref().map(|rw| validate_rewrite(rw).map_err(|m| (key("rewrite"), m))).transpose()?;
            let host = match r.host.as_deref() {
                None | Some("preserve") => HostMode::Preserve,
                Some("upstream") => HostMode::Upstream,
                Some(other) => {
                    return Err((key("host"), format!("{other:?}: use \"preserve\" or \"upstream\"")));
                }
            };
            let timeout = r
                .timeout
                .as_deref()
                .map(|t| parse_duration(&key("timeout"), t))
                .transpose()?
                .unwrap_or(DEFAULT_ROUTE_TIMEOUT);
            if timeout.is_zero() {
                return Err((key("timeout"), "must be greater than zero".into()));
            }
            let body_timeout = r
                .body_timeout
                .as_deref()
                .map(|t| parse_duration(&key("body_timeout"), t))
                .transpose()?
                .unwrap_or(DEFAULT_BODY_TIMEOUT);
            if body_timeout.is_zero() {
                return Err((key("body_timeout"), "must be greater than zero".into()));
            }
            Target::Proxy(ProxyTarget { upstream, rewrite, timeout, body_timeout, host })
        } else if let Some(f) = &r.file {
            let path = base_dir.join(f);
            if !path.is_file() {
                return Err((key("file"), format!("{} is not a readable file", path.display())));
            }
            Target::File(path)
        } else if let Some(d) = &r.dir {
            let path = base_dir.join(d);
            let root = path
                .canonicalize()
                .ok()
                .filter(|p| p.is_dir())
                .ok_or_else(|| (key("dir"), format!("{} is not a directory", path.display())))?;
            Target::Dir(root)
        } else {
            let resp = r.respond.as_ref().expect("one target is set");
            let code = resp.status.unwrap_or(200);
            let status = StatusCode::from_u16(code)
                .ok()
                .filter(|s| s.as_u16() >= 200)
                .ok_or_else(|| (key("respond.status"), format!("invalid status {code}")))?;
            Target::Respond { status, body: Bytes::from(resp.body.clone().unwrap_or_default()) }
        };
        let max_body =
            r.max_body.as_ref().map(|b| parse_size(&key("max_body"), b)).transpose()?.unwrap_or(server.max_body);
        if r.max_concurrent == Some(0) {
            return Err((key("max_concurrent"), "must be at least 1 (leave it out for no limit)".into()));
        }
        routes.push(RouteConfig { name, prefix, methods, target, max_body, max_concurrent: r.max_concurrent });
    }
    Ok(Config { source_name: String::new(), server, metrics, upstreams, routes })
}

/// An upstream URL: `http://host:port`, with no path beyond `/`.
fn parse_upstream_url(url: &str) -> Result<(Scheme, Authority), String> {
    let uri: Uri = url.parse().map_err(|e| format!("invalid URL {url:?}: {e}"))?;
    let scheme =
        uri.scheme().cloned().ok_or_else(|| format!("invalid URL {url:?}: missing scheme (use http://host:port)"))?;
    if scheme != Scheme::HTTP {
        return Err(format!("unsupported scheme in {url:?}: only http:// upstreams are supported"));
    }
    let authority = uri.authority().cloned().ok_or_else(|| format!("invalid URL {url:?}: missing host"))?;
    if authority.as_str().contains('@') {
        return Err(format!("invalid URL {url:?}: credentials are not supported"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("invalid URL {url:?}: a path or query is not supported; use a route's rewrite"));
    }
    Ok((scheme, authority))
}

/// Normalises a route prefix: must start with `/`; a trailing `/` is dropped
/// (so `/b/` and `/b` are the same segment-aware prefix).
fn normalize_prefix(p: &str) -> Result<String, String> {
    if !p.starts_with('/') {
        return Err(format!("{p:?} must start with '/'"));
    }
    if p.contains(['?', '#']) || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{p:?} must be a plain path"));
    }
    let trimmed = p.trim_end_matches('/');
    Ok(if trimmed.is_empty() { "/".to_owned() } else { trimmed.to_owned() })
}

fn validate_rewrite(rw: &str) -> Result<String, String> {
    if !rw.starts_with('/') {
        return Err(format!("{rw:?} must start with '/'"));
    }
    if rw.parse::<http::uri::PathAndQuery>().is_err() || rw.contains(['?', '#']) {
        return Err(format!("{rw:?} must be a plain path"));
    }
    Ok(rw.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline(text: &str) -> Result<Config, ConfigError> {
        load(&Source::Inline { text: text.to_owned(), base_dir: PathBuf::from(EMBEDDED_BASE_DIR) })
    }

    const UP: &str = "[upstreams.a]\nurl = \"http://127.0.0.1:9\"\n";

    #[test]
    fn embedded_default_is_valid() {
        let c = load(&Source::embedded()).unwrap();
        assert_eq!(c.server.listen, "127.0.0.1:8080".parse().unwrap());
        assert!(c.routes.iter().any(|r| r.name == "b" && matches!(r.target, Target::Proxy(_))));
        assert!(c.routes.iter().any(|r| matches!(r.target, Target::File(_))));
    }

    #[test]
    fn bad_configs_name_key_and_problem() {
        let cases: &[(&str, &str, &str)] = &[
            ("[[routes]]\nname='x'\nprefix='/x'\nupstream='nope'\n", "routes[0].upstream", "unknown upstream \"nope\""),
            ("[[routes]]\nname='x'\nprefix='/x'\n", "routes[0].upstream", "has 0 targets"),
            (
                "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nrespond={status=200}\n",
                "routes[0].upstream",
                "has 2 targets",
            ),
            (
                "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\ntimeout='2 parsecs'\n",
                "routes[0].timeout",
                "invalid duration",
            ),
            (
                "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\n[[routes]]\nname='x'\nprefix='/y'\nupstream='a'\n",
                "routes[1].name",
                "duplicate route name",
            ),
            ("[upstreams.b]\nurl='not a url'\n", "upstreams.b.url", "invalid URL"),
            ("[upstreams.b]\nurl='https://x:1'\n", "upstreams.b.url", "only http://"),
            ("[[routes]]\nname='x'\nprefix='/x'\ndir='no/such/dir'\n", "routes[0].dir", "is not a directory"),
            ("[[routes]]\nname='x'\nprefix='/x'\nfile='no/such.txt'\n", "routes[0].file", "is not a readable file"),
            ("[[routes]]\nname='x'\nprefix='x'\nupstream='a'\n", "routes[0].prefix", "must start with '/'"),
            ("[server]\nlisten='nowhere'\n", "server.listen", "invalid socket address"),
            ("[server]\nshutdown_timeout='soon'\n", "server.shutdown_timeout", "invalid duration"),
            (
                "[[routes]]\nname='x'\nprefix='/x'\nrespond={status=200}\ntimeout='1s'\n",
                "routes[0].timeout",
                "only applies",
            ),
            ("[server]\nmax_body='lots'\n", "server.max_body", "invalid size"),
            ("[server]\nmax_header_size=100\n", "server.max_header_size", "at least 8KiB"),
            (
                "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nmax_body='1 parsec'\n",
                "routes[0].max_body",
                "invalid size",
            ),
            (
                "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nmax_concurrent=0\n",
                "routes[0].max_concurrent",
                "at least 1",
            ),
            (
                "[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nbody_timeout='0s'\n",
                "routes[0].body_timeout",
                "greater than zero",
            ),
        ];
        for (text, key, msg) in cases {
            let e = inline(&format!("{UP}{text}")).expect_err(text);
            assert_eq!(e.key, *key, "{text}: {e}");
            assert!(e.message.contains(msg), "{text}: {e}");
            assert_eq!(e.source_name, "embedded default");
        }
    }

    #[test]
    fn unknown_key_is_refused() {
        let e = inline("[server]\nlisten_on='x'\n").unwrap_err();
        assert!(e.to_string().contains("listen_on"), "{e}");
    }

    #[test]
    fn defaults_apply() {
        let c = inline(&format!("{UP}[[routes]]\nname='x'\nprefix='/x/'\nupstream='a'\n")).unwrap();
        assert_eq!(c.routes[0].prefix, "/x");
        let Target::Proxy(p) = &c.routes[0].target else { panic!() };
        assert_eq!(p.timeout, DEFAULT_ROUTE_TIMEOUT);
        assert_eq!(p.host, HostMode::Preserve);
        assert_eq!(c.upstreams[0].pool_idle_timeout, Duration::from_secs(50));
        assert_eq!(c.server.header_read_timeout, Duration::from_secs(10));
        assert_eq!(c.metrics.path, "/metrics");
        assert_eq!(c.server.max_body, 10 * 1024 * 1024);
        assert_eq!(c.server.max_header_size, 64 * 1024);
        assert_eq!(c.server.max_uri_length, 8 * 1024);
        assert_eq!(c.routes[0].max_body, c.server.max_body);
        assert_eq!(c.routes[0].max_concurrent, None);
        assert_eq!(p.body_timeout, DEFAULT_BODY_TIMEOUT);
    }

    #[test]
    fn sizes_parse_as_text_or_bytes() {
        let c = inline(&format!(
            "[server]\nmax_body = 2048\nmax_uri_length = \"1KiB\"\n{UP}[[routes]]\nname='x'\nprefix='/x'\nupstream='a'\nmax_body='64KiB'\nmax_concurrent=3\n[[routes]]\nname='y'\nprefix='/y'\nupstream='a'\n"
        ))
        .unwrap();
        assert_eq!(c.server.max_body, 2048);
        assert_eq!(c.server.max_uri_length, 1024);
        assert_eq!(c.routes[0].max_body, 64 * 1024);
        assert_eq!(c.routes[0].max_concurrent, Some(3));
        assert_eq!(c.routes[1].max_body, 2048);
    }
}
