//! Upstreams: where proxy routes send requests, and how the gateway protects
//! them.
//!
//! - [`Upstream::forward`] is the proxy's data path: the request's header
//!   rules (`proxy`), admission (`admission`: `max_requests` and its
//!   queue), the choice of an endpoint (`endpoint`: balance, health,
//!   ejection), the exchange on that endpoint's pool (`exchange`, `pool`),
//!   retries within the retry budget, and the response's header rules.
//! - `health` runs the active checks; `endpoint` keeps each endpoint's
//!   state and picks one.

pub mod admission;
pub mod body;
pub mod connect;
pub mod endpoint;
pub mod exchange;
pub mod health;
pub mod io;
pub mod pool;
pub mod proxy;
pub mod retry;
pub mod tunnel;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::header::{self, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use metrics::{Counter, Gauge, counter, gauge};
use tokio::time::Instant;
use tower::retry::budget::{Budget, TpsBudget};

use crate::body::{Body, ClientFault};
use crate::config::{Balance, HostMode, ProxyTarget, RetryOn, UpstreamConfig};
use crate::error::GatewayError;
use crate::headers;
use crate::headers::X_REQUEST_ID;
use crate::metrics::{UPSTREAM_IN_FLIGHT, UPSTREAM_RETRIES, UPSTREAM_RETRIES_SKIPPED, UpstreamMetrics};
use crate::request::{Peer, RequestLog};
use admission::Admission;
use body::{InFlight, Lease, UpstreamBody};
use endpoint::{Attempt, Availability, Candidate, Endpoint};
use exchange::{Failure, Plan, exchange};
use pool::{Conn, SendBody};
use proxy::Prepared;
use retry::{HeadCopy, Outcome, should_retry};

/// One configured upstream: its endpoints, admission, retry budget and
/// metrics.
pub struct Upstream {
    pub config: UpstreamConfig,
    pub metrics: UpstreamMetrics,
    endpoints: Vec<Arc<Endpoint>>,
    admission: Option<Admission>,
    /// Only when a route retries through this upstream: depositing costs a
    /// clock read per request.
    budget: Option<TpsBudget>,
    /// Round-robin position.
    next: AtomicUsize,
    /// No endpoint could take the last request (logged once per change).
    down: AtomicBool,
    in_flight: Gauge,
    retries: Counter,
    retries_skipped: Counter,
}

/// What [`Upstream::forward`] keeps of a request from one attempt to the
/// next.
struct Tries {
    plan: Plan,
    /// The client's `Host`, for routes that preserve it.
    client_host: Option<HeaderValue>,
    /// The protocol an upgrade asked for, when the route tunnels it.
    asked: Option<HeaderValue>,
    /// Where the request body notes its own failure.
    fault: Option<Arc<OnceLock<ClientFault>>>,
    /// Retries left.
    left: u32,
    /// The endpoints tried so far (by index).
    tried: Vec<usize>,
}

/// What one attempt came to.
enum Tried {
    /// A response head the client gets (a 101 to be switched included).
    Answered(Response<Incoming>, Option<Conn>, Attempt),
    /// Try again with this request, on another endpoint where there is one.
    Again(Request<SendBody>),
    /// The answer is this error.
    Failed(GatewayError),
}

impl Upstream {
    /// Builds the upstream; starts health checks when configured. `retried`
    /// says whether any route retries through it.
    pub fn new(config: UpstreamConfig, retried: bool) -> Self {
        let metrics = UpstreamMetrics::new(&config.name);
        let endpoints: Vec<Arc<Endpoint>> =
            config.endpoints.iter().map(|e| Arc::new(Endpoint::new(e.clone(), &config))).collect();
        if let Some(health) = &config.health {
            endpoints.iter().for_each(|e| health::spawn(e, health.clone()));
        }
        let name = config.name.clone();
        let budget = retried.then(|| {
            let b = config.retry_budget;
            TpsBudget::new(Duration::from_secs(10), b.min_per_second, b.ratio)
        });
        Upstream {
            admission: config.admission.map(|a| Admission::new(a, &name)),
            budget,
            endpoints,
            next: AtomicUsize::new(0),
            down: AtomicBool::new(false),
            in_flight: gauge!(UPSTREAM_IN_FLIGHT, "upstream" => name.clone()),
            retries: counter!(UPSTREAM_RETRIES, "upstream" => name.clone()),
            retries_skipped: counter!(UPSTREAM_RETRIES_SKIPPED, "upstream" => name),
            metrics,
            config,
        }
    }

    /// Whether it was built from `config` with a retry budget as
    /// `retried` asks: a reload keeps it (pools, health, ejections) then.
    pub fn same_settings(&self, config: &UpstreamConfig, retried: bool) -> bool {
        self.budget.is_some() == retried && format!("{:?}", self.config) == format!("{config:?}")
    }

    /// False while the upstream has health checks and no endpoint passes
    /// them (`/readyz`).
    pub fn ready(&self) -> bool {
        self.config.health.is_none() || self.endpoints.iter().any(|e| e.is_healthy())
    }

    /// Forwards `req` (matched by a route with `prefix` and body limit
    /// `max_body`) and returns the upstream's response head with its body
    /// streaming. `deadline` is the request's arrival plus the route's
    /// timeout; time spent queueing and retrying counts toward it.
    ///
    /// Prepares the request, takes a `max_requests` slot, then makes one
    /// [`Upstream::attempt`] after another on the endpoints [`Upstream::choose`]
    /// picks, for as long as [`retry::should_retry`] and the budget allow.
    ///
    /// An `async move` block, not an `async fn`, so that the request is not
    /// copied again on the first poll (see [`crate::server::App::handle`]).
    #[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
    pub fn forward<'a>(
        &'a self,
        target: &'a ProxyTarget,
        prefix: &'a str,
        max_body: u64,
        req: Request<Incoming>,
        peer: &'a Peer,
        cx: &'a RequestLog<'_>,
        deadline: Instant,
    ) -> impl Future<Output = Result<Response<Body>, GatewayError>> + 'a {
        async move {
            let counted = cx.timing.as_ref().map(|t| t.bytes_in.clone());
            let Prepared { parts, body, plan, client_host, upgrade, fault } =
                proxy::prepare_request(req, target, prefix, max_body, peer, counted)?;
            // Made at once, and the parts never borrowed: rustc keeps room in
            // the future, for every request in flight, for any local that was
            // borrowed before an `.await`, even once it is moved out.
            let mut req = Request::from_parts(parts, body);
            if let Some(id) = cx.id {
                req.headers_mut().insert(X_REQUEST_ID, id.header_value());
            }
            // What the upgrade asked for, to hold the 101 to it.
            let asked = upgrade.as_ref().and_then(|_| req.headers().get(header::UPGRADE).cloned());
            if let Some(trace) = &cx.trace
                && cx.propagate_trace
            {
                trace.propagate(req.headers_mut());
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
            let mut tries = Tries { plan, client_host, asked, fault, left: target.retries, tried: Vec::new() };
            let mut upgrade = upgrade;
            loop {
                let (index, attempt) = self.choose(&tries.tried)?;
                let (response, conn, attempt) = match self.attempt(req, attempt, &mut tries, target, cx, deadline).await
                {
                    Tried::Answered(response, conn, attempt) => (response, conn, attempt),
                    Tried::Again(again) => {
                        (req, tries.left) = (again, tries.left - 1);
                        tries.tried.push(index);
                        continue;
                    }
                    Tried::Failed(e) => return Err(e),
                };
                if response.status() == StatusCode::SWITCHING_PROTOCOLS
                    && let (Some(client), Some(idle)) = (upgrade.take(), target.upgrade)
                {
                    // The tunnel holds no slot (see `tunnel`). A 101 comes
                    // only over HTTP/1.1, on its own connection.
                    let conn = conn.expect("an HTTP/1.1 exchange has its connection");
                    return Ok(tunnel::switch(response, conn, client, idle));
                }
                let lease = Lease::new(attempt, slot, in_flight);
                return Ok(self.respond(response, conn, lease, target));
            }
        }
    }

    /// One attempt on one endpoint, within the route's deadline: the
    /// endpoint's `Host`, the exchange, the endpoint's verdict (success or
    /// failure, for ejection), and whether the request goes again.
    #[allow(clippy::manual_async_fn)] // See `forward`: not an `async fn` on purpose.
    fn attempt<'a>(
        &'a self,
        mut req: Request<SendBody>,
        mut attempt: Attempt,
        tries: &'a mut Tries,
        target: &'a ProxyTarget,
        cx: &'a RequestLog<'_>,
        deadline: Instant,
    ) -> impl Future<Output = Tried> + 'a {
        async move {
            let endpoint = attempt.endpoint().clone();
            let (retry_on, may_retry) = (target.retry_on, tries.left > 0);
            // On the last attempt the client's Host is moved, not cloned:
            // its value is a slice of the client connection's read buffer,
            // which it would keep alive until the response (see `HeadCopy`).
            let preserved = if may_retry { tries.client_host.clone() } else { tries.client_host.take() };
            let host = match (target.host, preserved) {
                // An empty Host (allowed when the target has no authority)
                // gets the upstream's own.
                (HostMode::Preserve, Some(h)) if !h.is_empty() => h,
                _ => endpoint.host.clone(),
            };
            req.headers_mut().insert(header::HOST, host);
            let copy = (may_retry && tries.plan.retryable && (retry_on.reset || retry_on.unavailable))
                .then(|| HeadCopy::of(&req));
            let started = Instant::now();
            let timing = cx.timing.as_deref();
            let exchanged = exchange(&endpoint.pool, req, tries.plan, &self.retries, timing);
            let (response, conn) = match tokio::time::timeout_at(deadline, exchanged).await {
                Err(_) => {
                    attempt.failure();
                    let after = target.timeout;
                    return Tried::Failed(GatewayError::UpstreamTimeout { upstream: self.config.name.clone(), after });
                }
                Ok(Ok(answered)) => answered,
                Ok(Err(failure)) => return self.failed(failure, attempt, copy, tries, retry_on, &endpoint),
            };
            let status = response.status().as_u16();
            if let Err(e) = proxy::check_status(status, &self.config.name, tries.asked.is_some()) {
                attempt.failure();
                return Tried::Failed(e);
            }
            self.metrics.record(status, started.elapsed());
            if let Some(admission) = &self.admission {
                admission.observed(started.elapsed());
            }
            if let Some(t) = timing {
                t.set_header(started.elapsed(), &endpoint.config.url);
            }
            if matches!(status, 502..=504) {
                attempt.failure()
            } else {
                attempt.success()
            }
            if should_retry(Outcome::Status(status), retry_on, tries.left, copy.is_some())
                && let Some(again) = copy.and_then(HeadCopy::into_request)
                && self.within_budget()
            {
                return Tried::Again(again);
            }
            if status == 101
                && let Some(asked) = &tries.asked
            {
                let answered = response.headers().get(header::UPGRADE);
                if !headers::upgrade_accepted(asked, answered) {
                    attempt.failure();
                    let switched = answered.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                    return Tried::Failed(GatewayError::UpstreamProtocol {
                        upstream: self.config.name.clone(),
                        detail: format!("101 switched to {switched:?}, not to what was asked ({asked:?})"),
                    });
                }
            }
            Tried::Answered(response, conn, attempt)
        }
    }

    /// An exchange that failed before a response head: the client's own
    /// body's failure (its answer, no verdict on the endpoint), or the
    /// endpoint's, retried when the route and the budget allow.
    fn failed(
        &self,
        failure: Failure,
        mut attempt: Attempt,
        copy: Option<HeadCopy>,
        tries: &Tries,
        retry_on: RetryOn,
        endpoint: &Endpoint,
    ) -> Tried {
        // Over HTTP/2 the upstream error is only a stream reset, so the
        // body's own note is what tells.
        if let Some(fault) = tries.fault.as_ref().and_then(|f| f.get()) {
            return Tried::Failed(fault.to_error());
        }
        // A failure of the client's own body (too large, stalled, cut)
        // says nothing about the endpoint: no verdict, or any client could
        // get an upstream ejected.
        if !failure.is_clients() {
            attempt.failure();
        }
        let outcome = match &failure {
            Failure::Connect(..) => Outcome::Connect,
            Failure::Send(_) if failure.is_reset() => Outcome::Reset,
            Failure::Send(_) => Outcome::Other,
        };
        if should_retry(outcome, retry_on, tries.left, copy.is_some()) && self.within_budget() {
            match (failure, copy.and_then(HeadCopy::into_request)) {
                (Failure::Connect(_, unsent), _) => return Tried::Again(*unsent),
                (_, Some(again)) => return Tried::Again(again),
                (failure @ Failure::Send(_), None) => {
                    return Tried::Failed(failure.classify(&self.config.name, &endpoint.config.address));
                }
            }
        }
        Tried::Failed(failure.classify(&self.config.name, &endpoint.config.address))
    }

    /// The upstream's response, with the header rules applied and its body
    /// streaming; `lease` is held until the body is complete.
    fn respond(
        &self,
        response: Response<Incoming>,
        conn: Option<Conn>,
        lease: Lease,
        target: &ProxyTarget,
    ) -> Response<Body> {
        let (mut parts, body) = response.into_parts();
        let reusable = proxy::prepare_response(&mut parts, &body);
        let body = UpstreamBody::new(
            body,
            conn,
            reusable,
            lease,
            target.body_timeout,
            self.metrics.body_failed.clone(),
            self.metrics.body_stalled.clone(),
        );
        Response::from_parts(parts, Body::Upstream(Box::pin(body)))
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

    /// The endpoint for the next attempt (see [`endpoint::pick`]).
    fn choose(&self, tried: &[usize]) -> Result<(usize, Attempt), GatewayError> {
        loop {
            let picked = if let [only] = &self.endpoints[..] {
                match only.availability() {
                    Availability::Open => Some((0, false)),
                    Availability::TrialDue => Some((0, true)),
                    Availability::Closed => None,
                }
            } else {
                let candidates: Vec<Candidate> = self
                    .endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, e)| Candidate {
                        availability: e.availability(),
                        in_flight: e.in_flight(),
                        tried: tried.contains(&i),
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
            tracing::warn!(upstream = %self.config.name, "no endpoint may take traffic (unhealthy or ejected); answering 503");
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
