//! The process's parked connections (`gateway_connections_parked`), read
//! off the exporter: no request, since a metrics request would be one
//! more connection.

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
