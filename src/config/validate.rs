//! Validation of the raw file into the runtime types, one function per
//! section. Every error is `(key, message)`; `load` adds the source name.
//! Pure apart from checking that file and directory targets exist.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::uri::{Authority, Scheme};
use http::{Method, StatusCode, Uri};
use ipnet::IpNet;
use rustls_pki_types::ServerName;

use crate::layers::rules::HeaderRules;

use super::raw::{
    RawConfig, RawHeaderRules, RawHealth, RawMetrics, RawOutlier, RawRetryBudget, RawRoute, RawServer, RawServerTls,
    RawSize, RawTracing, RawUpstream,
};
use super::{
    AccessLogFormat, Address, Admission, Balance, Config, DEFAULT_BODY_TIMEOUT, DEFAULT_ROUTE_TIMEOUT,
    DEFAULT_UPGRADE_IDLE_TIMEOUT, EndpointConfig, HealthConfig, HostMode, ListenerTls, MetricsConfig, OutlierConfig,
    Protocol, ProxyTarget, RetryBudget, RetryOn, RouteConfig, ServerConfig, Target, TracingConfig, UpstreamConfig,
};

/// The largest `max_requests` (tokio's semaphore takes up to 2^61 permits;
/// anything near that is a typo).
const MAX_REQUESTS: usize = 1_000_000;

/// A problem with one key: `(key, message)`.
type Problem = (String, String);

pub(super) fn config(raw: RawConfig, base_dir: &Path) -> Result<Config, Problem> {
    let server = server(&raw.server, base_dir)?;
    let tracing = tracing(&raw.tracing)?;
    let metrics = metrics(&raw.metrics)?;
    let mut upstreams = Vec::new();
    let mut upstream_index = HashMap::new();
    for (name, up) in &raw.upstreams {
        upstream_index.insert(name.clone(), upstreams.len());
        upstreams.push(upstream(name, up, base_dir)?);
    }
    let mut routes: Vec<RouteConfig> = Vec::new();
    let mut seen_names = HashMap::new();
    let mut seen_prefixes: HashMap<String, String> = HashMap::new();
    for (i, r) in raw.routes.into_iter().enumerate() {
        let route = route(i, r, &server, &upstream_index, base_dir)?;
        let key = |k: &str| format!("routes[{i}].{k}");
        if let Some(prev) = seen_names.insert(route.name.clone(), i) {
            return Err((key("name"), format!("duplicate route name {:?} (also routes[{prev}])", route.name)));
        }
        if let Some(other) = seen_prefixes.insert(route.prefix.clone(), route.name.clone()) {
            return Err((key("prefix"), format!("{:?} is already the prefix of route {other:?}", route.prefix)));
        }
        routes.push(route);
    }
    Ok(Config { source_name: String::new(), source: None, server, metrics, tracing, upstreams, routes })
}

fn server(s: &RawServer, base_dir: &Path) -> Result<ServerConfig, Problem> {
    let server = ServerConfig {
        listen: parse_addr("server.listen", &s.listen)?,
        worker_threads: s.worker_threads,
        header_read_timeout: positive_duration("server.header_read_timeout", &s.header_read_timeout)?,
        idle_timeout: positive_duration("server.idle_timeout", &s.idle_timeout)?,
        send_timeout: positive_duration("server.send_timeout", &s.send_timeout)?,
        tcp_keepalive: Some(parse_duration("server.tcp_keepalive", &s.tcp_keepalive)?).filter(|d| !d.is_zero()),
        shutdown_timeout: parse_duration("server.shutdown_timeout", &s.shutdown_timeout)?,
        shutdown_delay: parse_duration("server.shutdown_delay", &s.shutdown_delay)?,
        max_connections: s.max_connections,
        access_log: s.access_log,
        max_header_size: parse_size("server.max_header_size", &s.max_header_size)?,
        max_uri_length: parse_size("server.max_uri_length", &s.max_uri_length)?,
        max_body: parse_size("server.max_body", &s.max_body)?,
        merge_slashes: s.merge_slashes,
        reject_encoded_slash: s.reject_encoded_slash,
        trusted_proxies: s
            .trusted_proxies
            .iter()
            .enumerate()
            .map(|(i, cidr)| parse_cidr(&format!("server.trusted_proxies[{i}]"), cidr))
            .collect::<Result<_, _>>()?,
        request_id: s.request_id,
        trace_context: s.trace_context,
        access_log_format: match s.access_log_format.as_deref() {
            None => None,
            Some("json") => Some(AccessLogFormat::Json),
            Some("combined") => Some(AccessLogFormat::Combined),
            Some(other) => {
                return Err(("server.access_log_format".into(), format!("{other:?}: use \"json\" or \"combined\"")));
            }
        },
        tls: s.tls.as_ref().map(|t| listener_tls(t, base_dir)).transpose()?,
    };
    // hyper's read buffer cannot be smaller than 8 KiB.
    if server.max_header_size < 8192 {
        return Err(("server.max_header_size".into(), "must be at least 8KiB".into()));
    }
    if server.max_connections == 0 {
        return Err(("server.max_connections".into(), "must be at least 1".into()));
    }
    if server.tcp_keepalive.is_some_and(|d| d < Duration::from_secs(1)) {
        return Err(("server.tcp_keepalive".into(), "must be at least 1s (or \"0s\" to turn it off)".into()));
    }
    Ok(server)
}

fn listener_tls(t: &RawServerTls, base_dir: &Path) -> Result<ListenerTls, Problem> {
    let (Some(cert), Some(key)) = (&t.cert, &t.key) else {
        let missing = if t.cert.is_none() { "cert" } else { "key" };
        return Err((format!("server.tls.{missing}"), "required: a PEM file".into()));
    };
    let (cert, key) = (base_dir.join(cert), base_dir.join(key));
    let client_ca = t.client_ca.as_ref().map(|c| base_dir.join(c));
    let config = crate::tls::server_config(&cert, &key, client_ca.as_deref()).map_err(|m| ("server.tls".into(), m))?;
    Ok(ListenerTls { config, cert, client_ca })
}

fn tracing(t: &RawTracing) -> Result<TracingConfig, Problem> {
    if let Some(url) = &t.otlp_endpoint {
        let uri: Uri =
            url.parse().map_err(|e| ("tracing.otlp_endpoint".to_owned(), format!("invalid URL {url:?}: {e}")))?;
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err((
                "tracing.otlp_endpoint".into(),
                "credentials in the URL are not supported (and would be logged)".into(),
            ));
        }
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err((
                "tracing.otlp_endpoint".into(),
                format!("{url:?}: use an http:// base URL, e.g. http://127.0.0.1:4318"),
            ));
        }
    }
    Ok(TracingConfig {
        otlp_endpoint: t.otlp_endpoint.clone(),
        service_name: t.service_name.clone().unwrap_or_else(|| "gateway".to_owned()),
    })
}

/// A route's `request_headers` or `response_headers`. `switched`: headers
/// the gateway itself sets after the rules, with the switch that makes it.
fn header_rules(
    raw: Option<&RawHeaderRules>,
    key: &str,
    switched: &[(HeaderName, &str)],
) -> Result<HeaderRules, Problem> {
    let Some(raw) = raw else { return Ok(HeaderRules::default()) };
    let name = |k: &str, n: &str| {
        let parsed =
            HeaderName::from_bytes(n.as_bytes()).map_err(|_| (k.to_owned(), format!("invalid header name {n:?}")))?;
        if let Some((_, switch)) = switched.iter().find(|(h, _)| *h == parsed) {
            return Err((
                k.to_owned(),
                format!("{n:?} is set by the gateway after the rules while {switch} is true; switch that off instead"),
            ));
        }
        if crate::headers::is_hop_by_hop(&parsed)
            || parsed == http::header::HOST
            || parsed == http::header::CONTENT_LENGTH
        {
            return Err((
                k.to_owned(),
                format!("{n:?} is managed by the gateway (hop-by-hop or framing) and cannot be set or removed"),
            ));
        }
        Ok(parsed)
    };
    let mut rules = HeaderRules::default();
    for (n, v) in &raw.set {
        let k = format!("{key}.set.{n}");
        let value = HeaderValue::from_str(v).map_err(|_| (k.clone(), format!("invalid header value {v:?}")))?;
        rules.set.push((name(&k, n)?, value));
    }
    for (i, n) in raw.remove.iter().enumerate() {
        rules.remove.push(name(&format!("{key}.remove[{i}]"), n)?);
    }
    Ok(rules)
}

fn metrics(m: &RawMetrics) -> Result<MetricsConfig, Problem> {
    if !m.path.starts_with('/') {
        return Err(("metrics.path".into(), format!("{:?} must start with '/'", m.path)));
    }
    if m.max_connections == 0 {
        return Err(("metrics.max_connections".into(), "must be at least 1".into()));
    }
    Ok(MetricsConfig {
        path: m.path.clone(),
        listen: m.listen.as_deref().map(|l| parse_addr("metrics.listen", l)).transpose()?,
        max_connections: m.max_connections,
    })
}

/// The TLS client config of an upstream with `https://` endpoints; the
/// `tls_*` keys apply to nothing else.
fn upstream_tls(
    up: &RawUpstream,
    endpoints: &[EndpointConfig],
    base_dir: &Path,
    key: &dyn Fn(&str) -> String,
    protocol: Protocol,
) -> Result<Option<Arc<rustls::ClientConfig>>, Problem> {
    let set = [
        ("tls_ca_file", up.tls_ca_file.is_some()),
        ("tls_server_name", up.tls_server_name.is_some()),
        ("tls_client_cert", up.tls_client_cert.is_some()),
        ("tls_client_key", up.tls_client_key.is_some()),
    ];
    if endpoints.iter().all(|e| e.tls_name.is_none()) {
        return match set.iter().find(|(_, s)| *s) {
            Some((k, _)) => Err((key(k), "only applies to https:// endpoints".into())),
            None => Ok(None),
        };
    }
    let ca = up.tls_ca_file.as_ref().map(|f| base_dir.join(f));
    let client = match (&up.tls_client_cert, &up.tls_client_key) {
        (Some(c), Some(k)) => Some((base_dir.join(c), base_dir.join(k))),
        (None, None) => None,
        (Some(_), None) => return Err((key("tls_client_key"), "required with tls_client_cert".into())),
        (None, Some(_)) => return Err((key("tls_client_cert"), "required with tls_client_key".into())),
    };
    let client_auth = client.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
    let alpn: &[&[u8]] = match protocol {
        Protocol::Http1 => &[b"http/1.1"],
        Protocol::H2c => &[b"h2"],
        Protocol::Auto => &[b"h2", b"http/1.1"],
    };
    crate::tls::client_config(ca.as_deref(), client_auth, alpn).map(Some).map_err(|(which, m)| match which {
        crate::tls::ClientKey::CaFile => (key("tls_ca_file"), m),
        crate::tls::ClientKey::ClientCert => (key("tls_client_cert"), m),
        crate::tls::ClientKey::ClientKey => (key("tls_client_key"), m),
    })
}

fn upstream(name: &str, up: &RawUpstream, base_dir: &Path) -> Result<UpstreamConfig, Problem> {
    let key = |k: &str| format!("upstreams.{name}.{k}");
    let urls: Vec<(String, &String)> = match (&up.url, &up.endpoints) {
        (Some(url), None) => vec![(key("url"), url)],
        (None, Some(list)) if list.is_empty() => return Err((key("endpoints"), "must list at least one URL".into())),
        (None, Some(list)) => list.iter().enumerate().map(|(i, u)| (key(&format!("endpoints[{i}]")), u)).collect(),
        _ => return Err((key("url"), "set exactly one of url and endpoints".into())),
    };
    let server_name = up
        .tls_server_name
        .as_ref()
        .map(|n| {
            ServerName::try_from(n.trim().to_owned())
                .map_err(|_| (key("tls_server_name"), format!("{n:?} is not a DNS name or IP address")))
        })
        .transpose()?;
    let mut endpoints: Vec<EndpointConfig> = Vec::new();
    for (k, url) in urls {
        let endpoint = parse_upstream_url(url, base_dir, server_name.as_ref()).map_err(|m| (k.clone(), m))?;
        if endpoints.iter().any(|e| e.address == endpoint.address) {
            return Err((k, format!("{url:?} is listed twice")));
        }
        endpoints.push(endpoint);
    }
    let balance = match up.balance.as_deref() {
        None | Some("least_request") => Balance::LeastRequest,
        Some("round_robin") => Balance::RoundRobin,
        Some(other) => return Err((key("balance"), format!("{other:?}: use \"least_request\" or \"round_robin\""))),
    };
    let protocol = match up.protocol.as_deref() {
        None | Some("http1") => Protocol::Http1,
        Some("h2c") => Protocol::H2c,
        Some("auto") if endpoints.iter().all(|e| e.tls_name.is_some()) => Protocol::Auto,
        Some("auto") => {
            return Err((key("protocol"), "\"auto\" chooses by ALPN: every endpoint must be https://".into()));
        }
        Some(other) => return Err((key("protocol"), format!("{other:?}: use \"http1\", \"h2c\" or \"auto\""))),
    };
    let max_connections = match up.max_connections {
        None => 1,
        Some(0) => return Err((key("max_connections"), "must be at least 1".into())),
        Some(n) if protocol == Protocol::Http1 => {
            return Err((key("max_connections"), format!("{n}: only for HTTP/2 (protocol = \"h2c\" or \"auto\")")));
        }
        Some(n) => n.min(1024),
    };
    let tls = upstream_tls(up, &endpoints, base_dir, &key, protocol)?;
    Ok(UpstreamConfig {
        name: name.to_owned(),
        endpoints,
        balance,
        connect_timeout: parse_duration(&key("connect_timeout"), up.connect_timeout.as_deref().unwrap_or("1s"))?,
        pool_max_idle_per_host: up.pool_max_idle_per_host.unwrap_or(1024),
        pool_idle_timeout: parse_duration(&key("pool_idle_timeout"), up.pool_idle_timeout.as_deref().unwrap_or("50s"))?,
        admission: admission(up, &key)?,
        health: up.health.as_ref().map(|h| health(h, &key)).transpose()?,
        outlier: up.outlier.as_ref().map(|o| outlier(o, &key)).transpose()?,
        retry_budget: retry_budget(up.retry_budget.as_ref(), &key)?,
        tls,
        protocol,
        max_connections,
    })
}

/// `max_requests`, `queue` and `queue_timeout`.
fn admission(up: &RawUpstream, key: &dyn Fn(&str) -> String) -> Result<Option<Admission>, Problem> {
    let Some(max_requests) = up.max_requests else {
        if up.queue.is_some() || up.queue_timeout.is_some() {
            let k = if up.queue.is_some() { "queue" } else { "queue_timeout" };
            return Err((key(k), "only applies with max_requests".into()));
        }
        return Ok(None);
    };
    if max_requests == 0 || max_requests > MAX_REQUESTS {
        return Err((key("max_requests"), format!("must be between 1 and {MAX_REQUESTS} (leave it out for no limit)")));
    }
    let queue_timeout = positive_duration(&key("queue_timeout"), up.queue_timeout.as_deref().unwrap_or("5s"))?;
    Ok(Some(Admission { max_requests, queue: up.queue.unwrap_or(100), queue_timeout }))
}

fn health(h: &RawHealth, key: &dyn Fn(&str) -> String) -> Result<HealthConfig, Problem> {
    let path = h.path.clone().ok_or_else(|| (key("health.path"), "missing".into()))?;
    if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
        return Err((key("health.path"), format!("{path:?} must be a path starting with '/'")));
    }
    let at_least_one = |k: &str, v: Option<u32>, default: u32| match v.unwrap_or(default) {
        0 => Err((key(k), "must be at least 1".to_owned())),
        n => Ok(n),
    };
    Ok(HealthConfig {
        path,
        interval: positive_duration(&key("health.interval"), h.interval.as_deref().unwrap_or("5s"))?,
        timeout: positive_duration(&key("health.timeout"), h.timeout.as_deref().unwrap_or("1s"))?,
        unhealthy_after: at_least_one("health.unhealthy_after", h.unhealthy_after, 3)?,
        healthy_after: at_least_one("health.healthy_after", h.healthy_after, 2)?,
    })
}

fn outlier(o: &RawOutlier, key: &dyn Fn(&str) -> String) -> Result<OutlierConfig, Problem> {
    let consecutive_failures = o.consecutive_failures.unwrap_or(5);
    if consecutive_failures == 0 {
        return Err((key("outlier.consecutive_failures"), "must be at least 1".into()));
    }
    let ejection_time = positive_duration(&key("outlier.ejection_time"), o.ejection_time.as_deref().unwrap_or("30s"))?;
    Ok(OutlierConfig { consecutive_failures, ejection_time })
}

fn retry_budget(b: Option<&RawRetryBudget>, key: &dyn Fn(&str) -> String) -> Result<RetryBudget, Problem> {
    let ratio = b.and_then(|b| b.ratio).unwrap_or(0.2);
    // tower's budget takes a retry percentage from 0 to 1000 (ten retries a request).
    if !(0.0..=10.0).contains(&ratio) {
        return Err((key("retry_budget.ratio"), format!("{ratio} must be between 0 and 10")));
    }
    let min_per_second = b.and_then(|b| b.min_per_second).unwrap_or(10);
    // tower's budget keeps min_per_second × its 10 s window in an i32.
    if min_per_second > 100_000_000 {
        return Err((key("retry_budget.min_per_second"), "must be at most 100000000".into()));
    }
    Ok(RetryBudget { ratio: ratio as f32, min_per_second })
}

fn route(
    i: usize,
    r: RawRoute,
    server: &ServerConfig,
    upstream_index: &HashMap<String, usize>,
    base_dir: &Path,
) -> Result<RouteConfig, Problem> {
    let key = |k: &str| format!("routes[{i}].{k}");
    let name = r.name.clone().filter(|n| !n.is_empty()).ok_or_else(|| (key("name"), "missing".into()))?;
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.') {
        return Err((key("name"), format!("{name:?}: use letters, digits, '_', '-' or '.'")));
    }
    if name == "unmatched" {
        return Err((key("name"), "\"unmatched\" is reserved for requests that match no route".into()));
    }
    let prefix = normalize_prefix(r.prefix.as_deref().ok_or_else(|| (key("prefix"), "missing".into()))?)
        .map_err(|m| (key("prefix"), m))?;
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
    let target = target(&name, &r, &key, upstream_index, base_dir)?;
    let max_body = r.max_body.as_ref().map(|b| parse_size(&key("max_body"), b)).transpose()?.unwrap_or(server.max_body);
    if r.max_concurrent == Some(0) {
        return Err((key("max_concurrent"), "must be at least 1 (leave it out for no limit)".into()));
    }
    let mut switched = Vec::new();
    if server.request_id {
        switched.push((crate::layers::request_id::X_REQUEST_ID, "server.request_id"));
    }
    let response_switched = switched.clone();
    if server.trace_context {
        switched.push((crate::layers::trace::TRACEPARENT, "server.trace_context"));
    }
    let request_headers = header_rules(r.request_headers.as_ref(), &key("request_headers"), &switched)?;
    let response_headers = header_rules(r.response_headers.as_ref(), &key("response_headers"), &response_switched)?;
    if r.panic.is_some() && !cfg!(debug_assertions) {
        return Err((key("panic"), "only in debug builds, for the gateway's own tests".into()));
    }
    Ok(RouteConfig {
        name,
        prefix,
        methods,
        target,
        max_body,
        max_concurrent: r.max_concurrent,
        request_headers,
        response_headers,
        compress: r.compress.unwrap_or(false),
        panic: r.panic,
    })
}

/// The route's one target, and the keys that only a proxy route may set.
fn target(
    name: &str,
    r: &RawRoute,
    key: &dyn Fn(&str) -> String,
    upstream_index: &HashMap<String, usize>,
    base_dir: &Path,
) -> Result<Target, Problem> {
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
        ("retries", r.retries.is_some()),
        ("retry_on", r.retry_on.is_some()),
        ("upgrade", r.upgrade.is_some()),
        ("upgrade_idle_timeout", r.upgrade_idle_timeout.is_some()),
    ];
    if r.upstream.is_none()
        && let Some((k, _)) = only_for_proxy.iter().find(|(_, set)| *set)
    {
        return Err((key(k), "only applies to routes with an upstream".into()));
    }
    if let Some(up) = &r.upstream {
        return proxy_target(up, r, key, upstream_index).map(Target::Proxy);
    }
    if let Some(f) = &r.file {
        let path = base_dir.join(f);
        if !path.is_file() {
            return Err((key("file"), format!("{} is not a readable file", path.display())));
        }
        return Ok(Target::File(path));
    }
    if let Some(d) = &r.dir {
        let path = base_dir.join(d);
        let root = path
            .canonicalize()
            .ok()
            .filter(|p| p.is_dir())
            .ok_or_else(|| (key("dir"), format!("{} is not a directory", path.display())))?;
        return Ok(Target::Dir(root));
    }
    let resp = r.respond.as_ref().expect("one target is set");
    let code = resp.status.unwrap_or(200);
    let status = StatusCode::from_u16(code)
        .ok()
        .filter(|s| s.as_u16() >= 200)
        .ok_or_else(|| (key("respond.status"), format!("invalid status {code}")))?;
    Ok(Target::Respond { status, body: Bytes::from(resp.body.clone().unwrap_or_default()) })
}

fn proxy_target(
    up: &str,
    r: &RawRoute,
    key: &dyn Fn(&str) -> String,
    upstream_index: &HashMap<String, usize>,
) -> Result<ProxyTarget, Problem> {
    let upstream = *upstream_index.get(up).ok_or_else(|| {
        let known: Vec<_> = upstream_index.keys().map(String::as_str).collect();
        (key("upstream"), format!("unknown upstream {up:?} (known: {})", known.join(", ")))
    })?;
    let rewrite = r.rewrite.as_deref().map(|rw| validate_rewrite(rw).map_err(|m| (key("rewrite"), m))).transpose()?;
    let host = match r.host.as_deref() {
        None | Some("preserve") => HostMode::Preserve,
        Some("upstream") => HostMode::Upstream,
        Some(other) => return Err((key("host"), format!("{other:?}: use \"preserve\" or \"upstream\""))),
    };
    let timeout = match r.timeout.as_deref() {
        Some(t) => positive_duration(&key("timeout"), t)?,
        None => DEFAULT_ROUTE_TIMEOUT,
    };
    let body_timeout = match r.body_timeout.as_deref() {
        Some(t) => positive_duration(&key("body_timeout"), t)?,
        None => DEFAULT_BODY_TIMEOUT,
    };
    let mut retry_on = RetryOn { connect: true, ..RetryOn::default() };
    if let Some(list) = &r.retry_on {
        retry_on = RetryOn::default();
        for item in list {
            match item.as_str() {
                "connect" => retry_on.connect = true,
                "reset" => retry_on.reset = true,
                "503" => retry_on.unavailable = true,
                other => {
                    return Err((key("retry_on"), format!("{other:?}: use any of \"connect\", \"reset\", \"503\"")));
                }
            }
        }
    }
    let retries = r.retries.unwrap_or(0);
    let upgrade_idle = match r.upgrade_idle_timeout.as_deref() {
        Some(t) => positive_duration(&key("upgrade_idle_timeout"), t)?,
        None => DEFAULT_UPGRADE_IDLE_TIMEOUT,
    };
    if r.upgrade == Some(false) && r.upgrade_idle_timeout.is_some() {
        return Err((key("upgrade_idle_timeout"), "has no effect with upgrade = false".into()));
    }
    let upgrade = r.upgrade.unwrap_or(true).then_some(upgrade_idle);
    Ok(ProxyTarget { upstream, rewrite, timeout, body_timeout, host, retries, retry_on, upgrade })
}

/// The longest duration any key takes: deadlines are instants, and an
/// instant that far ahead (humantime reads up to ~584 billion years) would
/// overflow the clock and panic at the first request that used it.
const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

fn parse_duration(key: &str, value: &str) -> Result<Duration, Problem> {
    let d = humantime::parse_duration(value.trim())
        .map_err(|e| (key.to_owned(), format!("invalid duration {value:?}: {e} (use e.g. \"250ms\", \"2s\")")))?;
    if d > MAX_DURATION {
        return Err((key.to_owned(), format!("{value:?} is too long: at most 10 years")));
    }
    Ok(d)
}

fn positive_duration(key: &str, value: &str) -> Result<Duration, Problem> {
    let d = parse_duration(key, value)?;
    if d.is_zero() {
        return Err((key.to_owned(), "must be greater than zero".into()));
    }
    Ok(d)
}

fn parse_size(key: &str, value: &RawSize) -> Result<u64, Problem> {
    match value {
        RawSize::Bytes(n) => Ok(*n),
        RawSize::Text(t) => t.trim().parse::<bytesize::ByteSize>().map(|b| b.as_u64()).map_err(|e| {
            (key.to_owned(), format!("invalid size {t:?}: {e} (use e.g. \"64KiB\", \"10MiB\" or a number of bytes)"))
        }),
    }
}

fn parse_addr(key: &str, value: &str) -> Result<SocketAddr, Problem> {
    value
        .parse()
        .map_err(|e| (key.to_owned(), format!("invalid socket address {value:?}: {e} (use e.g. \"127.0.0.1:8080\")")))
}

/// A CIDR block; a bare address is a block of one.
fn parse_cidr(key: &str, value: &str) -> Result<IpNet, Problem> {
    let value = value.trim();
    value
        .parse::<IpNet>()
        .or_else(|_| value.parse::<std::net::IpAddr>().map(IpNet::from))
        .map(|net| net.trunc())
        .map_err(|_| (key.to_owned(), format!("invalid CIDR {value:?} (use e.g. \"10.0.0.0/8\", \"::1\")")))
}

/// An upstream URL: `http://host:port` or `https://host:port`, with no path
/// beyond `/`, or `unix:PATH` (relative to `base_dir`). `server_name`
/// overrides the name an `https://` endpoint's certificate must carry.
fn parse_upstream_url(
    url: &str,
    base_dir: &Path,
    server_name: Option<&ServerName<'static>>,
) -> Result<EndpointConfig, String> {
    if let Some(path) = url.strip_prefix("unix:") {
        // `unix:///run/app.sock` is a common spelling too; `unix://x/y`
        // is not (is `x` a host or a folder?).
        let path = match path.strip_prefix("//") {
            Some(rest) if !rest.starts_with('/') => {
                return Err(format!("invalid URL {url:?}: use unix:/absolute/path or unix:relative/path"));
            }
            Some(rest) => rest,
            None => path,
        };
        if path.is_empty() {
            return Err(format!("invalid URL {url:?}: missing socket path (use unix:/run/app/app.sock)"));
        }
        let path = base_dir.join(path);
        // sun_path holds 108 bytes, the terminating NUL included.
        if path.as_os_str().len() > 107 {
            return Err(format!(
                "socket path {} is longer than a Unix socket address allows (107 bytes)",
                path.display()
            ));
        }
        return Ok(EndpointConfig {
            url: url.to_owned(),
            scheme: Scheme::HTTP,
            authority: Authority::from_static("localhost"),
            address: Address::Unix(path),
            tls_name: None,
        });
    }
    let uri: Uri = url.parse().map_err(|e| format!("invalid URL {url:?}: {e}"))?;
    let scheme =
        uri.scheme().cloned().ok_or_else(|| format!("invalid URL {url:?}: missing scheme (use http://host:port)"))?;
    if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
        return Err(format!("unsupported scheme in {url:?}: use http://host:port, https://host:port or unix:PATH"));
    }
    let authority = uri.authority().cloned().ok_or_else(|| format!("invalid URL {url:?}: missing host"))?;
    if authority.as_str().contains('@') {
        return Err(format!("invalid URL {url:?}: credentials are not supported"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("invalid URL {url:?}: a path or query is not supported; use a route's rewrite"));
    }
    let tls = scheme == Scheme::HTTPS;
    let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let address = Address::Tcp(format!("{}:{port}", authority.host()));
    let tls_name = match (tls, server_name) {
        (false, _) => None,
        (true, Some(name)) => Some(name.clone()),
        (true, None) => {
            // An IPv6 host is bracketed in the URL, not in the name.
            let host = authority.host().trim_start_matches('[').trim_end_matches(']');
            Some(
                ServerName::try_from(host.to_owned())
                    .map_err(|_| format!("{host:?} is not a valid TLS server name"))?,
            )
        }
    };
    Ok(EndpointConfig { url: url.to_owned(), scheme, authority, address, tls_name })
}

/// Normalises a route prefix: must start with `/`; a trailing `/` is dropped
/// (so `/b/` and `/b` are the same segment-aware prefix). The prefix must
/// itself be a normalised path, or no request could ever match it: requests
/// are matched after [`crate::path::normalize`].
fn normalize_prefix(p: &str) -> Result<String, String> {
    if !p.starts_with('/') {
        return Err(format!("{p:?} must start with '/'"));
    }
    if p.contains(['?', '#']) || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{p:?} must be a plain path"));
    }
    let trimmed = p.trim_end_matches('/');
    let prefix = if trimmed.is_empty() { "/".to_owned() } else { trimmed.to_owned() };
    let opts = crate::path::Options { merge_slashes: true, reject_encoded_slash: false };
    match crate::path::normalize(&prefix, opts) {
        Ok(n) if n == prefix => Ok(prefix),
        Ok(n) => Err(format!("{p:?} is not a normalised path (it would be {n:?}); requests are matched normalised")),
        Err(_) => Err(format!("{p:?} climbs above '/'")),
    }
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
