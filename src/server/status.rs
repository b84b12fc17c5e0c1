//! What the gateway thinks of its upstreams, for operators: the admin
//! listener's `/-/upstreams` (JSON), `/-/routes` (JSON: each route's
//! target, split and mirror, with the mirror's copies so far), `/-/config`
//! (the effective configuration, secrets redacted) and `/-/status` (one
//! self-contained HTML page over the three, refreshing itself). Never served on the
//! main listener: endpoint addresses and health details are for whoever
//! runs the gateway, not for its clients.

use std::time::SystemTime;

use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use serde_json::{Value, json};

use super::App;
use crate::body::Body;
use crate::config::Target;
use crate::discovery::Resolution;
use crate::upstream::Upstream;
use crate::upstream::endpoint::Endpoint;

/// The page: no external assets, no build step.
const PAGE: &str = include_str!("status.html");

/// The page's own policy: its inline script and style, requests to this
/// listener only, never framed.
const PAGE_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'";

impl App {
    /// `/-/upstreams`, `/-/routes`, `/-/config` or `/-/status`, if `path`
    /// is one.
    pub(super) fn status(&self, path: &str) -> Option<Response<Body>> {
        let (content_type, body) = match path {
            "/-/upstreams" => ("application/json", to_json(&self.upstreams_status())),
            "/-/routes" => ("application/json", to_json(&self.routes_status())),
            "/-/config" => ("application/json", to_json(&self.table.load().effective)),
            "/-/status" => ("text/html; charset=utf-8", PAGE.to_owned()),
            _ => return None,
        };
        let mut response = Response::new(Body::full(body));
        *response.status_mut() = StatusCode::OK;
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
        if path == "/-/status" {
            headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(PAGE_POLICY));
        }
        Some(response)
    }

    /// One object per upstream of the routes being served now.
    fn upstreams_status(&self) -> Value {
        let table = self.table.load();
        Value::Array(table.upstreams.iter().map(|u| upstream_status(u)).collect())
    }
}

impl App {
    /// One object per route being served now, in file order.
    fn routes_status(&self) -> Value {
        let table = self.table.load();
        let upstreams: Vec<_> = table.upstreams.iter().map(|u| u.config.clone()).collect();
        let routes = table.routes.iter().map(|r| {
            let c = &r.config;
            let mut out = json!({
                "name": c.name,
                "hosts": c.hosts.iter().map(|h| h.describe()).collect::<Vec<_>>(),
                "prefix": c.prefix,
                "target": c.target.describe(&upstreams),
            });
            if let Target::Proxy(p) = &c.target {
                // A split's `p.upstream` is only its first member: a split
                // route has `split`, no `upstream`.
                if p.split.is_none() {
                    out["upstream"] = table.upstreams[p.upstream].config.name.clone().into();
                }
                if let Some(split) = &p.split {
                    let members: Vec<Value> =
                        split.members.iter().map(|m| json!({ "upstream": m.name, "weight": m.weight })).collect();
                    out["split"] = json!({
                        "upstreams": members,
                        "sticky": split.sticky.as_ref().map(|s| s.describe()),
                        "sets_cookie": split.set_cookie.is_some(),
                    });
                }
            }
            if let Some(mirror) = &r.mirror {
                out["mirror"] = mirror.status();
            }
            out
        });
        Value::Array(routes.collect())
    }
}

fn to_json(value: &Value) -> String {
    let mut s = serde_json::to_string_pretty(value).expect("a JSON value serialises");
    s.push('\n');
    s
}

fn upstream_status(u: &Upstream) -> Value {
    let d = u.discovery();
    json!({
        "name": u.config.name,
        "source": d.source.as_str(),
        "lookup": d.name,
        "last_resolution": d.last_resolution.map(|at| json!({
            "at": timestamp(at),
            "result": d.result.as_ref().map(resolution),
        })),
        "last_success": d.last_success.map(timestamp),
        "ready": u.ready(),
        "queue": u.queued().map(|(waiting, size)| json!({ "waiting": waiting, "size": size })),
        "limit": u.limit().map(|l| json!({
            "max_requests": l.limit,
            "auto": l.learned.map(|a| json!({
                "min_rtt_seconds": a.min_rtt.map(|d| d.as_secs_f64()),
                "measuring": a.measuring,
                "overloaded": a.overloaded,
            })),
        })),
        "endpoints": u.endpoints().iter().map(|e| endpoint_status(e)).collect::<Vec<_>>(),
    })
}

fn endpoint_status(e: &Endpoint) -> Value {
    let ejected_for = e.ejected_for().filter(|d| !d.is_zero());
    let (open, idle) = e.pool.connections();
    json!({
        "address": e.config.url,
        "weight": e.config.weight,
        "healthy": e.is_healthy(),
        "ejected": ejected_for.is_some(),
        "ejected_until": ejected_for.map(|d| timestamp(SystemTime::now() + d)),
        "in_flight": e.in_flight(),
        "connections": { "open": open, "idle": idle },
        "last_check": e.last_check().map(|c| json!({
            "at": timestamp(c.at),
            "passed": c.passed,
            "detail": c.detail,
        })),
    })
}

/// A lookup's result: `ok` with the number of addresses, `not_found`, or
/// `error` with why.
fn resolution(r: &Resolution) -> Value {
    match r {
        Resolution::Found { addresses } => json!({ "result": r.label(), "addresses": addresses }),
        Resolution::Partial { addresses, reason } => {
            json!({ "result": r.label(), "addresses": addresses, "reason": reason })
        }
        Resolution::NotFound => json!({ "result": r.label() }),
        Resolution::Failed { reason } => json!({ "result": r.label(), "reason": reason }),
    }
}

/// RFC 3339, UTC, to the second.
fn timestamp(at: SystemTime) -> String {
    humantime::format_rfc3339_seconds(at).to_string()
}
