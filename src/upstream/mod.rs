//! Upstreams: where proxy routes send requests, and how the gateway protects
//! them.
//!
//! - [`Upstream::forward`] is the proxy's data path: the request's header
//!   rules (`proxy`), its body read ahead (`crate::body`), admission
//!   (`admission`: `max_requests` and its queue), the choice of an endpoint
//!   (`endpoint`: balance, health, ejection), one attempt after another
//!   (`attempt`) with the exchange on that endpoint's pool (`exchange`,
//!   `pool`) and the retry decision (`retry`, within the retry budget), and
//!   the response's header rules, its body streaming back (`body`).
//! - `pool` keeps idle connections; `connect` opens them (TCP, TLS, Unix)
//!   and `io` is their socket (send timeout, reset mid-exchange). HTTP/1.1
//!   goes through the gateway's own client (`h1`), HTTP/2 through hyper's.
//! - `health` runs the active checks; `tunnel` carries an upgraded
//!   connection after a 101; `series` writes the endpoints' metric series
//!   at each scrape.

pub mod adaptive;
pub mod admission;
mod attempt;
pub mod body;
mod budget;
pub mod connect;
pub mod endpoint;
pub mod exchange;
pub mod h1;
pub mod health;
pub mod io;
mod learned;
pub mod pool;
pub mod proxy;
pub mod retry;
pub mod series;
pub mod tunnel;
mod weighted;

use std::collections::HashMap;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use futures_util::FutureExt;
use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::Either;

use metrics::{Counter, Gauge, counter, gauge};
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::body::{Body, ReadAhead, RequestBody, UpstreamBody, WantsCopy};
use crate::config::{Balance, ProxyTarget, UpstreamConfig};
use crate::discovery;
use crate::error::GatewayError;
use crate::headers::{Field, Stamp, X_REQUEST_ID};
use crate::metrics::{UPSTREAM_IN_FLIGHT, UPSTREAM_RETRIES, UPSTREAM_RETRIES_SKIPPED, UpstreamMetrics};
use crate::request::{Peer, RequestLog};
use admission::Admission;
use attempt::{Tried, Tries};
use body::{InFlight, Lease, Leased, Received};
use budget::RetryBudget;
use endpoint::{Attempt, Availability, Candidate, Endpoint};
use exchange::{Plan, exchange};
use pool::SendBody;
use proxy::Prepared;

/// Endpoints whose candidates [`Upstream::choose`] lists on the stack; an
/// upstream with more lists them on the heap, one allocation a pick.
const INLINE_CANDIDATES: usize = 16;

/// One configured upstream: its endpoints, admission, retry budget and
/// metrics.
pub struct Upstream {
    pub config: UpstreamConfig,
    pub metrics: UpstreamMetrics,
    endpoints: Vec<Arc<Endpoint>>,
    /// Shared with the upstream of the same name that a reload replaces, so
    /// requests in flight and queued on either count against one limit.
    admission: Option<Arc<Admission>>,
    /// Only when a route retries through this upstream: depositing costs a
    /// clock read per request.
    budget: Option<Arc<RetryBudget>>,
    /// The bound on request body bytes read ahead, the gateway's.
    read_ahead: Arc<ReadAhead>,
    /// Round-robin position.
    next: AtomicUsize,
    /// No endpoint could take the last request (logged once per change).
    down: AtomicBool,
    in_flight: Gauge,
    retries: Counter,
    retries_skipped: Counter,
    /// A discovered upstream's lookups (never read by requests).
    discovery: Option<Arc<discovery::State>>,
}

impl Upstream {
    /// Builds the upstream; starts health checks when configured. `retried`
    /// says whether any route retries through it. `before` is the upstream
    /// of the same name that a reload replaces: its admission (requests in
    /// flight and queued, in their order), retry budget (while
    /// `retry_budget` is unchanged) and endpoints' health and ejection go on
    /// here, and endpoints whose settings did not change are kept whole,
    /// pools included.
    pub fn new(config: UpstreamConfig, retried: bool, read_ahead: Arc<ReadAhead>, before: Option<&Upstream>) -> Self {
        let metrics = UpstreamMetrics::new(&config.name);
        let mut started = Vec::new();
        // By address through a map: a discovered upstream may have a
        // thousand endpoints, rebuilt at every change of its set.
        let olds: HashMap<&str, &Arc<Endpoint>> =
            before.map(|b| b.endpoints.iter().map(|o| (o.config.url.as_str(), o)).collect()).unwrap_or_default();
        let endpoints: Vec<Arc<Endpoint>> = config
            .endpoints
            .iter()
            .map(|e| {
                let old = olds.get(e.url.as_str()).copied();
                match old {
                    Some(old) if old.unchanged(e, &config) => old.clone(),
                    old => {
                        let endpoint = Arc::new(Endpoint::new(e.clone(), &config, old.map(|o| &**o)));
                        started.push(endpoint.clone());
                        endpoint
                    }
                }
            })
            .collect();
        if let Some(health) = &config.health {
            started.iter().for_each(|e| health::spawn(e, health.clone()));
        }
        let name = config.name.clone();
        // A kept budget keeps the ratio and reserve it was built with: a
        // changed `retry_budget` needs one of its own.
        let same_budget = |b: &&Upstream| b.config.retry_budget == config.retry_budget;
        let budget = retried.then(|| match before.filter(same_budget).and_then(|b| b.budget.clone()) {
            Some(kept) => kept,
            None => {
                let b = config.retry_budget;
                Arc::new(RetryBudget::new(b.min_per_second, b.ratio))
            }
        });
        let admission = config.admission.map(|a| match before.and_then(|b| b.admission.clone().map(|k| (b, k))) {
            Some((b, kept)) => {
                kept.reconfigure(a, b.same_target(&config));
                kept
            }
            None => Arc::new(Admission::new(a, &name)),
        });
        Upstream {
            admission,
            budget,
            read_ahead,
            endpoints,
            next: AtomicUsize::new(0),
            down: AtomicBool::new(before.is_some_and(|b| b.down.load(Relaxed))),
            in_flight: gauge!(UPSTREAM_IN_FLIGHT, "upstream" => name.clone()),
            retries: counter!(UPSTREAM_RETRIES, "upstream" => name.clone()),
            retries_skipped: counter!(UPSTREAM_RETRIES_SKIPPED, "upstream" => name),
            discovery: None,
            metrics,
            config,
        }
    }

    /// Ties a discovered upstream to its lookups, for [`Upstream::discovery`].
    pub fn with_discovery(mut self, state: Arc<discovery::State>) -> Self {
        self.discovery = Some(state);
        self
    }

    /// The lookups this upstream was built from, if it is discovered.
    pub fn discovery_state(&self) -> Option<&Arc<discovery::State>> {
        self.discovery.as_ref()
    }

    /// For the status endpoints: where the endpoints come from (`static`,
    /// `dns`, `srv`), and for a discovered upstream the name, when it was
    /// last looked up, how that went and when it last found addresses. A
    /// copy, taken now.
    pub fn discovery(&self) -> discovery::Status {
        self.discovery.as_ref().map_or_else(discovery::Status::fixed, |d| d.status())
    }

    /// Whether it was built from `config` with a retry budget as
    /// `retried` asks: a reload keeps it whole (pools, health, ejections)
    /// then.
    pub fn same_settings(&self, config: &UpstreamConfig, retried: bool) -> bool {
        self.budget.is_some() == retried && self.config == *config
    }

    /// Whether `config` sends requests where this one does (the same URLs,
    /// or the same name to discover), so that what was learned of the
    /// upstream still holds.
    fn same_target(&self, config: &UpstreamConfig) -> bool {
        match (&self.config.discover, &config.discover) {
            (Some(a), Some(b)) => a.same_target(b),
            (None, None) => {
                let urls = |c: &UpstreamConfig| c.endpoints.iter().map(|e| e.url.clone()).collect::<Vec<_>>();
                urls(&self.config) == urls(config)
            }
            _ => false,
        }
    }

    /// Its endpoints, as configured (a discovered upstream's: as resolved
    /// when it was built), for the status endpoints and metrics.
    pub fn endpoints(&self) -> &[Arc<Endpoint>] {
        &self.endpoints
    }

    /// Requests waiting in its queue and the queue's size, when it has
    /// `max_requests`.
    pub fn queued(&self) -> Option<(usize, usize)> {
        self.admission.as_ref().map(|a| a.queued())
    }

    /// Its limit on requests in flight now, when it has `max_requests`.
    pub fn limit(&self) -> Option<admission::Limit> {
        self.admission.as_ref().map(|a| a.limit())
    }

    /// False while the upstream has health checks and no endpoint passes
    /// them (`/readyz`).
    pub fn ready(&self) -> bool {
        // A discovered upstream with no address yet (or none left) has
        // nowhere to send a request, checks or not.
        !self.endpoints.is_empty() && (self.config.health.is_none() || self.endpoints.iter().any(|e| e.is_healthy()))
    }

    /// Forwards `req` (matched by a route with `prefix` and body limit
    /// `max_body`) and returns the upstream's response head with its body
    /// streaming. `deadline` is the request's arrival plus the route's
    /// timeout; time spent queueing and retrying counts toward it.
    ///
    /// The request is prepared ([`proxy::prepare_request`], then `stamp`),
    /// its body's first bytes read ahead (`read_ahead`), a `max_requests`
    /// slot taken; then one attempt after another on the endpoints
    /// `Upstream::choose` picks: the endpoint's `Host`
    /// (`Upstream::address`), the exchange within the deadline, and what
    /// came of it (`Upstream::judge`, `Upstream::failed`,
    /// `Upstream::timed_out`), for as long as [`retry::should_retry`] and
    /// the budget allow.
    ///
    /// An `async move` block, not an `async fn`, so that the request is not
    /// copied again on the first poll (see [`crate::server::App::handle`]).
    /// The attempt's steps around the exchange are plain functions, so the
    /// exchange's future is this one's, not one nested in another.
    #[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
    pub fn forward<'a, B: proxy::ClientBody + Send + 'a>(
        &'a self,
        target: &'a ProxyTarget,
        prefix: &'a str,
        max_body: u64,
        req: Request<B>,
        peer: &'a Peer,
        cx: &'a RequestLog<'_>,
        deadline: Instant,
    ) -> impl Future<Output = Result<Response<Body>, GatewayError>> + 'a {
        async move {
            let counted = cx.timing.as_ref().map(|t| t.bytes_in.clone());
            let mut stamped = Stamp::default();
            let Prepared { parts, body, plan, client_host, mut upgrade, body_state } =
                proxy::prepare_request(req, target, prefix, max_body, peer, counted, &mut stamped)?;
            // Made here, not returned from a helper (each move of it is a
            // copy), and its parts never borrowed: rustc keeps room in the
            // future for any local borrowed before an `.await`.
            let mut req = Request::from_parts(parts, body);
            let asked = stamp(&mut req, upgrade.is_some(), cx, &mut stamped);
            let mut tries = Tries::new(plan, client_host, asked, body_state, target.retries);
            // The body's first bytes (all of a small one) before a slot: a
            // client that trickles its body holds none meanwhile.
            if let Either::Left(body) = req.body_mut()
                && target.request_buffer > 0
            {
                read_ahead(body, target, &self.read_ahead, deadline).await?;
                give_copy(&mut req, target.request_buffer, &self.read_ahead);
            }
            let slot = match &self.admission {
                Some(admission) => Some(admission.admit(deadline, target.timeout).await?),
                None => None,
            };
            // Only admitted requests earn retries: turned-away ones did no work.
            if let Some(budget) = &self.budget {
                budget.deposit();
            }
            let in_flight = InFlight::new(&self.in_flight);
            let timing = cx.timing.as_deref();
            let mut timer = peer.timer.lend(deadline, peer.own_h1());
            loop {
                let (index, mut attempt) = self.choose(&tries.tried)?;
                let endpoint = attempt.endpoint().clone();
                let copy = self.address(&mut req, &mut tries, &endpoint, target);
                let started = Instant::now();
                let plan = Plan { may_resend: !tries.resent.load(Relaxed), ..tries.plan };
                // A resend after a stale pooled connection: once a request,
                // and a retry like any other for the budget.
                let resend = || !tries.resent.swap(true, Relaxed) && self.within_budget();
                let exchanged =
                    pin!(exchange(&endpoint.pool, req, &stamped, plan, &resend, timing, peer.connection_interims()));
                // The response is answered from inside the match: moved out
                // of it first, it would be copied on its way.
                let tried = match timer.within(exchanged).await {
                    Some(Ok(response)) => match self.judge(&response, &mut attempt, copy, &tries, target) {
                        Some(tried) => tried,
                        None => {
                            self.answered(&response, (&attempt, &tries), timing, started, slot.as_ref());
                            if response.status() == StatusCode::SWITCHING_PROTOCOLS
                                && let (Some(client), Some(idle)) = (upgrade.take(), target.upgrade)
                            {
                                // The tunnel holds no slot (see `tunnel`). A 101
                                // comes only over HTTP/1.1, on its own connection.
                                return Ok(tunnel::switch(response, client, idle, &target.via));
                            }
                            let lease = Lease::new(attempt, slot, in_flight);
                            return Ok(self.respond(response, lease, target, cx.id.is_some()));
                        }
                    },
                    Some(Err(failure)) => self.failed(failure, attempt, copy, &tries, target.retry_on),
                    None => self.timed_out(attempt, &tries, target, slot.as_ref(), started),
                };
                match tried {
                    Tried::Again(again) => {
                        (req, tries.left) = (again, tries.left - 1);
                        tries.tried.push(index);
                    }
                    Tried::Failed(e) => return Err(e),
                }
            }
        }
    }

    /// The upstream's response, with the header rules applied and its body
    /// streaming; `lease` is held until the body is complete. `request_ids`:
    /// the request has the gateway's ID (the upstream's is dropped from the
    /// trailers).
    fn respond(
        &self,
        response: Response<Received>,
        lease: Lease,
        target: &ProxyTarget,
        request_ids: bool,
    ) -> Response<Body> {
        let (mut parts, body) = response.into_parts();
        let reusable = proxy::prepare_response(&mut parts, &body, &target.via);
        let (failed, stalled) = (self.metrics.body_failed.clone(), self.metrics.body_stalled.clone());
        let flags = (reusable, request_ids);
        let body = UpstreamBody::new(Leased { body, lease }, flags, target.body_timeout, failed, stalled);
        Response::from_parts(parts, Body::Upstream(Box::new(body)))
    }

    /// A retry is about to be made: whether the retry budget allows it.
    fn within_budget(&self) -> bool {
        let allowed = self.budget.as_ref().is_none_or(|b| b.withdraw());
        if allowed {
            self.retries.increment(1);
        } else {
            self.retries_skipped.increment(1);
            tracing::debug!(upstream = %self.config.name, "retry budget exhausted; not retrying");
        }
        allowed
    }

    /// The endpoint for the next attempt (see [`endpoint::pick`]); `tried`:
    /// the endpoints this request has tried. Public for its test of
    /// allocations (tests/choose_allocations.rs).
    pub fn choose(&self, tried: &[usize]) -> Result<(usize, Attempt), GatewayError> {
        loop {
            let picked = if let [only] = &self.endpoints[..] {
                match only.availability() {
                    Availability::Open => Some((0, false)),
                    Availability::TrialDue => Some((0, true)),
                    Availability::Closed => None,
                }
            } else {
                // On the stack up to INLINE_CANDIDATES endpoints: a Vec
                // here was an allocation and a free on every request.
                let candidates: SmallVec<[Candidate; INLINE_CANDIDATES]> = self
                    .endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, e)| Candidate {
                        availability: e.availability(),
                        in_flight: e.in_flight(),
                        tried: tried.contains(&i),
                        weight: e.config.weight,
                    })
                    .collect();
                // A request's first attempt moves the rotation on; a retry
                // goes on from where it stands.
                let next = match (self.config.balance, tried.is_empty()) {
                    (Balance::RoundRobin, true) => self.next.fetch_add(1, Relaxed),
                    (Balance::RoundRobin, false) => self.next.load(Relaxed),
                    (Balance::LeastRequest, _) => 0,
                };
                endpoint::pick(&candidates, self.config.balance, next, |n| fastrand::usize(..n))
            };
            let Some((index, trial)) = picked else {
                return Err(self.unavailable());
            };
            // A trial can be claimed by a concurrent request first: pick again.
            if let Some(attempt) = self.endpoints[index].begin(trial) {
                if self.down.load(Relaxed) && self.down.swap(false, Relaxed) {
                    tracing::info!(upstream = %self.config.name, "an endpoint takes traffic again");
                }
                return Ok((index, attempt));
            }
        }
    }

    /// No endpoint may take traffic: logged once per change of state.
    fn unavailable(&self) -> GatewayError {
        if !self.down.swap(true, Relaxed) {
            if self.endpoints.is_empty() {
                tracing::warn!(upstream = %self.config.name, "no endpoint: discovery has no address for the name; answering 503");
            } else {
                tracing::warn!(upstream = %self.config.name, "no endpoint may take traffic (unhealthy or ejected); answering 503");
            }
        }
        // When it may be worth asking again: the first ejection to end, or
        // the checks an unhealthy endpoint needs to pass (rounded up).
        let soonest = self.endpoints.iter().filter_map(|e| e.ejected_for()).min();
        let recovery = self.config.health.as_ref().map(|h| h.interval * h.healthy_after);
        let wait = soonest.or(recovery).unwrap_or(Duration::from_secs(1));
        let seconds = wait.as_millis().div_ceil(1000).max(1) as u64;
        GatewayError::Unavailable { upstream: self.config.name.clone(), retry_after: seconds }
    }
}

/// The request's ID and trace context for the upstream; returns the
/// protocol an upgrade asked for (`upgrading`: the route tunnels it), to hold
/// the 101 to it.
fn stamp(
    req: &mut Request<SendBody>,
    upgrading: bool,
    cx: &RequestLog<'_>,
    stamped: &mut Stamp,
) -> Option<HeaderValue> {
    if let Some(id) = cx.id {
        if stamped.carried.request_id {
            req.headers_mut().insert(X_REQUEST_ID, id.header_value());
        } else {
            stamped.add(Field::RequestId, id.header_value());
        }
    }
    let asked = upgrading.then(|| req.headers().get(header::UPGRADE).cloned()).flatten();
    if let Some(trace) = &cx.trace
        && cx.propagate_trace
    {
        trace.propagate(req.headers_mut(), stamped);
    }
    asked
}

/// A route's mirror waiting for the request's body (see
/// [`crate::body::WantsCopy`]) is given it when all of it was read ahead.
fn give_copy(req: &mut Request<SendBody>, limit: usize, bound: &Arc<ReadAhead>) {
    if let Some(wants) = req.extensions_mut().remove::<WantsCopy>()
        && let Either::Left(body) = req.body()
        && let Some(copy) = body.copy_whole(limit, bound)
    {
        wants.give(copy);
    }
}

/// Reads the first `request_buffer` bytes of a request's body (all of a
/// small one) within the route's deadline. Most bodies are in already: only
/// one that is not waits (boxed: only such requests pay for its timer).
async fn read_ahead(
    body: &mut RequestBody,
    target: &ProxyTarget,
    bound: &Arc<ReadAhead>,
    deadline: Instant,
) -> Result<(), GatewayError> {
    let n = target.request_buffer;
    let ahead = match body.read_ahead(n, bound).now_or_never() {
        Some(done) => done,
        None => match Box::pin(tokio::time::timeout_at(deadline, body.read_ahead(n, bound))).await {
            Ok(done) => done,
            Err(_) => return Err(GatewayError::BodyNotInTime { after: target.timeout }),
        },
    };
    ahead.map_err(|fault| fault.to_error())
}
