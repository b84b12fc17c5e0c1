//! The gradient controller against a model upstream: `workers` serving
//! one request each for `service`, the rest waiting in its own backlog, so
//! that latency grows with the requests in flight past the workers. The
//! clients keep `offered` requests outstanding; the limit lets through what
//! it allows.

use std::time::Duration;

use super::{Bounds, Gradient, WINDOW, Window};

const DEFAULT: Bounds = Bounds { min: 3, max: 1000 };
const MS: Duration = Duration::from_millis(1);

/// What the model upstream does with load.
#[derive(Clone, Copy)]
enum Upstream {
    /// `workers` × `service` each: latency grows past the workers.
    Workers(usize, Duration),
    /// The same latency at any load (an upstream that scales, or a cache).
    Flat(Duration),
    /// Every request times out after this long (what the gateway samples).
    TimesOut(Duration),
    /// Every request is reset: no answers, no samples.
    Resets,
}

impl Upstream {
    fn latency(self, in_flight: usize) -> Option<Duration> {
        match self {
            Upstream::Workers(w, s) => Some(s.mul_f64((in_flight as f64 / w as f64).max(1.0))),
            Upstream::Flat(s) | Upstream::TimesOut(s) => Some(s),
            Upstream::Resets => None,
        }
    }
}

/// A run of the model, window by window, keeping the clock and the
/// fraction of an answer each window carries to the next.
struct Sim {
    g: Gradient,
    now: Duration,
    carry: f64,
}

impl Sim {
    fn new(bounds: Bounds) -> Self {
        Sim { g: Gradient::new(bounds, 7), now: Duration::ZERO, carry: 0.0 }
    }

    /// `windows` windows of `up` offered `offered` requests at once; the
    /// limits after each.
    fn run(&mut self, up: Upstream, offered: usize, windows: usize) -> Vec<usize> {
        (0..windows)
            .map(|_| {
                let in_flight = offered.min(self.g.limit());
                let w = match up.latency(in_flight) {
                    Some(latency) => {
                        self.carry += in_flight as f64 * WINDOW.as_secs_f64() / latency.as_secs_f64();
                        let samples = self.carry.floor();
                        self.carry -= samples;
                        Window { samples: samples as u64, total: latency.mul_f64(samples), busiest: in_flight }
                    }
                    None => Window { samples: 0, total: Duration::ZERO, busiest: in_flight },
                };
                self.now += WINDOW;
                self.g.window(w, self.now)
            })
            .collect()
    }
}

#[test]
fn starts_at_the_floor_measuring_then_learns_the_minimum() {
    let mut sim = Sim::new(DEFAULT);
    assert!(sim.g.measuring());
    assert_eq!(sim.g.limit(), 3);
    assert_eq!(sim.g.min_rtt(), None);
    // 3 in flight at 100 ms: 3 answers a window, 50 answers in 17 windows.
    let limits = sim.run(Upstream::Workers(8, 100 * MS), 100, 17);
    assert!(limits.iter().all(|&l| l == 3), "{limits:?}");
    assert!(!sim.g.measuring());
    assert_eq!(ms(sim.g.min_rtt()), 100);
}

/// Under overload (clients offering far more than the upstream's workers),
/// the limit settles at the workers plus the little queue the algorithm
/// keeps to keep them busy (the 25% buffer and the headroom): never below
/// the workers (capacity thrown away), never at the clients' count (no
/// protection).
#[test]
fn settles_near_the_upstreams_capacity() {
    // (workers, service, offered, bounds, lowest and highest limit allowed
    // over the last 5 s of 20 s)
    let cases = [
        (8, 100 * MS, 100, DEFAULT, 8, 18),
        (4, 100 * MS, 100, DEFAULT, 4, 10),
        (16, 100 * MS, 200, DEFAULT, 16, 32),
        (32, 20 * MS, 500, DEFAULT, 32, 56),
        (64, 200 * MS, 1000, DEFAULT, 64, 100),
        (1, 50 * MS, 20, Bounds { min: 1, max: 1000 }, 1, 4),
        (8, 100 * MS, 100, Bounds { min: 3, max: 6 }, 6, 6),
    ];
    for (workers, service, offered, bounds, low, high) in cases {
        let mut sim = Sim::new(bounds);
        let limits = sim.run(Upstream::Workers(workers, service), offered, 200);
        let tail = &limits[150..];
        let (lo, hi) = (tail.iter().min().unwrap(), tail.iter().max().unwrap());
        assert!(
            *lo >= low && *hi <= high,
            "{workers} workers × {service:?}: limits {lo}..={hi}, wanted {low}..={high}: {limits:?}"
        );
    }
}

/// The upstream's capacity halves, then quadruples, mid-run: within 10 s
/// (100 windows) of each change the limit follows (8 workers, then 4,
/// then 16).
#[test]
fn follows_the_capacity_when_it_halves_and_doubles() {
    let mut sim = Sim::new(DEFAULT);
    sim.run(Upstream::Workers(8, 100 * MS), 200, 100);
    for (workers, low, high) in [(4, 4, 10), (16, 16, 32), (8, 8, 18)] {
        let limits = sim.run(Upstream::Workers(workers, 100 * MS), 200, 100);
        let tail = &limits[80..];
        assert!(
            tail.iter().all(|l| (low..=high).contains(l)),
            "{workers} workers: wanted {low}..={high}, got {limits:?}"
        );
    }
}

/// An upstream whose latency does not change with load: the limit neither
/// collapses (the gradient stays at its top) nor grows without bound (only
/// while at least half of it is in use), so that the day the upstream slows
/// down it is not at `auto_max`.
#[test]
fn a_flat_latency_neither_collapses_nor_grows_without_bound() {
    for offered in [1, 5, 20, 100] {
        let mut sim = Sim::new(DEFAULT);
        let limits = sim.run(Upstream::Flat(50 * MS), offered, 600);
        let tail = &limits[100..];
        let (lo, hi) = (*tail.iter().min().unwrap(), *tail.iter().max().unwrap());
        assert!(lo >= offered.max(3), "{offered} offered: the limit fell to {lo}");
        assert!(hi <= 4 * offered.max(3) + 8, "{offered} offered: the limit grew to {hi}");
    }
}

/// A failing upstream, as the filter counts failures: timeouts are slow
/// samples and drive the limit to the floor (and, five windows there, to a
/// new measurement of the minimum); fast 5xx answers are answers, quick
/// ones (the limit holds); resets are no samples (the limit holds).
#[test]
fn a_failing_upstream_counts_as_the_algorithm_says() {
    let mut sim = Sim::new(DEFAULT);
    sim.run(Upstream::Workers(16, 50 * MS), 200, 100);
    let learned = sim.g.limit();
    assert!(learned >= 16, "{learned}");

    let mut timeouts = sim.clone_state();
    let limits = timeouts.run(Upstream::TimesOut(Duration::from_secs(1)), 200, 30);
    assert_eq!(limits[10], 3, "timeouts did not drive the limit to the floor: {limits:?}");
    assert!(timeouts.g.measuring(), "five windows at the floor did not start a measurement: {limits:?}");

    let mut fast_errors = sim.clone_state();
    let limits = fast_errors.run(Upstream::Flat(MS), 200, 50);
    assert!(limits.iter().all(|&l| l >= learned), "fast 5xx answers lowered the limit: {limits:?}");

    let mut resets = sim.clone_state();
    let limits = resets.run(Upstream::Resets, 200, 50);
    assert!(limits.iter().all(|&l| l == learned), "resets moved the limit: {limits:?}");
}

/// The minimum RTT is measured again every minute or so (jittered): a
/// slower upstream is not for ever measured against its old minimum.
#[test]
fn measures_the_minimum_again_about_every_minute() {
    let mut sim = Sim::new(DEFAULT);
    sim.run(Upstream::Workers(8, 100 * MS), 100, 100);
    assert_eq!(ms(sim.g.min_rtt()), 100);
    // A deploy makes each request take 200 ms: the limit shrinks against
    // the old minimum, and the next measurement finds the new one.
    let limits = sim.run(Upstream::Workers(8, 200 * MS), 100, 700);
    assert_eq!(ms(sim.g.min_rtt()), 200, "{limits:?}");
    let tail = &limits[limits.len() - 50..];
    assert!(tail.iter().all(|l| (8..=18).contains(l)), "{tail:?}");
}

/// A reload's bounds apply to the learned limit at once, and while the
/// minimum is measured the floor is the new one.
#[test]
fn new_bounds_keep_the_learned_limit_within_them() {
    let mut sim = Sim::new(DEFAULT);
    sim.run(Upstream::Workers(16, 100 * MS), 200, 100);
    let learned = sim.g.limit();
    // (min, max, limit after)
    for (min, max, want) in [(3, 1000, learned), (1, 10, 10), (40, 100, 40), (3, learned, learned)] {
        let mut g = sim.g.clone();
        g.set_bounds(Bounds { min, max });
        assert_eq!(g.limit(), want, "bounds {min}..={max}");
    }
    let mut fresh = Gradient::new(DEFAULT, 1);
    fresh.set_bounds(Bounds { min: 5, max: 10 });
    assert_eq!((fresh.limit(), fresh.measuring()), (5, true));
}

/// Whole milliseconds, rounded (the mean is a float division).
fn ms(d: Option<Duration>) -> u128 {
    (d.expect("measured").as_secs_f64() * 1000.0).round() as u128
}

impl Sim {
    fn clone_state(&self) -> Sim {
        Sim { g: self.g.clone(), now: self.now, carry: self.carry }
    }
}
