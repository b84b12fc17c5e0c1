//! Idle connections without a task: a plain-TCP connection that has waited
//! for its next request for a while gives its task up, and what it keeps is
//! its socket, its state and a small cell the socket's readiness wakes.
//!
//! Why: a task is the largest thing an idle connection holds (its cell,
//! with room for the busiest state of its future, and the watchdog's timer
//! beside it); nginx keeps a connection structure and its events. tokio
//! serves a socket from a task, so the cell here is the waker the socket's
//! read readiness calls: bytes (or the end) spawn the connection's task
//! again, where it left off. The idle timeout and a shutdown reach parked
//! connections through their listener's [`Parking`], which looks at them
//! now and then. (tokio has no way to wait for many sockets from one task
//! without a future per socket; the waker is that, at its smallest.)
//!
//! A connection parks only once it has been idle for `server.park_after`:
//! a busy keep-alive connection keeps its task, and pays no spawn and no
//! timer per request. The listener's [`Parking`] looks at its connections
//! every half of that and asks those idle so long to park (their tasks
//! wake, and end). TLS connections keep their tasks (rustls may hold bytes
//! to write).
//!
//! A look costs the connections that wait idle with a task, not the busy
//! or parked ones, so that many connections waiting for their upstream or
//! for their next request cost little CPU: a busy or parked connection
//! leaves the list at the next look (and is put back when it next waits
//! idle or wakes), and the parked ones are looked at in the order they
//! parked, which is the order their idle timeouts pass in (see
//! [`Parking::sweep`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use super::Own;
use super::wire::{ClientStream, Shared};
use crate::listener::builders::Builders;
use crate::listener::conn::{ConnState, Watchdog};
use crate::listener::{Connection, Held, Kind, Said, Stops};
use crate::metrics::ConnectionGuard;
use crate::server::App;

/// A listener's parked connections: what spawns them again and what closes
/// them when their idle timeout passes or the listener shuts down.
pub struct Parking {
    handle: Handle,
    /// What every connection of the listener shares, kept here once
    /// rather than in each parked connection (see [`Parked`]).
    listener: Listener,
    /// `gateway_connections_parked`.
    parked: metrics::Gauge,
    tracker: TaskTracker,
    /// How long a connection waits in its task before it is asked to park
    /// (`server.park_after`); `None`: never.
    after: Option<Duration>,
    list: Mutex<List>,
}

#[derive(Default)]
struct List {
    /// The connections that may park and wait idle with a task (and those
    /// since ended, busy or parked, dropped at the next look).
    conns: Vec<Weak<ConnState>>,
    /// Each parked connection's cell, in the order they parked (and cells
    /// since woken, dropped when a look reaches them).
    cells: VecDeque<Weak<Cell>>,
    /// The cells the last look at all of them kept, or fewer: as many as
    /// are left, if the looks since dropped more from the front.
    kept: usize,
    /// Shutting down: no more connections park.
    closed: bool,
}

/// What a listener's connections share, from which a parked one's
/// [`Connection`] is made again.
pub struct Listener {
    pub builders: Arc<Builders>,
    pub app: Arc<App>,
    pub kind: Kind,
    /// The listener's graceful and immediate stops ([`Stops`] less the
    /// parking, which holds this).
    pub graceful: CancellationToken,
    pub now: CancellationToken,
    pub said: Arc<Said>,
}

/// A parked connection: its task's state, less the task: what of
/// [`Connection`] is its own (the rest is its listener's, in
/// [`Parking`]) but the watchdog (whose timer would keep the task), and
/// its slot. Small: every parked connection holds one.
struct Parked {
    wire: Shared,
    parking: Arc<Parking>,
    state: Arc<ConnState>,
    /// Its slot and its count among the open connections ([`Held`], whose
    /// count a connection of the main listener, the only one that parks,
    /// always has: kept unwrapped, the cell is a size class smaller).
    slot: OwnedSemaphorePermit,
    open: ConnectionGuard,
    /// Keeps the listener's drain waiting for the connection.
    token: TaskTrackerToken,
}

/// The waker a parked connection's socket holds: its first wake takes the
/// connection out and spawns its task.
struct Cell(Mutex<Option<Parked>>);

impl Cell {
    fn take(&self) -> Option<Parked> {
        self.0.lock().expect("parked lock").take()
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        // Dropped unwoken (the runtime going away): the connection closes.
        if let Ok(Some(parked)) = self.0.get_mut() {
            parked.parking.parked.decrement(1.0);
        }
    }
}

impl Wake for Cell {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if let Some(parked) = self.take() {
            parked.resume();
        }
    }
}

impl Parking {
    /// For a listener whose connections `tracker` tracks; made inside the
    /// runtime that serves them.
    pub fn new(listener: Listener, tracker: TaskTracker, after: Option<Duration>) -> Parking {
        let parked = crate::metrics::parked_connections();
        let list = Mutex::new(List::default());
        Parking { handle: Handle::current(), listener, parked, tracker, after, list }
    }

    /// A connection's stops: the listener's, and this parking.
    pub fn stops(self: &Arc<Self>) -> Stops {
        let l = &self.listener;
        Stops { graceful: l.graceful.clone(), now: l.now.clone(), said: l.said.clone(), parking: self.clone() }
    }

    /// The listener's [`Said`].
    pub fn said(&self) -> &Said {
        &self.listener.said
    }

    /// Whether its connections park at all.
    pub fn parks(&self) -> bool {
        self.after.is_some()
    }

    /// A new connection that may park.
    pub fn watch(&self, state: &Arc<ConnState>) {
        self.list.lock().expect("parking lock").conns.push(Arc::downgrade(state));
    }

    /// Every half of `park_after` (at least 10 ms, at most a second): asks
    /// the connections idle that long to park, and closes parked ones whose
    /// idle timeout has passed (they are late by at most twice that), until
    /// `stop`; then closes them all and lets no more park.
    pub async fn run(self: Arc<Self>, stop: CancellationToken) {
        let Some(after) = self.after else { return };
        let every = (after / 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = stop.cancelled() => break,
            }
            self.sweep(after, false);
        }
        self.sweep(after, true);
    }

    /// Asks connections idle for `after` to park, drops what ended, is busy,
    /// parked or woke, and closes the parked connections whose idle timeout has
    /// passed (all of them, `closing`). The clock is read once for all.
    ///
    /// The parked connections are looked at from the first that parked,
    /// up to the first still waiting for its idle timeout, not further:
    /// a connection is asked to park at the first look after it has been
    /// idle for `after`, so one that parked later went idle later, or
    /// earlier by less than the time between looks, and as a listener's
    /// connections share one idle timeout, its timeout passes at most that
    /// much sooner. A look takes all of them when shutting down, and when
    /// the cells have doubled since the last such look (or since a look
    /// left fewer): that drops the cells woken behind a waiting one (a
    /// connection that parks and wakes often leaves one at each park) at a
    /// cost of a few per park.
    fn sweep(&self, after: Duration, closing: bool) {
        let mut expired = Vec::new();
        let now = tokio::time::Instant::now();
        {
            let mut list = self.list.lock().expect("parking lock");
            list.closed |= closing;
            list.conns.retain(|state| match state.upgrade() {
                Some(state) if state.unlist() => false,
                Some(state) => {
                    if !closing {
                        state.ask_to_park(now, after);
                    }
                    true
                }
                None => false,
            });
            let mut look = |cell: &Weak<Cell>| match done(cell, now, closing) {
                Some(parked) => {
                    expired.extend(parked);
                    false
                }
                None => true,
            };
            if closing || list.cells.len() > 2 * list.kept + 64 {
                list.cells.retain(look);
                list.kept = list.cells.len();
            } else {
                while list.cells.front().is_some_and(|cell| !look(cell)) {
                    list.cells.pop_front();
                }
                // Doubled since the parked ones that are left, not since a
                // burst long gone: its size would let as many woken cells
                // again pile up behind one still waiting.
                list.kept = list.kept.min(list.cells.len());
            }
        }
        // Dropped here, outside the locks: an idle connection closes
        // quietly (a FIN), as its task would close it.
        self.parked.decrement(expired.len() as f64);
        drop(expired);
    }
}

/// What a look finds in a parked connection's cell: `None` while the
/// connection waits parked for less than its idle timeout (not `closing`),
/// else that the cell is done with, and the connection to close if it was
/// still parked (not woken meanwhile).
fn done(cell: &Weak<Cell>, now: tokio::time::Instant, closing: bool) -> Option<Option<Parked>> {
    let Some(cell) = cell.upgrade() else { return Some(None) };
    let mut slot = cell.0.lock().expect("parked lock");
    match &*slot {
        Some(p) if closing || p.state.idle_expired(now) => Some(slot.take()),
        Some(_) => None,
        None => Some(None),
    }
}

/// Parks `own`'s connection, taking its slot (`true`: its task may end),
/// or leaves it to its task: its socket is readable already, or the
/// listener is shutting down.
pub(super) fn park(own: &Own<'_>, stops: &Stops, held: &mut Option<Held>) -> bool {
    let (slot, open) = match held.take() {
        Some((slot, Some(open))) => (slot, open),
        other => {
            *held = other;
            return false;
        }
    };
    let parked = Parked {
        wire: own.wire.clone(),
        parking: stops.parking.clone(),
        state: own.state.clone(),
        slot,
        open,
        token: stops.parking.tracker.token(),
    };
    match parked.park() {
        None => true,
        Some(parked) => {
            *held = Some((parked.slot, Some(parked.open)));
            false
        }
    }
}

impl Parked {
    /// Parks the connection until its socket is readable; gives it back if
    /// it is already (or the listener is shutting down).
    fn park(self) -> Option<Parked> {
        let parking = self.parking.clone();
        // The task's wakers left behind would keep its memory.
        if let Some(interims) = self.state.peer.interims.get() {
            interims.forget_waiter();
        }
        self.state.peer.timer.forget();
        self.state.forget_park_waker();
        let cell = Arc::new(Cell(Mutex::new(None)));
        let waker = Waker::from(cell.clone());
        {
            // Filled before the waker can run: a wake waits for this lock.
            let mut slot = cell.0.lock().expect("parked lock");
            let mut wire = self.wire.lock();
            wire.shed();
            let ready = match &wire.io {
                ClientStream::Plain(io) => io.stream().poll_read_ready(&mut Context::from_waker(&waker)),
                ClientStream::Tls(_) => Poll::Ready(Ok(())),
            };
            drop(wire);
            if ready.is_ready() {
                return Some(self);
            }
            parking.parked.increment(1.0);
            self.state.set_parked();
            *slot = Some(self);
        }
        let mut list = parking.list.lock().expect("parking lock");
        if list.closed {
            drop(list);
            // Unless a wake took it meanwhile.
            return match cell.take() {
                Some(parked) => {
                    parking.parked.decrement(1.0);
                    // Shutting down: none is asked to park again.
                    parked.state.unpark();
                    Some(parked)
                }
                None => None,
            };
        }
        list.cells.push_back(Arc::downgrade(&cell));
        None
    }

    /// Spawns the connection's task again, where it left off.
    fn resume(self) {
        let parking = self.parking.clone();
        parking.parked.decrement(1.0);
        parking.handle.spawn(parking.tracker.track_future(self.serve()));
    }

    async fn serve(self) {
        let Parked { wire, parking, state, slot, open, token } = self;
        drop(token);
        if state.unpark() {
            parking.watch(&state);
        }
        let l = &parking.listener;
        let (builders, app, kind) = (l.builders.clone(), l.app.clone(), l.kind);
        let stops = parking.stops();
        // The canonical address (as the access log writes it): a parked
        // connection keeps no room for a whole socket address.
        let addr = SocketAddr::new(state.peer.ip, state.port);
        let watchdog = Watchdog::new(state.clone());
        let mut c = Connection { builders, addr, app, kind, stops, state, watchdog };
        // It parked, so it may again.
        super::serve_wire(wire, &mut c, &mut Some((slot, Some(open))), true).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::super::wire::Wire;
    use super::Cell;
    use crate::listener::conn::ConnState;

    /// A parked connection keeps, besides tokio's registration of its
    /// socket, its state, its wire and its cell: each within the allocator
    /// size class it fits today (with the `Arc`'s two counts and malloc's
    /// word, 256, 176 and 80 bytes; see docs/memory.md), so that a field
    /// added to one of them is a decision, not an accident.
    #[test]
    fn what_a_parked_connection_keeps_fits_its_size_classes() {
        assert!(size_of::<ConnState>() <= 232, "ConnState: {} bytes", size_of::<ConnState>());
        assert!(size_of::<Mutex<Wire>>() <= 152, "the wire: {} bytes", size_of::<Mutex<Wire>>());
        assert!(size_of::<Cell>() <= 56, "the cell: {} bytes", size_of::<Cell>());
    }
}
