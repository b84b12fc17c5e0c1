//! `[upstreams.NAME]`: endpoints and their URLs, TLS, protocol, admission,
//! health checks, ejection and the retry budget.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use http::Uri;
use http::uri::{Authority, Scheme};
use rustls_pki_types::ServerName;

use super::super::raw::{RawDiscover, RawHealth, RawMaxRequests, RawOutlier, RawRetryBudget, RawUpstream};
use super::super::{
    Address, Admission, AutoBounds as Bounds, Balance, Discover, DiscoverName, EndpointConfig, HealthConfig,
    MaxRequests, OutlierConfig, Protocol, RetryBudget, UpstreamConfig, UpstreamTls,
};
use super::{Problem, parse_duration, positive_duration};
use crate::config::redact_url;

/// The largest `max_requests` (tokio's semaphore takes up to 2^61 permits;
/// anything near that is a typo).
const MAX_REQUESTS: usize = 1_000_000;

/// The TLS client config of an upstream with `https://` endpoints (`tls`);
/// the `tls_*` keys apply to nothing else.
fn upstream_tls(
    up: &RawUpstream,
    tls: bool,
    base_dir: &Path,
    key: &dyn Fn(&str) -> String,
    protocol: Protocol,
) -> Result<Option<UpstreamTls>, Problem> {
    let set = [
        ("tls_ca_file", up.tls_ca_file.is_some()),
        ("tls_server_name", up.tls_server_name.is_some()),
        ("tls_client_cert", up.tls_client_cert.is_some()),
        ("tls_client_key", up.tls_client_key.is_some()),
    ];
    if !tls {
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
    let config = crate::tls::client_config(ca.as_deref(), client_auth, alpn).map_err(|(which, m)| match which {
        crate::tls::ClientKey::CaFile => (key("tls_ca_file"), m),
        crate::tls::ClientKey::ClientCert => (key("tls_client_cert"), m),
        crate::tls::ClientKey::ClientKey => (key("tls_client_key"), m),
    })?;
    // What it was made from, to tell a reload of unchanged files from a
    // renewal; the files were just read, so they are there.
    let mut source = Vec::new();
    let files = [ca.as_deref(), client_auth.map(|(c, _)| c), client_auth.map(|(_, k)| k)];
    for file in files {
        let bytes = file.map(|f| std::fs::read(f).unwrap_or_default()).unwrap_or_default();
        source.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
        source.extend_from_slice(&bytes);
    }
    for protocol in alpn {
        source.extend_from_slice(protocol);
        source.push(0);
    }
    let files = files.into_iter().flatten().map(Path::to_path_buf).collect();
    Ok(Some(UpstreamTls { config, source, files }))
}

/// The largest endpoint weight: shares finer than one in ten thousand are
/// not worth a wheel that large.
const MAX_WEIGHT: u32 = 10_000;

pub(super) fn upstream(name: &str, up: &RawUpstream, base_dir: &Path) -> Result<UpstreamConfig, Problem> {
    let key = |k: &str| format!("upstreams.{name}.{k}");
    let urls: Vec<(String, &String, Option<u32>)> = match (&up.url, &up.endpoints, &up.discover) {
        (Some(url), None, None) => vec![(key("url"), url, None)],
        (None, Some(list), None) if list.is_empty() => {
            return Err((key("endpoints"), "must list at least one URL".into()));
        }
        (None, Some(list), None) => {
            list.iter().enumerate().map(|(i, e)| (key(&format!("endpoints[{i}]")), e.url(), e.weight())).collect()
        }
        (None, None, Some(_)) => Vec::new(),
        _ => return Err((key("url"), "set exactly one of url, endpoints and discover".into())),
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
    for (k, url, weight) in urls {
        let mut endpoint = parse_upstream_url(url, base_dir, server_name.as_ref()).map_err(|m| (k.clone(), m))?;
        if let Some(weight) = weight {
            if !(1..=MAX_WEIGHT).contains(&weight) {
                return Err((format!("{k}.weight"), format!("{weight}: use 1 to {MAX_WEIGHT}")));
            }
            endpoint.weight = weight;
        }
        if endpoints.iter().any(|e| e.address == endpoint.address) {
            return Err((k, format!("{url:?} is listed twice")));
        }
        endpoints.push(endpoint);
    }
    let discover = up.discover.as_ref().map(|d| discover(d, server_name.as_ref(), &key)).transpose()?;
    let tls_wanted = match &discover {
        Some(d) => d.scheme == Scheme::HTTPS,
        None => endpoints.iter().all(|e| e.tls_name.is_some()),
    };
    let balance = match up.balance.as_deref() {
        None | Some("least_request") => Balance::LeastRequest,
        Some("round_robin") => Balance::RoundRobin,
        Some(other) => return Err((key("balance"), format!("{other:?}: use \"least_request\" or \"round_robin\""))),
    };
    let protocol = match up.protocol.as_deref() {
        None | Some("http1") => Protocol::Http1,
        Some("h2c") => Protocol::H2c,
        Some("auto") if tls_wanted => Protocol::Auto,
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
    let any_tls = discover.as_ref().map_or(endpoints.iter().any(|e| e.tls_name.is_some()), |_| tls_wanted);
    let tls = upstream_tls(up, any_tls, base_dir, &key, protocol)?;
    Ok(UpstreamConfig {
        name: name.to_owned(),
        endpoints,
        discover,
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

/// `discover = { dns = "name:port" | srv = "_http._tcp.name", scheme,
/// interval, min_ttl, max_ttl }`.
fn discover(
    d: &RawDiscover,
    server_name: Option<&ServerName<'static>>,
    key: &dyn Fn(&str) -> String,
) -> Result<Discover, Problem> {
    let scheme = match d.scheme.as_deref() {
        None | Some("http") => Scheme::HTTP,
        Some("https") => Scheme::HTTPS,
        Some(other) => return Err((key("discover.scheme"), format!("{other:?}: use \"http\" or \"https\""))),
    };
    let default_port = if scheme == Scheme::HTTPS { 443 } else { 80 };
    let name = match (&d.dns, &d.srv) {
        (Some(dns), None) => {
            let (host, port) = match dns.rsplit_once(':') {
                Some((host, port)) => {
                    let port = port.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                        (
                            key("discover.dns"),
                            format!("{:?}: the port must be a number from 1 to 65535", redact_url(dns)),
                        )
                    })?;
                    (host, port)
                }
                None => (dns.as_str(), default_port),
            };
            dns_name(host).map_err(|m| (key("discover.dns"), format!("{:?}: {m}", redact_url(dns))))?;
            DiscoverName::Dns { host: host.to_owned(), port }
        }
        (None, Some(srv)) => {
            dns_name(srv).map_err(|m| (key("discover.srv"), format!("{:?}: {m}", redact_url(srv))))?;
            DiscoverName::Srv(srv.clone())
        }
        _ => {
            return Err((
                key("discover"),
                "set exactly one of dns = \"name:port\" and srv = \"_http._tcp.name\"".into(),
            ));
        }
    };
    let interval = positive_duration(&key("discover.interval"), d.interval.as_deref().unwrap_or("5s"))?;
    let min_ttl = positive_duration(&key("discover.min_ttl"), d.min_ttl.as_deref().unwrap_or("1s"))?;
    let max_ttl = positive_duration(&key("discover.max_ttl"), d.max_ttl.as_deref().unwrap_or("60s"))?;
    if min_ttl > max_ttl {
        return Err((key("discover.min_ttl"), "must not be longer than max_ttl".into()));
    }
    if min_ttl > interval {
        return Err((key("discover.min_ttl"), "must not be longer than interval".into()));
    }
    let mut discover = Discover { name, scheme, interval, min_ttl, max_ttl, tls_name: None };
    if discover.scheme == Scheme::HTTPS {
        let name = match server_name {
            Some(n) => n.clone(),
            None => ServerName::try_from(discover.domain().to_owned())
                .map_err(|_| (key("discover"), format!("{:?} is not a valid TLS server name", discover.domain())))?,
        };
        discover.tls_name = Some(name);
    }
    Ok(discover)
}

/// A DNS name: dot-separated labels of letters, digits, `-` and `_`, of 1
/// to 63 bytes, 253 in all; a final dot is allowed (fully qualified).
fn dns_name(name: &str) -> Result<(), String> {
    let bare = name.strip_suffix('.').unwrap_or(name);
    if bare.is_empty() || bare.len() > 253 {
        return Err("not a DNS name".into());
    }
    if bare.parse::<std::net::IpAddr>().is_ok() {
        return Err("an address, not a name: use url for a fixed address".into());
    }
    let label_ok =
        |l: &str| (1..=63).contains(&l.len()) && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !bare.split('.').all(label_ok) {
        return Err("not a DNS name (labels of letters, digits, '-' and '_')".into());
    }
    Ok(())
}

/// `max_requests` (a number or `"auto"`, with `auto_min` and `auto_max`),
/// `queue` and `queue_timeout`.
fn admission(up: &RawUpstream, key: &dyn Fn(&str) -> String) -> Result<Option<Admission>, Problem> {
    let Some(raw) = &up.max_requests else {
        let stray = [("queue", up.queue.is_some()), ("queue_timeout", up.queue_timeout.is_some())];
        if let Some((k, _)) = stray.iter().find(|(_, set)| *set) {
            return Err((key(k), "only applies with max_requests".into()));
        }
        return auto_bounds(up, key, false).map(|_| None);
    };
    let range = || format!("must be between 1 and {MAX_REQUESTS}, or \"auto\" (leave it out for no limit)");
    let max_requests = match raw {
        RawMaxRequests::Text(t) if t == "auto" => MaxRequests::Auto(auto_bounds(up, key, true)?),
        RawMaxRequests::Count(n) => MaxRequests::Fixed(in_range(*n).ok_or_else(|| (key("max_requests"), range()))?),
        RawMaxRequests::Text(t) => match t.parse().ok().and_then(in_range) {
            Some(n) => MaxRequests::Fixed(n),
            None => return Err((key("max_requests"), format!("{t:?}: {}", range()))),
        },
    };
    if let MaxRequests::Fixed(_) = max_requests {
        auto_bounds(up, key, false)?;
    }
    let queue_timeout = positive_duration(&key("queue_timeout"), up.queue_timeout.as_deref().unwrap_or("5s"))?;
    Ok(Some(Admission { max_requests, queue: up.queue.unwrap_or(100), queue_timeout }))
}

fn in_range(n: u64) -> Option<usize> {
    usize::try_from(n).ok().filter(|n| (1..=MAX_REQUESTS).contains(n))
}

/// `auto_min` (default 3, the concurrency the minimum latency is measured
/// at) and `auto_max` (default 1000), Envoy's defaults; only with
/// `max_requests = "auto"`.
fn auto_bounds(up: &RawUpstream, key: &dyn Fn(&str) -> String, auto: bool) -> Result<Bounds, Problem> {
    if !auto {
        return match (up.auto_min, up.auto_max) {
            (None, None) => Ok(Bounds { min: 0, max: 0 }),
            (min, _) => {
                let k = if min.is_some() { "auto_min" } else { "auto_max" };
                Err((key(k), "only applies with max_requests = \"auto\"".into()))
            }
        };
    }
    let (min, max) = (up.auto_min.unwrap_or(3), up.auto_max.unwrap_or(1000));
    if !(1..=MAX_REQUESTS).contains(&min) {
        return Err((key("auto_min"), format!("must be between 1 and {MAX_REQUESTS}")));
    }
    if max < min || max > MAX_REQUESTS {
        return Err((key("auto_max"), format!("must be between auto_min ({min}) and {MAX_REQUESTS}")));
    }
    Ok(Bounds { min, max })
}

fn health(h: &RawHealth, key: &dyn Fn(&str) -> String) -> Result<HealthConfig, Problem> {
    let path = h.path.clone().ok_or_else(|| (key("health.path"), "missing".into()))?;
    if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
        let shown = crate::config::redact_url(&path);
        return Err((key("health.path"), format!("{shown:?} must be a path starting with '/'")));
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

/// An upstream URL: `http://host:port` or `https://host:port`, with no path
/// beyond `/`, or `unix:PATH` (see [`unix_path`]). `server_name`
/// overrides the name an `https://` endpoint's certificate must carry.
fn parse_upstream_url(
    url: &str,
    base_dir: &Path,
    server_name: Option<&ServerName<'static>>,
) -> Result<EndpointConfig, String> {
    // Messages go to logs, the admin reload's answer and stderr: a password
    // in the URL is shown as `/-/config` shows it.
    let shown = crate::config::redact_url(url);
    if let Some(path) = url.strip_prefix("unix:") {
        let path = unix_path(path, base_dir).map_err(|why| format!("invalid URL {shown:?}: {why}"))?;
        return Ok(EndpointConfig {
            url: url.to_owned(),
            scheme: Scheme::HTTP,
            authority: Authority::from_static("localhost"),
            address: Address::Unix(path),
            tls_name: None,
            weight: 1,
        });
    }
    let uri: Uri = url.parse().map_err(|e| format!("invalid URL {shown:?}: {e}"))?;
    let scheme =
        uri.scheme().cloned().ok_or_else(|| format!("invalid URL {shown:?}: missing scheme (use http://host:port)"))?;
    if scheme != Scheme::HTTP && scheme != Scheme::HTTPS {
        return Err(format!("unsupported scheme in {shown:?}: use http://host:port, https://host:port or unix:PATH"));
    }
    let authority = uri.authority().cloned().ok_or_else(|| format!("invalid URL {shown:?}: missing host"))?;
    if authority.as_str().contains('@') {
        return Err(format!("invalid URL {shown:?}: credentials are not supported"));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("invalid URL {shown:?}: a path or query is not supported; use a route's rewrite"));
    }
    let tls = scheme == Scheme::HTTPS;
    let port = authority.port_u16().unwrap_or(if tls { 443 } else { 80 });
    let address = Address::tcp(format!("{}:{port}", authority.host()));
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
    Ok(EndpointConfig { url: url.to_owned(), scheme, authority, address, tls_name, weight: 1 })
}

/// What `sun_path` holds: 108 bytes, a path's terminating NUL or an
/// abstract name's leading one included.
const SUN_PATH_BYTES: usize = 107;

/// The socket of `unix:PATH`: a file, relative to `base_dir`, or with `@`
/// a Linux abstract socket (`unix:@envoy_admin`, as `ss` and socat spell
/// it), which tokio connects to given the name after a NUL byte. The path
/// is taken as written, never percent-decoded, so a NUL byte or what looks
/// like a percent-encoding (`%00`, `%20`) is refused rather than left to
/// name a file of that spelling.
fn unix_path(path: &str, base_dir: &Path) -> Result<PathBuf, String> {
    // `unix:///run/app.sock` is a common spelling too; `unix://x/y` is not
    // (is `x` a host or a folder?).
    let path = match path.strip_prefix("//") {
        Some(rest) if !rest.starts_with('/') => return Err("use unix:/absolute/path or unix:relative/path".into()),
        Some(rest) => rest,
        None => path,
    };
    if path.is_empty() {
        return Err("missing socket path (use unix:/run/app/app.sock)".into());
    }
    if path.contains('\0') {
        return Err("a socket path cannot hold a NUL byte (an abstract socket is unix:@name)".into());
    }
    let encoded = path.as_bytes().windows(3).any(|w| w[0] == b'%' && w[1..].iter().all(u8::is_ascii_hexdigit));
    if encoded {
        return Err("a unix: path is not percent-decoded: write it as the file is named".into());
    }
    if let Some(name) = path.strip_prefix('@') {
        if !cfg!(any(target_os = "linux", target_os = "android")) {
            return Err("abstract sockets (unix:@name) exist only on Linux".into());
        }
        if name.is_empty() || name.len() > SUN_PATH_BYTES {
            return Err(format!("an abstract socket's name has 1 to {SUN_PATH_BYTES} bytes"));
        }
        return Ok(PathBuf::from(OsString::from_vec([&[0], name.as_bytes()].concat())));
    }
    let path = base_dir.join(path);
    if path.as_os_str().len() > SUN_PATH_BYTES {
        return Err(format!(
            "socket path {} is longer than a Unix socket address allows ({SUN_PATH_BYTES} bytes)",
            path.display()
        ));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_path_table() {
        let base = Path::new("/etc/gateway");
        let long = "d".repeat(SUN_PATH_BYTES + 1);
        let abstract_name = |name: &str| PathBuf::from(OsString::from_vec([&[0], name.as_bytes()].concat()));
        let cases: Vec<(&str, Result<PathBuf, &str>)> = vec![
            ("/run/app.sock", Ok("/run/app.sock".into())),
            ("///run/app.sock", Ok("/run/app.sock".into())),
            ("run/app.sock", Ok("/etc/gateway/run/app.sock".into())),
            // A file whose name holds `@` or `%` not followed by two hex digits.
            ("run/@x", Ok("/etc/gateway/run/@x".into())),
            ("/run/50%.sock", Ok("/run/50%.sock".into())),
            ("@envoy_admin", Ok(abstract_name("envoy_admin"))),
            ("@", Err("1 to 107 bytes")),
            ("", Err("missing socket path")),
            ("//run/app.sock", Err("use unix:/absolute/path")),
            ("%00x", Err("not percent-decoded")),
            ("/run/a%20b.sock", Err("not percent-decoded")),
            ("@%00x", Err("not percent-decoded")),
            ("x\0y", Err("NUL byte")),
            ("@a\0b", Err("NUL byte")),
        ];
        for (path, want) in cases {
            match (unix_path(path, base), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{path:?}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{path:?}: {got}"),
                (got, want) => panic!("{path:?}: {got:?}, not {want:?}"),
            }
        }
        assert!(unix_path(&format!("/{long}"), base).unwrap_err().contains("longer than"));
        assert!(unix_path(&format!("@{}", &long[1..]), base).is_ok(), "107 bytes");
        assert!(unix_path(&format!("@{long}"), base).unwrap_err().contains("1 to 107 bytes"));
    }
}
