//! Upstreams whose endpoints come from DNS (`discover`): one task per
//! discovered upstream asks its name again and again and keeps the set of
//! addresses it currently has; when the set changes, it tells the server,
//! which rebuilds the routing table the way a reload does
//! (`App::rediscovered`): the upstream is built anew with the new
//! endpoints, keeping those whose address is unchanged (their pools,
//! health and ejection), its admission and its retry budget. Requests thus
//! pay nothing for discovery: an upstream's endpoints are a plain list, as
//! for a static one.
//!
//! - `resolve`: the resolver (`[resolver]`) and one lookup, A/AAAA or SRV,
//!   turned into endpoints;
//! - `schedule`: when to ask again and what an answer does to the set
//!   (pure, table-tested);
//! - `hold`: an address an answer left out stays for its TTL (pure,
//!   table-tested), so a server answering subsets does not churn the set;
//! - here: the tasks, their metrics and log lines, and [`Status`], the
//!   read-only view of each upstream's discovery for the status endpoints.

pub mod hold;
pub mod resolve;
pub mod schedule;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hickory_resolver::TokioResolver;
use metrics::{counter, gauge};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{Config, Discover, EndpointConfig, ResolverSettings};
use crate::metrics::{DISCOVERY_LAST_SUCCESS, DISCOVERY_RESOLUTIONS};
use hold::Held;
use resolve::Answer;
use schedule::{Looked, SetChange};

/// Where an upstream's endpoints come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `url` or `endpoints`.
    Static,
    /// `discover = { dns = "name:port" }`: A and AAAA records.
    Dns,
    /// `discover = { srv = "..." }`: SRV records.
    Srv,
}

impl Source {
    /// `static`, `dns` or `srv`.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Static => "static",
            Source::Dns => "dns",
            Source::Srv => "srv",
        }
    }
}

/// How the last lookup of a discovered name went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// The name had this many addresses.
    Found { addresses: usize },
    /// NXDOMAIN, or no records.
    NotFound,
    /// Timeout, SERVFAIL, refused: the set was kept.
    Failed { reason: String },
}

impl Resolution {
    /// The `result` label of `gateway_discovery_resolutions_total`: `ok`,
    /// `not_found` or `error`.
    pub fn label(&self) -> &'static str {
        match self {
            Resolution::Found { .. } => "ok",
            Resolution::NotFound => "not_found",
            Resolution::Failed { .. } => "error",
        }
    }
}

/// What the status endpoints show of an upstream's discovery: read-only, a
/// copy taken at the call ([`crate::upstream::Upstream::discovery`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// `static`, `dns` or `srv` ([`Source::as_str`]).
    pub source: Source,
    /// The name looked up (`name:port`, or the SRV name); `None` for a
    /// static upstream.
    pub name: Option<String>,
    /// When the last lookup finished; `None` before the first (and always
    /// for a static upstream).
    pub last_resolution: Option<SystemTime>,
    /// How it went; `None` before the first.
    pub result: Option<Resolution>,
    /// When a lookup last found addresses.
    pub last_success: Option<SystemTime>,
}

impl Status {
    /// A static upstream's status.
    pub fn fixed() -> Status {
        Status { source: Source::Static, name: None, last_resolution: None, result: None, last_success: None }
    }
}

/// One discovered upstream's state, shared by its task, the discovery and
/// the upstreams built from it.
pub struct State {
    /// The addresses the name has now (as far as the rules go; see
    /// `schedule`), sorted.
    endpoints: Mutex<Vec<EndpointConfig>>,
    status: Mutex<Status>,
}

impl State {
    /// The endpoints the upstream should have now.
    pub fn endpoints(&self) -> Vec<EndpointConfig> {
        self.endpoints.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A copy of the discovery's status.
    pub fn status(&self) -> Status {
        self.status.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A discovered upstream's running lookups.
struct Watch {
    config: Discover,
    state: Arc<State>,
    task: tokio::task::AbortHandle,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Every discovered upstream's lookups, kept in step with the configuration
/// by [`Discovery::sync`].
pub struct Discovery {
    /// Notified when some upstream's set changed.
    changed: Arc<Notify>,
    inner: Mutex<Inner>,
}

struct Inner {
    settings: Option<ResolverSettings>,
    /// Built at the first discovered upstream; `Err` says why it could not be.
    resolver: Option<Result<Arc<TokioResolver>, String>>,
    watches: HashMap<String, Watch>,
}

impl Default for Discovery {
    fn default() -> Self {
        Discovery {
            changed: Arc::new(Notify::new()),
            inner: Mutex::new(Inner { settings: None, resolver: None, watches: HashMap::new() }),
        }
    }
}

impl Drop for Discovery {
    fn drop(&mut self) {
        // Wakes whoever waits for changes, to find the gateway gone.
        self.changed.notify_one();
    }
}

impl Discovery {
    /// What is notified when a set changes.
    pub fn changed(&self) -> Arc<Notify> {
        self.changed.clone()
    }

    /// Starts lookups for the discovered upstreams of `config` that have
    /// none yet and stops those of upstreams no longer there (or discovered
    /// differently). A changed `[resolver]` starts them all again. An
    /// upstream whose name and scheme stayed keeps the addresses it had.
    /// Must run on a tokio runtime.
    pub fn sync(&self, config: &Config) {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut carried: HashMap<String, (Discover, Vec<EndpointConfig>)> = HashMap::new();
        if inner.settings.as_ref() != Some(&config.resolver) {
            inner.settings = Some(config.resolver.clone());
            inner.resolver = None;
            carried = inner.watches.drain().map(|(name, w)| (name, (w.config.clone(), w.state.endpoints()))).collect();
        }
        let wanted: HashMap<&str, &Discover> =
            config.upstreams.iter().filter_map(|u| Some((u.name.as_str(), u.discover.as_ref()?))).collect();
        let stale: Vec<String> = inner
            .watches
            .iter()
            .filter(|(n, w)| wanted.get(n.as_str()) != Some(&&w.config))
            .map(|(n, _)| n.clone())
            .collect();
        for name in stale {
            if let Some(w) = inner.watches.remove(&name) {
                carried.insert(name, (w.config.clone(), w.state.endpoints()));
            }
        }
        for (name, discover) in wanted {
            if inner.watches.contains_key(name) {
                continue;
            }
            let settings = inner.settings.clone().unwrap_or_else(|| config.resolver.clone());
            let resolver = inner.resolver.get_or_insert_with(|| resolve::resolver(&settings).map(Arc::new)).clone();
            let kept = match carried.remove(name) {
                Some((before, endpoints)) if before.same_target(discover) => endpoints,
                _ => Vec::new(),
            };
            let state = Arc::new(State {
                endpoints: Mutex::new(kept),
                status: Mutex::new(Status {
                    source: if discover.source() == "srv" { Source::Srv } else { Source::Dns },
                    name: Some(discover.describe()),
                    last_resolution: None,
                    result: None,
                    last_success: None,
                }),
            });
            let task =
                tokio::spawn(run(name.to_owned(), discover.clone(), resolver, state.clone(), self.changed.clone()));
            inner.watches.insert(name.to_owned(), Watch { config: discover.clone(), state, task: task.abort_handle() });
        }
    }

    /// The state of the discovered upstream `name`, if it is one.
    pub fn state(&self, name: &str) -> Option<Arc<State>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).watches.get(name).map(|w| w.state.clone())
    }
}

/// Looks `d`'s name up again and again (see `schedule`), updating `state`
/// and notifying `changed` when its set changes. Aborted when its upstream
/// goes or is discovered differently.
async fn run(
    upstream: String,
    d: Discover,
    resolver: Result<Arc<TokioResolver>, String>,
    state: Arc<State>,
    changed: Arc<Notify>,
) {
    let last_success = gauge!(DISCOVERY_LAST_SUCCESS, "upstream" => upstream.clone());
    let count =
        |result: &'static str| counter!(DISCOVERY_RESOLUTIONS, "upstream" => upstream.clone(), "result" => result);
    for result in ["ok", "not_found", "error"] {
        count(result).increment(0);
    }
    let mut last_found: Option<Instant> = None;
    // Carried over from the lookups this task replaces, TTLs unknown.
    let mut held = Held::carried(state.endpoints(), d.min_ttl);
    let mut previous: Option<&'static str> = None;
    loop {
        let answer = match &resolver {
            Ok(resolver) => resolve::lookup(resolver, &d).await,
            Err(why) => Answer::Failed(why.clone()),
        };
        let now = Instant::now();
        let (looked, resolution) = match &answer {
            Answer::Found { endpoints, ttl } => {
                (Looked::Found { ttl: *ttl }, Resolution::Found { addresses: endpoints.len() })
            }
            Answer::NotFound => (Looked::NotFound, Resolution::NotFound),
            Answer::Failed(why) => (Looked::Failed, Resolution::Failed { reason: why.clone() }),
        };
        let (change, next) = schedule::decide(looked, last_found, now, &d);
        count(resolution.label()).increment(1);
        if previous != Some(resolution.label()) {
            log_outcome(&upstream, &d, &resolution, &state);
            previous = Some(resolution.label());
        }
        let wall = SystemTime::now();
        {
            let mut status = state.status.lock().unwrap_or_else(|e| e.into_inner());
            status.last_resolution = Some(wall);
            if let Resolution::Found { .. } = resolution {
                status.last_success = Some(wall);
                last_success.set(wall.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_secs_f64());
            }
            status.result = Some(resolution);
        }
        let new = match (change, answer) {
            (SetChange::Replace, Answer::Found { endpoints, ttl }) => {
                last_found = Some(now);
                Some(held.answer(&endpoints, ttl.clamp(d.min_ttl, d.max_ttl), now))
            }
            (SetChange::Empty, _) => {
                held.clear();
                Some(Vec::new())
            }
            _ => None,
        };
        if let Some(new) = new {
            let mut endpoints = state.endpoints.lock().unwrap_or_else(|e| e.into_inner());
            if *endpoints != new {
                log_change(&upstream, &endpoints, &new);
                *endpoints = new;
                drop(endpoints);
                changed.notify_one();
            }
        }
        tokio::time::sleep(next).await;
    }
}

/// A change in how lookups go: logged once per change, not per lookup.
fn log_outcome(upstream: &str, d: &Discover, resolution: &Resolution, state: &State) {
    let name = d.describe();
    let kept = state.endpoints.lock().unwrap_or_else(|e| e.into_inner()).len();
    match resolution {
        Resolution::Found { addresses } => tracing::info!(upstream, name, addresses, "discovery: name resolves"),
        Resolution::NotFound => tracing::warn!(
            upstream,
            name,
            kept,
            max_ttl = %humantime::format_duration(d.max_ttl),
            "discovery: name not found (NXDOMAIN or no records); its addresses go after max_ttl"
        ),
        Resolution::Failed { reason } => {
            tracing::warn!(upstream, name, kept, error = %reason, "discovery: lookup failed; keeping the last addresses")
        }
    }
}

fn log_change(upstream: &str, before: &[EndpointConfig], after: &[EndpointConfig]) {
    let added: Vec<&str> = after.iter().filter(|e| !before.contains(e)).map(|e| e.url.as_str()).collect();
    let removed: Vec<&str> = before.iter().filter(|e| !after.contains(e)).map(|e| e.url.as_str()).collect();
    if after.is_empty() {
        tracing::warn!(upstream, removed = ?removed, "discovery: no address left; requests get 503");
    } else {
        tracing::info!(upstream, added = ?added, removed = ?removed, endpoints = after.len(), "discovery: endpoints changed");
    }
}

/// How long to wait for one lookup in `gateway check`.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);
