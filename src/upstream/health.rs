//! Active health checks: one task per endpoint sends `GET path` every
//! `interval` on a connection of its own and wants a 2xx within `timeout`.
//! `unhealthy_after` failures in a row mark the endpoint unhealthy (it gets
//! no traffic) and `healthy_after` passes in a row mark it healthy again.
//! The first check runs at start-up and decides on its own, so a sidecar
//! that starts before its app reports "not ready" at once. Until a check
//! has passed, checks come every [`UNSETTLED_INTERVAL`] (or `interval`, if
//! shorter) and each decides on its own, so an app that comes up after its
//! gateway is served within about that long, not `healthy_after` intervals
//! later. A task ends when its upstream is dropped.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{Either, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};

use super::connect::{TlsTarget, connect_stream};
use super::endpoint::Endpoint;
use super::h1;
use super::io::UpstreamIo;
use super::pool::Conn;
use crate::config::{Address, HealthConfig};

/// How often an endpoint is checked until a check has passed.
pub const UNSETTLED_INTERVAL: Duration = Duration::from_secs(1);

/// Starts the checks of `endpoint`.
pub fn spawn(endpoint: &Arc<Endpoint>, config: HealthConfig) {
    let endpoint = Arc::downgrade(endpoint);
    tokio::spawn(run(endpoint, config));
}

async fn run(endpoint: Weak<Endpoint>, config: HealthConfig) {
    let (mut passes, mut failures) = (0u32, 0u32);
    // No check has passed yet: each decides alone, and they come sooner.
    let mut unsettled = true;
    // A reload that replaces the endpoint ends these checks (its state goes
    // on with the new endpoint's own, if it has any).
    let generation = endpoint.upgrade().map(|e| e.checks());
    loop {
        let Some(e) = endpoint.upgrade() else { return };
        let address = e.config.address.clone();
        let tls = e.tls.clone();
        // `auto`: the probe's own connection's ALPN decides.
        let h2c = e.pool.h2_prior_knowledge();
        let host = e.host.clone();
        drop(e);
        let checked = tokio::time::timeout(
            config.timeout,
            probe(&address, tls.as_ref(), h2c, host, &config.path, config.timeout),
        )
        .await;
        let (passed, failure) = match checked {
            Ok(Ok(status)) if status.is_success() => (true, String::new()),
            Ok(Ok(status)) => (false, format!("answered {status}")),
            Ok(Err(e)) => (false, e.to_string()),
            Err(_) => (false, format!("no answer within {}", humantime::format_duration(config.timeout))),
        };
        let Some(e) = endpoint.upgrade() else { return };
        if Some(e.checks()) != generation {
            return;
        }
        e.record_check(passed, &failure);
        if passed {
            (passes, failures) = (passes + 1, 0);
        } else {
            (passes, failures) = (0, failures + 1);
        }
        if unsettled || (passed && passes >= config.healthy_after) || (!passed && failures >= config.unhealthy_after) {
            e.set_healthy(passed, &failure);
        }
        unsettled &= !passed;
        drop(e);
        let pause = if unsettled { config.interval.min(UNSETTLED_INTERVAL) } else { config.interval };
        tokio::time::sleep(pause).await;
    }
}

/// One check: the status `GET path` answered.
async fn probe(
    address: &Address,
    tls: Option<&TlsTarget>,
    h2c: bool,
    host: http::HeaderValue,
    path: &str,
    timeout: Duration,
) -> Result<http::StatusCode, Box<dyn std::error::Error + Send + Sync>> {
    let stream = connect_stream(address, tls, timeout).await?;
    if h2c || stream.alpn_h2() {
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake::<_, _, Empty<Bytes>>(TokioExecutor::new(), TokioIo::new(stream))
                .await?;
        let connection = tokio::spawn(connection);
        let scheme = if tls.is_some() { "https" } else { "http" };
        let authority = host.to_str().unwrap_or("localhost");
        let request = Request::get(format!("{scheme}://{authority}{path}"))
            .version(http::Version::HTTP_2)
            .header(header::USER_AGENT, "gateway-health-check")
            .body(Empty::new())?;
        let status = sender.send_request(request).await?.status();
        connection.abort();
        return Ok(status);
    }
    // A connection of its own, closed once the head is in (the gateway's
    // HTTP/1.1 client, as for requests).
    let conn = Conn::unpooled(UpstreamIo::new(stream, true));
    let request = Request::get(path)
        .header(header::HOST, host)
        .header(header::USER_AGENT, "gateway-health-check")
        .header(header::CONNECTION, "close")
        .body(Either::Right(Empty::new()))?;
    Ok(h1::send(conn, request).await?.status())
}

/// How long the checks need to notice a change, at most: for the docs and
/// `Retry-After`.
pub fn detection_time(config: &HealthConfig) -> Duration {
    config.interval * config.unhealthy_after.max(config.healthy_after) + config.timeout
}
