//! Asking the DNS: the resolver built from `[resolver]` (hickory's, on
//! tokio; not getaddrinfo on the blocking pool, which gives no TTL and
//! holds a thread per lookup), and one lookup of a discovered name turned
//! into endpoints.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::NetError;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{RData, Record, RecordType};

use crate::config::{Discover, DiscoverName, EndpointConfig, ResolverSettings};

/// Builds the resolver: the configured servers (UDP, TCP when an answer is
/// truncated), or the system's. No cache: each lookup asks, and the
/// schedule (see `schedule`) is the cache, so `max_ttl` can cut a long TTL
/// short.
pub fn resolver(settings: &ResolverSettings) -> Result<TokioResolver, String> {
    let mut builder = if settings.nameservers.is_empty() {
        TokioResolver::builder_tokio().map_err(|e| format!("cannot read the system's resolver configuration: {e}"))?
    } else {
        let servers = settings
            .nameservers
            .iter()
            .map(|addr| {
                let mut server = NameServerConfig::udp_and_tcp(addr.ip());
                server.connections.iter_mut().for_each(|c| c.port = addr.port());
                server
            })
            .collect();
        TokioResolver::builder_with_config(ResolverConfig::from_name_servers(servers), TokioRuntimeProvider::default())
    };
    let options = builder.options_mut();
    options.timeout = settings.timeout;
    options.attempts = settings.attempts;
    options.cache_size = 0;
    builder.build().map_err(|e| format!("cannot build the resolver: {e}"))
}

/// What one lookup of a discovered name came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The endpoints, sorted by address, and the smallest TTL among the
    /// records that made them.
    Found { endpoints: Vec<EndpointConfig>, ttl: Duration },
    /// NXDOMAIN, or no records of the types asked.
    NotFound,
    /// Nothing learnt: timeout, SERVFAIL, refused (the reason).
    Failed(String),
}

/// Looks `d`'s name up: A and AAAA (both asked at once), or SRV and then
/// its targets' addresses.
pub async fn lookup(resolver: &TokioResolver, d: &Discover) -> Answer {
    match &d.name {
        DiscoverName::Dns { host, port } => match addresses(resolver, host).await {
            Ok((ips, ttl)) => found(d, ips.into_iter().map(|ip| (ip, *port)), ttl),
            Err(answer) => answer,
        },
        DiscoverName::Srv(name) => srv(resolver, d, name).await,
    }
}

/// The endpoints of `(address, port)` pairs, or `NotFound` for none.
fn found(d: &Discover, pairs: impl IntoIterator<Item = (IpAddr, u16)>, ttl: Duration) -> Answer {
    let unique: BTreeSet<(IpAddr, u16)> = pairs.into_iter().collect();
    if unique.is_empty() {
        return Answer::NotFound;
    }
    Answer::Found { endpoints: unique.into_iter().map(|(ip, port)| d.endpoint(ip, port)).collect(), ttl }
}

/// The addresses of `host` (A and AAAA) and their smallest TTL. One family
/// failing while the other has addresses still gives those (a DNS server
/// that fails AAAA queries is common); both failing, or one failing and the
/// other empty, is a failure.
async fn addresses(resolver: &TokioResolver, host: &str) -> Result<(Vec<IpAddr>, Duration), Answer> {
    let (v4, v6) = tokio::join!(resolver.lookup(host, RecordType::A), resolver.lookup(host, RecordType::AAAA));
    let mut ips = Vec::new();
    let mut ttl: Option<u32> = None;
    let mut failure = None;
    for looked in [v4, v6] {
        match looked {
            Ok(lookup) => {
                for record in lookup.answers() {
                    let ip = match &record.data {
                        RData::A(a) => IpAddr::V4(a.0),
                        RData::AAAA(a) => IpAddr::V6(a.0),
                        _ => continue,
                    };
                    ips.push(ip);
                    ttl = Some(ttl.map_or(record.ttl, |t| t.min(record.ttl)));
                }
            }
            Err(e) if e.is_no_records_found() => {}
            Err(e) => failure = Some(describe(&e)),
        }
    }
    match (ttl, failure) {
        (Some(ttl), _) => Ok((ips, Duration::from_secs(ttl.into()))),
        (None, Some(why)) => Err(Answer::Failed(why)),
        (None, None) => Err(Answer::NotFound),
    }
}

/// SRV: the records of the lowest priority (RFC 2782: the others are
/// fallbacks, used only when all of those are unreachable, which the
/// gateway's health checks and ejection decide instead), each target's
/// addresses on the record's port. Weights are not used: balancing has no
/// weights.
async fn srv(resolver: &TokioResolver, d: &Discover, name: &str) -> Answer {
    let lookup = match resolver.lookup(name, RecordType::SRV).await {
        Ok(lookup) => lookup,
        Err(e) if e.is_no_records_found() => return Answer::NotFound,
        Err(e) => return Answer::Failed(describe(&e)),
    };
    let records: Vec<(&Record, u16, u16, String)> = lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => Some((r, s.priority, s.port, s.target.to_ascii())),
            _ => None,
        })
        .collect();
    let Some(lowest) = records.iter().map(|(_, priority, _, _)| *priority).min() else { return Answer::NotFound };
    let mut pairs = Vec::new();
    let mut ttl = u32::MAX;
    let mut failure = None;
    for (record, _, port, target) in records.iter().filter(|(_, p, _, _)| *p == lowest) {
        ttl = ttl.min(record.ttl);
        match addresses(resolver, target).await {
            Ok((ips, t)) => {
                ttl = ttl.min(u32::try_from(t.as_secs()).unwrap_or(u32::MAX));
                pairs.extend(ips.into_iter().map(|ip| (ip, *port)));
            }
            Err(Answer::Failed(why)) => failure = Some(why),
            Err(_) => {}
        }
    }
    // A target that failed to resolve leaves the set as it was rather than
    // drop its endpoints for a DNS hiccup.
    if let Some(why) = failure {
        return Answer::Failed(format!("SRV target: {why}"));
    }
    found(d, pairs, Duration::from_secs(ttl.into()))
}

/// A lookup failure in a few words.
fn describe(e: &NetError) -> String {
    e.to_string()
}
