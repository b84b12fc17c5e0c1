//! What the upstream's response body ([`crate::body::UpstreamBody`]) holds
//! until it is complete: its connection (back to the pool after the last
//! byte, closed otherwise) and its [`Lease`] on the upstream.

use metrics::Gauge;

use super::admission::Slot;
use super::endpoint::Attempt;
use super::pool::Conn;
use crate::body::Held;

/// What a response body holds until it is complete: the endpoint attempt
/// (in flight, for balancing), the upstream slot (`max_requests`) and its
/// place in the in-flight gauge.
pub struct Lease {
    _attempt: Attempt,
    _slot: Option<Slot>,
    _in_flight: InFlight,
}

impl Lease {
    pub fn new(attempt: Attempt, slot: Option<Slot>, in_flight: InFlight) -> Self {
        Lease { _attempt: attempt, _slot: slot, _in_flight: in_flight }
    }
}

/// One request in the upstream's in-flight gauge, until dropped.
pub struct InFlight(Gauge);

impl InFlight {
    pub fn new(gauge: &Gauge) -> Self {
        gauge.increment(1.0);
        InFlight(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// What an upstream's response body holds (see [`Held`]): its connection
/// until the body is complete, and its [`Lease`] until the body is dropped.
/// A connection dropped before the body is complete is aborted (see
/// [`Conn`]).
pub struct Leased {
    pub conn: Option<Conn>,
    pub lease: Lease,
}

impl Held for Leased {
    fn complete(&mut self, reusable: bool) {
        if let Some(conn) = self.conn.take() {
            if reusable { conn.release() } else { conn.close() }
        }
    }

    fn fail(&mut self) {
        self.conn = None;
    }
}
