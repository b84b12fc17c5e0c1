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
//!   and an upstream holds at most `MAX_ENDPOINTS`;
//! - `weights`: an SRV answer's record weights shared among their
//!   addresses (pure, table-tested);
//! - `task`: the task of each upstream, its metrics and log lines;
//! - here: keeping the tasks in step with the configuration, and
//!   [`Status`], the read-only view of each upstream's discovery for the
//!   status endpoints.

pub mod hold;
pub mod resolve;
pub mod schedule;
mod task;
mod weights;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use hickory_resolver::TokioResolver;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::config::{Config, Discover, EndpointConfig, ResolverSettings};

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
    /// Some part failed (AAAA, one SRV target): this many addresses, its
    /// last good ones among them (none: what answered found none, and the
    /// set goes after `max_ttl` as for `NotFound`).
    Partial { addresses: usize, reason: String },
    /// Timeout, SERVFAIL, refused: the set was kept.
    Failed { reason: String },
}

impl Resolution {
    /// The `result` label of `gateway_discovery_resolutions_total`: `ok`,
    /// `partial`, `not_found` or `error`.
    pub fn label(&self) -> &'static str {
        match self {
            Resolution::Found { .. } => "ok",
            Resolution::Partial { .. } => "partial",
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
    /// When the name last had addresses (`None`: never): carried over to
    /// the lookups that replace these, so that a name gone keeps its
    /// addresses until `max_ttl` after that, a reload or not.
    last_found: Mutex<Option<Instant>>,
    status: Mutex<Status>,
}

impl State {
    /// The endpoints the upstream should have now.
    pub fn endpoints(&self) -> Vec<EndpointConfig> {
        self.endpoints.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// When the name last had addresses.
    fn last_found(&self) -> Option<Instant> {
        *self.last_found.lock().unwrap_or_else(|e| e.into_inner())
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
        let mut carried: HashMap<String, Watch> = HashMap::new();
        if inner.settings.as_ref() != Some(&config.resolver) {
            inner.settings = Some(config.resolver.clone());
            inner.resolver = None;
            carried = inner.watches.drain().collect();
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
                carried.insert(name, w);
            }
        }
        for (name, discover) in wanted {
            if inner.watches.contains_key(name) {
                continue;
            }
            let settings = inner.settings.clone().unwrap_or_else(|| config.resolver.clone());
            let resolver = inner.resolver.get_or_insert_with(|| resolve::resolver(&settings).map(Arc::new)).clone();
            // Its task stops as it is dropped here.
            let (kept, last_found) = match carried.remove(name) {
                Some(before) if before.config.same_target(discover) => {
                    (before.state.endpoints(), before.state.last_found())
                }
                _ => (Vec::new(), None),
            };
            let state = Arc::new(State {
                endpoints: Mutex::new(kept),
                last_found: Mutex::new(last_found),
                status: Mutex::new(Status {
                    source: if discover.source() == "srv" { Source::Srv } else { Source::Dns },
                    name: Some(discover.describe()),
                    last_resolution: None,
                    result: None,
                    last_success: None,
                }),
            });
            let task = tokio::spawn(task::run(
                name.to_owned(),
                discover.clone(),
                resolver,
                state.clone(),
                self.changed.clone(),
            ));
            inner.watches.insert(name.to_owned(), Watch { config: discover.clone(), state, task: task.abort_handle() });
        }
    }

    /// The state of the discovered upstream `name`, if it is one.
    pub fn state(&self, name: &str) -> Option<Arc<State>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).watches.get(name).map(|w| w.state.clone())
    }
}

/// How long to wait for one lookup in `gateway check`.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(10);
