//! The guard that records a request dropped before its answer.

use std::sync::atomic::Ordering;

use http::{Method, Response, StatusCode};
use tokio::time::Instant;

use super::App;
use crate::access::AccessLine;
use crate::body::Body;
use crate::error::CLIENT_CLOSED;
use crate::metrics::RouteMetrics;
use crate::request::RequestLog;
use crate::upstream::Upstream;

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
