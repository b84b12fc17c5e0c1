//! One request's bookkeeping: what its logs and the upstream need to know
//! about it, and the guard that records a request dropped before its answer.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::time::Instant;

use super::App;
use crate::access::{AccessLine, UpstreamTiming};
use crate::body::Body;
use crate::layers::request_id::RequestId;
use crate::layers::trace::TraceContext;
use crate::metrics::RouteMetrics;
use crate::upstream::Upstream;

/// What the upstream and the logs of one request need to know about it.
pub struct RequestLog<'a> {
    /// Its ID, when request IDs are on.
    pub id: Option<&'a RequestId>,
    /// Its trace, when trace context is on or spans are exported.
    pub trace: Option<TraceContext>,
    /// Whether the upstream gets the trace (trace context is on).
    pub propagate_trace: bool,
    /// What the proxy learns of the upstream, when the access log is on.
    pub timing: Option<Arc<UpstreamTiming>>,
    /// The access log line, when the access log is on.
    pub(super) access: Option<Box<AccessLine>>,
    /// What the exported span needs, when spans are exported.
    pub(super) span: Option<Box<SpanStart>>,
}

/// The parts of a request its span needs, taken at its start.
pub(super) struct SpanStart {
    pub(super) path: String,
    pub(super) host: Option<String>,
    pub(super) client: String,
}

/// A request on its way to a response head. Dropped before it got one
/// (the client left, the handling panicked, or the shutdown timeout cut it
/// off), it still reaches the metrics, the access log and the exported
/// span, as 499 (nginx's "client closed request"), 500 or 503; else a
/// request that ends that way would leave no trace at all.
pub(super) struct Unanswered<'a> {
    pub(super) app: &'a App,
    pub(super) route: &'a RouteMetrics,
    pub(super) upstream: Option<&'a Upstream>,
    pub(super) method: &'a Method,
    pub(super) start: Instant,
    /// Taken when the response is ready.
    pub(super) cx: Option<RequestLog<'a>>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let Some(cx) = self.cx.take() else { return };
        // A panic drops the data path's locals as it unwinds, this one too.
        let status = if std::thread::panicking() {
            StatusCode::INTERNAL_SERVER_ERROR
        } else if self.app.abandoning.load(Ordering::Relaxed) {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            CLIENT_CLOSED
        };
        let mut stub = Response::new(Body::empty());
        *stub.status_mut() = status;
        let mut stub = self.app.finish(self.route, self.upstream, self.method, self.start, cx, stub);
        // No body will be sent: the line is written now.
        if let Some(line) = stub.extensions_mut().remove::<Box<AccessLine>>() {
            line.write();
        }
    }
}

/// 499, nginx's status for a request whose client closed the connection
/// before it was answered. It is never sent; logs and metrics use it.
pub const CLIENT_CLOSED: StatusCode = match StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => unreachable!(),
};

impl<'a> RequestLog<'a> {
    /// `trace_context`: continue the caller's trace and pass it on;
    /// `exporting`: spans are exported (a new trace per request, when trace
    /// context is off); `logged`: the access log shows the trace ID. The
    /// trace is read from the request as the client sent it, before
    /// hop-by-hop stripping and the route's header rules. When only a
    /// proxied request would use it, it is left to [`RequestLog::route_found`].
    pub(super) fn new(
        req: &Request<Incoming>,
        id: Option<&'a RequestId>,
        trace_context: bool,
        exporting: bool,
        logged: bool,
    ) -> Self {
        let trace = if trace_context && (exporting || logged) {
            Some(TraceContext::from_headers(req.headers()))
        } else {
            exporting.then(TraceContext::root)
        };
        RequestLog { id, trace, propagate_trace: trace_context, timing: None, access: None, span: None }
    }

    /// The route is known: a request that will be proxied gets the trace it
    /// passes on, if it has none yet. Other routes skip it (about 90
    /// instructions a request, `benches/callgrind /hello`) when nothing
    /// else shows it. The route's header rules have not run yet, so the
    /// trace is still the one the client sent.
    pub(super) fn route_found(&mut self, req: &Request<Incoming>, proxied: bool) {
        if proxied && self.propagate_trace && self.trace.is_none() {
            self.trace = Some(TraceContext::from_headers(req.headers()));
        }
    }

    /// The request ID for a log line (`-` without one).
    pub fn request_id(&self) -> &str {
        self.id.map_or("-", RequestId::as_str)
    }
}
