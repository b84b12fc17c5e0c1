//! What runs beside a connection's exchanges: the watchdog's timeouts and
//! the shutdown signals ([`guard`]), and the tunnel after a 101 ([`switch`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

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
    pub flags: &'a Flags,
    pub addr: &'a std::net::SocketAddr,
}

/// Runs `f` beside the watchdog and the shutdown signals: a shutdown ends
/// it while the connection is idle (see [`Flags`]), else marks the
/// response in flight the last. (`f` pinned by the caller: taken by value,
/// it would be kept twice in this future.)
pub(super) async fn guard<F: Future>(mut f: Pin<&mut F>, s: &mut Signals<'_, '_>) -> Result<F::Output, Stop> {
    loop {
        tokio::select! {
            biased;
            out = f.as_mut() => return Ok(out),
            expired = &mut *s.watchdog => return Err(expired_stop(expired, s.addr)),
            _ = s.stop.as_mut() => {
                if s.flags.closing() {
                    return Err(Stop::Cut);
                }
                s.flags.closing.store(true, Relaxed);
                s.stop.set(s.stops.now.cancelled());
                if s.flags.idle.load(Relaxed) {
                    return Err(Stop::Close);
                }
            }
        }
    }
}

fn expired_stop(expired: Expired, addr: &std::net::SocketAddr) -> Stop {
    match expired {
        Expired::Idle => return Stop::Close,
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
