//! The process's parked connections (`gateway_connections_parked`) and
//! open ones (`gateway_connections_active`), read off the exporter: no
//! request, since a metrics request would be one more connection.

use std::time::{Duration, Instant};

use super::sample;

/// The parked connections now.
pub fn parked() -> f64 {
    sample(&gateway::metrics::install().render(), "gateway_connections_parked", &[]).unwrap_or(0.0)
}

/// Waits up to `within` for `want` parked connections; the last count.
pub async fn parked_become(want: f64, within: Duration) -> f64 {
    let until = Instant::now() + within;
    loop {
        let now = parked();
        if now == want || Instant::now() >= until {
            return now;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One test at a time of a file that reads the process's gauges (the
/// parked count, the heap): each test binary has its own.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The client connections open now (`gateway_connections_active`, the
/// main listeners' only).
pub fn active() -> f64 {
    sample(&gateway::metrics::install().render(), "gateway_connections_active", &[]).unwrap_or(0.0)
}

/// The file's one-at-a-time lock, taken once no connection is left parked,
/// or open at all, in the process (waited for up to 5 s, not asserted: a
/// test's own count is still taken from its base). The last test's
/// connections may still be parked or open when it lets go of the lock
/// (its runtime, gateway and sockets are dropped after), and when they went
/// the next test's gauge fell below its base (CI: a base of 9 parked fell
/// to 1 after a test that left 200 connections parking). The open count,
/// which some tests read too, falls so after a test that ends with a
/// connection open (a tunnel, say).
pub async fn one_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    let one = SERIAL.lock().await;
    let until = Instant::now() + Duration::from_secs(5);
    while (parked() != 0.0 || active() != 0.0) && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    one
}
