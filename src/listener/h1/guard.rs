//! What runs beside a connection's exchanges: the watchdog's timeouts and
//! the shutdown signals ([`guard`]), and the tunnel after a 101 ([`switch`]).

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use tokio::io::AsyncWriteExt;

use super::Stop;
use super::wire::{Shared, Switched};
use crate::listener::Stops;
use crate::listener::conn::{Expired, Timeouts, Watchdog};
use crate::metrics;
use crate::upstream::tunnel::Tunnel;

/// What the exchanges and their guard tell each other.
#[derive(Default)]
pub(super) struct Flags {
    /// A graceful shutdown has begun: the response in flight is the last.
    pub closing: AtomicBool,
    /// The connection waits for its next request, where a shutdown closes it.
    pub idle: AtomicBool,
}

impl Flags {
    pub fn closing(&self) -> bool {
        self.closing.load(Relaxed)
    }
}

/// Runs `f` beside the watchdog and the shutdown signals: a shutdown ends
/// it while the connection is idle (see [`Flags`]), else marks the
/// response in flight the last.
pub(super) async fn guard<F: Future>(
    f: F,
    watchdog: &mut Watchdog,
    stops: &Stops,
    flags: &Flags,
    addr: std::net::SocketAddr,
) -> Result<F::Output, Stop> {
    let mut f = pin!(f);
    // Made once: a cancellation future registers itself when first polled.
    let mut graceful = pin!(stops.graceful.cancelled());
    let mut now = pin!(stops.now.cancelled());
    loop {
        tokio::select! {
            biased;
            out = &mut f => return Ok(out),
            expired = &mut *watchdog => return Err(expired_stop(expired, addr)),
            _ = &mut now, if flags.closing() => return Err(Stop::Cut),
            _ = &mut graceful, if !flags.closing() => {
                flags.closing.store(true, Relaxed);
                if flags.idle.load(Relaxed) {
                    return Err(Stop::Close);
                }
            }
        }
    }
}

fn expired_stop(expired: Expired, addr: std::net::SocketAddr) -> Stop {
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
