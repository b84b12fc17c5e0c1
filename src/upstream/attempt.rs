//! One attempt on one endpoint, around the exchange that
//! [`Upstream::forward`] awaits: the request addressed to the endpoint, and
//! what came of it (a response head judged, a failure, the deadline), with
//! the endpoint's verdict and whether the request goes again (the decision
//! itself is `retry::should_retry`, pure). Plain functions, so the exchange's
//! future is the forward's own and nothing large is moved through them.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use http::header::{self, HeaderValue};
use http::{Request, Response};
use tokio::time::Instant;

use super::admission::Slot;
use super::body::Received;
use super::endpoint::{Attempt, Endpoint};
use super::exchange::{Failure, Plan};
use super::pool::SendBody;
use super::retry::{HeadCopy, Outcome, should_retry};
use super::{Upstream, proxy};
use crate::access::UpstreamTiming;
use crate::body::BodyState;
use crate::config::{HostMode, ProxyTarget, RetryOn};
use crate::error::GatewayError;
use crate::headers;

/// What [`Upstream::forward`] keeps of a request from one attempt to the
/// next.
pub(super) struct Tries {
    pub(super) plan: Plan,
    /// The client's `Host`, for routes that preserve it.
    pub(super) client_host: Option<HeaderValue>,
    /// The protocol an upgrade asked for, when the route tunnels it.
    pub(super) asked: Option<HeaderValue>,
    /// What the request body tells of itself.
    pub(super) body_state: Option<Arc<BodyState>>,
    /// Retries left.
    pub(super) left: u32,
    /// The endpoints tried so far (by index).
    pub(super) tried: Vec<usize>,
    /// Sent once more after a stale pooled connection (see `exchange`).
    pub(super) resent: AtomicBool,
}

/// What an attempt came to, when it is not a response for the client.
pub(super) enum Tried {
    /// Try again with this request, on another endpoint where there is one.
    Again(Request<SendBody>),
    /// The answer is this error.
    Failed(GatewayError),
}

/// How long a client must have sent nothing of its body for an upstream
/// that ends the exchange meanwhile to be waiting for the client, not
/// failing on its own.
const CLIENT_QUIET: std::time::Duration = std::time::Duration::from_millis(100);

impl Tries {
    /// The upstream's own share of the time from `started` to `now`, for
    /// an answer (`answered`): from the end of a body the client was still
    /// sending, else from `started`; `None` when the answer came before
    /// the client's body was all in. A learned limit takes it for the
    /// upstream's latency, and a slow upload is the client's time: counted,
    /// a few slow uploaders at a cold start made the minimum latency theirs,
    /// and the limit let in many times what the upstream could do.
    fn upstream_time(&self, started: Instant, now: Instant) -> Option<std::time::Duration> {
        let from = match &self.body_state {
            None => started,
            Some(body) => body.completed_at()?.max(started),
        };
        Some(now.saturating_duration_since(from))
    }

    pub(super) fn new(
        plan: Plan,
        client_host: Option<HeaderValue>,
        asked: Option<HeaderValue>,
        body_state: Option<Arc<BodyState>>,
        retries: u32,
    ) -> Tries {
        Tries { plan, client_host, asked, body_state, left: retries, tried: Vec::new(), resent: AtomicBool::new(false) }
    }
}

impl Upstream {
    /// Addresses the request to `endpoint` (its `Host`, when the route does
    /// not preserve the client's), and keeps its head when it may be sent
    /// again.
    pub(super) fn address(
        &self,
        req: &mut Request<SendBody>,
        tries: &mut Tries,
        endpoint: &Endpoint,
        target: &ProxyTarget,
    ) -> Option<HeadCopy> {
        let (retry_on, may_retry) = (target.retry_on, tries.left > 0);
        // On the last attempt the client's Host is moved, not cloned: its
        // value is a slice of a shared buffer, which it would keep alive
        // until the response (see `HeadCopy`).
        let preserved = if may_retry { tries.client_host.clone() } else { tries.client_host.take() };
        let host = match (target.host, preserved) {
            // An empty Host (allowed when the target has no authority) gets
            // the upstream's own.
            (HostMode::Preserve, Some(h)) if !h.is_empty() => h,
            _ => endpoint.host.clone(),
        };
        req.headers_mut().insert(header::HOST, host);
        (may_retry && tries.plan.retryable && (retry_on.reset || retry_on.unavailable)).then(|| HeadCopy::of(req))
    }

    /// The route's deadline passed before the response head: the
    /// endpoint's failure, unless the gateway was still waiting for the
    /// client's body (its own fault, no verdict on the endpoint: else a
    /// client that never finishes its body could get every endpoint ejected).
    /// A learned limit counts it as an answer that took all that time (as
    /// Envoy's filter sees its own 504).
    pub(super) fn timed_out(
        &self,
        mut attempt: Attempt,
        tries: &Tries,
        target: &ProxyTarget,
        slot: Option<&Slot>,
        started: Instant,
    ) -> Tried {
        if tries.body_state.as_ref().is_some_and(|b| b.awaiting_client()) {
            return Tried::Failed(GatewayError::BodyNotInTime { after: target.timeout });
        }
        if let Some(slot) = slot {
            // A body not all in by now was the upstream's to read (the
            // client was not waiting, above): its whole time counts.
            let now = Instant::now();
            slot.observed(tries.upstream_time(started, now).unwrap_or(now - started), now);
        }
        attempt.failure();
        let after = target.timeout;
        Tried::Failed(GatewayError::UpstreamTimeout { upstream: self.config.name.clone(), after })
    }

    /// A response head, judged: the endpoint's verdict (success or failure,
    /// for ejection), and `None` when it goes to the client, else whether
    /// the request goes again (a 503 the route retries) or what the client
    /// gets instead (a status that is not HTTP, a 101 to the wrong protocol).
    pub(super) fn judge(
        &self,
        response: &Response<Received>,
        attempt: &mut Attempt,
        copy: Option<HeadCopy>,
        tries: &Tries,
        target: &ProxyTarget,
    ) -> Option<Tried> {
        let status = response.status().as_u16();
        if let Err(e) = proxy::check_status(status, &self.config.name, tries.asked.is_some()) {
            attempt.failure();
            return Some(Tried::Failed(e));
        }
        if matches!(status, 502..=504) {
            attempt.failure()
        } else {
            attempt.success()
        }
        if should_retry(Outcome::Status(status), target.retry_on, tries.left, copy.is_some())
            && let Some(again) = copy.and_then(HeadCopy::into_request)
            && self.within_budget()
        {
            return Some(Tried::Again(again));
        }
        if status == 101
            && let Some(asked) = &tries.asked
        {
            let answered = response.headers().get(header::UPGRADE);
            if !headers::upgrade_accepted(asked, answered) {
                attempt.failure();
                let switched = answered.map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
                return Some(Tried::Failed(GatewayError::UpstreamProtocol {
                    upstream: self.config.name.clone(),
                    detail: format!("101 switched to {switched:?}, not to what was asked ({asked:?})"),
                }));
            }
        }
        None
    }

    /// A response head that goes to the client: its time in the metrics
    /// and the access log, and the upstream's share of it (see
    /// [`Tries::upstream_time`]) in the admission's (`slot`'s).
    pub(super) fn answered(
        &self,
        response: &Response<Received>,
        (attempt, tries): (&Attempt, &Tries),
        timing: Option<&UpstreamTiming>,
        started: Instant,
        slot: Option<&Slot>,
    ) {
        let now = Instant::now();
        let took = now - started;
        self.metrics.record(response.status().as_u16(), took);
        if let Some(slot) = slot
            && let Some(own) = tries.upstream_time(started, now)
        {
            slot.observed(own, now);
        }
        if let Some(t) = timing {
            t.set_header(took, &attempt.endpoint().config.url);
        }
    }

    /// An exchange that failed before a response head: the client's own
    /// body's failure (its answer, no verdict on the endpoint), or the
    /// endpoint's, retried when the route and the budget allow.
    pub(super) fn failed(
        &self,
        failure: Failure,
        mut attempt: Attempt,
        copy: Option<HeadCopy>,
        tries: &Tries,
        retry_on: RetryOn,
    ) -> Tried {
        // Over HTTP/2 the upstream error is only a stream reset, so the
        // body's own note is what tells.
        if let Some(fault) = tries.body_state.as_ref().and_then(|b| b.fault()) {
            return Tried::Failed(fault.to_error());
        }
        // A failure of the client's own body (too large, stalled, cut)
        // says nothing about the endpoint: no verdict, or any client could
        // get an upstream ejected. Nor does an upstream that gave up while
        // the gateway still waited for the client's body (its own body
        // timeout, say).
        if !failure.is_clients() {
            if tries.body_state.as_ref().is_some_and(|b| b.awaiting_quiet_client(CLIENT_QUIET)) {
                let detail = failure.classify(&self.config.name, &attempt.endpoint().config.address).to_string();
                return Tried::Failed(GatewayError::BodyIncomplete { detail });
            }
            attempt.failure();
        }
        let outcome = match &failure {
            Failure::Connect(..) => Outcome::Connect,
            _ if failure.is_reset() => Outcome::Reset,
            Failure::Send(_) | Failure::SendH2(_) => Outcome::Other,
        };
        if should_retry(outcome, retry_on, tries.left, copy.is_some()) && self.within_budget() {
            match (failure, copy.and_then(HeadCopy::into_request)) {
                (Failure::Connect(_, unsent), _) => return Tried::Again(*unsent),
                (_, Some(again)) => return Tried::Again(again),
                (failure @ (Failure::Send(_) | Failure::SendH2(_)), None) => {
                    return Tried::Failed(failure.classify(&self.config.name, &attempt.endpoint().config.address));
                }
            }
        }
        Tried::Failed(failure.classify(&self.config.name, &attempt.endpoint().config.address))
    }
}
