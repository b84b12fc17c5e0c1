//! The buckets of `shared = "redis"` routes, in the Redis of
//! `[rate_limit_store]`: one atomic script per decision (GCRA on Redis's own
//! clock, so the replicas' clocks do not matter), over one multiplexed
//! connection that the `redis` crate's `ConnectionManager` re-establishes.
//!
//! A command that finds its connection closed (Redis closes idle ones) is
//! tried once more on the new connection the manager opens, within the same
//! `timeout`. While Redis fails (slower than `timeout`, refusing, or reset),
//! requests do not wait for it: the store is marked down at the first
//! failure (logged once), `on_error` decides every request without asking
//! Redis, and a background probe brings the store back up once the script
//! decides again (logged once).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{Client, IntoConnectionInfo, Script, TlsCertificates};
use tokio::time::Instant;

use super::Decision;
use super::metrics;
use crate::config::RateLimitStoreConfig;

/// How often a down store is probed.
pub const PROBE_EVERY: Duration = Duration::from_millis(250);

/// GCRA (the token bucket by theoretical arrival times, TAT) in one atomic
/// step. KEYS[1] is the bucket, ARGV[1] the interval T in microseconds,
/// ARGV[2] the burst. The bucket holds its TAT; it expires when it would be
/// full again, so idle keys cost Redis nothing. Redis 5+ replicates a
/// script's effects, so `TIME` may be read before the write. Returns
/// `{allowed, remaining, retry_after_us, reset_us}`.
const GCRA: &str = r#"
local t = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + t
local limit = t * burst
if new_tat - now > limit then
  return {0, 0, new_tat - limit - now, tat - now}
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000))
return {1, math.floor((limit - (new_tat - now)) / t), 0, new_tat - now}
"#;

/// Why Redis did not decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// No answer within `timeout`.
    Timeout,
    /// The connection failed (refused, reset, closed).
    Connection,
    /// Redis answered with an error, or with something the script does not return.
    Reply,
    /// The store was already down: Redis was not asked.
    Down,
}

impl StoreError {
    /// The `kind` label of `gateway_rate_limit_store_errors_total`.
    pub fn kind(self) -> &'static str {
        match self {
            StoreError::Timeout => "timeout",
            StoreError::Connection => "connection",
            StoreError::Reply => "reply",
            StoreError::Down => "down",
        }
    }
}

/// The shared store: one per `[rate_limit_store]`, used by every shared route.
pub struct RedisStore {
    pub config: RateLimitStoreConfig,
    conn: ConnectionManager,
    script: Script,
    up: AtomicBool,
}

impl RedisStore {
    /// Starts the probe, which connects at once (see [`spawn_probe`]) and
    /// ends when the store is dropped.
    pub fn new(config: &RateLimitStoreConfig) -> Result<Arc<RedisStore>, String> {
        let mut info = config.url.as_str().into_connection_info().map_err(|e| format!("rate_limit_store.url: {e}"))?;
        if let Some(password) = &config.password {
            let settings = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(settings);
        }
        // With `ca_file`, its CAs are the only roots (webpki's otherwise).
        let client = match &config.ca_file {
            None => Client::open(info).map_err(|e| format!("rate_limit_store.url: {e}"))?,
            Some(ca) => {
                let certs = TlsCertificates { client_tls: None, root_cert: Some(ca.pem.clone()) };
                Client::build_with_tls(info, certs).map_err(|e| format!("rate_limit_store.ca_file: {e}"))?
            }
        };
        // One quick reconnection try per failure: the probe, not the
        // manager's backoff, decides when to try again.
        let manager = ConnectionManagerConfig::new()
            .set_number_of_retries(1)
            .set_min_delay(Duration::from_millis(10))
            .set_max_delay(Duration::from_millis(100))
            .set_connection_timeout(Some(config.timeout.max(Duration::from_millis(500))))
            // The crate's default (500 ms) would cut a longer `timeout` short.
            .set_response_timeout(Some(config.timeout));
        let conn = ConnectionManager::new_lazy_with_config(client, manager).map_err(|e| e.to_string())?;
        let store =
            Arc::new(RedisStore { config: config.clone(), conn, script: Script::new(GCRA), up: AtomicBool::new(true) });
        spawn_probe(Arc::downgrade(&store));
        Ok(store)
    }

    /// One request's decision for `key`, or why Redis gave none; never
    /// waits longer than `timeout`.
    pub async fn decide(&self, key: &[u8], interval: Duration, burst: u32) -> Result<Decision, StoreError> {
        if !self.up.load(Ordering::Relaxed) {
            return Err(StoreError::Down);
        }
        let start = Instant::now();
        let micros = u64::try_from(interval.as_micros()).unwrap_or(u64::MAX).max(1);
        let reply = self.invoke(key, micros, burst, self.config.timeout).await;
        metrics::rate_limit_store_duration(start.elapsed());
        if let Err((e, code)) = &reply {
            self.mark_down(*e, code.as_deref());
        }
        reply.map_err(|(e, _)| e)
    }

    /// `code`: Redis's error code (`READONLY`, `NOPERM`, `OOM`, ...), never
    /// its message, which may quote a key (a client's header value).
    fn mark_down(&self, e: StoreError, code: Option<&str>) {
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                error = e.kind(),
                redis_error = code.unwrap_or("-"),
                timeout = %humantime::format_duration(self.config.timeout),
                on_error = self.config.on_error.as_str(),
                "rate limit store failed; on_error decides until it answers again"
            );
        }
    }

    /// Whether the script decides now: what a down store's probe asks, on
    /// a bucket of its own (`PROBE_KEY`, gone a millisecond later). A PING
    /// would not do: a Redis that answers it but refuses the script (a
    /// read-only replica, `maxmemory` reached, an ACL without `EVALSHA`)
    /// would be marked up and down again every probe.
    async fn script_answers(&self) -> bool {
        let wait = self.config.timeout.max(PROBE_EVERY);
        self.invoke(PROBE_KEY.as_bytes(), 1, 1, wait).await.is_ok()
    }

    /// The script's decision for `key` (interval in microseconds, burst),
    /// waiting `wait` at most, or why there is none (and Redis's error code
    /// when it answered with an error).
    async fn invoke(
        &self,
        key: &[u8],
        micros: u64,
        burst: u32,
        wait: Duration,
    ) -> Result<Decision, (StoreError, Option<String>)> {
        let deadline = Instant::now() + wait;
        let mut call = self.script.key(key);
        call.arg(micros).arg(burst);
        let mut retried = false;
        loop {
            let mut conn = self.conn.clone();
            let result = tokio::time::timeout_at(deadline, call.invoke_async::<Vec<i64>>(&mut conn)).await;
            return match result {
                Err(_) => Err((StoreError::Timeout, None)),
                Ok(Err(e)) if e.is_timeout() => Err((StoreError::Timeout, None)),
                // Redis closes idle connections (its `timeout`, `CLIENT
                // KILL`, a proxy's idle limit) and that is found out only
                // by the next command: the manager has begun a new
                // connection, which gets one try before the store counts
                // as down.
                Ok(Err(e))
                    if !retried && (e.is_connection_dropped() || e.is_io_error()) && !e.is_connection_refusal() =>
                {
                    retried = true;
                    continue;
                }
                Ok(Err(e)) if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() => {
                    Err((StoreError::Connection, None))
                }
                Ok(Err(e)) => Err((StoreError::Reply, e.code().map(str::to_owned))),
                Ok(Ok(reply)) => parse(&reply).ok_or((StoreError::Reply, None)),
            };
        }
    }

    /// Whether the store takes decisions now.
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }
}

/// The bucket a down store's probe asks for (within the `gateway:rl:`
/// prefix an ACL may confine the gateway to; no route's key, which has a
/// `:` after the route's name).
const PROBE_KEY: &str = "gateway:rl:-probe";

fn parse(reply: &[i64]) -> Option<Decision> {
    let &[allowed, remaining, retry_after, reset] = reply else { return None };
    let micros = |n: i64| Duration::from_micros(u64::try_from(n).unwrap_or(0));
    Some(Decision {
        allowed: allowed == 1,
        remaining: u32::try_from(remaining).unwrap_or(0),
        retry_after: micros(retry_after),
        reset: micros(reset),
    })
}

/// Runs the script once at start, so the connection is open and the script
/// loaded before the first request, which would otherwise pay for both
/// within its `timeout` (and, on a slow start, be decided by `on_error`).
/// Then, while the store is down, runs it every [`PROBE_EVERY`] (which also
/// makes the connection manager reconnect) and marks the store up once it
/// decides.
fn spawn_probe(store: Weak<RedisStore>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    runtime.spawn(async move {
        // Its failure marks nothing down: the first request finds out.
        if let Some(store) = store.upgrade() {
            store.script_answers().await;
        }
        loop {
            tokio::time::sleep(PROBE_EVERY).await;
            let Some(store) = store.upgrade() else { return };
            if store.is_up() {
                continue;
            }
            if store.script_answers().await {
                store.up.store(true, Ordering::Relaxed);
                tracing::info!("rate limit store answers again; it decides from now on");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies() {
        let d = parse(&[1, 4, 0, 200_000]).unwrap();
        assert_eq!((d.allowed, d.remaining, d.reset), (true, 4, Duration::from_millis(200)));
        let d = parse(&[0, 0, 1_500_000, 3_000_000]).unwrap();
        assert_eq!((d.allowed, d.retry_after), (false, Duration::from_millis(1500)));
        assert!(parse(&[1, 2]).is_none());
    }
}
