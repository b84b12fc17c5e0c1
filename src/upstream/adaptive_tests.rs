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

/// A run of the model, window by window, keeping the clock, the fraction
/// of an answer each window carries to the next, and the load each window
/// sent its requests under (`sent`: start, end, requests in flight).
struct Sim {
    g: Gradient,
    now: Duration,
    carry: f64,
    sent: Vec<(Duration, Duration, usize)>,
}

impl Sim {
    fn new(bounds: Bounds) -> Self {
        Sim { g: Gradient::new(bounds, 7, Duration::ZERO), now: Duration::ZERO, carry: 0.0, sent: Vec::new() }
    }

    /// `windows` windows of `up` offered `offered` requests at once; the
    /// limits after each.
    fn run(&mut self, up: Upstream, offered: usize, windows: usize) -> Vec<usize> {
        (0..windows)
            .map(|_| {
                let (start, window) = (self.now, self.g.window_len());
                let in_flight = offered.min(self.g.limit());
                self.now += window;
                self.sent.push((start, self.now, in_flight));
                let w = match up.latency(in_flight) {
                    Some(latency) => {
                        self.carry += in_flight as f64 * window.as_secs_f64() / latency.as_secs_f64();
                        let samples = self.carry.floor();
                        self.carry -= samples;
                        let proven = self.proven(up, start.saturating_sub(latency), self.now.saturating_sub(latency));
                        Window { samples: samples as u64, total: latency.mul_f64(samples), busiest: in_flight, proven }
                    }
                    None => Window { samples: 0, total: Duration::ZERO, busiest: in_flight, proven: 0 },
                };
                self.g.window(w, self.now)
            })
            .collect()
    }

    /// The answers coming back now were sent a latency ago, between `from`
    /// and `to`: the largest load they were sent under whose answers are
    /// within the slow start's bound (the latency is the model's now; a
    /// model that lags the proof but not the rise of the latency).
    fn proven(&self, up: Upstream, from: Duration, to: Duration) -> usize {
        let Some(bound) = self.g.ramp_bound() else { return 0 };
        self.sent
            .iter()
            .filter(|&&(start, end, load)| start < to && end > from && up.latency(load).is_some_and(|l| l <= bound))
            .map(|&(_, _, load)| load)
            .max()
            .unwrap_or(0)
    }

    /// How long the limit was below `level` since `since`.
    fn below(&self, level: usize, since: Duration, limits: &[usize]) -> Duration {
        let windows = self.sent.iter().rev().take(limits.len()).rev();
        // The limit after a window is in force during the next one.
        let ends = windows.map(|&(_, end, _)| end).collect::<Vec<_>>();
        let mut held = Duration::ZERO;
        for (i, &l) in limits.iter().enumerate().take(limits.len().saturating_sub(1)) {
            if l < level && ends[i] >= since {
                held += ends[i + 1] - ends[i];
            }
        }
        held
    }
}

#[test]
fn starts_at_the_floor_measuring_then_learns_the_minimum() {
    let mut sim = Sim::new(DEFAULT);
    assert!(sim.g.measuring());
    assert_eq!(sim.g.limit(), 3);
    assert_eq!(sim.g.min_rtt(), None);
    // 3 in flight at 100 ms: 3 answers a window; after a second, its 30
    // answers will do.
    let limits = sim.run(Upstream::Workers(8, 100 * MS), 100, 10);
    assert!(limits.iter().all(|&l| l == 3), "{limits:?}");
    assert!(!sim.g.measuring());
    assert_eq!(ms(sim.g.min_rtt()), 100);
}

/// The measurement of the minimum ends after 50 answers or, past a
/// second, with a round of `auto_min` answers: an upstream that takes
/// seconds does not hold the limit at its floor for 50 × its latency /
/// `auto_min` (17 s for 1 s at 3).
#[test]
fn the_measurement_ends_after_fifty_answers_or_a_second() {
    // (floor, latency, windows at the floor, give or take one)
    let cases = [(3, 100 * MS, 10), (10, 100 * MS, 5), (3, 1000 * MS, 10), (3, 5000 * MS, 50), (1, 2000 * MS, 20)];
    for (min, latency, want) in cases {
        let mut sim = Sim::new(Bounds { min, max: 1000 });
        let mut windows = 0;
        while sim.g.measuring() && windows < 1000 {
            sim.run(Upstream::Flat(latency), 1000, 1);
            windows += 1;
        }
        assert!(
            (want..=want + 1).contains(&windows),
            "floor {min}, {latency:?}: measured in {windows} windows, wanted {want}"
        );
        assert_eq!(ms(sim.g.min_rtt()), latency.as_millis(), "floor {min}, {latency:?}");
    }
}

/// Under no overload (an upstream whose latency does not change with load,
/// clients keeping more requests in flight than the floor), the limit lets
/// all of them through soon after a cold start: a second or so measuring
/// the minimum (not 50 answers at the floor: 17 s at 1 s), then the slow
/// start, which doubles it once a round trip (and a window at most) while
/// the latency stays flat, up to the clients' count (or `auto_max`); and it
/// stays there, with no measurement of the minimum (every window confirms
/// it). The gradient's climb alone (a quarter and its root a
/// window) took 27 s to let 1000 clients through at 1 s.
#[test]
fn from_a_cold_start_a_flat_latency_doubles_the_limit_each_round_trip() {
    // (latency, clients, bounds)
    let cases = [
        (1000 * MS, 1000, DEFAULT),
        (100 * MS, 1000, DEFAULT),
        (1000 * MS, 2000, Bounds { min: 3, max: 5000 }),
        (5000 * MS, 300, DEFAULT),
        (20 * MS, 64, DEFAULT),
        (300 * MS, 5000, DEFAULT),
    ];
    for (latency, clients, bounds) in cases {
        let target = clients.min(bounds.max);
        let mut sim = Sim::new(bounds);
        let measured = Duration::from_secs(1).max(latency) + WINDOW;
        let doublings = (target as f64 / bounds.min as f64).log2().ceil() as u32;
        let allowed = measured + (latency + WINDOW) * doublings;
        let limits = sim.run(Upstream::Flat(latency), clients, 2000);
        let reached = limits.iter().position(|&l| l >= target).map(|i| sim.sent[i].1);
        assert!(
            reached.is_some_and(|r| r <= allowed),
            "{clients} clients at {latency:?}: reached {target} at {reached:?}, allowed {allowed:?}: {limits:?}"
        );
        assert!(sim.g.ramping(), "{clients} clients at {latency:?}: a flat latency ended the slow start");
        // Then for 2000 windows more (minutes), never below it.
        let since = sim.now;
        let after = sim.run(Upstream::Flat(latency), clients, 2000);
        let held = sim.below(target, since, &after);
        assert_eq!(held, Duration::ZERO, "{clients} clients at {latency:?}: held below them in {:?}", sim.now - since);
        let hi = limits.iter().chain(&after).max().unwrap();
        assert!(*hi <= (2 * clients).min(bounds.max), "{clients} clients at {latency:?}: the limit grew to {hi}");
    }
}

/// The slow start against an upstream whose latency rises with load: it
/// ends at the first window slower than the minimum's tolerance, having
/// never let through more than twice a load whose answers came back
/// quick (at most about twice the workers: a tenth more than them still
/// looks quick), and the gradient takes over from there.
#[test]
fn the_slow_start_ends_at_the_first_rise_below_twice_the_capacity() {
    // (workers, service, offered)
    let cases = [
        (8, 100 * MS, 100),
        (2, 200 * MS, 40),
        (16, 50 * MS, 1000),
        (100, 1000 * MS, 1000),
        (500, 1000 * MS, 1000),
        (4, 20 * MS, 200),
    ];
    for (workers, service, offered) in cases {
        let mut sim = Sim::new(DEFAULT);
        let limits = sim.run(Upstream::Workers(workers, service), offered, 300);
        assert!(!sim.g.ramping(), "{workers} workers × {service:?}: still in the slow start: {limits:?}");
        let quick = (workers as f64 * (1.0 + 0.1)).floor() as usize;
        let hi = *limits.iter().max().unwrap();
        assert!(
            hi <= 2 * quick.max(DEFAULT.min),
            "{workers} workers × {service:?}: the limit reached {hi}, over twice {quick}: {limits:?}"
        );
        // And the slow start does not come back, not even for a faster
        // upstream: the gradient alone, at most doubling (and its root) a
        // window, but when a measurement of the minimum gives back the
        // limit it held at the floor.
        let doubled = |l: usize| (l as f64 * 2.0 + (l as f64 * 2.0).sqrt()) as usize;
        let more = sim.run(Upstream::Flat(service / 4), offered, 100);
        assert!(!sim.g.ramping(), "{workers} workers × {service:?}: the slow start came back");
        assert!(more.windows(2).all(|w| w[0] == DEFAULT.min || w[1] <= doubled(w[0])), "{more:?}");
    }
}

/// A window whose mean is past the slow start's tolerance ends it only if
/// none of its answers came within it: a few answers delayed on their way
/// (the gateway busy turning clients away) leave the quick ones' proof,
/// where a queue inside the upstream would have delayed them all.
#[test]
fn the_slow_start_ends_on_a_window_with_no_quick_answer() {
    let mut sim = Sim::new(DEFAULT);
    sim.run(Upstream::Flat(1000 * MS), 1000, 40);
    let limit = sim.g.limit();
    assert!(sim.g.ramping() && limit > DEFAULT.min, "{limit}");
    let slow = |proven| Window { samples: 10, total: 13 * 1000 * MS, busiest: limit, proven };
    let after = sim.g.window(slow(limit), sim.now + WINDOW);
    assert!(sim.g.ramping(), "answers late by 3/10 on average, some of them quick, ended the slow start");
    assert_eq!(after, 2 * limit, "the quick ones' proof counts");
    sim.g.window(slow(0), sim.now + WINDOW * 2);
    assert!(!sim.g.ramping(), "a window of slow answers only did not end the slow start");
}

/// An upstream that is never pushed (clients fewer than half the limit):
/// the slow start proves no more than they send, so the limit stays at
/// twice their count at most, and the day more clients come it doubles
/// from there.
#[test]
fn the_slow_start_grows_only_with_the_load_sent() {
    for offered in [1, 5, 20, 100] {
        let mut sim = Sim::new(DEFAULT);
        let limits = sim.run(Upstream::Flat(200 * MS), offered, 500);
        let hi = *limits.iter().max().unwrap();
        assert!(hi <= (2 * offered).max(DEFAULT.min), "{offered} offered: the limit grew to {hi}");
        assert!(sim.g.ramping());
        let more = sim.run(Upstream::Flat(200 * MS), 1000, 60);
        assert!(more.last().is_some_and(|&l| l == 1000), "{offered}, then 1000 offered: {more:?}");
    }
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
    assert!(!timeouts.g.ramping(), "{limits:?}");
    // That measurement finds the timeouts' time, and the limit climbs from
    // the floor against it by the gradient (a quarter and its root a
    // window) as Envoy's does.
    let limits = timeouts.run(Upstream::TimesOut(Duration::from_secs(1)), 200, 30);
    assert_eq!(ms(timeouts.g.min_rtt()), 1000, "{limits:?}");
    let quarter = |l: usize| (l as f64 * 1.25 + (l as f64 * 1.25).sqrt()) as usize;
    assert!(limits.windows(2).all(|w| w[1] <= quarter(w[0])), "{limits:?}");

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

/// The minimum is measured again only when no window for a whole interval
/// (a minute or so) had latency within a tenth of it (BBR's rule for
/// ProbeRTT): an upstream whose latency does not change with load keeps
/// the limit the gradient gave it for minutes, never at the floor; one
/// whose latency rose (at the same load, so that the gradient alone does
/// not take the limit to its floor), or that was seen well below the
/// minimum, is measured again within the interval, and the limit follows.
#[test]
fn the_minimum_is_measured_again_only_when_the_latency_left_it() {
    // Flat, once the gradient rules (an upstream with workers first ended
    // the slow start): five minutes of windows, none at the floor.
    for (latency, offered) in [(100 * MS, 200), (1000 * MS, 1000), (20 * MS, 40)] {
        let mut sim = Sim::new(DEFAULT);
        sim.run(Upstream::Workers(16, latency), offered, 100);
        assert!(!sim.g.ramping());
        let since = sim.now;
        let mut limits = Vec::new();
        while sim.now - since < Duration::from_secs(300) {
            limits.extend(sim.run(Upstream::Flat(latency), offered, 1));
        }
        let lowest = limits[limits.len() / 2..].iter().min().unwrap();
        assert!(*lowest >= offered, "flat at {latency:?}, {offered} offered: fell to {lowest}: {limits:?}");
        assert!(limits.iter().all(|&l| l > DEFAULT.min), "flat at {latency:?}: at the floor: {limits:?}");
    }
    // (latency learned, then, the first window of each cycle, an
    // other latency, the one after the one learned: what the next
    // measurement finds, give or take a tenth)
    let cases = [
        (100 * MS, 130 * MS, 130 * MS, 130),
        (1000 * MS, 1200 * MS, 1200 * MS, 1200),
        (100 * MS, 50 * MS, 100 * MS, 67),
    ];
    for (learned, first, then, found) in cases {
        let mut sim = Sim::new(DEFAULT);
        sim.run(Upstream::Flat(learned), 100, 300);
        assert_eq!(ms(sim.g.min_rtt()), learned.as_millis());
        let since = sim.now;
        while sim.now - since < Duration::from_secs(75) && ms(sim.g.min_rtt()) == learned.as_millis() {
            sim.run(Upstream::Flat(first), 100, 1);
            sim.run(Upstream::Flat(then), 100, 1);
        }
        let min = ms(sim.g.min_rtt()) as f64;
        assert!(
            (min - found as f64).abs() <= found as f64 * 0.1,
            "learned {learned:?}, then {first:?} and {then:?}: the minimum is {min} ms after {:?}",
            sim.now - since
        );
    }
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
    let mut fresh = Gradient::new(DEFAULT, 1, Duration::ZERO);
    fresh.set_bounds(Bounds { min: 5, max: 10 });
    assert_eq!((fresh.limit(), fresh.measuring()), (5, true));
}

/// Whole milliseconds, rounded (the mean is a float division).
fn ms(d: Option<Duration>) -> u128 {
    (d.expect("measured").as_secs_f64() * 1000.0).round() as u128
}

impl Sim {
    fn clone_state(&self) -> Sim {
        Sim { g: self.g.clone(), now: self.now, carry: self.carry, sent: self.sent.clone() }
    }
}
