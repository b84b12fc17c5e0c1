//! One discovered upstream's task: asks its name again and again (see
//! `schedule`), combines each answer with what it held (see `hold`),
//! publishes the set in its [`State`] and notifies the server when it
//! changed; counts and logs how lookups go, once per change.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

use hickory_resolver::TokioResolver;
use metrics::{Gauge, counter, gauge};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::hold::{Combined, Held, MAX_ENDPOINTS};
use super::resolve::{self, Answer, SKIP_REASONS, Skipped};
use super::schedule::{self, Looked, SetChange};
use super::{Resolution, State};
use crate::config::{Discover, EndpointConfig};
use crate::metrics::{DISCOVERY_LAST_SUCCESS, DISCOVERY_RESOLUTIONS, DISCOVERY_SKIPPED};

/// The `result` labels of `gateway_discovery_resolutions_total`.
const RESULTS: [&str; 4] = ["ok", "partial", "not_found", "error"];

/// Looks `d`'s name up again and again, updating `state` and notifying
/// `changed` when its set changes. Aborted when its upstream goes or is
/// discovered differently.
pub(super) async fn run(
    upstream: String,
    d: Discover,
    resolver: Result<Arc<TokioResolver>, String>,
    state: Arc<State>,
    changed: Arc<Notify>,
) {
    for result in RESULTS {
        counter!(DISCOVERY_RESOLUTIONS, "upstream" => upstream.clone(), "result" => result).increment(0);
    }
    for reason in SKIP_REASONS {
        counter!(DISCOVERY_SKIPPED, "upstream" => upstream.clone(), "reason" => reason).increment(0);
    }
    let mut task = Task {
        last_success: gauge!(DISCOVERY_LAST_SUCCESS, "upstream" => upstream.clone()),
        // Carried over from the lookups this task replaces, TTLs unknown.
        held: Held::carried(state.endpoints(), d.min_ttl),
        previous: None,
        skipped: HashSet::new(),
        over: false,
        upstream,
        d,
        state,
        changed,
    };
    loop {
        let answer = match &resolver {
            Ok(resolver) => resolve::lookup(resolver, &task.d).await,
            Err(why) => Answer::Failed(why.clone()),
        };
        task.skip(&answer);
        let next = task.take(answer, Instant::now());
        tokio::time::sleep(next).await;
    }
}

/// What the task keeps between lookups.
struct Task {
    upstream: String,
    d: Discover,
    state: Arc<State>,
    changed: Arc<Notify>,
    held: Held,
    /// The last lookup's `result` label (its change is logged).
    previous: Option<&'static str>,
    /// The records the last answer left out (each is logged when it
    /// first appears, not at every lookup).
    skipped: HashSet<Skipped>,
    /// Whether the last answer had more addresses than the upstream holds
    /// (logged when it starts).
    over: bool,
    last_success: Gauge,
}

impl Task {
    /// Counts the records an answer left out, at every lookup, and logs
    /// each once for as long as the answers keep giving it.
    fn skip(&mut self, answer: &Answer) {
        let Answer::Parts { skipped, .. } = answer else { return };
        for s in skipped {
            counter!(DISCOVERY_SKIPPED, "upstream" => self.upstream.clone(), "reason" => s.reason).increment(1);
            if !self.skipped.contains(s) {
                tracing::warn!(
                    upstream = %self.upstream,
                    name = %self.d.describe(),
                    record = %s.record,
                    reason = s.reason,
                    "discovery: a record that can never be an upstream is left out"
                );
            }
        }
        self.skipped = skipped.iter().cloned().collect();
    }

    /// Counts the addresses an answer of `found` had beyond
    /// [`MAX_ENDPOINTS`], at every lookup, and logs when an answer first
    /// has too many.
    fn too_many(&mut self, found: usize) {
        let left_out = self.held.left_out();
        if left_out > 0 {
            counter!(DISCOVERY_SKIPPED, "upstream" => self.upstream.clone(), "reason" => "too_many")
                .increment(left_out as u64);
            if !self.over {
                tracing::warn!(
                    upstream = %self.upstream,
                    name = %self.d.describe(),
                    found,
                    kept = MAX_ENDPOINTS,
                    left_out,
                    "discovery: the name has more addresses than an upstream holds; the lowest are kept"
                );
            }
        }
        self.over = left_out > 0;
    }

    /// Takes one lookup's answer: the status, the set; returns when to ask
    /// again.
    fn take(&mut self, answer: Answer, now: Instant) -> std::time::Duration {
        let combined = self.held.combine(answer);
        let (looked, resolution) = match &combined {
            Combined::Found { endpoints, ttl, failed: None } => {
                (Looked::Found { ttl: *ttl }, Resolution::Found { addresses: endpoints.len() })
            }
            Combined::Found { endpoints, ttl, failed: Some(why) } => {
                (Looked::Partial { ttl: *ttl }, Resolution::Partial { addresses: endpoints.len(), reason: why.clone() })
            }
            Combined::NotFound { failed: None } => (Looked::NotFound, Resolution::NotFound),
            // What answered says the name has no address: kept until max_ttl
            // as for a name not found, and counted as partial.
            Combined::NotFound { failed: Some(why) } => {
                (Looked::NotFound, Resolution::Partial { addresses: 0, reason: why.clone() })
            }
            Combined::Failed(why) => (Looked::Failed, Resolution::Failed { reason: why.clone() }),
        };
        let (change, next) = schedule::decide(looked, self.state.last_found(), now, &self.d);
        self.record(resolution);
        let new = match (change, combined) {
            (SetChange::Replace, Combined::Found { endpoints, ttl, .. }) => {
                *self.state.last_found.lock().unwrap_or_else(|e| e.into_inner()) = Some(now);
                let set = self.held.answer(&endpoints, ttl.clamp(self.d.min_ttl, self.d.max_ttl), now);
                self.too_many(endpoints.len());
                Some(set)
            }
            (SetChange::Empty, _) => {
                self.held.clear();
                Some(Vec::new())
            }
            _ => None,
        };
        if let Some(new) = new {
            self.publish(new);
        }
        next
    }

    /// Counts the lookup, logs a change in how lookups go, and keeps it in
    /// the status.
    fn record(&mut self, resolution: Resolution) {
        let label = resolution.label();
        counter!(DISCOVERY_RESOLUTIONS, "upstream" => self.upstream.clone(), "result" => label).increment(1);
        if self.previous != Some(label) {
            log_outcome(&self.upstream, &self.d, &resolution, &self.state);
            self.previous = Some(label);
        }
        let wall = SystemTime::now();
        let mut status = self.state.status.lock().unwrap_or_else(|e| e.into_inner());
        status.last_resolution = Some(wall);
        if let Resolution::Found { .. } | Resolution::Partial { addresses: 1.., .. } = resolution {
            status.last_success = Some(wall);
            self.last_success.set(wall.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs_f64());
        }
        status.result = Some(resolution);
    }

    /// The set the upstream should have now: published, and the server
    /// told, when it changed.
    fn publish(&self, new: Vec<EndpointConfig>) {
        let mut endpoints = self.state.endpoints.lock().unwrap_or_else(|e| e.into_inner());
        if *endpoints != new {
            log_change(&self.upstream, &endpoints, &new);
            *endpoints = new;
            drop(endpoints);
            self.changed.notify_one();
        }
    }
}

/// A change in how lookups go: logged once per change, not per lookup.
fn log_outcome(upstream: &str, d: &Discover, resolution: &Resolution, state: &State) {
    let name = d.describe();
    let kept = state.endpoints().len();
    match resolution {
        Resolution::Found { addresses } => tracing::info!(upstream, name, addresses, "discovery: name resolves"),
        Resolution::Partial { addresses: 0, reason } => tracing::warn!(
            upstream,
            name,
            kept,
            error = %reason,
            max_ttl = %humantime::format_duration(d.max_ttl),
            "discovery: the part of the lookup that answered found no address and the rest failed; \
             its addresses go after max_ttl"
        ),
        Resolution::Partial { addresses, reason } => tracing::warn!(
            upstream,
            name,
            addresses,
            error = %reason,
            "discovery: part of the lookup failed; that part keeps its last addresses"
        ),
        Resolution::NotFound => tracing::warn!(
            upstream,
            name,
            kept,
            max_ttl = %humantime::format_duration(d.max_ttl),
            "discovery: name not found (NXDOMAIN, or no records of the name); its addresses go after max_ttl"
        ),
        Resolution::Failed { reason } => {
            tracing::warn!(upstream, name, kept, error = %reason, "discovery: lookup failed; keeping the last addresses")
        }
    }
}

/// How many addresses of each kind a set change logs: a line listing
/// thousands is cut by log shippers (see `access`), and the counts say
/// the rest.
const LOGGED_ADDRESSES: usize = 8;

fn log_change(upstream: &str, before: &[EndpointConfig], after: &[EndpointConfig]) {
    let Change { added, removed, reweighted } = change(before, after);
    let sample = |list: &[String]| list.iter().take(LOGGED_ADDRESSES).cloned().collect::<Vec<_>>();
    if after.is_empty() {
        tracing::warn!(
            upstream,
            removed = ?sample(&removed),
            removed_count = removed.len(),
            "discovery: no address left; requests get 503"
        );
    } else {
        tracing::info!(
            upstream,
            added = ?sample(&added),
            added_count = added.len(),
            removed = ?sample(&removed),
            removed_count = removed.len(),
            reweighted = ?sample(&reweighted),
            reweighted_count = reweighted.len(),
            endpoints = after.len(),
            "discovery: endpoints changed"
        );
    }
}

/// What a set change did, by address: an address in both sets whose weight
/// changed is reweighted (`"url old -> new"`), not removed and added again.
#[derive(Debug, PartialEq, Eq)]
struct Change {
    added: Vec<String>,
    removed: Vec<String>,
    reweighted: Vec<String>,
}

fn weights(set: &[EndpointConfig]) -> HashMap<&str, u32> {
    set.iter().map(|e| (e.url.as_str(), e.weight)).collect()
}

/// By address through maps, not a search of one set for each address of
/// the other: a DNS answer may hold thousands, and this runs on the
/// runtime's thread.
fn change(before: &[EndpointConfig], after: &[EndpointConfig]) -> Change {
    let (was, is) = (weights(before), weights(after));
    let mut change = Change { added: Vec::new(), removed: Vec::new(), reweighted: Vec::new() };
    for e in after {
        match was.get(e.url.as_str()) {
            None => change.added.push(e.url.clone()),
            Some(&w) if w != e.weight => change.reweighted.push(format!("{} {w} -> {}", e.url, e.weight)),
            Some(_) => {}
        }
    }
    change.removed = before.iter().filter(|e| !is.contains_key(e.url.as_str())).map(|e| e.url.clone()).collect();
    change
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(port: u16, weight: u32) -> EndpointConfig {
        EndpointConfig { weight, ..super::super::hold::tests::at(port) }
    }

    #[test]
    fn change_table() {
        type Case = (
            &'static [(u16, u32)],
            &'static [(u16, u32)],
            &'static [&'static str],
            &'static [&'static str],
            &'static [&'static str],
        );
        // (before, after as (port, weight); added, removed, reweighted)
        let cases: &[Case] = &[
            (&[(1, 1)], &[(1, 1), (2, 1)], &["127.0.0.1:2"], &[], &[]),
            (&[(1, 1), (2, 1)], &[(1, 1)], &[], &["127.0.0.1:2"], &[]),
            // A weight-only change (an SRV record's weight): neither added nor removed.
            (&[(1, 1), (2, 10)], &[(1, 1), (2, 20)], &[], &[], &["127.0.0.1:2 10 -> 20"]),
            (&[(1, 1), (2, 10)], &[(2, 5), (3, 1)], &["127.0.0.1:3"], &["127.0.0.1:1"], &["127.0.0.1:2 10 -> 5"]),
            (&[(1, 1)], &[], &[], &["127.0.0.1:1"], &[]),
        ];
        let set = |s: &[(u16, u32)]| s.iter().map(|&(p, w)| at(p, w)).collect::<Vec<_>>();
        let strings = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        for (before, after, added, removed, reweighted) in cases {
            let want = Change { added: strings(added), removed: strings(removed), reweighted: strings(reweighted) };
            assert_eq!(change(&set(before), &set(after)), want, "{before:?} -> {after:?}");
        }
    }
}
