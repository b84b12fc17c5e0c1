//! `[resolver]`: the DNS servers discovered upstreams are looked up with.

use std::net::SocketAddr;

use super::super::ResolverSettings;
use super::super::raw::RawResolver;
use super::{Problem, positive_duration};

/// `[resolver]`: `nameservers` are `ip` or `ip:port` (port 53).
pub(super) fn resolver(r: &RawResolver) -> Result<ResolverSettings, Problem> {
    let nameservers = r
        .nameservers
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, n)| {
            let n = n.trim();
            n.parse::<SocketAddr>()
                .or_else(|_| n.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
                .map_err(|_| {
                    (
                        format!("resolver.nameservers[{i}]"),
                        format!("{n:?} is not an address (use \"10.0.0.10\" or \"127.0.0.1:5353\")"),
                    )
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if r.nameservers.as_ref().is_some_and(|n| n.is_empty()) {
        return Err((
            "resolver.nameservers".into(),
            "must list at least one server (leave it out for the system's)".into(),
        ));
    }
    let attempts = r.attempts.unwrap_or(2);
    if !(1..=10).contains(&attempts) {
        return Err(("resolver.attempts".into(), format!("{attempts} must be between 1 and 10")));
    }
    Ok(ResolverSettings {
        nameservers,
        timeout: positive_duration("resolver.timeout", r.timeout.as_deref().unwrap_or("2s"))?,
        attempts,
    })
}
