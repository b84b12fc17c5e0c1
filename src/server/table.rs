//! The routes and upstreams requests are served by, built from a config,
//! and the reload that replaces them while the gateway serves.

use std::sync::{Arc, Weak};

use crate::body::Incoming;
use http::{HeaderValue, Method, Request};
use tokio::sync::Notify;

use super::App;
use crate::auth::Guard;
use crate::body::ReadAhead;
use crate::cache::RouteCache;
use crate::config::{Config, ConfigError, ProxyTarget, RouteConfig, ServerConfig, Target, UpstreamConfig};
use crate::discovery::Discovery;
use crate::layers::RouteLayers;
use crate::limits::ConcurrencyLimit;
use crate::metrics::{self, RouteMetrics};
use crate::ratelimit::{RedisStore, RouteLimiter};
use crate::router::split::NewCookie;
use crate::router::{RouteKey, Router};
use crate::upstream::Upstream;
use ::metrics::Counter;

/// A route with its runtime state.
pub(super) struct Route {
    pub(super) config: RouteConfig,
    /// The route's layers; `None` when it enables none.
    pub(super) layers: Option<RouteLayers>,
    pub(super) metrics: RouteMetrics,
    /// The methods the route answers, with the `Allow` value for a 405;
    /// `None` answers every method.
    pub(super) methods: Option<(Vec<Method>, String)>,
    /// The route's `max_concurrent`, if set (shared with the route of the
    /// same name after a reload).
    pub(super) limit: Option<Arc<ConcurrencyLimit>>,
    /// The route's response cache, when it has `cache`.
    pub(super) cache: Option<Arc<RouteCache>>,
    /// The route's `rate_limit`, if set (kept, with its buckets, by a reload
    /// that leaves it unchanged).
    pub(super) rate_limit: Option<Arc<RouteLimiter>>,
    /// Whether `rate_limit` is keyed by a header `guard`'s credentials set,
    /// and so decided after them.
    pub(super) limit_after_auth: bool,
    /// The route's access control (`allow`, `deny`, `auth`), if any.
    /// Shared with the route of the same name after a rebuild from the
    /// same configuration (a discovery change), so its JWKS keys and
    /// remembered credentials go on; a reload builds it anew.
    pub(super) guard: Option<Arc<Guard>>,
    /// The route's `mirror`, if set.
    pub(super) mirror: Option<super::mirror::Mirror>,
    /// Requests its split sent to each of its upstreams (by index).
    split_counts: Vec<(usize, Counter)>,
}

impl Route {
    pub(super) fn allows(&self, method: &Method) -> bool {
        self.methods.as_ref().is_none_or(|(ms, _)| ms.contains(method))
    }

    /// The upstream a proxy route sends the request to (its split's
    /// choice, counted).
    pub(super) fn upstream<'t>(
        &self,
        upstreams: &'t [Arc<Upstream>],
        req: &mut Request<Incoming>,
        tls: bool,
    ) -> Option<&'t Upstream> {
        let Target::Proxy(p) = &self.config.target else { return None };
        let chosen = p.upstream_for(req, tls);
        if let Some((_, counter)) = self.split_counts.iter().find(|(i, _)| *i == chosen) {
            counter.increment(1);
        }
        Some(&upstreams[chosen])
    }

    /// What a proxy route does as the request goes on: its mirror's copy;
    /// returns the sticky cookie its split sets, for the answer.
    pub(super) fn before_proxy(
        &self,
        p: &ProxyTarget,
        req: &mut Request<Incoming>,
        peer: &crate::request::Peer,
        cx: &crate::request::RequestLog<'_>,
    ) -> Option<HeaderValue> {
        if let Some(mirror) = &self.mirror {
            mirror.copy(req, peer, cx);
        }
        let sets = p.split.as_ref().is_some_and(|s| s.set_cookie.is_some());
        sets.then(|| req.extensions_mut().remove::<NewCookie>()).flatten().map(|c| c.0)
    }
}

/// The routes and upstreams requests are served by: replaced as a whole
/// by a reload, while requests already under way finish on the one they
/// started with.
pub(super) struct Table {
    pub(super) router: Router,
    pub(super) routes: Vec<Route>,
    pub(super) upstreams: Vec<Arc<Upstream>>,
    /// `[rate_limit_store]`'s connection (kept by a reload that leaves it
    /// unchanged).
    pub(super) rate_limit_store: Option<Arc<RedisStore>>,
    /// The configuration these were built from, as `/-/config` shows it.
    pub(super) effective: Arc<serde_json::Value>,
}

/// What asked for a reload: the `trigger` label of
/// `gateway_config_reloads_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// SIGHUP.
    Signal,
    /// `POST /-/reload` on the admin listener.
    Admin,
    /// The file changed on disk (`--watch`, `server.watch_config`).
    Watch,
}

impl Trigger {
    /// The label value: `signal`, `admin` or `watch`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Signal => "signal",
            Trigger::Admin => "admin",
            Trigger::Watch => "watch",
        }
    }
}

/// Rebuilds the table each time discovery changes an upstream's addresses,
/// until the app is gone. Changes that come while a rebuild runs are taken
/// by the next one.
pub async fn follow_discovery(app: Weak<App>, changed: Arc<Notify>) {
    loop {
        changed.notified().await;
        let Some(app) = app.upgrade() else { return };
        // On the blocking pool: it waits for a reload's lock, which holds
        // it while reading files.
        let _ = tokio::task::spawn_blocking(move || app.rediscovered()).await;
    }
}

/// Methods file routes answer unless the route says otherwise.
const FILE_METHODS: [Method; 2] = [Method::GET, Method::HEAD];

impl App {
    /// Loads the configuration again from where it came from and, if it is
    /// valid, serves new requests with its routes and upstreams at once
    /// (requests under way finish on the old ones). Upstreams whose settings
    /// did not change keep their pools; removed ones close their idle
    /// connections once their last request is done. `[server]` (but for its
    /// `tls` files), `[metrics]` and `[tracing]` need a restart: a change
    /// there is logged and not applied. An invalid file changes nothing.
    ///
    /// Counted with `trigger="signal"`, as SIGHUP's; see [`App::reload_by`].
    pub fn reload(&self) -> Result<Vec<&'static str>, ConfigError> {
        self.reload_by(Trigger::Signal)
    }

    /// [`App::reload`], counted in `gateway_config_reloads_total` with
    /// what asked for it.
    pub fn reload_by(&self, trigger: Trigger) -> Result<Vec<&'static str>, ConfigError> {
        self.reload_from(trigger, None)
    }

    /// [`App::reload_by`], with the file's bytes as the watcher read and
    /// checked them when `text` is given.
    pub(super) fn reload_from(&self, trigger: Trigger, text: Option<&str>) -> Result<Vec<&'static str>, ConfigError> {
        // One at a time: two at once could store the older file last.
        let mut current = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let loaded = match (&self.config.source, text) {
            (Some(source), text) => crate::config::load_again(source, text, &self.config.server),
            (None, _) => Err(ConfigError::new(self.config.source_name.clone(), "", "no file to load again")),
        };
        let mut new = match loaded {
            Ok(new) => new,
            Err(e) => {
                metrics::config_reloaded(false, trigger.as_str());
                tracing::error!(error = %e, trigger = trigger.as_str(), "config reload failed; nothing changed");
                return Err(e);
            }
        };
        let (needs_restart, renewed) = self.keep_server(&current, &mut new);
        self.discovery.sync(&new);
        let old = self.table.load();
        let table = Table::new(&new, Some(&old), &self.read_ahead, &self.discovery, false);
        let kept = table.upstreams.iter().filter(|u| old.upstreams.iter().any(|o| Arc::ptr_eq(o, u))).count();
        self.table.store(Arc::new(table));
        if let (Some(tls), true) = (&new.server.tls, renewed) {
            // Renewed files: served from the next connection on.
            self.tls.store(Some(tls.config.clone()));
        }
        if !needs_restart.is_empty() {
            tracing::warn!(
                sections = needs_restart.join(", "),
                "config reload: these sections changed and need a restart; running on with their old values"
            );
        }
        metrics::config_reloaded(true, trigger.as_str());
        tracing::info!(
            routes = new.routes.len(),
            upstreams = new.upstreams.len(),
            upstreams_kept = kept,
            trigger = trigger.as_str(),
            "config reloaded"
        );
        *current = new;
        Ok(needs_restart)
    }

    /// Discovery changed some upstream's addresses: the table is built
    /// again from the configuration as last loaded, as a reload builds it
    /// (other upstreams are kept whole; the changed one keeps the
    /// endpoints whose address stayed, with their pools, health and
    /// ejection, and its admission). Requests under way finish on the
    /// endpoints they have; a removed endpoint's idle connections close
    /// when its last request is done.
    pub fn rediscovered(&self) {
        let current = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let old = self.table.load();
        let table = Table::new(&current, Some(&old), &self.read_ahead, &self.discovery, true);
        self.table.store(Arc::new(table));
    }

    /// The upstreams serving new requests now, in name order (for the
    /// status endpoints: each has [`Upstream::discovery`] and
    /// [`Upstream::endpoints`]).
    pub fn upstreams(&self) -> Vec<Arc<Upstream>> {
        self.table.load().upstreams.clone()
    }

    /// What [`follow_discovery`] waits on.
    pub fn discovery_changes(&self) -> Arc<Notify> {
        self.discovery.changed()
    }

    /// Sets `gateway_upstream_endpoints{upstream,state}` from the
    /// endpoints' health and ejection now (before each scrape).
    pub(super) fn publish_endpoint_states(&self) {
        let table = self.table.load();
        for u in &table.upstreams {
            let (mut healthy, mut unhealthy, mut ejected) = (0, 0, 0);
            for e in u.endpoints() {
                if !e.is_healthy() {
                    unhealthy += 1;
                } else if e.ejected_for().is_some() {
                    ejected += 1;
                } else {
                    healthy += 1;
                }
            }
            metrics::endpoint_states(&u.config.name, healthy, unhealthy, ejected);
        }
    }

    /// The listener's TLS config as of now (a reload may replace it).
    pub fn tls_config(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.tls.load_full()
    }
}

/// Which of the sections a reload cannot apply changed.
impl App {
    /// Makes `new`, the file loaded again, run on with the `[server]` of
    /// `current` (the start's, but for TLS files a reload renewed; its
    /// routes were built against it, see
    /// [`config::load_again`](crate::config::load_again)) unless `new`
    /// renews the TLS files; `/-/config` shows it so. Returns the sections
    /// that changed from the start's and need a restart, and whether the
    /// TLS files are renewed.
    fn keep_server(&self, current: &Config, new: &mut Config) -> (Vec<&'static str>, bool) {
        let start = &self.config;
        // The start also took this from the command line (`--watch`):
        // compared as the files have it.
        let in_file = |c: &Config, key: &str| c.effective.get("server").and_then(|s| s.get(key)).cloned();
        let watch_changed = in_file(start, "watch_config") != in_file(new, "watch_config");
        new.server.watch_config = start.server.watch_config;
        // Unset in the file, the access log format followed --log-format at
        // start (see `cli`); the same holds now.
        if new.server.access_log_format.is_none() {
            new.server.access_log_format = start.server.access_log_format;
        }
        let mut needs_restart = restart_sections(start, new);
        if watch_changed && !needs_restart.contains(&"server") {
            needs_restart.insert(0, "server");
        }
        let renewed = match (&start.server.tls, &new.server.tls) {
            (Some(old), Some(new)) => old.client_ca.is_some() == new.client_ca.is_some(),
            (None, None) => false,
            // Turning TLS or client certificates on or off changes what the
            // listener is: not silently.
            _ => {
                needs_restart.push("server.tls (on/off, client_ca)");
                false
            }
        };
        let tls = if renewed { new.server.tls.take() } else { current.server.tls.clone() };
        let mut effective = (*new.effective).clone();
        if let (Some(tree), Some(running)) = (effective.as_object_mut(), current.effective.get("server")) {
            let mut server = running.clone();
            if let (Some(server), true) = (server.as_object_mut(), renewed) {
                match new.effective.get("server").and_then(|s| s.get("tls")) {
                    Some(tls) => server.insert("tls".into(), tls.clone()),
                    None => server.remove("tls"),
                };
            }
            tree.insert("server".into(), server);
        }
        new.effective = Arc::new(effective);
        new.server = ServerConfig { tls, ..current.server.clone() };
        (needs_restart, renewed)
    }
}

fn restart_sections(old: &Config, new: &Config) -> Vec<&'static str> {
    // `[server.tls]` is compared apart (see `App::reload`).
    let server = |c: &Config| ServerConfig { tls: None, ..c.server.clone() };
    let mut changed = Vec::new();
    if server(old) != server(new) {
        changed.push("server");
    }
    if old.metrics != new.metrics {
        changed.push("metrics");
    }
    if old.tracing != new.tracing {
        changed.push("tracing");
    }
    changed
}

impl Table {
    /// Builds the routes and upstreams of `config`, taking over from
    /// `running` every upstream whose settings are unchanged (with its pools
    /// and health state; certificate files that hold the same bytes are
    /// unchanged), and from an upstream of the same name whose settings
    /// changed, its admission and its endpoints' state (see
    /// [`Upstream::new`]). A discovered upstream's endpoints are those its
    /// name has in `discovery` now.
    /// `same_config`: `running` was built from this very configuration (a
    /// rebuild after discovery changed addresses), so what the routes hold
    /// that a reload would read again (access control's keys and files) is
    /// kept as it is.
    pub(super) fn new(
        config: &Config,
        running: Option<&Table>,
        read_ahead: &Arc<ReadAhead>,
        discovery: &Discovery,
        same_config: bool,
    ) -> Table {
        let running_upstreams = running.map_or(&[][..], |t| &t.upstreams[..]);
        let upstreams: Vec<Arc<Upstream>> = (0..config.upstreams.len())
            .map(|i| upstream(config, i, running_upstreams, read_ahead, discovery))
            .collect();
        let rate_limit_store = rate_limit_store(config, running);
        let routes: Vec<Route> = config
            .routes
            .iter()
            .map(|r| {
                let old = running.and_then(|t| t.routes.iter().find(|o| o.config.name == r.name));
                let kept_guard = old.filter(|_| same_config).and_then(|o| o.guard.clone());
                Route::new(config, r, old, kept_guard, &upstreams, &rate_limit_store)
            })
            .collect();
        let router = Router::build(config.routes.iter().map(|r| RouteKey {
            hosts: &r.hosts,
            prefix: &r.prefix,
            conditions: r.conditions.as_ref(),
        }));
        Table { router, routes, upstreams, rate_limit_store, effective: config.effective.clone() }
    }
}

/// Upstream `i` of `config`: the running one of that name if its settings
/// (and its discovered endpoints) did not change, else one built anew that
/// inherits what `Upstream::new` carries over from the one it replaces.
fn upstream(
    config: &Config,
    i: usize,
    running: &[Arc<Upstream>],
    read_ahead: &Arc<ReadAhead>,
    discovery: &Discovery,
) -> Arc<Upstream> {
    let u = &config.upstreams[i];
    let retried = config.routes.iter().any(|r| matches!(&r.target, Target::Proxy(p) if p.retries > 0 && p.goes_to(i)));
    let state = u.discover.as_ref().and_then(|_| discovery.state(&u.name));
    let u = match &state {
        Some(s) => UpstreamConfig { endpoints: s.endpoints(), ..u.clone() },
        None => u.clone(),
    };
    let same_lookups = |kept: &Upstream| match (kept.discovery_state(), &state) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (a, b) => a.is_none() && b.is_none(),
    };
    match running.iter().find(|o| o.config.name == u.name) {
        Some(kept) if kept.same_settings(&u, retried) && same_lookups(kept) => kept.clone(),
        before => {
            let built = Upstream::new(u, retried, read_ahead.clone(), before.map(|b| &**b));
            Arc::new(match state {
                Some(s) => built.with_discovery(s),
                None => built,
            })
        }
    }
}

impl Route {
    /// Route `r`, keeping from `old` (the running route of its name) what
    /// its unchanged settings allow: the cache's entries, the rate limit's
    /// buckets, the concurrency count; `guard` is the running access
    /// control when the whole configuration is the same.
    fn new(
        config: &Config,
        r: &RouteConfig,
        old: Option<&Route>,
        guard: Option<Arc<Guard>>,
        upstreams: &[Arc<Upstream>],
        rate_limit_store: &Option<Arc<RedisStore>>,
    ) -> Route {
        if let Target::Proxy(p) = &r.target {
            metrics::set_route_timeout(&r.name, p.timeout);
        }
        let methods = match (&r.target, &r.methods) {
            (_, Some(ms)) => Some(ms.clone()),
            (Target::File(_) | Target::Dir { .. }, None) => Some(FILE_METHODS.to_vec()),
            _ => None,
        };
        let methods = methods.map(|ms| {
            let allow = ms.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
            (ms, allow)
        });
        // The entries of a route whose cache settings did not change are
        // kept (see `RouteCache::new`).
        let cache = match &r.target {
            Target::Proxy(p) => p.cache.clone().map(|c| {
                let running = old.and_then(|o| o.cache.as_ref()).map(|c| &c.store);
                let upstream = upstreams[p.upstream].clone();
                let id_slot = config.server.request_id;
                RouteCache::new(&r.name, p, c, (&r.prefix, r.max_body, id_slot), upstream, running)
            }),
            _ => None,
        };
        let rate_limit = r.rate_limit.as_ref().map(|rl| match old.and_then(|o| o.rate_limit.as_ref()) {
            Some(kept) if kept.same_settings(rl, rate_limit_store.as_ref()) => kept.clone(),
            _ => RouteLimiter::new(&r.name, rl, rate_limit_store.clone()),
        });
        let guard = guard.or_else(|| {
            let previous = old.and_then(|o| o.guard.as_deref());
            r.access.as_ref().map(|a| Arc::new(Guard::new(&r.name, a, &config.server.trusted_proxies, previous)))
        });
        // A limit keyed by a header the credentials set is decided after
        // them (see `App::admit`).
        let limit_after_auth = rate_limit
            .as_ref()
            .is_some_and(|rl| rl.key_header().is_some_and(|h| guard.as_ref().is_some_and(|g| g.sets_header(h))));
        let mirror = match &r.target {
            Target::Proxy(p) => p.mirror.as_ref().map(|m| {
                let running = old.and_then(|o| o.mirror.as_ref());
                super::mirror::Mirror::new((&r.name, &r.prefix), p, m, &config.upstreams[m.upstream], running)
            }),
            _ => None,
        };
        let split_counts = match &r.target {
            Target::Proxy(ProxyTarget { split: Some(split), .. }) => {
                split.members.iter().map(|m| (m.upstream, metrics::split(&r.name, &m.name))).collect()
            }
            _ => Vec::new(),
        };
        Route {
            mirror,
            split_counts,
            cache,
            rate_limit,
            limit_after_auth,
            guard,
            layers: RouteLayers::new(r),
            config: r.clone(),
            metrics: RouteMetrics::new(&r.name),
            methods,
            // A limit on a route of the same name, changed or not, goes on
            // counting the requests it already admitted.
            limit: r.max_concurrent.map(|max| match old.and_then(|o| o.limit.as_ref()) {
                Some(limit) => Arc::new(limit.with_limit(max)),
                None => Arc::new(ConcurrencyLimit::new(max)),
            }),
        }
    }
}

/// `[rate_limit_store]`'s connection: the running one if its settings did
/// not change. A store that cannot be made (a URL the `redis` crate refuses)
/// leaves shared routes to `on_error`'s local limiter, with an error logged.
fn rate_limit_store(config: &Config, running: Option<&Table>) -> Option<Arc<RedisStore>> {
    let wanted = config.rate_limit_store.as_ref()?;
    if let Some(kept) = running.and_then(|t| t.rate_limit_store.as_ref()).filter(|s| s.config == *wanted) {
        return Some(kept.clone());
    }
    match RedisStore::new(wanted) {
        Ok(store) => Some(store),
        Err(e) => {
            tracing::error!(error = %e, "rate limit store not usable; shared limits are kept by each gateway");
            None
        }
    }
}
