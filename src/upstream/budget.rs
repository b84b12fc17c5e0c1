//! The retry budget of an upstream: in any ten seconds, at most
//! `min_per_second` × 10 retries plus `ratio` retries per request sent.
//!
//! Hand-written rather than tower's `TpsBudget`, which has this shape:
//! its ring of one-second slots moves two slots where one second has
//! passed (it clears the next slot, then steps past it) and forgets the
//! part of a second left over, so under steady traffic it remembers about
//! half its window and lets about twice the retries through; and it
//! rounds `1 / ratio` down (0.3 earns a retry every 3 requests). Here the
//! ring moves one slot per whole second passed, and a request earns
//! `ratio` retries in thousandths.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The window is this many slots of [`SLOT`].
const SLOTS: usize = 10;
const SLOT: Duration = Duration::from_secs(1);
/// A retry costs this much; a request earns `ratio` × this.
const RETRY: i64 = 1000;

/// See the module documentation.
#[derive(Debug)]
pub struct RetryBudget {
    /// What a request earns, in thousandths of a retry.
    earned: i64,
    /// `min_per_second` over the window, always there.
    reserve: i64,
    ring: Mutex<Ring>,
}

#[derive(Debug)]
struct Ring {
    /// What each second earned less what it spent; `slots[now]` is the
    /// current one.
    slots: [i64; SLOTS],
    now: usize,
    /// When the current slot began.
    began: Instant,
}

impl RetryBudget {
    pub fn new(min_per_second: u32, ratio: f32) -> RetryBudget {
        let earned = (f64::from(ratio) * RETRY as f64).round() as i64;
        let reserve = i64::from(min_per_second).saturating_mul(SLOTS as i64 * RETRY);
        let ring = Ring { slots: [0; SLOTS], now: 0, began: Instant::now() };
        RetryBudget { earned, reserve, ring: Mutex::new(ring) }
    }

    /// A request was sent.
    pub fn deposit(&self) {
        let mut ring = self.ring();
        let now = ring.now;
        ring.slots[now] = ring.slots[now].saturating_add(self.earned);
    }

    /// A retry is about to be made: whether the budget has one, taken if so.
    pub fn withdraw(&self) -> bool {
        let mut ring = self.ring();
        let left = ring.slots.iter().fold(self.reserve, |sum, s| sum.saturating_add(*s));
        if left < RETRY {
            return false;
        }
        let now = ring.now;
        ring.slots[now] -= RETRY;
        true
    }

    /// The ring, moved on to the current second.
    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        let mut ring = self.ring.lock().unwrap_or_else(|e| e.into_inner());
        let passed = ring.began.elapsed().as_secs();
        if passed > 0 {
            for _ in 0..passed.min(SLOTS as u64) {
                ring.now = (ring.now + 1) % SLOTS;
                let now = ring.now;
                ring.slots[now] = 0;
            }
            ring.began += SLOT * passed as u32;
        }
        ring
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests at `rate` a second (retrying each) for `seconds`, in steps
    /// of a tenth of a second on a paused clock: the retries made.
    async fn retries(budget: &RetryBudget, rate: u32, seconds: u32) -> u32 {
        let (mut made, step) = (0, Duration::from_millis(100));
        for tick in 0..seconds * 10 {
            let due = (tick + 1) * rate / 10 - tick * rate / 10;
            for _ in 0..due {
                budget.deposit();
                made += u32::from(budget.withdraw());
            }
            tokio::time::advance(step).await;
        }
        made
    }

    /// The documented rule: 10 s × `min_per_second` plus `ratio` per request,
    /// in a burst and under steady traffic alike (tower's budget let 410
    /// of 414 through in 20 s at about 20 a second, where this rule gives
    /// about 282).
    #[tokio::test(start_paused = true)]
    async fn retries_stay_within_the_documented_rule() {
        // (rate a second, seconds, retries the rule allows)
        let cases = [
            // A burst: the reserve (100) and a fifth of 300 requests.
            (3000, 1, 160),
            // Steady: past the first ten seconds, 10 + 0.2 × 20 a second.
            (20, 20, 100 + 20 * 20 / 5 + 10 * 10),
            (40, 30, 100 + 40 * 30 / 5 + 20 * 10),
            (5, 20, 100),
        ];
        for (rate, seconds, allowed) in cases {
            let budget = RetryBudget::new(10, 0.2);
            let made = retries(&budget, rate, seconds).await;
            let requests = rate * seconds;
            // The window holds 9-10 whole seconds: within one second's
            // reserve and earnings of the rule.
            let slack = 10 + rate / 5;
            assert!(made.abs_diff(allowed.min(requests)) <= slack, "{rate}/s for {seconds}s: {made} of {allowed}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_ratio_earns_its_share_in_thousandths() {
        for (ratio, requests, want) in [(0.3f32, 1000, 300), (0.2, 1000, 200), (0.0, 1000, 0), (1.5, 100, 150)] {
            let budget = RetryBudget::new(0, ratio);
            (0..requests).for_each(|_| budget.deposit());
            let made = (0..10_000).take_while(|_| budget.withdraw()).count();
            assert_eq!(made, want, "ratio {ratio}");
        }
    }
}
