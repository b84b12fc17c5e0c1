//! Asking the DNS: the resolver built from `[resolver]` (hickory's, on
//! tokio; not getaddrinfo on the blocking pool, which gives no TTL and
//! holds a thread per lookup), and one lookup of a discovered name turned
//! into endpoints.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use futures_util::{StreamExt, stream};
use hickory_resolver::TokioResolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::lookup::Lookup;
use hickory_resolver::net::NetError;
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};

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
    /// The name (or SRV record set) is there: what each of its parts gave,
    /// and the records left out because they can never be an upstream.
    Parts { parts: Vec<Part>, skipped: Vec<Skipped> },
    /// NXDOMAIN, or no SRV records.
    NotFound,
    /// Nothing learnt: timeout, SERVFAIL, refused (the reason).
    Failed(String),
}

/// One query of a lookup: the A or the AAAA records of the name, or of one
/// SRV target on its record's port. Parts fail on their own (a DNS server
/// that fails AAAA queries is common), so each is kept apart: a failed one
/// stands in with its last good addresses (see `hold`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    /// Which query: `A`, `AAAA`, or `target:port A` for SRV.
    pub key: String,
    /// The SRV record's priority (0 for a name's own A and AAAA).
    pub priority: u16,
    /// The SRV record's weight (0 for a name's own A and AAAA). The parts
    /// of one record share the key but for the family after its space.
    pub weight: u16,
    pub outcome: Outcome,
}

/// What one part gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Endpoints (possibly none: the type has no records), and the smallest
    /// TTL among the records that made them.
    Found { endpoints: Vec<EndpointConfig>, ttl: Duration },
    /// Timeout, SERVFAIL, refused (the reason).
    Failed(String),
}

/// A record that can never be an upstream, left out of the endpoints.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Skipped {
    /// The address, or the SRV record (`target:port`).
    pub record: String,
    /// One of [`SKIP_REASONS`] (`too_many` is counted by the task, never
    /// a record of its own).
    pub reason: &'static str,
}

/// The `reason` label values of `gateway_discovery_skipped_total`.
pub const SKIP_REASONS: [&str; 8] =
    ["port_zero", "no_service", "other_name", "unspecified", "multicast", "broadcast", "link_local", "too_many"];

/// Why an answer's address can never be an upstream, if it cannot: no one
/// listens on 0.0.0.0 or `::` (a connect to it reaches the gateway's own
/// host), and TCP has no multicast or broadcast. Link-local addresses are
/// refused too: an IPv6 one cannot be reached without an interface the
/// DNS cannot name, and 169.254.169.254 is where clouds serve instance
/// credentials, which a DNS record must not turn into an upstream.
/// Loopback is allowed: a sidecar answering on 127.0.0.1 is a real
/// upstream. An IPv6 address that embeds an IPv4 one is judged by the
/// IPv4 rules (see [`embedded`]).
pub fn unusable(ip: IpAddr) -> Option<&'static str> {
    match embedded(ip) {
        ip if ip.is_unspecified() => Some("unspecified"),
        ip if ip.is_multicast() => Some("multicast"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("broadcast"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("link_local"),
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => Some("link_local"),
        _ => None,
    }
}

/// The IPv4 address an IPv6 one stands for, where it embeds one: mapped
/// (`::ffff:0:0/96`), IPv4-compatible (`::/96`, deprecated by RFC 4291
/// §2.5.5.1 but still routed by some stacks) and NAT64's well-known prefix
/// (`64:ff9b::/96`, RFC 6052 §2.1), which a translator that does not
/// refuse non-global IPv4 turns into a connection to 169.254.169.254.
/// `::` and `::1` stay IPv6 (unspecified and loopback, not 0.0.0.0 and
/// 0.0.0.1). A network-specific NAT64 prefix (RFC 6052 §2.2) places the
/// IPv4 address where its operator chose, so it cannot be told from
/// plain IPv6.
fn embedded(ip: IpAddr) -> IpAddr {
    let IpAddr::V6(v6) = ip else { return ip };
    if v6.is_unspecified() || v6.is_loopback() {
        return ip;
    }
    let [a, b, c, d, e, f, ..] = v6.segments();
    match (a, b, c, d, e, f) {
        (0, 0, 0, 0, 0, 0 | 0xffff) | (0x64, 0xff9b, 0, 0, 0, 0) => {
            let [.., w, x, y, z] = v6.octets();
            IpAddr::V4(Ipv4Addr::new(w, x, y, z))
        }
        _ => ip,
    }
}

/// Looks `d`'s name up: A and AAAA (both asked at once), or SRV and then
/// its targets' addresses (all targets at once, up to a bound).
pub async fn lookup(resolver: &TokioResolver, d: &Discover) -> Answer {
    match &d.name {
        DiscoverName::Dns { host, port } => {
            let (v4, v6) = families(resolver, host).await;
            let mut skipped = Vec::new();
            let mut part = |key: &str, looked| Part {
                key: key.to_owned(),
                priority: 0,
                weight: 0,
                outcome: outcome(d, looked, *port, None, &mut skipped),
            };
            let parts = vec![part("A", v4), part("AAAA", v6)];
            Answer::Parts { parts, skipped }
        }
        DiscoverName::Srv(name) => srv(resolver, d, name).await,
    }
}

/// One family's addresses, or why the query failed.
type Looked = Result<Addresses, String>;

/// What one family's answer held.
#[derive(Debug, Default)]
struct Addresses {
    ips: Vec<IpAddr>,
    /// The smallest TTL among them (`None`: no records).
    ttl: Option<u32>,
    /// Addresses of a name that is neither the one asked nor one a CNAME
    /// of the answer leads to from it: not the name's, left out.
    others: Vec<IpAddr>,
}

/// The A and the AAAA records of `host`, asked at once.
async fn families(resolver: &TokioResolver, host: &str) -> (Looked, Looked) {
    let (v4, v6) = tokio::join!(resolver.lookup(host, RecordType::A), resolver.lookup(host, RecordType::AAAA));
    (addresses(v4), addresses(v6))
}

fn addresses(looked: Result<Lookup, NetError>) -> Looked {
    let lookup = match looked {
        Ok(lookup) => lookup,
        Err(e) if e.is_no_records_found() => return Ok(Addresses::default()),
        Err(e) => return Err(describe(&e)),
    };
    let names = owners(&lookup);
    let mut found = Addresses::default();
    for record in lookup.answers() {
        let ip = match &record.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            _ => continue,
        };
        if !names.contains(&name_key(&record.name)) {
            found.others.push(ip);
            continue;
        }
        found.ips.push(ip);
        found.ttl = Some(found.ttl.map_or(record.ttl, |t| t.min(record.ttl)));
    }
    Ok(found)
}

/// The names whose records answer `lookup`'s question: the name asked, and
/// each one the answer's CNAME records lead to from it. Other records in
/// the answer section say nothing of the name (a server may add them,
/// answer for another name, or be lied to).
fn owners(lookup: &Lookup) -> HashSet<String> {
    let mut cnames: HashMap<String, String> = HashMap::new();
    for r in lookup.answers() {
        if let RData::CNAME(target) = &r.data {
            cnames.entry(name_key(&r.name)).or_insert_with(|| name_key(&target.0));
        }
    }
    let mut names = HashSet::new();
    let mut name = name_key(lookup.query().name());
    // Each name once: a CNAME loop ends.
    while names.insert(name.clone()) {
        match cnames.get(&name) {
            Some(next) => name = next.clone(),
            None => break,
        }
    }
    names
}

/// A DNS name as compared: lower case, without the final dot.
fn name_key(name: &Name) -> String {
    name.to_ascii().trim_end_matches('.').to_ascii_lowercase()
}

/// A part's outcome: its addresses on `port`, sorted and without repeats,
/// valid for the smaller of their TTL and `cap` (an SRV record's); the
/// [`unusable`] ones go to `skipped`.
fn outcome(d: &Discover, looked: Looked, port: u16, cap: Option<u32>, skipped: &mut Vec<Skipped>) -> Outcome {
    match looked {
        Ok(Addresses { ips, ttl, others }) => {
            for ip in others {
                skipped.push(Skipped { record: ip.to_string(), reason: "other_name" });
            }
            let mut unique = BTreeSet::new();
            for ip in ips {
                match unusable(ip) {
                    Some(reason) => skipped.push(Skipped { record: ip.to_string(), reason }),
                    None => {
                        unique.insert(ip);
                    }
                }
            }
            let ttl = ttl.into_iter().chain(cap).min().unwrap_or(0);
            let endpoints = unique.into_iter().map(|ip| d.endpoint(ip, port)).collect();
            Outcome::Found { endpoints, ttl: Duration::from_secs(ttl.into()) }
        }
        Err(why) => Outcome::Failed(why),
    }
}

/// How many SRV targets are looked up at once.
const TARGETS_AT_ONCE: usize = 16;

/// SRV: every record's target, its addresses on the record's port, each
/// family of each target a part of its own, with the record's priority:
/// which priority serves is decided with the last good addresses of the
/// parts that fail (`hold`), so every priority's targets are asked, and
/// the records' weights become the endpoints' there.
async fn srv(resolver: &TokioResolver, d: &Discover, name: &str) -> Answer {
    let lookup = match resolver.lookup(name, RecordType::SRV).await {
        Ok(lookup) => lookup,
        Err(e) if e.is_no_records_found() => return Answer::NotFound,
        Err(e) => return Answer::Failed(describe(&e)),
    };
    let names = owners(&lookup);
    let records: Vec<(&Record, u16, u16, u16, String)> = lookup
        .answers()
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => Some((r, s.priority, s.weight, s.port, s.target.to_ascii())),
            _ => None,
        })
        .collect();
    if records.is_empty() {
        return Answer::NotFound;
    }
    let (mut asked, mut skipped) = (Vec::new(), Vec::new());
    for (record, priority, weight, port, target) in &records {
        let skip = if !names.contains(&name_key(&record.name)) {
            Some("other_name")
        } else if *port == 0 {
            // RFC 2782: port 0 means the service is not there; nothing listens.
            Some("port_zero")
        } else if target == "." {
            // RFC 2782: the target "." means the service is decidedly not
            // available at this name.
            Some("no_service")
        } else {
            None
        };
        match skip {
            Some(reason) => skipped.push(Skipped { record: format!("{target}:{port}"), reason }),
            None => asked.push((record.ttl, *priority, *weight, *port, target)),
        }
    }
    // Together, so that targets that do not answer cost about one timeout
    // per TARGETS_AT_ONCE of them, not one each; bounded, so that a huge record set is not as many queries
    // in flight. In record order, as the parts' keys are.
    // (The futures made first: a stream holding the closure would not be
    // `Send` for every lifetime, as a spawned task must be.)
    let queries: Vec<_> = asked.iter().map(|(_, _, _, _, target)| families(resolver, target)).collect();
    let looked: Vec<(Looked, Looked)> = stream::iter(queries).buffered(TARGETS_AT_ONCE).collect().await;
    let mut parts = Vec::new();
    for ((ttl, priority, weight, port, target), (v4, v6)) in asked.into_iter().zip(looked) {
        for (family, looked) in [("A", v4), ("AAAA", v6)] {
            let outcome = outcome(d, looked, port, Some(ttl), &mut skipped);
            parts.push(Part { key: format!("{target}:{port} {family}"), priority, weight, outcome });
        }
    }
    Answer::Parts { parts, skipped }
}

/// A lookup failure in a few words.
fn describe(e: &NetError) -> String {
    e.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_table() {
        let cases = [
            ("10.1.2.3", None),
            ("2001:db8::1", None),
            // A sidecar on loopback is an upstream.
            ("127.0.0.1", None),
            ("::1", None),
            ("0.0.0.0", Some("unspecified")),
            ("::", Some("unspecified")),
            ("::ffff:0.0.0.0", Some("unspecified")),
            ("224.0.0.1", Some("multicast")),
            ("239.255.255.250", Some("multicast")),
            ("ff02::1", Some("multicast")),
            ("::ffff:224.0.0.1", Some("multicast")),
            ("255.255.255.255", Some("broadcast")),
            // A subnet's broadcast address cannot be told from a host's.
            ("10.1.2.255", None),
            ("169.254.169.254", Some("link_local")),
            ("::ffff:169.254.1.1", Some("link_local")),
            ("fe80::1", Some("link_local")),
            ("febf::1", Some("link_local")),
            ("fec0::1", None),
            ("169.253.255.255", None),
            // An IPv6 address that embeds an IPv4 one: the IPv4 rules.
            ("64:ff9b::a9fe:a9fe", Some("link_local")),
            ("64:ff9b::169.254.1.1", Some("link_local")),
            ("64:ff9b::0.0.0.0", Some("unspecified")),
            ("64:ff9b::224.0.0.1", Some("multicast")),
            ("64:ff9b::255.255.255.255", Some("broadcast")),
            ("64:ff9b::10.1.2.3", None),
            ("::a9fe:a9fe", Some("link_local")),
            ("::224.0.0.1", Some("multicast")),
            ("::255.255.255.255", Some("broadcast")),
            ("::10.1.2.3", None),
            ("::ffff:255.255.255.255", Some("broadcast")),
            // Only the well-known prefix's /96: others are plain IPv6.
            ("64:ff9b:1::a9fe:a9fe", None),
            ("64:ff9b::1:a9fe:a9fe", None),
            ("2001:db8::a9fe:a9fe", None),
        ];
        for (ip, want) in cases {
            assert_eq!(unusable(ip.parse().unwrap()), want, "{ip}");
        }
    }
}
