//! A route's target (`upstream`, `split`, `file`, `dir`, `respond`,
//! `redirect`) and the keys that only a proxy route may set.

use super::*;

/// The route's one target, and the keys that only a proxy route may set.
pub(super) fn target(
    name: &str,
    r: &RawRoute,
    key: &dyn Fn(&str) -> String,
    upstream_index: &HashMap<String, usize>,
    base_dir: &Path,
) -> Result<Target, Problem> {
    let targets = [
        ("upstream", r.upstream.is_some()),
        ("split", r.split.is_some()),
        ("file", r.file.is_some()),
        ("dir", r.dir.is_some()),
        ("respond", r.respond.is_some()),
        ("redirect", r.redirect.is_some()),
    ];
    let set: Vec<&str> = targets.iter().filter(|(_, set)| *set).map(|(k, _)| *k).collect();
    let one_of = "set exactly one of upstream, split, file, dir, respond, redirect";
    match set[..] {
        [_] => {}
        // Told at the second one set, the key in excess, and by name.
        [_, second, ..] => {
            let both = set.join(" and ");
            return Err((key(second), format!("route {name:?} sets {both}; {one_of}")));
        }
        [] => return Err((key("upstream"), format!("route {name:?} has no target; {one_of}"))),
    }
    let only_for_proxy = [
        ("rewrite", r.rewrite.is_some()),
        ("timeout", r.timeout.is_some()),
        ("host", r.host.is_some()),
        ("body_timeout", r.body_timeout.is_some()),
        ("request_buffer", r.request_buffer.is_some()),
        ("retries", r.retries.is_some()),
        ("retry_on", r.retry_on.is_some()),
        ("upgrade", r.upgrade.is_some()),
        ("upgrade_idle_timeout", r.upgrade_idle_timeout.is_some()),
        ("cache", r.cache.is_some()),
        ("mirror", r.mirror.is_some()),
    ];
    if r.upstream.is_none()
        && r.split.is_none()
        && let Some((k, _)) = only_for_proxy.iter().find(|(_, set)| *set)
    {
        return Err((key(k), "only applies to routes with an upstream".into()));
    }
    if r.dotfiles.is_some() && r.dir.is_none() {
        return Err((key("dotfiles"), "only applies to routes with a dir".into()));
    }
    if r.sticky.is_some() && r.split.is_none() {
        return Err((key("sticky"), "only applies to routes with a split".into()));
    }
    if let Some(up) = &r.upstream {
        return proxy_target(up, r, key, upstream_index).map(Target::Proxy);
    }
    if let Some(members) = &r.split {
        let split = routing::split(members, r.sticky.as_ref(), key, upstream_index)?;
        if r.cache.is_some() {
            return Err((key("cache"), "not with a split: each version would need its own store".into()));
        }
        let first = &split.members[0].name;
        let mut target = proxy_target(first, r, key, upstream_index)?;
        target.split = Some(std::sync::Arc::new(split));
        return Ok(Target::Proxy(target));
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
        return Ok(Target::Dir { root, dotfiles: r.dotfiles.unwrap_or(false) });
    }
    if let Some(redirect) = &r.redirect {
        return crate::router::redirect::Redirect::parse(redirect.status.unwrap_or(308), &redirect.location)
            .map(Target::Redirect)
            .map_err(|(field, m)| (key(&format!("redirect.{field}")), m));
    }
    let resp = r.respond.as_ref().expect("one target is set");
    let code = resp.status.unwrap_or(200);
    // A fixed answer is final (no 1xx), and HTTP defines no class past 5xx.
    let status = StatusCode::from_u16(code)
        .ok()
        .filter(|s| (200..=599).contains(&s.as_u16()))
        .ok_or_else(|| (key("respond.status"), format!("invalid status {code}: use 200 to 599")))?;
    Ok(Target::Respond { status, body: Bytes::from(resp.body.clone().unwrap_or_default()) })
}

fn proxy_target(
    up: &str,
    r: &RawRoute,
    key: &dyn Fn(&str) -> String,
    upstream_index: &HashMap<String, usize>,
) -> Result<ProxyTarget, Problem> {
    let upstream = *upstream_index.get(up).ok_or_else(|| (key("upstream"), unknown_upstream(up, upstream_index)))?;
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
    let cache = r.cache.as_ref().map(|c| cache::cache(c, key)).transpose()?;
    let request_buffer = match &r.request_buffer {
        Some(size) => usize::try_from(parse_size(&key("request_buffer"), size)?)
            .map_err(|_| (key("request_buffer"), "too large".to_owned()))?,
        None => DEFAULT_REQUEST_BUFFER,
    };
    let mirror = r.mirror.as_ref().map(|m| routing::mirror(m, key, upstream_index)).transpose()?;
    Ok(ProxyTarget {
        upstream,
        split: None,
        mirror,
        rewrite,
        timeout,
        body_timeout,
        request_buffer,
        host,
        retries,
        retry_on,
        upgrade,
        cache,
        drop_underscore_headers: false,
        guarded_trailers: std::sync::Arc::from([]),
        via: Default::default(),
    })
}

/// A route's (or its split's or mirror's) upstream that no `[upstreams]`
/// table defines: the ones that are, in name order (the index's own order
/// changes from run to run), and the nearest when it looks like a typo.
pub(super) fn unknown_upstream(up: &str, upstream_index: &HashMap<String, usize>) -> String {
    let mut known: Vec<&str> = upstream_index.keys().map(String::as_str).collect();
    known.sort_unstable();
    if known.is_empty() {
        return format!("unknown upstream {up:?} (no [upstreams] are defined)");
    }
    let limit = if up.chars().count() <= 5 { 1 } else { 2 };
    let near = known.iter().map(|k| (crate::config::errors::distance(up, k), *k)).filter(|(d, _)| *d <= limit).min();
    let guess = near.map(|(_, k)| format!("; did you mean {k:?}?")).unwrap_or_default();
    format!("unknown upstream {up:?} (known: {}){guess}", known.join(", "))
}
