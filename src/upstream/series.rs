//! The per-endpoint series of `/metrics` (those with an `endpoint` label),
//! written at each scrape from the endpoints the upstreams have now rather
//! than kept in the metrics recorder. The recorder cannot remove one series
//! (its idle timeout works per metric kind and would also drop every gauge
//! set once, as the route timeouts), so the series of an address that left
//! (a pod gone, a DNS answer changed, a reload) stayed for ever, without
//! bound under pod churn. Written from the endpoints, they go with them at
//! the next scrape; a counter of an address that comes back starts again
//! at 0, which Prometheus reads as a counter reset.

use std::fmt::Write;
use std::sync::Arc;

use super::Upstream;
use super::endpoint::Endpoint;
use crate::metrics::{ENDPOINT_EJECTED, ENDPOINT_EJECTIONS, ENDPOINT_HEALTHY, UPSTREAM_CONNECTIONS_OPENED};

/// Each family: name, type, help, and its value for an endpoint.
type Family = (&'static str, &'static str, &'static str, fn(&Endpoint) -> u64);

const FAMILIES: [Family; 4] = [
    (ENDPOINT_HEALTHY, "gauge", "1 while the endpoint passes its active health checks, else 0.", |e| {
        u64::from(e.series().0)
    }),
    (ENDPOINT_EJECTED, "gauge", "1 while the endpoint is ejected (until a trial request succeeds), else 0.", |e| {
        u64::from(e.series().1)
    }),
    (ENDPOINT_EJECTIONS, "counter", "Times the endpoint was ejected after consecutive failures.", |e| e.series().2),
    (
        UPSTREAM_CONNECTIONS_OPENED,
        "counter",
        "TCP connections opened to each endpoint of the upstream (reuse is requests / this).",
        |e| e.series().3,
    ),
];

/// The Prometheus text exposition of the endpoints of `upstreams`.
pub fn render(upstreams: &[Arc<Upstream>]) -> String {
    let mut out = String::new();
    if upstreams.iter().all(|u| u.endpoints().is_empty()) {
        return out;
    }
    for (name, kind, help, value) in FAMILIES {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for u in upstreams {
            for e in u.endpoints() {
                let (upstream, endpoint) = (escape(&u.config.name), escape(&e.config.url));
                let _ = writeln!(out, "{name}{{upstream=\"{upstream}\",endpoint=\"{endpoint}\"}} {}", value(e));
            }
        }
        out.push('\n');
    }
    out
}

/// A label value as the text format wants it: `\`, `"` and line feeds
/// escaped.
fn escape(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn label_values_are_escaped() {
        for (raw, want) in [("127.0.0.1:80", "127.0.0.1:80"), ("unix:/a\"b", "unix:/a\\\"b"), ("a\\b\nc", "a\\\\b\\nc")]
        {
            assert_eq!(escape(raw), want);
        }
    }
}
