//! Validation of the raw file into the runtime types, one function per
//! section. Every error is `(key, message)`; `load` adds the source name.
//! Pure apart from checking that file and directory targets exist.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{StatusCode, Uri};

use crate::config::{redact_url, refused_name, refused_value};
use crate::headers::rules::HeaderRules;

use super::raw::{RawConfig, RawHeaderRules, RawRoute, RawServer, RawServerTls, RawSize, RawTracing};
use super::{
    AccessLogFormat, Config, DEFAULT_BODY_TIMEOUT, DEFAULT_REQUEST_BUFFER, DEFAULT_ROUTE_TIMEOUT,
    DEFAULT_UPGRADE_IDLE_TIMEOUT, HostMode, Http1Server, Http2Server, ListenerTls, ProxyTarget, RetryOn, RouteConfig,
    ServerConfig, Target, TracingConfig,
};

mod access;
mod address;
mod cache;
pub(super) mod methods;
mod metrics;
mod ratelimit;
mod resolver;
mod routing;
mod target;
mod upstream;

use access::{RawAccessKeys, access, parse_cidr};
use address::parse_addr;
use metrics::metrics;
use resolver::resolver;
use target::target;
use upstream::upstream;

/// A problem with one key: `(key, message)`.
type Problem = (String, String);

/// `running`: on a reload, the `[server]` the gateway runs on with; the
/// routes take their defaults from it, and must hold under it and under
/// the file's own (the next start checks them so).
pub(super) fn config(raw: RawConfig, base_dir: &Path, running: Option<&ServerConfig>) -> Result<Config, Problem> {
    let server = server(&raw.server, base_dir)?;
    let running =
        running.filter(|r| ServerConfig { tls: None, ..(*r).clone() } != ServerConfig { tls: None, ..server.clone() });
    let tracing = tracing(&raw.tracing)?;
    let metrics = metrics(&raw.metrics)?;
    let rate_limit_store =
        raw.rate_limit_store.as_ref().map(|s| ratelimit::store(s, |v| std::env::var(v).ok(), base_dir)).transpose()?;
    let resolver = resolver(&raw.resolver)?;
    let mut upstreams = Vec::new();
    let mut upstream_index = HashMap::new();
    for (name, up) in &raw.upstreams {
        check_name(name).map_err(|m| (format!("upstreams.{name:?}"), m))?;
        upstream_index.insert(name.clone(), upstreams.len());
        upstreams.push(upstream(name, up, base_dir)?);
    }
    let mut routes: Vec<RouteConfig> = Vec::new();
    let mut seen_names = HashMap::new();
    for (i, r) in raw.routes.into_iter().enumerate() {
        let rate_limit = r
            .rate_limit
            .as_ref()
            .map(|rl| ratelimit::rate_limit(rl, &format!("routes[{i}].rate_limit"), rate_limit_store.as_ref()))
            .transpose()?;
        let built = match running {
            Some(running) => {
                route(i, r.clone(), &server, &upstream_index, base_dir)?;
                route(i, r, running, &upstream_index, base_dir).map_err(|(key, message)| {
                    (key, format!("{message} (in the running [server], kept until a restart)"))
                })?
            }
            None => route(i, r, &server, &upstream_index, base_dir)?,
        };
        let route = RouteConfig { rate_limit, ..built };
        let key = |k: &str| format!("routes[{i}].{k}");
        if let Some(prev) = seen_names.insert(route.name.clone(), i) {
            return Err((key("name"), format!("duplicate route name {:?} (also routes[{prev}])", route.name)));
        }
        routes.push(route);
    }
    routing::refuse_unreachable(&routes)?;
    routing::refuse_routing_on_auth_headers(&routes)?;
    routing::mirror_endpoints(&routes, &upstreams)?;
    Ok(Config {
        source_name: String::new(),
        source: None,
        server,
        metrics,
        tracing,
        resolver,
        upstreams,
        routes,
        rate_limit_store,
        effective: Default::default(),
    })
}

fn server(s: &RawServer, base_dir: &Path) -> Result<ServerConfig, Problem> {
    let server = ServerConfig {
        listen: parse_addr("server.listen", &s.listen)?,
        worker_threads: s.worker_threads,
        header_read_timeout: positive_duration("server.header_read_timeout", &s.header_read_timeout)?,
        idle_timeout: positive_duration("server.idle_timeout", &s.idle_timeout)?,
        send_timeout: positive_duration("server.send_timeout", &s.send_timeout)?,
        park_after: Some(parse_duration("server.park_after", &s.park_after)?).filter(|d| !d.is_zero()),
        tcp_keepalive: Some(parse_duration("server.tcp_keepalive", &s.tcp_keepalive)?).filter(|d| !d.is_zero()),
        shutdown_timeout: parse_duration("server.shutdown_timeout", &s.shutdown_timeout)?,
        shutdown_delay: parse_duration("server.shutdown_delay", &s.shutdown_delay)?,
        max_connections: s.max_connections,
        access_log: s.access_log,
        max_header_size: parse_size("server.max_header_size", &s.max_header_size)?,
        max_uri_length: parse_size("server.max_uri_length", &s.max_uri_length)?,
        max_body: parse_size("server.max_body", &s.max_body)?,
        request_buffer_total: parse_size("server.request_buffer_total", &s.request_buffer_total)?,
        drop_underscore_headers: s.drop_underscore_headers,
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
        watch_config: s.watch_config,
        http1: match s.http1.as_deref() {
            Some("hyper") => Http1Server::Hyper,
            None | Some("gateway") => Http1Server::Gateway,
            Some(other) => return Err(("server.http1".into(), format!("{other:?}: use \"hyper\" or \"gateway\""))),
        },
        http2: match s.http2.as_deref() {
            None | Some("hyper") => Http2Server::Hyper,
            Some("gateway") => Http2Server::Gateway,
            Some(other) => return Err(("server.http2".into(), format!("{other:?}: use \"hyper\" or \"gateway\""))),
        },
        via: match &s.via {
            Some(name) => crate::headers::Via::new(name).map_err(|m| ("server.via".to_owned(), m))?,
            None => crate::headers::Via::default(),
        },
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
    let config = crate::tls::server_config(&cert, &key, client_ca.as_deref())
        .map_err(|(which, m)| (format!("server.tls.{which}"), m))?;
    Ok(ListenerTls { config, cert, key, client_ca })
}

fn tracing(t: &RawTracing) -> Result<TracingConfig, Problem> {
    if let Some(url) = &t.otlp_endpoint {
        let shown = crate::config::redact_url(url);
        let uri: Uri =
            url.parse().map_err(|e| ("tracing.otlp_endpoint".to_owned(), format!("invalid URL {shown:?}: {e}")))?;
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err((
                "tracing.otlp_endpoint".into(),
                "credentials in the URL are not supported (and would be logged)".into(),
            ));
        }
        // `/v1/traces` is appended to the URL as written, so it would land
        // after a query; and a token in one would be logged.
        if url.contains(['?', '#']) {
            return Err((
                "tracing.otlp_endpoint".into(),
                "a query or fragment in the URL is not supported (it would be logged, and /v1/traces goes after the path)"
                    .into(),
            ));
        }
        if uri.scheme_str() != Some("http") || uri.authority().is_none() {
            return Err((
                "tracing.otlp_endpoint".into(),
                format!("{shown:?}: use an http:// base URL, e.g. http://127.0.0.1:4318"),
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
        let parsed = HeaderName::from_bytes(n.as_bytes())
            .map_err(|_| (k.to_owned(), format!("invalid header name {:?}", refused_name(n))))?;
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
        let k = format!("{key}.set.{}", refused_name(n));
        let value = HeaderValue::from_str(v)
            .map_err(|_| (k.clone(), format!("invalid header value {}", refused_value(n, v))))?;
        rules.set.push((name(&k, n)?, value));
    }
    for (i, n) in raw.remove.iter().enumerate() {
        rules.remove.push(name(&format!("{key}.remove[{i}]"), n)?);
    }
    Ok(rules)
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
    check_name(&name).map_err(|m| (key("name"), m))?;
    if name == "unmatched" {
        return Err((key("name"), "\"unmatched\" is reserved for requests that match no route".into()));
    }
    let prefix = normalize_prefix(r.prefix.as_deref().ok_or_else(|| (key("prefix"), "missing".into()))?)
        .map_err(|m| (key("prefix"), m))?;
    let (hosts, conditions) = routing::matchers(&r, &key)?;
    let methods = r.methods.as_deref().map(|ms| methods::methods(&key("methods"), ms)).transpose()?;
    let mut target = target(&name, &r, &key, upstream_index, base_dir)?;
    let max_body = r.max_body.as_ref().map(|b| parse_size(&key("max_body"), b)).transpose()?.unwrap_or(server.max_body);
    if r.max_concurrent == Some(0) {
        return Err((key("max_concurrent"), "must be at least 1 (leave it out for no limit)".into()));
    }
    let mut switched = Vec::new();
    if server.request_id {
        switched.push((crate::headers::X_REQUEST_ID, "server.request_id"));
    }
    let response_switched = switched.clone();
    if server.trace_context {
        switched.push((crate::headers::TRACEPARENT, "server.trace_context"));
    }
    let request_headers = header_rules(r.request_headers.as_ref(), &key("request_headers"), &switched)?;
    let response_headers = header_rules(r.response_headers.as_ref(), &key("response_headers"), &response_switched)?;
    let keys = RawAccessKeys {
        allow: r.allow.as_deref(),
        deny: r.deny.as_deref(),
        auth: r.auth.as_ref(),
        forward_credentials: r.forward_credentials,
    };
    let access = access(keys, &key, base_dir)?.map(std::sync::Arc::new);
    if let Target::Proxy(p) = &mut target {
        p.drop_underscore_headers = server.drop_underscore_headers;
        p.via = server.via.clone();
        let ruled = request_headers.remove.iter().chain(request_headers.set.iter().map(|(n, _)| n));
        let authed = access.as_ref().map(|a| a.guarded_headers()).unwrap_or_default();
        let gateway = [&crate::headers::SET_BY_GATEWAY[..], &crate::headers::FROM_PROXIES_ONLY].concat();
        p.guarded_trailers = gateway.iter().chain(ruled).chain(&authed).cloned().collect();
    }
    if r.panic.is_some() && !cfg!(debug_assertions) {
        return Err((key("panic"), "only in debug builds, for the gateway's own tests".into()));
    }
    Ok(RouteConfig {
        name,
        prefix,
        hosts,
        conditions,
        methods,
        target,
        max_body,
        max_concurrent: r.max_concurrent,
        request_headers,
        response_headers,
        compress: r.compress.unwrap_or(false),
        rate_limit: None,
        panic: r.panic,
        access,
    })
}

/// The longest duration any key takes: deadlines are instants, and an
/// instant that far ahead (humantime reads up to ~584 billion years) would
/// overflow the clock and panic at the first request that used it.
const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

fn parse_duration(key: &str, value: &str) -> Result<Duration, Problem> {
    // A bare number (`timeout = 5`, read as the text "5"): humantime's
    // answer quoted it and offered `5sec` beside the usual forms.
    // A decimal ("0.5") drew "for example 0sec", a sign "expected number".
    let v = value.trim();
    let number = v.parse::<f64>().is_ok_and(f64::is_finite) && v.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if number {
        return Err((key.to_owned(), format!("a duration needs its unit: \"{v}s\" or \"{v}ms\", not {v}")));
    }
    if v.starts_with('-') {
        return Err((key.to_owned(), format!("invalid duration {value:?}: a duration cannot be negative")));
    }
    let d = humantime::parse_duration(v).map_err(|e| {
        let lower = v.to_lowercase();
        let why = match humantime::parse_duration(&lower) {
            Ok(_) => format!("units are written in lower case: {lower:?}"),
            Err(_) => format!("{e} (use e.g. \"250ms\", \"2s\")"),
        };
        (key.to_owned(), format!("invalid duration {value:?}: {why}"))
    })?;
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
        // bytesize's own words ("cannot parse float from empty string" for
        // "-1MiB") describe its parser, not the value.
        RawSize::Text(t) => t.trim().parse::<bytesize::ByteSize>().map(|b| b.as_u64()).map_err(|_| {
            let why = match t.trim_start().starts_with('-') {
                true => "a size cannot be negative",
                false => "a size is a number and a unit (B, KB, KiB, MB, MiB, GB, GiB)",
            };
            (key.to_owned(), format!("invalid size {t:?}: {why} (use e.g. \"64KiB\", \"10MiB\" or a number of bytes)"))
        }),
    }
}

/// A route's or upstream's name: it becomes a metric label, a log field
/// and a key of `/-/upstreams` and the status page, so it is plain.
fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.') {
        return Err(format!("{name:?}: use letters, digits, '_', '-' or '.'"));
    }
    Ok(())
}

/// Normalises a route prefix: must start with `/`; a trailing `/` is dropped
/// (so `/b/` and `/b` are the same segment-aware prefix). The prefix must
/// itself be a normalised path, or no request could ever match it: requests
/// are matched after [`crate::path::normalize`].
fn normalize_prefix(p: &str) -> Result<String, String> {
    if !p.starts_with('/') {
        return Err(format!("{:?} must start with '/'", redact_url(p)));
    }
    if p.contains(['?', '#']) || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{:?} must be a plain path", redact_url(p)));
    }
    // A request's `;` parameters and `%2F` are read as a parameter-dropping
    // or slash-decoding upstream reads them when its route is chosen (see
    // `path::routing_view`): a prefix spelt with them would never be chosen,
    // and its requests would fall to a shorter prefix's route, past its guard.
    if p.contains(';') || p.to_ascii_uppercase().contains("%2F") {
        return Err(format!(
            "{p:?}: a prefix cannot hold ';' or '%2F' (requests choose routes by their segments without them)"
        ));
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
        return Err(format!("{:?} must start with '/'", redact_url(rw)));
    }
    if rw.parse::<http::uri::PathAndQuery>().is_err() || rw.contains(['?', '#']) {
        return Err(format!("{:?} must be a plain path", redact_url(rw)));
    }
    Ok(rw.to_owned())
}
