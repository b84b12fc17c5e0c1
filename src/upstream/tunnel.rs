//! HTTP/1.1 upgrades (WebSocket and the like) on proxy routes: once the
//! upstream answers `101 Switching Protocols`, the gateway relays the 101
//! and then copies bytes both ways until either side closes, or until
//! neither has sent a byte for the route's `upgrade_idle_timeout`.
//!
//! The client's side is taken with hyper's `upgrade::on` (from the
//! request); the upstream's is the connection the gateway's HTTP/1.1
//! client read the 101 on, with any bytes it read past the 101's head
//! (`h1::Upgraded`). No HTTP is parsed here.
//! The tunnel runs in the client connection's own task, after hyper has
//! handed the connection over ([`crate::listener`]): it keeps the
//! connection's `max_connections` slot, and shutdown drains it like a
//! request, cutting it at `shutdown_timeout`.
//!
//! A tunnel holds no `max_requests` slot of its upstream: that bounds
//! requests in flight, and a WebSocket may stay open for hours.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::Response;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use metrics::{Gauge, gauge};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

use super::body::Received;
use super::h1::Upgraded;
use super::proxy;
use crate::body::Body;
use crate::headers::Via;
use crate::metrics::UPGRADED_ACTIVE;

/// A tunnel waiting for the 101 to reach the client. It travels to the
/// client connection in the response's extensions (which must be `Clone`,
/// hence the shared cell).
#[derive(Clone)]
pub struct PendingTunnel(Arc<Mutex<Option<Tunnel>>>);

impl PendingTunnel {
    /// Names the route, for the active-tunnels gauge.
    pub fn set_route(&self, route: &str) {
        if let Some(t) = self.0.lock().expect("tunnel lock").as_mut() {
            t.route = route.to_owned();
        }
    }

    /// The tunnel, once (the connection takes it).
    pub fn take(&self) -> Option<Tunnel> {
        self.0.lock().expect("tunnel lock").take()
    }
}

/// The client's side of a tunnel.
pub enum ClientSide {
    /// hyper's connection hands the client's socket over once the 101 is out.
    Hyper(OnUpgrade),
    /// The gateway's own HTTP/1.1 connection runs the tunnel over its
    /// socket itself (see [`Tunnel::run_over`]).
    Connection,
}

/// Both sides of a switched connection and how long it may stay silent.
pub struct Tunnel {
    client: ClientSide,
    upstream: Upgraded,
    idle: Duration,
    route: String,
}

/// The client's response to an upgrade the upstream accepted: the 101 with
/// the protocol switched to, and the tunnel in its extensions.
pub fn switch(response: Response<Received>, client: ClientSide, idle: Duration, via: &Via) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    proxy::prepare_response(&mut parts, &body, via);
    let upstream = match body {
        Received::Http1(body) => body.into_upgraded().expect("a 101 leaves its connection to the tunnel"),
        Received::Http2(_) => unreachable!("a 101 comes only over HTTP/1.1"),
    };
    let tunnel = Tunnel { client, upstream, idle, route: String::new() };
    parts.extensions.insert(PendingTunnel(Arc::new(Mutex::new(Some(tunnel)))));
    Response::from_parts(parts, Body::empty())
}

impl Tunnel {
    /// Copies bytes both ways until both sides have closed, either fails,
    /// the tunnel has been silent for its idle timeout, or a write has been
    /// blocked for `send_timeout` (a side that stopped reading: bytes the
    /// other side sends would otherwise keep the tunnel "busy" forever).
    pub async fn run(self, send_timeout: Duration) {
        let ClientSide::Hyper(on) = self.client else { return };
        match on.await {
            Ok(client) => relay(TokioIo::new(client), self.upstream, self.idle, self.route, send_timeout).await,
            Err(e) => tracing::debug!(route = self.route, error = %e, "upgrade did not complete"),
        }
    }

    /// [`Tunnel::run`] over the client's socket `client`, handed over by
    /// the gateway's own HTTP/1.1 connection.
    pub async fn run_over<C: AsyncRead + AsyncWrite + Unpin>(self, client: C, send_timeout: Duration) {
        relay(client, self.upstream, self.idle, self.route, send_timeout).await
    }
}

/// Copies bytes both ways between the two sides (see [`Tunnel::run`]).
async fn relay<C: AsyncRead + AsyncWrite + Unpin>(
    client: C,
    mut upstream: Upgraded,
    idle: Duration,
    route: String,
    send_timeout: Duration,
) {
    upstream.io_mut().into_tunnel(idle);
    let _active = Active::new(gauge!(UPGRADED_ACTIVE, "route" => route.clone()));
    let clock = Clock { start: Instant::now(), last_read: AtomicU64::new(0), blocked: Default::default() };
    let mut client = Watched { io: client, clock: &clock, side: 0 };
    let mut upstream = Watched { io: upstream, clock: &clock, side: 1 };
    tokio::select! {
        copied = tokio::io::copy_bidirectional(&mut client, &mut upstream) => match copied {
            Ok((up, down)) => tracing::debug!(route, up, down, "tunnel closed"),
            Err(e) => tracing::debug!(route, error = %e, "tunnel failed"),
        },
        why = clock.expired(idle, send_timeout) => tracing::debug!(route, "tunnel {why}; closing"),
    }
}

/// What a tunnel's two sides report, in milliseconds since `start`.
struct Clock {
    start: Instant,
    /// When either side last read bytes.
    last_read: AtomicU64,
    /// Per side (client, upstream): since when a write to it has been
    /// waiting, plus one (0: none is). Per side, or writes flowing the
    /// other way would hide one that stays blocked.
    blocked: [AtomicU64; 2],
}

impl Clock {
    fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.start + Duration::from_millis(ms)
    }

    /// Resolves once no byte has been read for `idle`, or a write has been
    /// blocked for `send`; says which.
    async fn expired(&self, idle: Duration, send: Duration) -> &'static str {
        loop {
            let quiet = self.at(self.last_read.load(Relaxed)) + idle;
            let blocked = self.blocked.iter().map(|b| b.load(Relaxed)).filter(|&b| b != 0).min();
            let stalled = blocked.map(|b| self.at(b - 1) + send);
            let now = Instant::now();
            if now >= quiet {
                return "idle";
            }
            if stalled.is_some_and(|at| now >= at) {
                return "blocked: a side stopped reading";
            }
            // Woken at the nearer deadline, or now and then to notice a
            // write that blocks meanwhile.
            let check = stalled.unwrap_or(now + send).min(quiet).min(now + send / 4);
            tokio::time::sleep_until(check).await;
        }
    }
}

/// One tunnel in `gateway_upgraded_connections_active`, until dropped.
struct Active(Gauge);

impl Active {
    fn new(gauge: Gauge) -> Self {
        gauge.increment(1.0);
        Active(gauge)
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.decrement(1.0);
    }
}

/// One side of a tunnel, noting when it last read bytes and whether a
/// write is waiting. (Per-direction read timeouts, as `tokio-io-timeout`
/// offers, would close a WebSocket whose server pushes to a client that
/// never speaks; the tunnel is idle only when neither side sends.)
struct Watched<'a, T> {
    io: T,
    clock: &'a Clock,
    /// Its index in [`Clock::blocked`].
    side: usize,
}

impl<T: AsyncRead + Unpin> AsyncRead for Watched<'_, T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.last_read.store(self.clock.now(), Relaxed);
        }
        poll
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Watched<'_, T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.io).poll_write(cx, buf);
        let blocked = &self.clock.blocked[self.side];
        match &poll {
            Poll::Pending if blocked.load(Relaxed) == 0 => blocked.store(self.clock.now() + 1, Relaxed),
            Poll::Ready(_) if blocked.load(Relaxed) != 0 => blocked.store(0, Relaxed),
            _ => {}
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
