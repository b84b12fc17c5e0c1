//! What an answer with addresses does to the set, address by address: the
//! answer's addresses are in it, and one the answer left out stays for its
//! record's TTL (clamped to `min_ttl..max_ttl`) from the first answer
//! without it. And what a lookup whose parts went differently comes to
//! (`Held::combine`): a part that failed (AAAA timing out while A answers,
//! one SRV target's address lookup failing) stands in with its last good
//! addresses, neither dropping them nor holding back the parts that
//! answered. Pure, so the rules are table-tested.
//!
//! Why keep it: a DNS server that answers a rotating or truncated subset
//! of a large record set (round-robin DNS, answers cut to fit a UDP
//! packet) would otherwise make the set churn at every lookup, and an
//! endpoint that leaves and comes back starts again with no pool, health
//! or ejection. Why only for its TTL: a resolver that fetched the name
//! just before that answer hands the address out for one more TTL, so the
//! service must keep it serving that long anyway (Envoy's STRICT_DNS drops
//! it at once; HAProxy's `hold obsolete` keeps it for a fixed time; the
//! TTL is the time the DNS itself promises).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::time::Instant;

use super::resolve::{Answer, Outcome, Part};
use crate::config::EndpointConfig;

/// The set, with when each address was last left out, and each part's last
/// good endpoints.
#[derive(Debug, Default)]
pub struct Held {
    entries: Vec<Entry>,
    /// By part key (see [`Part`]): what the part last gave when it answered.
    last_good: HashMap<String, (Vec<EndpointConfig>, Duration)>,
}

/// What a lookup came to once its failed parts stood in with their last
/// good endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Combined {
    /// Endpoints, with the smallest TTL of the parts that gave them;
    /// `failed` says why some part failed (it was asked again soon).
    Found { endpoints: Vec<EndpointConfig>, ttl: Duration, failed: Option<String> },
    /// No part had any endpoint: those that answered have none, and those
    /// that failed (`failed` says why) had no last good ones to stand in.
    NotFound { failed: Option<String> },
    /// Nothing learnt: every part failed (the set is kept as it is), or
    /// the lookup as a whole.
    Failed(String),
}

#[derive(Debug)]
struct Entry {
    endpoint: EndpointConfig,
    /// Its TTL, clamped, as of the last answer that gave it.
    ttl: Duration,
    /// The first answer since then that left it out.
    missing_since: Option<Instant>,
}

impl Held {
    /// A set carried over (a reload, a changed `[resolver]`): each
    /// address held for `ttl` if the first answer leaves it out.
    pub fn carried(endpoints: Vec<EndpointConfig>, ttl: Duration) -> Held {
        let entries = endpoints.into_iter().map(|endpoint| Entry { endpoint, ttl, missing_since: None }).collect();
        Held { entries, last_good: HashMap::new() }
    }

    /// Takes an answer's endpoints, valid for `ttl` (already clamped), at
    /// `now`; returns the set: the answer's and those it left out whose
    /// TTL has not passed since the first answer without them, in address
    /// order.
    pub fn answer(&mut self, found: &[EndpointConfig], ttl: Duration, now: Instant) -> Vec<EndpointConfig> {
        // By address: an answer may change an endpoint's weight.
        self.entries.retain_mut(|e| {
            if found.iter().any(|f| f.url == e.endpoint.url) {
                return true;
            }
            let since = *e.missing_since.get_or_insert(now);
            now.saturating_duration_since(since) < e.ttl
        });
        for f in found {
            match self.entries.iter_mut().find(|e| e.endpoint.url == f.url) {
                Some(e) => {
                    e.endpoint = f.clone();
                    e.ttl = ttl;
                    e.missing_since = None;
                }
                None => self.entries.push(Entry { endpoint: f.clone(), ttl, missing_since: None }),
            }
        }
        self.entries.sort_by_key(|e| (e.endpoint.url.parse::<SocketAddr>().ok(), e.endpoint.url.clone()));
        self.endpoints()
    }

    /// Forgets every address (the name has been gone for `max_ttl`).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.last_good.clear();
    }

    /// A lookup's parts combined: a failed part gives its last good
    /// endpoints; a part no longer asked (an SRV target that left) is
    /// forgotten. Of SRV parts, those of the lowest priority that has an
    /// endpoint (RFC 2782: the lowest the client can reach; the gateway's
    /// health checks and ejection decide among its endpoints).
    pub fn combine(&mut self, answer: Answer) -> Combined {
        let parts = match answer {
            Answer::Parts { parts, .. } => parts,
            Answer::NotFound => return Combined::NotFound { failed: None },
            Answer::Failed(why) => return Combined::Failed(why),
        };
        self.last_good.retain(|key, _| parts.iter().any(|p| p.key == *key));
        // Each part's priority, endpoints (`None`: failed, none good
        // before) and why it failed, with its record and weight.
        let mut taken = Vec::with_capacity(parts.len());
        for Part { key, priority, weight, outcome } in parts {
            let record = key.rsplit_once(' ').map_or(key.as_str(), |(record, _)| record).to_owned();
            match outcome {
                Outcome::Found { endpoints, ttl } => {
                    self.last_good.insert(key, (endpoints.clone(), ttl));
                    taken.push((priority, Some((endpoints, ttl)), None, (record, weight)));
                }
                Outcome::Failed(why) => {
                    let kept = self.last_good.get(&key).cloned();
                    taken.push((priority, kept, Some(format!("{key}: {why}")), (record, weight)));
                }
            }
        }
        // Whether the lookup learnt anything: some part answered.
        let answered = taken.iter().any(|(_, _, why, _)| why.is_none());
        let has_some = |got: &Option<(Vec<EndpointConfig>, Duration)>| got.as_ref().is_some_and(|(e, _)| !e.is_empty());
        // With none, every part says what the lookup came to.
        if let Some(lowest) = taken.iter().filter(|(_, got, _, _)| has_some(got)).map(|(p, _, _, _)| *p).min() {
            taken.retain(|(p, _, _, _)| *p == lowest);
        }
        let (mut records, mut ttl, mut failed) = (Vec::<Record>::new(), None::<Duration>, None);
        for (_, got, why, (record, weight)) in taken {
            failed = why.or(failed);
            let Some((got, t)) = got else { continue };
            if !got.is_empty() {
                ttl = Some(ttl.map_or(t, |u| u.min(t)));
            }
            match records.iter_mut().find(|r| r.0 == record) {
                Some(r) => r.2.extend(got),
                None => records.push((record, weight, got)),
            }
        }
        let endpoints = weighted(records);
        match (ttl, failed) {
            // Nothing answered: a failed lookup, which keeps the set whole.
            (_, Some(why)) if !answered => Combined::Failed(why),
            (Some(ttl), failed) => Combined::Found { endpoints, ttl, failed },
            // What answered has no address, and what failed none to stand
            // in: the name is gone as far as anything says, so the rule for
            // a name not found applies, not the one for a failed lookup
            // (which would keep the set for ever).
            (None, failed) => Combined::NotFound { failed },
        }
    }

    /// The set as it is.
    pub fn endpoints(&self) -> Vec<EndpointConfig> {
        self.entries.iter().map(|e| e.endpoint.clone()).collect()
    }
}

/// One SRV record's endpoints (both families), by its key and weight.
type Record = (String, u16, Vec<EndpointConfig>);

/// The heaviest an endpoint weighs (as in the file).
const MAX_WEIGHT: u64 = 10_000;

/// How many times a record of weight 0 the lightest other weighs, when
/// there are both.
const ZERO_WEIGHT_SHARE: u64 = 100;

/// The endpoints of one priority's records, weighted as RFC 2782 has the
/// records chosen: each record's weight is shared among its addresses, in
/// the smallest whole numbers that keep the proportions (so round robin's
/// runs stay short), at most [`MAX_WEIGHT`]. A record of weight 0 among
/// heavier ones weighs 1 an address against at least
/// [`ZERO_WEIGHT_SHARE`] for the lightest other (the RFC's "very small
/// chance"; it still serves when they cannot), even where that bends the
/// others' proportions (see [`scale`]); when every record weighs 0 (and
/// for a name's own A and AAAA), every address weighs 1. An address of
/// several records weighs their sum.
fn weighted(records: Vec<Record>) -> Vec<EndpointConfig> {
    let records: Vec<Record> = records.into_iter().filter(|(_, _, e)| !e.is_empty()).collect();
    // Each record's weight an address, in whole numbers: over the least
    // common multiple of the address counts (bounded: they are small).
    let lcm = records.iter().fold(1u64, |l, (_, _, e)| (l / gcd(l, e.len() as u64) * e.len() as u64).min(MAX_WEIGHT));
    let mut shares: Vec<u64> = records.iter().map(|(_, w, e)| u64::from(*w) * lcm / e.len() as u64).collect();
    let g = shares.iter().fold(0, |g, &s| gcd(g, s));
    if g > 0 {
        shares.iter_mut().for_each(|s| *s /= g);
        scale(&mut shares);
    }
    let mut out: Vec<EndpointConfig> = Vec::new();
    for ((_, _, endpoints), share) in records.into_iter().zip(shares) {
        let share = share.max(1) as u32;
        for mut e in endpoints {
            match out.iter_mut().find(|o| o.url == e.url) {
                Some(o) if g > 0 => o.weight = (o.weight + share).min(MAX_WEIGHT as u32),
                Some(_) => {}
                None => {
                    e.weight = share;
                    out.push(e);
                }
            }
        }
    }
    out
}

/// Brings records' shares (in lowest terms, not all 0) within
/// [`MAX_WEIGHT`], those of weight 0 left at 0. Beside a share of 0 the
/// others are first raised so the lightest is at least
/// [`ZERO_WEIGHT_SHARE`], and scaling down never takes one below it: the
/// promise to a record of weight 0 holds, and at the extremes (records of
/// 65535 and 1) the others' proportions give instead.
fn scale(shares: &mut [u64]) {
    let least = if shares.contains(&0) { ZERO_WEIGHT_SHARE } else { 1 };
    let lightest = shares.iter().copied().filter(|&s| s > 0).min().unwrap_or(1);
    let times = least.div_ceil(lightest);
    shares.iter_mut().for_each(|s| *s *= times);
    let heaviest = shares.iter().copied().max().unwrap_or(1);
    if heaviest > MAX_WEIGHT {
        let down = |s: u64| ((s as f64 * MAX_WEIGHT as f64 / heaviest as f64).round() as u64).max(least);
        shares.iter_mut().filter(|s| **s > 0).for_each(|s| *s = down(*s));
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::{Discover, DiscoverName};

    /// An endpoint of a discovered name, at `port` (also for `task`'s tests).
    pub(in crate::discovery) fn at(port: u16) -> EndpointConfig {
        let d = Discover {
            name: DiscoverName::Dns { host: "app".into(), port: 80 },
            scheme: http::uri::Scheme::HTTP,
            interval: Duration::from_secs(5),
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(60),
            tls_name: None,
        };
        d.endpoint("127.0.0.1".parse().unwrap(), port)
    }

    #[test]
    fn answer_table() {
        let s = Duration::from_secs;
        let t0 = Instant::now();
        // (answer's ports, its TTL, seconds after t0, the set's ports)
        type Step = (&'static [u16], u64, u64, &'static [u16]);
        let cases: Vec<(&str, Vec<Step>)> = vec![
            ("answers replace an empty set", vec![(&[2, 1], 5, 0, &[1, 2])]),
            ("left out once, kept", vec![(&[1, 2], 5, 0, &[1, 2]), (&[1], 5, 1, &[1, 2])]),
            (
                "back within its TTL, kept",
                vec![(&[1, 2], 5, 0, &[1, 2]), (&[1], 5, 1, &[1, 2]), (&[1, 2], 5, 2, &[1, 2])],
            ),
            // The TTL runs from the first answer without it, not the last with it.
            ("gone at its TTL", vec![(&[1, 2], 5, 0, &[1, 2]), (&[1], 5, 4, &[1, 2]), (&[1], 5, 9, &[1])]),
            ("still within it", vec![(&[1, 2], 5, 0, &[1, 2]), (&[1], 5, 4, &[1, 2]), (&[1], 5, 8, &[1, 2])]),
            // Its TTL is the one of the last answer that gave it.
            ("its own TTL", vec![(&[1, 2], 2, 0, &[1, 2]), (&[1], 30, 1, &[1, 2]), (&[1], 30, 3, &[1])]),
            // Back, it is a fresh entry: the next absence starts a new TTL.
            (
                "a new absence, a new TTL",
                vec![(&[1, 2], 5, 0, &[1, 2]), (&[1], 5, 1, &[1, 2]), (&[1, 2], 5, 2, &[1, 2]), (&[1], 5, 5, &[1, 2])],
            ),
            ("a TTL of 0 keeps nothing", vec![(&[1, 2], 0, 0, &[1, 2]), (&[1], 0, 0, &[1])]),
        ];
        for (name, steps) in cases {
            let mut held = Held::default();
            for (i, (ports, ttl, secs, want)) in steps.into_iter().enumerate() {
                let found: Vec<EndpointConfig> = ports.iter().map(|p| at(*p)).collect();
                let got = held.answer(&found, s(ttl), t0 + s(secs));
                let want: Vec<EndpointConfig> = want.iter().map(|p| at(*p)).collect();
                assert_eq!(got, want, "{name}, step {i}");
            }
        }
    }

    fn parts(parts: Vec<Part>) -> Answer {
        Answer::Parts { parts, skipped: Vec::new() }
    }

    fn part(key: &str, ports: Option<&[u16]>) -> Part {
        tier(0, key, ports)
    }

    /// A part of an SRV record of `priority`.
    fn tier(priority: u16, key: &str, ports: Option<&[u16]>) -> Part {
        let outcome = match ports {
            Some(ports) => {
                Outcome::Found { endpoints: ports.iter().map(|p| at(*p)).collect(), ttl: Duration::from_secs(5) }
            }
            None => Outcome::Failed("SERVFAIL".into()),
        };
        Part { key: key.into(), priority, weight: 0, outcome }
    }

    #[test]
    fn srv_weights_table() {
        // (records: weight, ports), the endpoints' (port, weight)
        type Case = (&'static str, Vec<(u16, &'static [u16])>, &'static [(u16, u32)]);
        let cases: Vec<Case> = vec![
            ("all 0: each weighs 1", vec![(0, &[1]), (0, &[2, 3])], &[(1, 1), (2, 1), (3, 1)]),
            ("in proportion, smallest numbers", vec![(60, &[1]), (40, &[2])], &[(1, 3), (2, 2)]),
            ("one of 0 among others", vec![(5, &[1]), (0, &[2])], &[(1, 100), (2, 1)]),
            ("0 among unequal others", vec![(2, &[1]), (3, &[2]), (0, &[3])], &[(1, 100), (2, 150), (3, 1)]),
            ("a record's weight shared by its addresses", vec![(50, &[1, 2]), (50, &[3])], &[(1, 1), (2, 1), (3, 2)]),
            ("an address of two records weighs both", vec![(10, &[1]), (10, &[1]), (30, &[2])], &[(1, 2), (2, 3)]),
            ("two records of 0, one address", vec![(0, &[1]), (0, &[1])], &[(1, 1)]),
            ("a record without addresses", vec![(9, &[]), (1, &[2])], &[(2, 1)]),
            ("too heavy: scaled to the bound", vec![(65535, &[1]), (1, &[2])], &[(1, 10_000), (2, 1)]),
            // Scaled down, the lightest other stays 100 times a record of 0.
            ("0 beside a too heavy one", vec![(65535, &[1]), (1, &[2]), (0, &[3])], &[(1, 10_000), (2, 100), (3, 1)]),
            ("0 beside 65535 and 300", vec![(65535, &[1]), (300, &[2]), (0, &[3])], &[(1, 10_000), (2, 100), (3, 1)]),
            // Where the proportions allow it, they are kept.
            ("scaled, 0 kept apart", vec![(65535, &[1]), (6554, &[2]), (0, &[3])], &[(1, 10_000), (2, 1_000), (3, 1)]),
            (
                "0 and a record of two",
                vec![(65535, &[1]), (1, &[2, 3]), (0, &[4])],
                &[(1, 10_000), (2, 100), (3, 100), (4, 1)],
            ),
            ("three addresses and two", vec![(1, &[1, 2, 3]), (1, &[4, 5])], &[(1, 2), (2, 2), (3, 2), (4, 3), (5, 3)]),
        ];
        for (name, records, want) in cases {
            let records = records
                .into_iter()
                .enumerate()
                .map(|(i, (w, ports))| (format!("t{i}:80"), w, ports.iter().map(|p| at(*p)).collect()))
                .collect();
            let got: Vec<(u16, u32)> = weighted(records)
                .iter()
                .map(|e| (e.url.rsplit(':').next().unwrap().parse().unwrap(), e.weight))
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn an_answer_that_reweighs_an_address_keeps_one_entry() {
        let t0 = Instant::now();
        let mut held = Held::default();
        let heavy = EndpointConfig { weight: 7, ..at(1) };
        assert_eq!(held.answer(&[at(1), at(2)], Duration::from_secs(5), t0), vec![at(1), at(2)]);
        assert_eq!(held.answer(&[heavy.clone(), at(2)], Duration::from_secs(5), t0), vec![heavy, at(2)]);
    }

    #[test]
    fn combine_table() {
        let found = |ports: &[u16], failed: Option<&str>| Combined::Found {
            endpoints: ports.iter().map(|p| at(*p)).collect(),
            ttl: Duration::from_secs(5),
            failed: failed.map(|k| format!("{k}: SERVFAIL")),
        };
        // Each case: lookups one after another, each with what it comes to.
        let cases: Vec<(&str, Vec<(Answer, Combined)>)> = vec![
            ("both answer", vec![(parts(vec![part("A", Some(&[1])), part("AAAA", Some(&[2]))]), found(&[1, 2], None))]),
            (
                "AAAA fails: its last good stand in",
                vec![
                    (parts(vec![part("A", Some(&[1])), part("AAAA", Some(&[2]))]), found(&[1, 2], None)),
                    (parts(vec![part("A", Some(&[1, 3])), part("AAAA", None)]), found(&[1, 3, 2], Some("AAAA"))),
                ],
            ),
            (
                "a part that never answered gives nothing",
                vec![(parts(vec![part("A", Some(&[1])), part("AAAA", None)]), found(&[1], Some("AAAA")))],
            ),
            (
                "every part failing is a failed lookup, last good or not",
                vec![
                    (parts(vec![part("A", Some(&[1])), part("AAAA", Some(&[]))]), found(&[1], None)),
                    (parts(vec![part("A", None), part("AAAA", None)]), Combined::Failed("AAAA: SERVFAIL".into())),
                ],
            ),
            (
                "every part failing, none ever good",
                vec![(parts(vec![part("A", None)]), Combined::Failed("A: SERVFAIL".into()))],
            ),
            (
                "no records anywhere",
                vec![(parts(vec![part("A", Some(&[])), part("AAAA", Some(&[]))]), Combined::NotFound { failed: None })],
            ),
            (
                "A has none and AAAA fails with none to stand in: not found",
                vec![
                    (parts(vec![part("A", Some(&[1])), part("AAAA", Some(&[]))]), found(&[1], None)),
                    (
                        parts(vec![part("A", Some(&[])), part("AAAA", None)]),
                        Combined::NotFound { failed: Some("AAAA: SERVFAIL".into()) },
                    ),
                ],
            ),
            (
                "A has none and AAAA fails with its last good: those",
                vec![
                    (parts(vec![part("A", Some(&[1])), part("AAAA", Some(&[2]))]), found(&[1, 2], None)),
                    (parts(vec![part("A", Some(&[])), part("AAAA", None)]), found(&[2], Some("AAAA"))),
                ],
            ),
            (
                "a part no longer asked is forgotten",
                vec![
                    (parts(vec![part("a:1 A", Some(&[1])), part("b:2 A", Some(&[2]))]), found(&[1, 2], None)),
                    (parts(vec![part("a:1 A", Some(&[1]))]), found(&[1], None)),
                    (parts(vec![part("a:1 A", Some(&[1])), part("b:2 A", None)]), found(&[1], Some("b:2 A"))),
                ],
            ),
            (
                "the lowest priority with an address",
                vec![
                    (parts(vec![tier(10, "a:1 A", Some(&[1])), tier(20, "b:2 A", Some(&[2]))]), found(&[1], None)),
                    // None there: the next.
                    (parts(vec![tier(10, "a:1 A", Some(&[])), tier(20, "b:2 A", Some(&[2]))]), found(&[2], None)),
                    // Failing there with its last good: those.
                    (parts(vec![tier(10, "a:1 A", None), tier(20, "b:2 A", Some(&[2]))]), found(&[2], None)),
                    (parts(vec![tier(10, "a:1 A", Some(&[1])), tier(20, "b:2 A", Some(&[2]))]), found(&[1], None)),
                    (parts(vec![tier(10, "a:1 A", None), tier(20, "b:2 A", Some(&[2]))]), found(&[1], Some("a:1 A"))),
                    // A failing fallback says nothing of the set.
                    (parts(vec![tier(10, "a:1 A", Some(&[1])), tier(20, "b:2 A", None)]), found(&[1], None)),
                    // No priority has one: all parts say.
                    (
                        parts(vec![tier(10, "a:1 A", Some(&[])), tier(20, "b:2 A", Some(&[]))]),
                        Combined::NotFound { failed: None },
                    ),
                ],
            ),
            (
                "the lookup as a whole",
                vec![
                    (Answer::NotFound, Combined::NotFound { failed: None }),
                    (Answer::Failed("x".into()), Combined::Failed("x".into())),
                ],
            ),
        ];
        for (name, steps) in cases {
            let mut held = Held::default();
            for (i, (answer, want)) in steps.into_iter().enumerate() {
                assert_eq!(held.combine(answer), want, "{name}, step {i}");
            }
        }
    }

    #[test]
    fn carried_addresses_are_held_for_the_ttl_given() {
        let t0 = Instant::now();
        let mut held = Held::carried(vec![at(1), at(2)], Duration::from_secs(1));
        assert_eq!(held.answer(&[at(1)], Duration::from_secs(30), t0), [at(1), at(2)]);
        assert_eq!(held.answer(&[at(1)], Duration::from_secs(30), t0 + Duration::from_secs(1)), [at(1)]);
        held.clear();
        assert!(held.endpoints().is_empty());
    }
}
