//! A route's deadline over its upstream exchange, on a timer the client's
//! connection keeps from one request to the next ([`KeptTimer`], in
//! [`crate::request::Peer`]).
//!
//! Why not `tokio::time::timeout_at` for each request: its timer goes into
//! the runtime's timer wheel at its first wait and comes out when dropped,
//! both under the timer driver's lock, for every proxied request. A kept
//! timer stays in the wheel between requests and is only moved: to a later
//! deadline, as the next request on a route has, that is one atomic store,
//! and the wheel moves it for real only when its old deadline comes (see
//! benches/README.md, Decisions).

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Mutex;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

/// A connection's timer, lent to one request at a time.
#[derive(Debug, Default)]
pub struct KeptTimer(Mutex<Option<Pin<Box<Sleep>>>>);

impl KeptTimer {
    /// The kept timer set to `deadline`, or a new one when none is kept
    /// (the connection's first request); given back when the loan drops.
    /// `keep`: only where the connection's requests run in its own task,
    /// one at a time. Kept by a connection whose requests each have a task
    /// (HTTP/2 streams), the timer's waker would keep the last one's
    /// memory while the connection idles.
    pub fn lend(&self, deadline: Instant, keep: bool) -> Loan<'_> {
        let home = keep.then_some(self);
        let kept = home.and_then(|home| home.0.try_lock().ok()?.take());
        let sleep = match kept {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        Loan { home, sleep: Some(sleep) }
    }

    /// Drops the kept timer: its waker, the last task that waited on it,
    /// would keep that task's memory (a connection that parks gives its
    /// task up).
    pub fn forget(&self) {
        if let Ok(mut slot) = self.0.lock() {
            slot.take();
        }
    }

    /// Whether a timer is kept.
    #[cfg(test)]
    fn is_kept(&self) -> bool {
        self.0.lock().is_ok_and(|slot| slot.is_some())
    }
}

/// A timer lent by a [`KeptTimer`].
#[derive(Debug)]
pub struct Loan<'a> {
    /// Where it goes back to (`None`: dropped).
    home: Option<&'a KeptTimer>,
    /// Always `Some` but in `drop`.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl Loan<'_> {
    /// Runs `fut` until it ends (`Some`) or the deadline passes (`None`),
    /// as `tokio::time::timeout_at` does.
    pub fn within<'s, F: Future>(&'s mut self, fut: Pin<&'s mut F>) -> Within<'s, F> {
        let sleep = self.sleep.as_mut().expect("lent").as_mut();
        Within { fut, sleep }
    }
}

impl Drop for Loan<'_> {
    fn drop(&mut self) {
        if let Some(home) = self.home
            && let Ok(mut slot) = home.0.try_lock()
            && slot.is_none()
        {
            *slot = self.sleep.take();
        }
    }
}

/// The future of [`Loan::within`].
pub struct Within<'s, F> {
    fut: Pin<&'s mut F>,
    sleep: Pin<&'s mut Sleep>,
}

impl<F: Future> Future for Within<'_, F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let had_budget = tokio::task::coop::has_budget_remaining();
        if let Poll::Ready(out) = self.fut.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        // As tokio's `Timeout`: when the future spent the task's budget,
        // the timer is still looked at, or a busy exchange would never
        // time out.
        let fired = if had_budget && !tokio::task::coop::has_budget_remaining() {
            pin!(tokio::task::coop::unconstrained(self.sleep.as_mut())).poll(cx)
        } else {
            self.sleep.as_mut().poll(cx)
        };
        fired.map(|()| None)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// The deadline passes while the future waits; a future that ends
    /// first gives its output; the timer given back is the one lent, set
    /// again for the next loan (an earlier deadline too).
    #[tokio::test(start_paused = true)]
    async fn loans_time_out_and_the_timer_is_kept() {
        let kept = KeptTimer::default();
        let start = Instant::now();
        {
            let mut loan = kept.lend(start + Duration::from_secs(5), true);
            let waiting = pin!(std::future::pending::<()>());
            assert_eq!(loan.within(waiting).await, None);
            assert_eq!(Instant::now(), start + Duration::from_secs(5));
        }
        assert!(kept.is_kept());
        let first = {
            let mut loan = kept.lend(Instant::now() + Duration::from_secs(5), true);
            let ended = pin!(async { 7 });
            assert_eq!(loan.within(ended).await, Some(7));
            &**loan.sleep.as_ref().unwrap() as *const Sleep
        };
        for (wait, timeout) in [(1, 30), (2, 3), (9, 1)] {
            let now = Instant::now();
            let mut loan = kept.lend(now + Duration::from_secs(timeout), true);
            assert_eq!(&**loan.sleep.as_ref().unwrap() as *const Sleep, first, "not the kept timer");
            let slow = pin!(tokio::time::sleep(Duration::from_secs(wait)));
            let got = loan.within(slow).await;
            assert_eq!(got.is_some(), wait < timeout, "wait {wait}, timeout {timeout}");
            assert_eq!(Instant::now(), now + Duration::from_secs(wait.min(timeout)));
        }
        kept.forget();
        assert!(!kept.is_kept());
    }

    /// Two loans at once: the second gets a timer of its own, and one is
    /// kept after. A loan not to be kept is not.
    #[tokio::test(start_paused = true)]
    async fn a_second_loan_meanwhile_gets_its_own_timer() {
        let kept = KeptTimer::default();
        drop(kept.lend(Instant::now(), false));
        assert!(!kept.is_kept());
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut a = kept.lend(deadline, true);
        let mut b = kept.lend(deadline + Duration::from_secs(1), true);
        let (wait_a, wait_b) = (pin!(std::future::pending::<()>()), pin!(std::future::pending::<()>()));
        let (got_a, got_b) = tokio::join!(a.within(wait_a), b.within(wait_b));
        assert_eq!((got_a, got_b), (None, None));
        assert_eq!(Instant::now(), deadline + Duration::from_secs(1));
        drop((a, b));
        assert!(kept.is_kept());
    }

    /// A future that spends the task's whole budget each poll still times
    /// out. (On the real clock: a paused one moves only when the runtime
    /// idles, which this future never lets it.)
    #[tokio::test]
    async fn a_future_that_spends_the_budget_still_times_out() {
        let kept = KeptTimer::default();
        let mut loan = kept.lend(Instant::now() + Duration::from_millis(10), true);
        let spender = pin!(async {
            loop {
                tokio::task::coop::consume_budget().await;
            }
        });
        // tokio's own timeout around it, so that a failure ends the test.
        let got = tokio::time::timeout(Duration::from_secs(10), loan.within(spender)).await;
        assert_eq!(got.expect("the deadline was never looked at"), None);
    }
}
