//! The request path's side of `max_requests = "auto"`: the window of
//! latency samples being filled, in atomics (no lock per request), handed
//! to the controller ([`super::adaptive::Gradient`]) by the answer that
//! closes the window; and the queue's overload state ([`Codel`]).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

use super::adaptive::{Cadence, WINDOW, Window};

/// A window's samples and their total, in one word so that one atomic add
/// records an answer: the count above `TOTAL_BITS`, microseconds below.
const TOTAL_BITS: u32 = 40;
/// The longest sample, in microseconds: past it a sample says no more (the
/// gradient is at its floor long before).
const LONGEST_SAMPLE_US: u64 = 60_000_000;
/// The samples a window takes at most: with each at most the longest, the
/// total cannot overflow into the count (room is left for answers that
/// pass the check at once on other threads). An `auto_max` in the tens of
/// thousands and a route timeout past a minute could otherwise make more
/// such answers close in one window.
const MOST_SAMPLES: u64 = ((1 << TOTAL_BITS) / LONGEST_SAMPLE_US) * 7 / 8;

/// The window being filled, and the requests in flight.
pub(super) struct Learned {
    /// On while `max_requests = "auto"` (a reload may switch it).
    pub(super) on: AtomicBool,
    /// A request was let in at once since the queue's last turn (CoDel
    /// counts it as a wait of nothing).
    pub(super) at_once: AtomicBool,
    origin: Instant,
    /// When the window ends, in microseconds since `origin`.
    window_end_us: AtomicU64,
    /// How long a window lasts (see [`Learned::set_window`]).
    window_us: AtomicU64,
    packed: AtomicU64,
    busiest: AtomicUsize,
    /// During the slow start, the latency bound of an answer that proves
    /// its load (see `Gradient::ramp_bound`), in microseconds; 0 after.
    ramp_us: AtomicU64,
    /// During the slow start, an answer that proves a load above this
    /// hands its proof on at once (see `Gradient::cadence`).
    raises_past: AtomicUsize,
    /// While the minimum is measured, every answer closes its window.
    every_answer: AtomicBool,
    /// The largest load proved in the window being filled.
    proven: AtomicUsize,
    in_flight: AtomicUsize,
    /// Bumped when a measurement of the minimum starts: a request admitted
    /// before it is not sampled (its latency is of the load before).
    epoch: AtomicU64,
}

impl Learned {
    pub(super) fn new(on: bool) -> Self {
        Learned {
            on: AtomicBool::new(on),
            at_once: AtomicBool::new(false),
            origin: Instant::now(),
            window_end_us: AtomicU64::new(WINDOW.as_micros() as u64),
            window_us: AtomicU64::new(WINDOW.as_micros() as u64),
            packed: AtomicU64::new(0),
            busiest: AtomicUsize::new(0),
            ramp_us: AtomicU64::new(0),
            raises_past: AtomicUsize::new(usize::MAX),
            every_answer: AtomicBool::new(false),
            proven: AtomicUsize::new(0),
            in_flight: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
        }
    }

    /// A request admitted: its ticket, for [`Learned::sample`].
    pub(super) fn admitted(&self) -> Ticket {
        let load = self.in_flight.fetch_add(1, Relaxed) + 1;
        self.busiest.fetch_max(load, Relaxed);
        Ticket { epoch: self.epoch.load(Relaxed), load }
    }

    pub(super) fn released(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
    }

    /// Since the controller's origin, for its clock.
    pub(super) fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.origin)
    }

    /// An answer of a request admitted with `ticket` took `took`, at
    /// `now`: the window that ends with it, when it is the first past the
    /// end (or while the minimum is measured, any); or, during the slow
    /// start, its proof alone when that raises the limit (a window of no
    /// answers, see `Gradient::cadence`).
    pub(super) fn sample(&self, took: Duration, ticket: Ticket, now: Instant) -> Option<Window> {
        if ticket.epoch != self.epoch.load(Relaxed) {
            return None;
        }
        let us = (took.as_micros() as u64).min(LONGEST_SAMPLE_US);
        if self.packed.load(Relaxed) >> TOTAL_BITS < MOST_SAMPLES {
            self.packed.fetch_add((1 << TOTAL_BITS) | us, Relaxed);
        }
        let ramp = self.ramp_us.load(Relaxed);
        let proves = ramp != 0 && us <= ramp;
        if proves {
            self.proven.fetch_max(ticket.load, Relaxed);
        }
        let every = self.every_answer.load(Relaxed);
        let now_us = self.elapsed(now).as_micros() as u64;
        let end = self.window_end_us.load(Relaxed);
        // One answer closes the window; the others go on filling the next.
        if (now_us < end && !every)
            || self
                .window_end_us
                .compare_exchange(end, now_us + self.window_us.load(Relaxed), Relaxed, Relaxed)
                .is_err()
        {
            // A proof that raises the limit is handed on at once, alone; the
            // window goes on filling, to be judged whole at its end.
            let raises = proves && self.raises_past.fetch_max(ticket.load, Relaxed) < ticket.load;
            let busiest = self.busiest.load(Relaxed);
            return raises.then_some(Window { samples: 0, total: Duration::ZERO, busiest, proven: ticket.load });
        }
        let packed = self.packed.swap(0, Relaxed);
        let busiest = self.busiest.swap(self.in_flight.load(Relaxed), Relaxed);
        let total = Duration::from_micros(packed & ((1 << TOTAL_BITS) - 1));
        let proven = self.proven.swap(0, Relaxed);
        Some(Window { samples: packed >> TOTAL_BITS, total, busiest, proven })
    }

    /// The controller's next window (`Gradient::window_len`), the slow
    /// start's bound on an answer that proves its load and the load whose
    /// proof closes a window at once, and whether every answer does
    /// (`Gradient::cadence`). Once the gradient
    /// rules, windows last Envoy's 100 ms, or the upstream's minimum
    /// latency when that is longer (a departure): a shorter window would
    /// judge a limit by answers to requests sent under the one before, and
    /// let it grow several times over before the first answer to the growth
    /// came back.
    pub(super) fn set_window(&self, cadence: Cadence) {
        self.window_us.store(cadence.len.as_micros() as u64, Relaxed);
        let (ramp_us, raises_past) =
            cadence.ramp.map_or((0, usize::MAX), |(r, past)| ((r.as_micros() as u64).max(1), past));
        self.ramp_us.store(ramp_us, Relaxed);
        self.raises_past.store(raises_past, Relaxed);
        self.every_answer.store(cadence.every_answer, Relaxed);
    }

    /// A measurement of the minimum starts: answers to requests admitted
    /// before it no longer count.
    pub(super) fn new_epoch(&self) {
        self.epoch.fetch_add(1, Relaxed);
        self.packed.store(0, Relaxed);
    }
}

/// What a sampled request carries from its admission to its answer.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ticket {
    /// Answers to requests admitted before a measurement began are not
    /// sampled.
    epoch: u64,
    /// Requests in flight when it was admitted, itself included.
    load: usize,
}

/// CoDel's interval: a queue that has not once been short for this long
/// is a standing queue.
pub(super) const INTERVAL: Duration = Duration::from_millis(100);
/// CoDel's target, the least: the standing delay accepted.
const TARGET: Duration = Duration::from_millis(5);

/// The queue's overload state, as folly's `Codel` (Facebook's servers)
/// keeps it, after CoDel (RFC 8289): at the end of each `INTERVAL`, the
/// queue is overloaded for the next one when the shortest wait of the one
/// that ended was above the target; while overloaded, a request whose turn
/// comes after more than twice the target is turned away instead (folly:
/// "slough"), which drains a standing queue at once and serves the requests
/// that can still be served in time. Pure: the caller keeps it under the
/// admission's lock and gives the time.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Codel {
    interval_end: Duration,
    min_delay: Duration,
    overloaded: bool,
}

impl Codel {
    /// A request's turn came after waiting `delay`, at `now`, with `target`
    /// (see [`target`]): whether it is turned away.
    pub(super) fn dequeued(&mut self, delay: Duration, now: Duration, target: Duration) -> bool {
        if now > self.interval_end {
            self.interval_end = now + INTERVAL;
            self.overloaded = self.min_delay > target;
            // More than one request must come in an interval before any is
            // turned away.
            self.min_delay = delay;
            return false;
        }
        self.min_delay = self.min_delay.min(delay);
        self.overloaded && delay > target * 2
    }

    /// The queue emptied: no queue stands (RFC 8289 leaves its dropping
    /// state on an empty queue), and the interval under way saw a wait of
    /// nothing. Without it, the last interval's verdict stayed on an idle
    /// queue, shown as overloaded for as long as no request waited again.
    pub(super) fn emptied(&mut self) {
        self.overloaded = false;
        self.min_delay = Duration::ZERO;
    }

    pub(super) fn overloaded(&self) -> bool {
        self.overloaded
    }
}

/// CoDel's target for an upstream: 5 ms, or the time between two slots
/// freeing (its typical latency over the limit) when that is longer. A
/// waiter turned away sooner would leave the slot that frees next with no
/// one to take it, and the upstream idle: folly's 5 ms suits servers that
/// answer in milliseconds, not a service whose workers take 100 ms each.
pub(super) fn target(typical: Duration, limit: usize) -> Duration {
    TARGET.max(typical / limit.max(1) as u32)
}

#[cfg(test)]
mod tests {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    use super::*;
    use crate::upstream::adaptive::{Bounds, Gradient};

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn codel_turns_away_only_after_a_whole_interval_above_the_target() {
        // (time, delay, turned away, overloaded after), target 5 ms.
        let steps = [
            (1, 0, false, false),   // first interval opens
            (50, 20, false, false), // above the target, but the interval is not over
            (90, 30, false, false),
            (102, 40, false, false), // interval over, its shortest wait 0: fine
            (150, 40, false, false),
            (203, 12, false, true), // interval over, shortest 40 ms: overloaded
            (210, 8, false, true),  // within twice the target
            (220, 11, true, true),  // past twice the target: turned away
            (250, 3, false, true),
            (304, 30, false, false), // the last interval's shortest was 3 ms: over
            (320, 30, false, false),
        ];
        let mut c = Codel::default();
        for (at, delay, away, overloaded) in steps {
            assert_eq!(c.dequeued(delay * MS, at * MS, 5 * MS), away, "at {at} ms");
            assert_eq!(c.overloaded(), overloaded, "at {at} ms");
        }
    }

    /// An emptied queue is not overloaded, and the interval under way,
    /// which saw it empty, does not judge it so at its end.
    #[test]
    fn an_emptied_queue_stands_no_more() {
        let mut c = Codel::default();
        for (at, delay) in [(1, 0), (50, 40), (102, 40), (150, 40), (203, 40)] {
            c.dequeued(delay * MS, at * MS, 5 * MS);
        }
        assert!(c.overloaded());
        c.emptied();
        assert!(!c.overloaded());
        // The next interval's end: its waits were 40 ms, but it saw the
        // queue empty.
        c.dequeued(40 * MS, 250 * MS, 5 * MS);
        assert!(!c.dequeued(40 * MS, 310 * MS, 5 * MS));
        assert!(!c.overloaded());
    }

    #[test]
    fn the_target_is_the_time_between_two_slots_freeing_at_least_5_ms() {
        // (typical latency, limit, target)
        let cases = [(100, 8, 12.5), (100, 40, 5.0), (1000, 1, 1000.0), (0, 0, 5.0), (20, 2, 10.0)];
        for (typical, limit, want) in cases {
            assert_eq!(target(typical * MS, limit), MS.mul_f64(want), "{typical} ms / {limit}");
        }
    }

    #[test]
    fn a_window_closes_once_with_its_samples() {
        let l = Learned::new(true);
        let epoch = l.admitted();
        l.admitted();
        let start = l.origin;
        assert_eq!(l.sample(30 * MS, epoch, start + 10 * MS), None);
        assert_eq!(l.sample(50 * MS, epoch, start + 20 * MS), None);
        let w = l.sample(70 * MS, epoch, start + 101 * MS).expect("the window ended");
        assert_eq!(w, Window { samples: 3, total: 150 * MS, busiest: 2, proven: 0 });
        assert_eq!(l.sample(10 * MS, epoch, start + 150 * MS), None, "the next window ends 100 ms later");
        // A measurement began: answers to requests admitted before it do
        // not count.
        l.new_epoch();
        assert_eq!(l.sample(10 * MS, epoch, start + 400 * MS), None);
        let w = l.sample(10 * MS, l.admitted(), start + 401 * MS).expect("the window ended");
        assert_eq!((w.samples, w.busiest), (1, 3));
    }

    /// Tens of thousands of answers past the longest sample in one window
    /// (a huge `auto_max`, a route timeout past a minute): the window keeps
    /// a count it can hold, and their mean is the longest sample. Their
    /// total overflowed into the count before.
    #[test]
    fn a_window_of_very_many_very_long_answers_keeps_its_mean() {
        let l = Learned::new(true);
        let (ticket, start) = (l.admitted(), l.origin);
        for _ in 0..20_000 {
            assert_eq!(l.sample(120_000 * MS, ticket, start + 10 * MS), None);
        }
        let w = l.sample(120_000 * MS, ticket, start + 101 * MS).expect("the window ended");
        assert_eq!(w.samples, MOST_SAMPLES, "{w:?}");
        assert_eq!(w.total / w.samples as u32, Duration::from_micros(LONGEST_SAMPLE_US), "{w:?}");
    }

    /// During the slow start, an answer within the bound proves the load
    /// its request was sent under; a slower one proves nothing, and after
    /// the slow start nothing is proved.
    #[test]
    fn a_quick_answer_proves_the_load_it_was_sent_under() {
        let l = Learned::new(true);
        let start = l.origin;
        l.set_window(Cadence { len: 100 * MS, ramp: Some((110 * MS, usize::MAX)), every_answer: false });
        let tickets: Vec<Ticket> = (0..4).map(|_| l.admitted()).collect();
        assert_eq!(tickets.iter().map(|t| t.load).collect::<Vec<_>>(), [1, 2, 3, 4]);
        // (answer of, took, at, the window's proven load when it closes)
        let steps = [(1, 100, 10, None), (3, 120, 20, None), (0, 105, 101, Some(2)), (2, 90, 150, None)];
        for (i, took, at, proven) in steps {
            let w = l.sample(took * MS, tickets[i], start + at * MS);
            assert_eq!(w.map(|w| w.proven), proven, "answer of {i} at {at} ms");
        }
        l.set_window(Cadence { len: 100 * MS, ramp: None, every_answer: false });
        let w = l.sample(10 * MS, l.admitted(), start + 250 * MS).expect("the window ended");
        assert_eq!(w.proven, 3, "the window filled during the slow start");
        let w = l.sample(10 * MS, l.admitted(), start + 400 * MS).expect("the window ended");
        assert_eq!(w.proven, 0, "no slow start, no proof");
    }

    /// An answer that would change what the controller does is handed on
    /// before the window's end: during the slow start a proof of a load
    /// past the one given, alone (the window goes on filling); while the
    /// minimum is measured, any answer, closing its window.
    #[test]
    fn an_answer_that_changes_the_limit_is_handed_on_at_once() {
        let l = Learned::new(true);
        let start = l.origin;
        l.set_window(Cadence { len: 100 * MS, ramp: Some((110 * MS, 2)), every_answer: false });
        let tickets: Vec<Ticket> = (0..4).map(|_| l.admitted()).collect();
        // (answer of, took, at, the samples and proven load of the window
        // it closes)
        let steps = [
            (1, 100, 10, None),         // proves 2, not past 2
            (3, 120, 20, None),         // too slow to prove 4
            (2, 100, 30, Some((0, 3))), // proves 3: handed on at once
            (0, 100, 40, None),         // proves 1
        ];
        for (i, took, at, closed) in steps {
            let w = l.sample(took * MS, tickets[i], start + at * MS);
            assert_eq!(w.map(|w| (w.samples, w.proven)), closed, "answer of {i} at {at} ms");
        }
        l.set_window(Cadence { len: 100 * MS, ramp: None, every_answer: true });
        let w = l.sample(500 * MS, l.admitted(), start + 50 * MS).expect("every answer closes its window");
        assert_eq!((w.samples, w.proven), (5, 3), "the window went on filling");
        let w = l.sample(500 * MS, l.admitted(), start + 51 * MS).expect("every answer closes its window");
        assert_eq!(w.samples, 1);
    }

    /// The request path and the controller together, answer by answer, as
    /// `Admission` joins them: an upstream that answers every request after
    /// `latency` and up to `jitter` more, and `clients` clients that send
    /// again at once when answered or refused, so that every slot the limit
    /// gives is taken at once. The limits set, with their times, until
    /// `until`, and when the first minimum was measured.
    fn closed_loop(
        latency: Duration,
        jitter: u64,
        clients: usize,
        until: Duration,
    ) -> (Vec<(Duration, usize)>, Duration) {
        let l = Learned::new(true);
        let mut g = Gradient::new(Bounds { min: 3, max: 1000 }, 7, Duration::ZERO);
        let mut rng = fastrand::Rng::with_seed(1);
        // (answered at, sent at, the ticket's epoch and load)
        let mut answers = BinaryHeap::new();
        let (mut in_flight, mut now, mut measured) = (0, Duration::ZERO, until);
        let mut limits = Vec::new();
        loop {
            while in_flight < g.limit().min(clients) {
                let t = l.admitted();
                in_flight += 1;
                answers.push(Reverse((now + latency + MS * rng.u64(0..=jitter) as u32, now, t.epoch, t.load)));
            }
            let Some(Reverse((at, sent, epoch, load))) = answers.pop().filter(|a| a.0.0 <= until) else { break };
            now = at;
            if let Some(w) = l.sample(at - sent, Ticket { epoch, load }, l.origin + at) {
                let was_measuring = g.measuring();
                let limit = g.window(w, at);
                if g.measuring() && !was_measuring {
                    l.new_epoch();
                }
                if g.min_rtt().is_some() && measured == until {
                    measured = at;
                }
                l.set_window(g.cadence());
                limits.push((at, limit));
            }
            l.released();
            in_flight -= 1;
        }
        (limits, measured)
    }

    /// From a cold start, in front of an upstream whose latency does not
    /// change with load and clients enough to fill any limit, the slow
    /// start doubles the limit once a round trip (and a window), though the
    /// answers come back in bursts (all those sent when the limit rose, a
    /// round trip later): the answer that proves a load above half the
    /// limit is acted on at once, not at the first answer past the window's
    /// end.
    #[test]
    fn with_answers_in_bursts_the_slow_start_doubles_each_round_trip() {
        // (latency, jitter in ms, clients)
        let cases =
            [(1000 * MS, 0, 1000), (1000 * MS, 10, 1000), (400 * MS, 5, 300), (100 * MS, 2, 1000), (20 * MS, 1, 64)];
        for (latency, jitter, clients) in cases {
            let until = Duration::from_secs(60);
            let (limits, measured) = closed_loop(latency, jitter, clients, until);
            let target = clients.min(1000);
            let doublings = (target as f64 / 3.0).log2().ceil() as u32;
            let allowed = measured + (latency + MS * jitter as u32 + WINDOW) * doublings;
            let reached = limits.iter().find(|&&(_, l)| l >= target).map(|&(at, _)| at);
            assert!(
                reached.is_some_and(|r| r <= allowed),
                "{clients} clients at {latency:?}: measured at {measured:?}, reached {target} at {reached:?}, \
                 allowed {allowed:?}: {limits:?}"
            );
        }
    }
}
