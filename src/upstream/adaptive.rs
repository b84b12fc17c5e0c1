//! `max_requests = "auto"`: the limit on requests in flight to an upstream,
//! learned from how long its answers take. Pure: windows of latency samples
//! in, a limit out ([`Gradient::window`]); `admission` feeds it and applies
//! the limit.
//!
//! The algorithm is Envoy's adaptive concurrency *gradient controller*
//! (envoyproxy.io, HTTP filter "Adaptive Concurrency";
//! `source/extensions/filters/http/adaptive_concurrency/controller/gradient_controller.cc`):
//!
//! - the *minimum RTT* is measured with the limit pinned to its floor
//!   (`auto_min`) until enough answers came back, at start-up and again every
//!   minute or so (jittered, so that replicas do not all measure at once),
//!   and at once after the limit sat at its floor for five windows in a row
//!   (the measurement may have been wrong);
//! - every window (100 ms) of answers gives a *sample RTT*, and
//!   `gradient = clamp(min_rtt × 1.25 / sample_rtt, 0.5, 2)`;
//!   `limit × gradient + sqrt(limit × gradient)` is the new limit (the
//!   square root is headroom for bursts), within the bounds.
//!
//! Why this one: its reference point stays true under a sustained overload.
//! Netflix's Vegas takes the smallest of ordinary samples and Gradient2 a
//! long average of them, and both drift up with the very queue they are
//! meant to see when the upstream is never idle; Envoy's re-measures with
//! the upstream all but idle, at a known cost (a moment at the floor per
//! minute, which the last departure below spares an upstream that shows
//! no queue). It is also what the issue describes, a measured minimum and
//! a gradient against recent latency.
//!
//! Six departures, each said where it is made:
//! - a window's latency is the mean of its samples, not a percentile: two
//!   atomic adds per answer instead of a locked histogram (Gradient2 also
//!   averages);
//! - a window lasts the minimum RTT when that is longer than 100 ms
//!   (`learned`);
//! - the limit does not grow in a window in which fewer than half of it
//!   were in use (Netflix Gradient2's "app-limited" rule): an upstream whose
//!   latency does not change with load would otherwise see its limit grow
//!   to `auto_max` while nothing tests it, and then be no protection at all
//!   the day it slows down;
//! - a measurement of the minimum ends after a second if it has had a
//!   round of answers by then, not only after 50 of them: 50 answers at
//!   `auto_min` requests at once hold the limit at its floor for 50 ×
//!   the latency / `auto_min`, most of a minute for an upstream that
//!   takes seconds;
//! - a *slow start* before the gradient rules, as TCP's (RFC 5681, 3.1:
//!   the window doubles each round trip until the first sign of
//!   congestion): from a cold start the gradient's climb of a quarter and
//!   its root a window takes twenty windows to go from the floor to a
//!   thousand, twenty seconds in front of an upstream that takes one. While
//!   every window's latency stays within a tenth of the minimum, the limit
//!   becomes twice the largest number of requests in flight that a quick
//!   answer has shown the upstream takes (the in-flight count when that
//!   request was sent), so it doubles once a round trip while the clients
//!   fill it (the answer that proves it is handed on at once, see
//!   [`Gradient::cadence`]) and never passes twice a load that was seen to
//!   be fine; the
//!   first window slower than that, none of whose answers came within it,
//!   ends it for good, as HyStart++ (RFC 9406) ends TCP's at the first
//!   round whose quickest delay rose by an eighth or so (see
//!   [`Gradient::ramp`]);
//! - the measurement every minute or so is put off while the latency
//!   confirms the minimum, as BBR enters ProbeRTT only when no ordinary
//!   sample refreshed its minimum for the whole interval: a window within a
//!   tenth of the minimum puts it off by an interval from that window, so
//!   that an upstream whose latency does not change with load is not held
//!   at the floor once a minute; a slower upstream confirms nothing and is
//!   measured on time (see [`Gradient::confirm`]).
//!
//! Failures count as they do in Envoy's filter: every answer with a head is
//! a sample (a 5xx as any other status), a route timeout is a sample of the
//! whole time waited (Envoy's own 504 passes the filter likewise), and a
//! request that ends with no head (reset, refused connection, the client
//! gone) is none: it only gives its slot back.

use std::time::Duration;

/// How often the limit is computed again.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Answers the minimum RTT is measured over.
const MIN_RTT_SAMPLES: u64 = 50;
/// Past this, a measurement that has had `auto_min` answers ends with them.
const MIN_RTT_LONGEST: Duration = Duration::from_secs(1);
/// How often the minimum RTT is measured again, before jitter.
const MIN_RTT_INTERVAL: Duration = Duration::from_secs(60);
/// Up to this share of `MIN_RTT_INTERVAL` is added at random.
const JITTER: f64 = 0.15;
/// Latency up to this much above the minimum is not yet a queue.
const BUFFER: f64 = 0.25;
/// Windows in a row at the floor that call for a new measurement.
const FLOOR_WINDOWS: u32 = 5;
/// During the slow start, latency up to this much above the minimum is no
/// sign of a queue yet; below `BUFFER`, so that it ends while the gradient
/// would still let the limit grow. A window within it of the minimum also
/// confirms the minimum (see `Gradient::confirm`).
const RAMP_TOLERANCE: f64 = 0.1;

pub use crate::config::AutoBounds as Bounds;

/// What the answers of one window came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Window {
    /// Answers (samples) in the window.
    pub samples: u64,
    /// Their latencies, added.
    pub total: Duration,
    /// The most requests in flight at once during the window.
    pub busiest: usize,
    /// During the slow start: the most requests in flight when one of the
    /// window's answers was sent, among the answers within
    /// [`Gradient::ramp_bound`] (0 if none); in a window of no answers,
    /// the proof handed on at once (see [`Gradient::cadence`]).
    pub proven: usize,
}

/// How the request path fills and closes the controller's windows (see
/// [`Gradient::cadence`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cadence {
    /// How long the next window lasts ([`Gradient::window_len`]).
    pub len: Duration,
    /// During the slow start: the latency up to which an answer proves the
    /// load it was sent under ([`Gradient::ramp_bound`]), and the load a
    /// proof must pass to raise the limit.
    pub ramp: Option<(Duration, usize)>,
    /// While the minimum is measured: every answer closes its window.
    pub every_answer: bool,
}

/// The controller's state: the limit, and the minimum RTT it is measured
/// against.
#[derive(Debug, Clone)]
pub struct Gradient {
    bounds: Bounds,
    limit: usize,
    min_rtt: Option<Duration>,
    /// While the minimum RTT is measured.
    measuring: Option<Measuring>,
    /// Windows in a row the gradient left the limit at its floor.
    at_floor: u32,
    /// In the slow start (see [`Gradient::ramp`]).
    ramping: bool,
    /// When the minimum RTT is measured again.
    next_measure: Duration,
    /// How long after a measurement, or after the last window that confirmed
    /// its minimum, the next one comes (drawn, jittered, at each measurement).
    interval: Duration,
    /// A window since the last measurement was well below the minimum: no
    /// window puts the next measurement off (see [`Gradient::confirm`]).
    doubted: bool,
    rng: fastrand::Rng,
}

#[derive(Debug, Clone, Copy)]
struct Measuring {
    /// The limit to come back to (Envoy's "deferred" limit).
    resume: usize,
    samples: u64,
    total: Duration,
    /// When it started, on the clock of [`Gradient::window`].
    started: Duration,
}

impl Gradient {
    /// A controller that starts by measuring the minimum RTT, at the floor.
    /// `seed` draws the jitter; `now` is on the clock of [`Gradient::window`].
    pub fn new(bounds: Bounds, seed: u64, now: Duration) -> Self {
        let mut g = Gradient {
            bounds,
            limit: bounds.min,
            min_rtt: None,
            measuring: None,
            at_floor: 0,
            ramping: true,
            next_measure: Duration::ZERO,
            interval: MIN_RTT_INTERVAL,
            doubted: false,
            rng: fastrand::Rng::with_seed(seed),
        };
        g.measure(now);
        g
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The minimum RTT measured last, if any yet.
    pub fn min_rtt(&self) -> Option<Duration> {
        self.min_rtt
    }

    /// Whether the minimum RTT is being measured (the limit pinned at the
    /// floor).
    pub fn measuring(&self) -> bool {
        self.measuring.is_some()
    }

    /// Whether the slow start is on (it ends for good at the first window
    /// whose latency is past the minimum's tolerance).
    pub fn ramping(&self) -> bool {
        self.ramping
    }

    /// During the slow start, once the minimum is known: the latency up to
    /// which an answer shows that the load it was sent under is fine.
    pub fn ramp_bound(&self) -> Option<Duration> {
        self.min_rtt.filter(|_| self.ramping && self.measuring.is_none()).map(|m| m.mul_f64(1.0 + RAMP_TOLERANCE))
    }

    /// How long the next window lasts: 100 ms, or the minimum RTT when
    /// that is longer once the gradient rules (a departure, see
    /// `learned`). The slow start judges each answer by the load it was
    /// sent under, not a window by the limit before it, so it keeps the
    /// short window (and a proof that raises the limit is handed on at
    /// once, see [`Gradient::cadence`]).
    pub fn window_len(&self) -> Duration {
        match self.min_rtt {
            Some(m) if !self.ramping => m.max(WINDOW),
            _ => WINDOW,
        }
    }

    /// The next window's length, and which answers are handed on before
    /// the window's end: a window closes with the first answer past its
    /// end, and answers come back in bursts, those of the requests let in
    /// when the limit rose together a round trip later, so the first of a
    /// burst would close a window of one answer and leave the rest of it to
    /// the window closed by the next burst, a round trip late. So the
    /// answer that would change what the controller does is handed on at
    /// once: during the slow start, one that proves a load above half the
    /// limit (the limit doubles on it), alone, as a window of no answers
    /// (the window goes on filling: a window cut short would judge the
    /// latency on the few answers before the cut); while the minimum is
    /// measured, any, closing its window (the measurement counts answers,
    /// 50 at most).
    pub fn cadence(&self) -> Cadence {
        let raises = (self.limit < self.bounds.max).then_some(self.limit / 2);
        Cadence { len: self.window_len(), ramp: self.ramp_bound().zip(raises), every_answer: self.measuring.is_some() }
    }

    /// A reload's bounds: the learned limit is kept, within them.
    pub fn set_bounds(&mut self, bounds: Bounds) {
        self.bounds = bounds;
        self.limit = if self.measuring.is_some() { bounds.min } else { self.limit.clamp(bounds.min, bounds.max) };
        if let Some(m) = &mut self.measuring {
            m.resume = m.resume.clamp(bounds.min, bounds.max);
        }
    }

    /// Pins the limit to the floor until the minimum RTT is measured; the
    /// samples before it are no measure of it.
    fn measure(&mut self, now: Duration) {
        let resume = match self.measuring {
            Some(m) => m.resume,
            None => self.limit,
        };
        self.measuring = Some(Measuring { resume, samples: 0, total: Duration::ZERO, started: now });
        self.limit = self.bounds.min;
        self.at_floor = 0;
    }

    /// The window that just ended, at `now` (time since any fixed origin):
    /// the limit from now on.
    pub fn window(&mut self, w: Window, now: Duration) -> usize {
        if let Some(m) = &mut self.measuring {
            m.samples += w.samples;
            m.total += w.total;
            let enough = m.samples >= self.bounds.min as u64 && now >= m.started + MIN_RTT_LONGEST;
            if m.samples >= MIN_RTT_SAMPLES || enough {
                self.min_rtt = Some(mean(m.total, m.samples));
                self.limit = m.resume.clamp(self.bounds.min, self.bounds.max);
                self.measuring = None;
                self.interval = MIN_RTT_INTERVAL + MIN_RTT_INTERVAL.mul_f64(JITTER * self.rng.f64());
                self.next_measure = now + self.interval;
                self.doubted = false;
            }
            return self.limit;
        }
        let sample = mean(w.total, w.samples.max(1)).max(Duration::from_micros(1));
        let min_rtt = self.min_rtt.filter(|_| w.samples > 0);
        if let Some(min_rtt) = min_rtt {
            self.confirm(sample, min_rtt, now);
        }
        if now >= self.next_measure {
            self.measure(now);
            return self.limit;
        }
        let Some(min_rtt) = min_rtt else {
            // No answers: during the slow start, a proof handed on at once.
            if self.ramp_bound().is_some() {
                self.limit = self.limit.max(w.proven.saturating_mul(2).min(self.bounds.max));
            }
            return self.limit;
        };
        if self.ramp(&w, sample, min_rtt) {
            return self.limit;
        }
        let gradient = (min_rtt.as_secs_f64() * (1.0 + BUFFER) / sample.as_secs_f64()).clamp(0.5, 2.0);
        let scaled = self.limit as f64 * gradient;
        // Truncated, as Envoy's integer limit is.
        let computed = ((scaled + scaled.sqrt()) as usize).clamp(self.bounds.min, self.bounds.max);
        let app_limited = w.busiest * 2 < self.limit;
        let new = if computed > self.limit && app_limited { self.limit } else { computed };
        // Only the gradient's own verdict counts: an idle upstream's limit
        // held at the floor says nothing of the measurement.
        let floored = computed == self.bounds.min && self.limit == self.bounds.min;
        self.at_floor = if floored { self.at_floor + 1 } else { 0 };
        self.limit = new;
        if self.at_floor >= FLOOR_WINDOWS {
            self.measure(now);
        }
        self.limit
    }
}

impl Gradient {
    /// BBR's rule for its minimum RTT (draft-cardwell-iccrg-bbr-congestion-control,
    /// ProbeRTT: entered only when no ordinary sample refreshed the minimum
    /// for its whole window), on a window of mean latency `sample`: one
    /// within a tenth of the minimum, either side, shows the upstream not
    /// queueing and the minimum still true, and puts the next measurement
    /// off to a whole interval from now. Latency that rose confirms nothing,
    /// so a slower upstream is measured again within the interval; one well
    /// below the minimum (a faster upstream, or errors answered quickly)
    /// leaves the measurement on time, as Envoy's, whatever windows follow:
    /// lowering the minimum to it, as BBR does, would collapse the limit the
    /// day those errors stop.
    fn confirm(&mut self, sample: Duration, min_rtt: Duration, now: Duration) {
        let ratio = sample.as_secs_f64() / min_rtt.as_secs_f64();
        if ratio < 1.0 - RAMP_TOLERANCE {
            self.doubted = true;
        } else if ratio <= 1.0 + RAMP_TOLERANCE && !self.doubted {
            self.next_measure = now + self.interval;
        }
    }

    /// The slow start, for a window of mean latency `sample`: whether it
    /// set the limit. While the latency stays within the tolerance the
    /// limit is twice the largest load a quick answer proved (never lower
    /// than it was: nothing said the upstream is full), which needs clients
    /// enough to fill more than half of it, as the gradient's "app-limited"
    /// rule does. The first window past the tolerance, none of whose
    /// answers came within it, ends it for good and hands that window to
    /// the gradient: HyStart++ judges a round by its quickest answer, since
    /// a queue inside the upstream delays every answer, and answers delayed
    /// on their way (the gateway or its machine busy, say answering the
    /// clients the limit turns away) are no queue in it. It is only entered from a cold
    /// start (or a reload that learns again), not after the limit
    /// collapsed, since an upstream whose every request times out also
    /// has a flat latency, and the gradient alone brings a recovered one
    /// back fast (it doubles the limit while latency is below the minimum).
    fn ramp(&mut self, w: &Window, sample: Duration, min_rtt: Duration) -> bool {
        if !self.ramping {
            return false;
        }
        if sample.as_secs_f64() > min_rtt.as_secs_f64() * (1.0 + RAMP_TOLERANCE) && w.proven == 0 {
            self.ramping = false;
            return false;
        }
        self.limit = self.limit.max(w.proven.saturating_mul(2).min(self.bounds.max));
        true
    }
}

fn mean(total: Duration, samples: u64) -> Duration {
    Duration::from_secs_f64(total.as_secs_f64() / samples as f64)
}

#[cfg(test)]
#[path = "adaptive_tests.rs"]
mod tests;
