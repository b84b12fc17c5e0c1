//! How a listener tells its connections to stop.

use std::sync::Arc;
use std::sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Release},
};

use tokio_util::sync::CancellationToken;

use super::h1;

/// How a connection is told to stop: `graceful` finishes what is in flight
/// (shutdown begins), `now` closes it (the shutdown timeout passed).
#[derive(Clone)]
pub(crate) struct Stops {
    pub graceful: CancellationToken,
    pub now: CancellationToken,
    /// Whether `graceful` and `now` were cancelled, for a look on every wake.
    pub said: Arc<Said>,
    /// Where idle own HTTP/1.1 connections park (and are closed at the
    /// start of a shutdown).
    pub parking: Arc<h1::Parking>,
}

/// Whether each of [`Stops`]'s tokens has been cancelled, set before it is,
/// so that a connection its cancellation wakes sees it here. A load, where
/// `CancellationToken::is_cancelled` locks the token's mutex: one mutex
/// for all of a listener's connections, which look on every wake (see
/// benches/README.md, "Locked instructions").
#[derive(Default)]
pub(crate) struct Said {
    graceful: AtomicBool,
    now: AtomicBool,
}

impl Said {
    pub(crate) fn graceful(&self) -> bool {
        self.graceful.load(Acquire)
    }

    pub(crate) fn now(&self) -> bool {
        self.now.load(Acquire)
    }

    /// Says `now`, before its token is cancelled.
    pub(super) fn say_now(&self) {
        self.now.store(true, Release);
    }
}

/// Cancels `graceful` once `stop` is, after saying so in `said`.
pub(super) async fn relay(stop: CancellationToken, graceful: CancellationToken, said: Arc<Said>) {
    stop.cancelled().await;
    said.graceful.store(true, Release);
    graceful.cancel();
}
