//! One endpoint of an upstream: its pool, its requests in flight, whether
//! active health checks pass, and passive ejection (a circuit breaker); and
//! the choice of an endpoint for a request ([`pick`], pure over the states
//! it is given, table-tested).
//!
//! Ejection follows Envoy's outlier detection in its simplest form:
//! `consecutive_failures` failures in a row eject the endpoint for
//! `ejection_time`; after that one request is let through as a trial, and
//! its outcome brings the endpoint back or ejects it again.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use http::header::HeaderValue;
use metrics::Counter;
use tokio::time::Instant;

use super::connect::TlsTarget;
use super::pool::Pool;
use crate::config::{Balance, EndpointConfig, HealthConfig, OutlierConfig, Protocol, UpstreamConfig, UpstreamTls};

/// Milliseconds since the first call, plus one: 0 means "never".
fn now_ms() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// One endpoint and its state.
pub struct Endpoint {
    pub config: EndpointConfig,
    pub pool: Pool,
    /// The `Host` sent when the route asks for the upstream's own.
    pub host: HeaderValue,
    /// For an `https://` endpoint (health checks use it too).
    pub tls: Option<TlsTarget>,
    upstream: String,
    outlier: Option<OutlierConfig>,
    /// What a reload that changes the endpoint's settings hands on to the
    /// endpoint that replaces it (see [`Endpoint::new`]).
    state: Arc<State>,
    /// The upstream's settings this endpoint was built with.
    settings: Settings,
}

/// An endpoint's counts, health and ejection: carried across a reload, so
/// a changed setting neither forgets an ejection nor lets more requests in
/// than are in flight. Its metric series are read from here at each scrape
/// (see `series`), not registered with the recorder, so they go with it.
struct State {
    in_flight: AtomicUsize,
    /// Passes its health checks (always, without them):
    /// `gateway_upstream_endpoint_healthy`.
    healthy: AtomicBool,
    failures: AtomicU32,
    /// Ejected until then (in [`now_ms`]); 0 when not ejected. Not 0 is
    /// `gateway_upstream_endpoint_ejected` 1 (until a trial succeeds).
    ejected_until: AtomicU64,
    /// A trial request is under way.
    trial: AtomicBool,
    /// `gateway_upstream_ejections_total`.
    ejections: AtomicU64,
    /// `gateway_upstream_connections_opened_total`, counted by the pool.
    opened: Arc<AtomicU64>,
    /// Which endpoint's health checks may set `healthy`: bumped when a
    /// reload replaces the endpoint, so the old one's checks stop.
    checks: AtomicU64,
    /// The latest health check's result (for the status endpoints).
    last_check: Mutex<Option<Check>>,
}

/// One health check's result, as the status endpoints show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub at: SystemTime,
    pub passed: bool,
    /// Why it failed (empty when it passed).
    pub detail: String,
}

/// The upstream's settings an endpoint is built from: a reload that leaves
/// them (and the endpoint's own) as they were keeps the endpoint whole, its
/// pool and health checks included.
#[derive(Debug, Clone, PartialEq)]
struct Settings {
    connect_timeout: Duration,
    pool_idle_timeout: Duration,
    pool_max_idle_per_host: usize,
    health: Option<HealthConfig>,
    outlier: Option<OutlierConfig>,
    tls: Option<UpstreamTls>,
    protocol: Protocol,
    max_connections: usize,
}

impl Settings {
    fn of(u: &UpstreamConfig) -> Settings {
        Settings {
            connect_timeout: u.connect_timeout,
            pool_idle_timeout: u.pool_idle_timeout,
            pool_max_idle_per_host: u.pool_max_idle_per_host,
            health: u.health.clone(),
            outlier: u.outlier,
            tls: u.tls.clone(),
            protocol: u.protocol,
            max_connections: u.max_connections,
        }
    }
}

/// Whether an endpoint may take a request now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    /// Healthy and not ejected.
    Open,
    /// Ejected, its ejection time over, no trial under way: the next request
    /// may be its trial.
    TrialDue,
    /// Unhealthy, ejected, or waiting for its trial's outcome.
    Closed,
}

impl Endpoint {
    /// Builds the endpoint. `before` is the endpoint of the same URL that
    /// a reload replaces: its counts, health and ejection go on here.
    pub fn new(config: EndpointConfig, upstream: &UpstreamConfig, before: Option<&Endpoint>) -> Endpoint {
        let state = match before {
            // Health is the checks' to say: without them an endpoint is
            // healthy, whatever the checks it had before said.
            Some(b) => {
                // The checks of the endpoint replaced stop: only this one's
                // (if any) speak for the state from now on.
                b.state.checks.fetch_add(1, Relaxed);
                // Health is the checks' to say, ejection the outlier
                // detection's: without them an endpoint is healthy and not
                // ejected, whatever they said before.
                if upstream.health.is_none() {
                    b.set_healthy(true, "");
                }
                if upstream.outlier.is_none() {
                    let o = &b.state;
                    o.ejected_until.store(0, Relaxed);
                    o.failures.store(0, Relaxed);
                    o.trial.store(false, Relaxed);
                }
                b.state.clone()
            }
            None => Arc::new(State {
                in_flight: AtomicUsize::new(0),
                healthy: AtomicBool::new(true),
                failures: AtomicU32::new(0),
                ejected_until: AtomicU64::new(0),
                trial: AtomicBool::new(false),
                ejections: AtomicU64::new(0),
                opened: Arc::new(AtomicU64::new(0)),
                checks: AtomicU64::new(0),
                last_check: Mutex::new(None),
            }),
        };
        // The count goes on across a pool replaced by a reload.
        let pool = Pool::new(&config, upstream, Counter::from_arc(state.opened.clone()));
        let host = HeaderValue::from_str(config.authority.as_str()).expect("an authority is a valid header");
        Endpoint {
            tls: TlsTarget::new(&config, upstream),
            config,
            pool,
            host,
            upstream: upstream.name.clone(),
            outlier: upstream.outlier,
            state,
            settings: Settings::of(upstream),
        }
    }

    /// Whether a reload to `config` (an endpoint of `upstream`) may keep
    /// this endpoint as it is, pool and health checks included.
    pub fn unchanged(&self, config: &EndpointConfig, upstream: &UpstreamConfig) -> bool {
        self.config == *config && self.settings == Settings::of(upstream)
    }

    pub fn availability(&self) -> Availability {
        if !self.state.healthy.load(Relaxed) {
            return Availability::Closed;
        }
        let (Some(_), o) = (&self.outlier, &self.state) else { return Availability::Open };
        match o.ejected_until.load(Relaxed) {
            0 => Availability::Open,
            until if now_ms() < until || o.trial.load(Relaxed) => Availability::Closed,
            _ => Availability::TrialDue,
        }
    }

    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Relaxed)
    }

    pub fn is_healthy(&self) -> bool {
        self.state.healthy.load(Relaxed)
    }

    /// How long until an ejection ends, if the endpoint is ejected.
    pub fn ejected_for(&self) -> Option<Duration> {
        self.outlier.as_ref()?;
        let until = self.state.ejected_until.load(Relaxed);
        (until != 0).then(|| Duration::from_millis(until.saturating_sub(now_ms())))
    }

    /// The generation of health checks that speak for this endpoint now
    /// (see `health`).
    pub fn checks(&self) -> u64 {
        self.state.checks.load(Relaxed)
    }

    /// Keeps a health check's result for the status endpoints (every
    /// check, whether or not it changes the endpoint's health).
    pub fn record_check(&self, passed: bool, detail: &str) {
        let check = Check { at: SystemTime::now(), passed, detail: detail.to_owned() };
        *self.state.last_check.lock().expect("check lock") = Some(check);
    }

    /// The latest health check's result, if a check has run.
    pub fn last_check(&self) -> Option<Check> {
        self.state.last_check.lock().expect("check lock").clone()
    }

    /// Its per-endpoint series now: healthy, ejected, ejections, and
    /// connections opened.
    pub fn series(&self) -> (bool, bool, u64, u64) {
        let o = &self.state;
        let ejected = o.ejected_until.load(Relaxed) != 0;
        (o.healthy.load(Relaxed), ejected, o.ejections.load(Relaxed), o.opened.load(Relaxed))
    }

    /// The upstream's name.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// Records a health check result (see `health`); logs a change, with
    /// why the last check failed.
    pub fn set_healthy(&self, healthy: bool, failure: &str) {
        if self.state.healthy.swap(healthy, Relaxed) != healthy {
            if healthy {
                tracing::info!(upstream = %self.upstream, endpoint = %self.config.url, "endpoint healthy again");
            } else {
                tracing::warn!(upstream = %self.upstream, endpoint = %self.config.url, check = failure, "endpoint unhealthy");
            }
        }
    }

    /// Starts a request on this endpoint. `trial` claims the endpoint's
    /// trial; `None` if another request claimed it first.
    pub fn begin(self: &Arc<Self>, trial: bool) -> Option<Attempt> {
        if trial {
            self.outlier.as_ref()?;
            self.state.trial.compare_exchange(false, true, Relaxed, Relaxed).ok()?;
        }
        self.state.in_flight.fetch_add(1, Relaxed);
        Some(Attempt { endpoint: self.clone(), trial, decided: false })
    }

    /// Ejects the endpoint, if its ejection state is still `current` (two
    /// failures at once eject, and count, once).
    fn eject(&self, config: &OutlierConfig, current: u64) {
        let o = &self.state;
        let until = now_ms() + config.ejection_time.as_millis() as u64;
        if o.ejected_until.compare_exchange(current, until, Relaxed, Relaxed).is_err() {
            return;
        }
        o.failures.store(0, Relaxed);
        o.ejections.fetch_add(1, Relaxed);
        tracing::warn!(
            upstream = %self.upstream,
            endpoint = %self.config.url,
            ejection_time = %humantime::format_duration(config.ejection_time),
            "endpoint ejected after consecutive failures"
        );
    }
}

/// One request's use of an endpoint: counted in flight until dropped, and
/// told its outcome (for ejection).
pub struct Attempt {
    endpoint: Arc<Endpoint>,
    trial: bool,
    decided: bool,
}

impl Attempt {
    pub fn endpoint(&self) -> &Arc<Endpoint> {
        &self.endpoint
    }

    /// The exchange succeeded: a trial brings the endpoint back.
    pub fn success(&mut self) {
        self.decided = true;
        if self.endpoint.outlier.is_none() {
            return;
        }
        let o = &self.endpoint.state;
        if o.failures.load(Relaxed) != 0 {
            o.failures.store(0, Relaxed);
        }
        if self.trial {
            o.ejected_until.store(0, Relaxed);
            o.trial.store(false, Relaxed);
            tracing::info!(upstream = %self.endpoint.upstream, endpoint = %self.endpoint.config.url, "ejected endpoint back after a good trial");
        }
    }

    /// The exchange failed (connect, reset, protocol, timeout, 502/503/504).
    pub fn failure(&mut self) {
        self.decided = true;
        let Some(config) = &self.endpoint.outlier else { return };
        let o = &self.endpoint.state;
        if self.trial {
            // Ejected again before the trial is released, so no request in
            // between can take a second trial.
            self.endpoint.eject(config, o.ejected_until.load(Relaxed));
            o.trial.store(false, Relaxed);
        } else if o.failures.fetch_add(1, Relaxed) + 1 >= config.consecutive_failures {
            self.endpoint.eject(config, 0);
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        self.endpoint.state.in_flight.fetch_sub(1, Relaxed);
        // Abandoned without an outcome (the client went away): no verdict,
        // and the trial is free for the next request.
        if self.trial && !self.decided && self.endpoint.outlier.is_some() {
            self.endpoint.state.trial.store(false, Relaxed);
        }
    }
}

/// What [`pick`] sees of an endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Candidate {
    pub availability: Availability,
    pub in_flight: usize,
    /// Already tried for this request.
    pub tried: bool,
    /// Its `weight` (1 unless configured).
    pub weight: u32,
}

/// The endpoint for a request, and whether it goes as a trial. An endpoint
/// whose trial is due gets it; otherwise the balance chooses among the open
/// endpoints not yet tried for this request, or among all open ones when
/// every one has been tried. `random` gives indexes below its argument;
/// `next` is the round-robin counter's value.
pub fn pick(
    endpoints: &[Candidate],
    balance: Balance,
    next: usize,
    mut random: impl FnMut(usize) -> usize,
) -> Option<(usize, bool)> {
    if let Some(i) = endpoints.iter().position(|e| e.availability == Availability::TrialDue && !e.tried) {
        return Some((i, true));
    }
    let open = |e: &Candidate| e.availability == Availability::Open;
    let fresh = endpoints.iter().any(|e| open(e) && !e.tried);
    let eligible = |e: &Candidate| open(e) && (!fresh || !e.tried);
    let count = endpoints.iter().filter(|e| eligible(e)).count();
    let nth = |n: usize| endpoints.iter().enumerate().filter(|(_, e)| eligible(e)).nth(n).map(|(i, _)| i);
    let weighted = endpoints.iter().any(|e| e.weight != endpoints[0].weight);
    match (count, balance) {
        (0, _) => None,
        (1, _) => nth(0).map(|i| (i, false)),
        (_, Balance::RoundRobin) if weighted => {
            super::weighted::round_robin(endpoints, eligible, next).map(|i| (i, false))
        }
        (_, Balance::LeastRequest) if weighted => {
            super::weighted::least_request(endpoints, eligible, random).map(|i| (i, false))
        }
        (_, Balance::RoundRobin) => {
            // Strict rotation over the eligible endpoints: a closed one's
            // turns are shared by all the others, not taken by its neighbour.
            let i = if count == endpoints.len() { next % count } else { nth(next % count)? };
            Some((i, false))
        }
        (_, Balance::LeastRequest) => {
            // Power of two random choices, by requests in flight.
            let a = random(count);
            let b = (a + 1 + random(count - 1)) % count;
            let (a, b) = (nth(a)?, nth(b)?);
            let chosen = if endpoints[b].in_flight < endpoints[a].in_flight { b } else { a };
            Some((chosen, false))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Availability::{Closed, Open, TrialDue};

    fn c(availability: Availability, in_flight: usize, tried: bool) -> Candidate {
        Candidate { availability, in_flight, tried, weight: 1 }
    }

    #[test]
    fn pick_table() {
        type Case = (Vec<Candidate>, Balance, usize, Option<(usize, bool)>);
        let cases: Vec<Case> = vec![
            (vec![c(Open, 0, false)], Balance::LeastRequest, 0, Some((0, false))),
            (vec![c(Closed, 0, false)], Balance::LeastRequest, 0, None),
            (vec![c(Closed, 0, false), c(Closed, 0, false)], Balance::RoundRobin, 0, None),
            // The only endpoint, already tried: tried again.
            (vec![c(Open, 0, true)], Balance::LeastRequest, 0, Some((0, false))),
            // Another one is preferred to a tried one.
            (vec![c(Open, 0, true), c(Open, 9, false)], Balance::LeastRequest, 0, Some((1, false))),
            (vec![c(Open, 0, true), c(Closed, 0, false)], Balance::RoundRobin, 0, Some((0, false))),
            // A due trial goes first, once per request.
            (vec![c(Open, 0, false), c(TrialDue, 0, false)], Balance::LeastRequest, 0, Some((1, true))),
            (vec![c(Open, 0, false), c(TrialDue, 0, true)], Balance::LeastRequest, 0, Some((0, false))),
            // Least request: of the two drawn (0 and 1 here), the less busy.
            (vec![c(Open, 5, false), c(Open, 2, false), c(Open, 0, false)], Balance::LeastRequest, 0, Some((1, false))),
            // Round robin: the counter's turn among the eligible endpoints.
            (vec![c(Open, 0, false), c(Open, 0, false), c(Open, 0, false)], Balance::RoundRobin, 4, Some((1, false))),
            (vec![c(Open, 0, false), c(Closed, 0, false), c(Open, 0, false)], Balance::RoundRobin, 1, Some((2, false))),
            (vec![c(Open, 0, false), c(Closed, 0, false), c(Open, 0, true)], Balance::RoundRobin, 2, Some((0, false))),
        ];
        for (endpoints, balance, next, want) in cases {
            // A "random" source that always draws 0: the pair is (0, 1).
            assert_eq!(pick(&endpoints, balance, next, |_| 0), want, "{endpoints:?} {balance:?} {next}");
        }
    }

    #[test]
    fn least_request_draws_two_distinct_endpoints() {
        let endpoints = [c(Open, 3, false), c(Open, 1, false), c(Open, 2, false)];
        for a in 0..3 {
            for b in 0..2 {
                let mut draws = [a, b].into_iter();
                let (i, _) = pick(&endpoints, Balance::LeastRequest, 0, |_| draws.next().unwrap()).unwrap();
                let first = a;
                let second = (a + 1 + b) % 3;
                assert_ne!(first, second);
                let want = if endpoints[second].in_flight < endpoints[first].in_flight { second } else { first };
                assert_eq!(i, want, "draws {a} {b}");
            }
        }
    }
}
