//! `[metrics]`: the metrics path and the admin listener, with its address
//! list and the host names it answers.

use super::super::MetricsConfig;
use super::super::raw::RawMetrics;
use super::access::cidrs;
use super::{Problem, parse_addr};

pub(super) fn metrics(m: &RawMetrics) -> Result<MetricsConfig, Problem> {
    if !m.path.starts_with('/') {
        let shown = crate::config::redact_url(&m.path);
        return Err(("metrics.path".into(), format!("{shown:?} must start with '/'")));
    }
    if m.max_connections == 0 {
        return Err(("metrics.max_connections".into(), "must be at least 1".into()));
    }
    // The list guards the admin listener only: without one it would guard
    // nothing while looking as if it did, and an empty one would let
    // everyone in.
    if let Some(allow) = &m.allow {
        if m.listen.is_none() {
            return Err((
                "metrics.allow".into(),
                "needs metrics.listen: it guards the admin listener, and without one /metrics, /healthz and /readyz \
                 answer on the main listener, where routes' allow lists apply"
                    .into(),
            ));
        }
        if allow.is_empty() {
            return Err(("metrics.allow".into(), "is empty: list the addresses the admin listener answers".into()));
        }
    }
    Ok(MetricsConfig {
        path: m.path.clone(),
        listen: m.listen.as_deref().map(|l| parse_addr("metrics.listen", l)).transpose()?,
        max_connections: m.max_connections,
        allow: cidrs(m.allow.as_deref(), "metrics.allow")?,
        hosts: admin_hosts(m.hosts.as_deref().unwrap_or_default())?,
    })
}

/// `metrics.hosts`: DNS names, compared without case and without a port.
fn admin_hosts(hosts: &[String]) -> Result<Vec<String>, Problem> {
    hosts
        .iter()
        .map(|h| {
            let name = h.trim_end_matches('.').to_ascii_lowercase();
            let label_ok =
                |l: &str| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if name.len() > 253 || !name.split('.').all(label_ok) {
                return Err(("metrics.hosts".into(), format!("{h:?} is not a host name (no port, no scheme)")));
            }
            Ok(name)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::admin_hosts;

    #[test]
    fn admin_host_names_are_names_without_port_or_scheme() {
        let ok = ["gw.internal", "GW-Admin.Internal.", "localhost", "a"];
        let names = admin_hosts(&ok.map(String::from)).unwrap();
        assert_eq!(names, ["gw.internal", "gw-admin.internal", "localhost", "a"]);
        for bad in ["gw.internal:9090", "http://gw", "", "a..b", "under_score.test", "*.gw.internal", "a b"] {
            let e = admin_hosts(&[bad.to_owned()]).expect_err(bad);
            assert_eq!(e.0, "metrics.hosts", "{bad}");
        }
    }
}
