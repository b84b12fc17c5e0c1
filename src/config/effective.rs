//! The effective configuration the admin listener's `/-/config` shows:
//! the tree as loaded (defaults of `[server]` and `[metrics]` included,
//! secrets redacted), with the defaults validation gave routes, upstreams,
//! `[resolver]` and `[tracing]` filled in where the file left a key out, so
//! that what it shows is what runs.

use std::time::Duration;

use serde_json::{Map, Value, json};

use super::{Balance, Config, MaxRequests, Protocol, RouteConfig, Target, UpstreamConfig};

/// `tree` with the resolved values of `config` where it has no key.
pub(super) fn with_defaults(mut tree: Value, config: &Config) -> Value {
    let Some(root) = tree.as_object_mut() else { return tree };
    if let Some(Value::Object(ups)) = root.get_mut("upstreams") {
        for up in &config.upstreams {
            if let Some(Value::Object(raw)) = ups.get_mut(&up.name) {
                fill(raw, upstream(up));
            }
        }
    }
    if let Some(Value::Array(routes)) = root.get_mut("routes") {
        for (raw, r) in routes.iter_mut().zip(&config.routes) {
            if let Value::Object(raw) = raw {
                fill(raw, route(r));
            }
        }
    }
    let resolver = json!({
        "timeout": duration(config.resolver.timeout),
        "attempts": config.resolver.attempts,
    });
    fill(root, object(json!({ "resolver": resolver, "tracing": { "service_name": config.tracing.service_name } })));
    tree
}

/// Adds what `raw` lacks from `defaults`, into tables it has too.
fn fill(raw: &mut Map<String, Value>, defaults: Map<String, Value>) {
    for (key, value) in defaults {
        match (raw.get_mut(&key), value) {
            (Some(Value::Object(inner)), Value::Object(value)) => fill(inner, value),
            (Some(_), _) => {}
            (None, value) => {
                raw.insert(key, value);
            }
        }
    }
}

fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

fn duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

fn upstream(up: &UpstreamConfig) -> Map<String, Value> {
    let mut out = object(json!({
        "balance": match up.balance {
            Balance::LeastRequest => "least_request",
            Balance::RoundRobin => "round_robin",
        },
        "connect_timeout": duration(up.connect_timeout),
        "pool_max_idle_per_host": up.pool_max_idle_per_host,
        "pool_idle_timeout": duration(up.pool_idle_timeout),
        // The ratio as written: an `f32` widened to JSON's `f64` shows
        // 0.2 as 0.20000000298023224.
        "retry_budget": {
            "ratio": up.retry_budget.ratio.to_string().parse::<f64>().unwrap_or(0.0),
            "min_per_second": up.retry_budget.min_per_second,
        },
        "protocol": match up.protocol {
            Protocol::Http1 => "http1",
            Protocol::H2c => "h2c",
            Protocol::Auto => "auto",
        },
        "max_connections": up.max_connections,
    }));
    if let Some(a) = &up.admission {
        out.insert("queue".into(), json!(a.queue));
        out.insert("queue_timeout".into(), json!(duration(a.queue_timeout)));
        if let MaxRequests::Auto(b) = a.max_requests {
            out.insert("auto_min".into(), json!(b.min));
            out.insert("auto_max".into(), json!(b.max));
        }
    }
    if let Some(h) = &up.health {
        let health = json!({
            "interval": duration(h.interval),
            "timeout": duration(h.timeout),
            "unhealthy_after": h.unhealthy_after,
            "healthy_after": h.healthy_after,
        });
        out.insert("health".into(), health);
    }
    if let Some(o) = &up.outlier {
        let outlier =
            json!({ "consecutive_failures": o.consecutive_failures, "ejection_time": duration(o.ejection_time) });
        out.insert("outlier".into(), outlier);
    }
    out
}

fn route(r: &RouteConfig) -> Map<String, Value> {
    let mut out = object(json!({ "max_body": r.max_body, "compress": r.compress }));
    let Target::Proxy(p) = &r.target else { return out };
    let retry_on: Vec<&str> =
        [(p.retry_on.connect, "connect"), (p.retry_on.reset, "reset"), (p.retry_on.unavailable, "503")]
            .into_iter()
            .filter_map(|(on, name)| on.then_some(name))
            .collect();
    let proxy = json!({
        "timeout": duration(p.timeout),
        "body_timeout": duration(p.body_timeout),
        "request_buffer": p.request_buffer,
        "host": match p.host {
            super::HostMode::Preserve => "preserve",
            super::HostMode::Upstream => "upstream",
        },
        "retries": p.retries,
        "retry_on": retry_on,
        "upgrade": p.upgrade.is_some(),
    });
    fill(&mut out, object(proxy));
    if let Some(idle) = p.upgrade {
        out.insert("upgrade_idle_timeout".into(), json!(duration(idle)));
    }
    if let Some(c) = &p.cache {
        let cache = json!({ "cache": {
            "max_size": c.max_size,
            "max_entry": c.max_entry,
            "default_ttl": duration(c.default_ttl),
            "coalesce": c.coalesce,
            "stale_while_revalidate": duration(c.stale_while_revalidate),
            "stale_if_error": duration(c.stale_if_error),
            "targeted": c.targeted.iter().map(|n| n.as_str()).collect::<Vec<_>>(),
        }});
        fill(&mut out, object(cache));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_missing_keys_are_filled() {
        let mut raw = object(json!({ "a": 1, "t": { "x": "file" } }));
        fill(&mut raw, object(json!({ "a": 2, "b": 3, "t": { "x": "default", "y": 4 } })));
        assert_eq!(Value::Object(raw), json!({ "a": 1, "b": 3, "t": { "x": "file", "y": 4 } }));
    }
}
