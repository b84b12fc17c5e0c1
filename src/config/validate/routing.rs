//! A route's matchers besides its prefix (`hosts`, `headers`, `query`),
//! and the refusal of a file with a route that can never be chosen.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderName;

use super::Problem;
use crate::config::MirrorConfig;
use crate::config::RouteConfig;
use crate::config::raw::{RawMirror, RawRoute, RawSplit, RawSticky, RawWant};
use crate::headers::same_cgi_name;
use crate::router::split::{Member, SetCookie, Split, Sticky};
use crate::router::{Conditions, HostPattern, Want};

/// Conditions a route may hold at most, of each kind: each is checked
/// on every request that reaches its prefix.
const MAX_CONDITIONS: usize = 32;

/// The route's `hosts` and its `headers` and `query` conditions.
pub(super) fn matchers(
    r: &RawRoute,
    key: &dyn Fn(&str) -> String,
) -> Result<(Vec<HostPattern>, Option<Arc<Conditions>>), Problem> {
    let mut hosts: Vec<HostPattern> = Vec::new();
    for (i, text) in r.hosts.iter().flatten().enumerate() {
        let k = key(&format!("hosts[{i}]"));
        let host = HostPattern::parse(text).map_err(|m| (k.clone(), m))?;
        if hosts.contains(&host) {
            return Err((k, format!("{text:?} is listed twice")));
        }
        hosts.push(host);
    }
    if r.hosts.as_ref().is_some_and(Vec::is_empty) {
        return Err((key("hosts"), "empty: leave it out for a route that serves any host".into()));
    }
    let mut conditions = Conditions::default();
    for (name, raw) in r.headers.iter().flatten() {
        let k = key(&format!("headers.{}", crate::config::refused_name(name)));
        let parsed = HeaderName::from_bytes(name.as_bytes()).map_err(|_| (k.clone(), "not a header name".into()))?;
        if parsed == http::header::HOST {
            return Err((k, "use `hosts` to match the host".into()));
        }
        conditions.headers.push((parsed, want(raw, name).map_err(|m| (k, m))?));
    }
    for (name, raw) in r.query.iter().flatten() {
        let k = key(&format!("query.{name}"));
        if name.is_empty() {
            return Err((k, "an empty parameter name".into()));
        }
        conditions.query.push((name.clone(), want(raw, name).map_err(|m| (k, m))?));
    }
    for (k, n) in [("headers", conditions.headers.len()), ("query", conditions.query.len())] {
        if n > MAX_CONDITIONS {
            return Err((key(k), format!("{n} conditions: at most {MAX_CONDITIONS}")));
        }
    }
    Ok((hosts, (!conditions.is_empty()).then(|| Arc::new(conditions))))
}

/// The condition on the header or parameter `name`; a refused pattern is
/// not quoted where `/-/config` would not show it (under a name that names
/// a secret, or a credential itself).
fn want(raw: &RawWant, name: &str) -> Result<Want, String> {
    Ok(match raw {
        RawWant::Pattern(p) if crate::config::redact_condition(name, &p.regex) == crate::config::REDACTED => {
            Want::secret_pattern(&p.regex)?
        }
        RawWant::Flag(true) => Want::Present,
        RawWant::Flag(false) => Want::Absent,
        RawWant::Text(t) if t == "*" => Want::Present,
        RawWant::Text(t) => Want::Equals(t.as_str().into()),
        RawWant::Pattern(p) => Want::pattern(&p.regex)?,
    })
}

/// Refuses routes that can never be chosen: one behind an earlier route
/// with the same prefix, a host in common (or neither naming hosts), and
/// conditions that hold whenever its own do.
pub(super) fn refuse_unreachable(routes: &[RouteConfig]) -> Result<(), Problem> {
    let mut seen: HashMap<(Option<&HostPattern>, &str), Vec<usize>> = HashMap::new();
    for (j, route) in routes.iter().enumerate() {
        let hosts: Vec<Option<&HostPattern>> = match &route.hosts[..] {
            [] => vec![None],
            hosts => hosts.iter().map(Some).collect(),
        };
        for host in hosts {
            let earlier = seen.entry((host, route.prefix.as_str())).or_default();
            let conditions = |r: &RouteConfig| r.conditions.clone().unwrap_or_default();
            if let Some(&i) = earlier.iter().find(|&&i| conditions(&routes[i]).implied_by(&conditions(route))) {
                let on = host.map(|h| format!("host {:?}, ", h.describe())).unwrap_or_default();
                return Err((
                    format!("routes[{j}].prefix"),
                    format!(
                        "route {:?} can never be chosen: route {:?} (routes[{i}]) comes first with the same {on}prefix \
                         {:?} and conditions that hold whenever its own do; put the more specific one first or \
                         tell them apart with headers or query",
                        route.name, routes[i].name, route.prefix
                    ),
                ));
            }
            earlier.push(j);
        }
    }
    Ok(())
}

/// Refuses a route whose `headers` condition names a header some route's
/// `auth` sets (a JWT's `forward_claims`, a forward auth service's
/// `response_headers`): the route is chosen before its auth runs, from the
/// client's own copy, so a client could pick it by sending the header.
pub(super) fn refuse_routing_on_auth_headers(routes: &[RouteConfig]) -> Result<(), Problem> {
    let same = |s: &HeaderName, name: &HeaderName| s == name || same_cgi_name(s.as_str(), name.as_str());
    let set_by = |name: &HeaderName| {
        routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.access.as_ref().is_some_and(|a| a.sets().iter().any(|s| same(s, name))))
    };
    for (j, route) in routes.iter().enumerate() {
        let names = route.conditions.iter().flat_map(|c| c.headers.iter().map(|(n, _)| n));
        for name in names {
            if let Some((i, by)) = set_by(name) {
                return Err((
                    format!("routes[{j}].headers.{name}"),
                    format!(
                        "route {:?} (routes[{i}]) sets {name} from its auth, but routes are chosen before auth runs, \
                         from the client's own copy: a client could pick this route by sending it; route by path or \
                         host, and let the upstream read the header",
                        by.name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A route's `split` and `sticky`.
pub(super) fn split(
    members: &[RawSplit],
    sticky: Option<&RawSticky>,
    key: &dyn Fn(&str) -> String,
    upstream_index: &std::collections::HashMap<String, usize>,
) -> Result<Split, Problem> {
    if members.len() < 2 {
        return Err((key("split"), "name two upstreams or more (one alone is `upstream`)".into()));
    }
    let mut parsed: Vec<Member> = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let k = |field: &str| key(&format!("split[{i}].{field}"));
        let upstream = *upstream_index
            .get(&m.upstream)
            .ok_or_else(|| (k("upstream"), super::target::unknown_upstream(&m.upstream, upstream_index)))?;
        if parsed.iter().any(|p| p.upstream == upstream) {
            return Err((k("upstream"), format!("{:?} is listed twice", m.upstream)));
        }
        if m.weight > MAX_SPLIT_WEIGHT {
            return Err((k("weight"), format!("{}: use 0 to {MAX_SPLIT_WEIGHT}", m.weight)));
        }
        parsed.push(Member { upstream, name: m.upstream.clone(), weight: m.weight });
    }
    if parsed.iter().all(|m| m.weight == 0) {
        return Err((key("split"), "every weight is 0: no upstream would take a request".into()));
    }
    let (sticky, set_cookie) = match sticky {
        Some(s) => sticky_key(s, key).map(|(k, set)| (Some(k), set))?,
        None => (None, None),
    };
    let mut split = Split::new(parsed, sticky);
    split.set_cookie = set_cookie;
    Ok(split)
}

/// A split's `sticky`, in either form, and the cookie it sets (if any).
fn sticky_key(s: &RawSticky, key: &dyn Fn(&str) -> String) -> Result<(Sticky, Option<SetCookie>), Problem> {
    let t = match s {
        RawSticky::Text(text) => return Ok((Sticky::parse(text).map_err(|m| (key("sticky"), m))?, None)),
        RawSticky::Table(t) => t,
    };
    let sticky = match (&t.header, &t.cookie) {
        (Some(name), None) => Sticky::parse(&format!("header:{name}")),
        (None, Some(name)) => Sticky::parse(&format!("cookie:{name}")),
        _ => Err("name either `header` or `cookie`".to_owned()),
    }
    .map_err(|m| (key("sticky"), m))?;
    if t.set == Some(true) && t.cookie.is_none() {
        return Err((key("sticky.set"), "only a cookie is set".into()));
    }
    if t.max_age.is_some() && t.set != Some(true) {
        return Err((key("sticky.max_age"), "only with set = true".into()));
    }
    let max_age = t.max_age.as_deref().map(|a| super::positive_duration(&key("sticky.max_age"), a)).transpose()?;
    Ok((sticky, (t.set == Some(true)).then_some(SetCookie { max_age })))
}

/// The largest weight of a split's member.
const MAX_SPLIT_WEIGHT: u32 = 10_000;

/// A route's `mirror`; its upstream's endpoints are checked in
/// [`mirror_endpoints`] once every upstream is known.
pub(super) fn mirror(
    m: &RawMirror,
    key: &dyn Fn(&str) -> String,
    upstream_index: &std::collections::HashMap<String, usize>,
) -> Result<MirrorConfig, Problem> {
    let upstream = *upstream_index
        .get(&m.upstream)
        .ok_or_else(|| (key("mirror.upstream"), super::target::unknown_upstream(&m.upstream, upstream_index)))?;
    let percent = m.percent.unwrap_or(100.0);
    if !(percent > 0.0 && percent <= 100.0) {
        return Err((key("mirror.percent"), format!("{percent}: above 0 and at most 100")));
    }
    Ok(MirrorConfig { upstream, percent })
}

/// A mirror's upstream is spoken to plainly: `http://` endpoints listed in
/// the file (not `https://`, Unix sockets or `discover`).
pub(super) fn mirror_endpoints(
    routes: &[RouteConfig],
    upstreams: &[crate::config::UpstreamConfig],
) -> Result<(), Problem> {
    for (i, r) in routes.iter().enumerate() {
        let crate::config::Target::Proxy(p) = &r.target else { continue };
        let Some(m) = &p.mirror else { continue };
        let up = &upstreams[m.upstream];
        let plain = up.discover.is_none()
            && up
                .endpoints
                .iter()
                .all(|e| e.scheme == http::uri::Scheme::HTTP && !matches!(e.address, crate::config::Address::Unix(_)));
        if !plain {
            return Err((
                format!("routes[{i}].mirror.upstream"),
                format!("{:?}: a mirror's upstream must list http:// endpoints (not https, unix or discover)", up.name),
            ));
        }
    }
    Ok(())
}
