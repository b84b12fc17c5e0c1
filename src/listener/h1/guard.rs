//! What runs beside a connection's exchanges: the watchdog's timeouts and
//! the shutdown signals ([`guard`]), and the tunnel after a 101 ([`switch`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::task::{Context, Poll, ready};

use tokio::io::AsyncWriteExt;

use super::Stop;
use super::wire::{Shared, Switched};
use crate::listener::Stops;
use crate::listener::conn::{Expired, Timeouts, Watchdog};
use crate::metrics;
use crate::upstream::tunnel::Tunnel;
use tokio_util::sync::WaitForCancellationFuture;

/// What the exchanges and their guard tell each other.
#[derive(Default)]
pub(super) struct Flags {
    /// A graceful shutdown has begun: the response in flight is the last.
    pub closing: AtomicBool,
    /// The connection waits for its next request with nothing of it read,
    /// where a shutdown closes it.
    pub idle: AtomicBool,
    /// A request waits for its answer, of which nothing (but whole 1xx
    /// heads) has been written: cut by the shutdown timeout, it is
    /// answered 503 (see `serve_wire`).
    pub unanswered: AtomicBool,
}

impl Flags {
    pub fn closing(&self) -> bool {
        self.closing.load(Relaxed)
    }
}

/// What a connection's exchanges run beside: the watchdog and the shutdown
/// signals.
pub(super) struct Signals<'a, 's> {
    pub watchdog: &'a mut Watchdog,
    pub stops: &'s Stops,
    /// The shutdown signal waited for: `stops.graceful`'s, then, once
    /// closing, `stops.now`'s in its place (one at a time: every idle
    /// connection keeps room for it). Made once per connection: a
    /// cancellation future registers itself when first polled.
    pub stop: Pin<&'a mut WaitForCancellationFuture<'s>>,
    /// Whether `stop` has been polled: it has then registered the task's
    /// waker with its token (see [`Signals::poll_stop`]).
    pub stop_polled: bool,
    pub flags: &'a Flags,
    pub addr: &'a std::net::SocketAddr,
}

impl Signals<'_, '_> {
    /// Whether the shutdown signal waited for has come. Once `stop` is
    /// polled, its token wakes this task when cancelled, so it is polled
    /// again only then: a poll locks the token and looks through its
    /// waiters, on every wake of every connection, where a flag set before
    /// the cancellation is a load (see `listener::Said`).
    fn poll_stop(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let said = if self.flags.closing() { self.stops.said.now() } else { self.stops.said.graceful() };
        if self.stop_polled && !said {
            return Poll::Pending;
        }
        self.stop_polled = true;
        self.stop.as_mut().poll(cx)
    }
}

/// Runs `f` beside the watchdog and the shutdown signals: a shutdown ends
/// it while the connection is idle (see [`Flags`]), else marks the
/// response in flight the last. (`f` pinned by the caller: taken by value,
/// it would be kept twice in this future.)
pub(super) async fn guard<F: Future>(mut f: Pin<&mut F>, s: &mut Signals<'_, '_>) -> Result<F::Output, Stop> {
    std::future::poll_fn(|cx| {
        loop {
            if let Poll::Ready(out) = f.as_mut().poll(cx) {
                return Poll::Ready(Ok(out));
            }
            if let Poll::Ready(expired) = Pin::new(&mut *s.watchdog).poll(cx) {
                return Poll::Ready(Err(expired_stop(expired, s.addr)));
            }
            ready!(s.poll_stop(cx));
            if s.flags.closing() {
                return Poll::Ready(Err(Stop::Cut));
            }
            s.flags.closing.store(true, Relaxed);
            s.stop.set(s.stops.now.cancelled());
            s.stop_polled = false;
            if s.flags.idle.load(Relaxed) {
                return Poll::Ready(Err(Stop::Close));
            }
        }
    })
    .await
}

fn expired_stop(expired: Expired, addr: &std::net::SocketAddr) -> Stop {
    match expired {
        Expired::Idle | Expired::Asked | Expired::Resets => return Stop::Close,
        Expired::HeaderTimeout => {
            metrics::rejected("", "header_timeout");
            tracing::debug!(client = %addr, "no request head within the header read timeout");
        }
        Expired::SendTimeout => {
            metrics::rejected("", "send_timeout");
            tracing::debug!(client = %addr, "client accepted no bytes within the send timeout");
        }
        Expired::GraceOver => {}
    }
    Stop::Cut
}

/// After a 101: the tunnel over the client's socket, until it ends or the
/// shutdown timeout cuts it.
pub(super) async fn switch(wire: Shared, tunnel: Box<Tunnel>, stops: Stops, timeouts: Timeouts) {
    let Some((io, read)) = wire.into_parts() else { return };
    let mut client = Switched { io, read };
    tokio::select! {
        _ = Box::pin(tunnel.run_over(&mut client, timeouts.send)) => {}
        _ = stops.now.cancelled() => {}
    }
    let _ = client.shutdown().await;
}
