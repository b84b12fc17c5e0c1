//! A panic while handling a request answers 500 to that request, is counted
//! (`gateway_panics_total`) and logged with the request ID, and leaves the
//! connection and the process serving. The catching is in
//! [`crate::server::App::handle`] (see there why not tower-http's
//! `CatchPanicLayer`); this is the answer.

use std::any::Any;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::header;
use http::{Response, StatusCode};

use crate::body::Body;

/// The response to a panic: 500, counted, logged with the request ID.
pub fn panic_response(panic: Box<dyn Any + Send + 'static>, request_id: Option<&str>) -> Response<Body> {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(not a string)".to_owned());
    crate::metrics::panicked();
    let request_id = request_id.unwrap_or("-");
    tracing::error!(request_id, panic = %message, "request handling panicked; answered 500");
    Response::builder()
        .status(StatusCode::INTERNAL_SERVER_ERROR)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::full("internal error\n"))
        .expect("valid response")
}

/// Polls a pinned future, catching a panic. `futures_util`'s `catch_unwind`
/// takes the future by value, which copies the data path's future once more
/// per request (see benches/README.md, Decisions); this one borrows it
/// where it already lives.
pub struct CatchUnwindRef<'a, F>(pub Pin<&'a mut F>);

impl<F: Future> Future for CatchUnwindRef<'_, F> {
    type Output = Result<F::Output, Box<dyn Any + Send + 'static>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let inner = self.0.as_mut();
        match catch_unwind(AssertUnwindSafe(|| inner.poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        }
    }
}
