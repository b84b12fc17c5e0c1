//! Keep-alive connections to one HTTP/1 upstream endpoint, over TCP or a
//! Unix socket.
//!
//! Hand-written (over the gateway's own HTTP/1.1 client, `h1`, and hyper's
//! connection-level HTTP/2 client) rather than taken from hyper-util's
//! legacy `Client`: on the proxy path, the legacy client's pool
//! (checkout, return, hashing its pool key, its connect race and the large
//! futures those move) is a large share of the gateway's per-request cost
//! (see benches/README.md, Decisions). A sidecar needs much less: a
//! last-in-first-out stack of idle connections per upstream, a cap on how
//! many are kept, an idle timeout that a reaper task enforces (so idle
//! connections really close), and a count of connections opened. Keep the
//! idle timeout below the upstream's own keep-alive timeout.
//!
//! A connection is opened by `connect` and runs over `io`'s [`UpstreamIo`]
//! (send timeout, reset when dropped mid-exchange). An idle HTTP/1.1
//! connection is a plain struct here (its socket and a few flags: no task,
//! no buffer), checked before reuse and by the reaper for a close or stray
//! bytes from the upstream; HTTP/2 connections are hyper's, shared.

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Empty};
use hyper::client::conn::http2;
use hyper_util::rt::TokioIo;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use metrics::Counter;
use tokio::time::Instant;

use super::connect::{ConnectError, TlsTarget, connect_stream};
use super::io::UpstreamIo;
use crate::body::RequestBody;
use crate::config::{Address, EndpointConfig, Protocol, UpstreamConfig};

/// The body sent upstream: the client's, streamed, or nothing.
///
/// The client's body is boxed: it is moved with the request from attempt to
/// attempt, and hyper's HTTP/2 client queues it. Bodiless requests (most)
/// allocate nothing for it.
pub type SendBody = Either<Box<RequestBody>, Empty<Bytes>>;

/// The idle connections of one upstream.
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    /// Where to connect.
    address: Address,
    /// The endpoint's own authority: HTTP/2's `:authority` when the
    /// request's `Host` cannot be one.
    authority: http::uri::Authority,
    tls: Option<TlsTarget>,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
    idle: Mutex<Vec<Idle>>,
    /// `gateway_upstream_connections_opened_total`.
    opened: Counter,
    /// Connections open now (for the status endpoints). Its own `Arc`: a
    /// connection holding the pool would keep the idle connections (and
    /// so itself) alive.
    open: Arc<AtomicUsize>,
    reaper: Once,
    /// As configured: with [`Protocol::Auto`], each new connection's ALPN
    /// decides what that connection speaks.
    configured: Protocol,
    /// What new requests are sent as: [`Protocol::Auto`] until a
    /// connection's ALPN tells, then what the latest new connection chose
    /// (see [`protocol_code`]; an atomic, read on every request). A
    /// backend whose ALPN changes (a rolling upgrade, a balancer with mixed
    /// backends) is followed, not held to its first answer.
    protocol: AtomicU8,
    /// HTTP/2: the shared connections (at most `h2_max`), each carrying
    /// many requests at once.
    h2: Mutex<Vec<http2::SendRequest<SendBody>>>,
    h2_max: usize,
    /// Round-robin position over the HTTP/2 connections.
    h2_next: AtomicUsize,
    /// Held while an HTTP/2 connection is being opened, so that requests
    /// arriving together wait for it instead of each opening its own.
    h2_connecting: tokio::sync::Mutex<()>,
    /// When opening an HTTP/2 connection last failed, and why: requests
    /// that were waiting for that attempt share its failure instead of each
    /// trying again in turn.
    h2_failed: Mutex<Option<(Instant, String)>>,
}

/// HTTP/2 flow-control windows toward upstreams (see `Pool::connect`).
const H2_STREAM_WINDOW: u32 = 256 * 1024;
const H2_CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
/// HTTP/2 PINGs: one after this much silence, and the connection is
/// dropped if it is not answered within the timeout.
const H2_PING_EVERY: Duration = Duration::from_secs(5);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// [`Protocol`] as a number, for an atomic.
fn protocol_code(p: Protocol) -> u8 {
    match p {
        Protocol::Http1 => 0,
        Protocol::H2c => 1,
        Protocol::Auto => 2,
    }
}

/// Counts a connection as open while it lives.
struct Open(Arc<AtomicUsize>);

impl Open {
    fn new(count: &Arc<AtomicUsize>) -> Open {
        count.fetch_add(1, Relaxed);
        Open(count.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// A new connection: HTTP/1.1 (one request at a time, pooled when idle) or
/// HTTP/2 (shared).
pub enum Connected {
    Http1(Conn),
    Http2(http2::SendRequest<SendBody>),
}

struct Idle {
    conn: Conn,
    since: Instant,
}

/// An HTTP/1.1 connection taken from the pool or newly made. Give it back
/// with [`Conn::release`] once its response body is complete, or close it
/// cleanly with [`Conn::close`]; dropping it instead aborts the connection
/// with a TCP reset.
pub struct Conn {
    io: UpstreamIo,
    pool: Weak<Inner>,
    _open: Option<Open>,
}

impl Pool {
    pub fn new(endpoint: &EndpointConfig, config: &UpstreamConfig, opened: Counter) -> Pool {
        Pool {
            inner: Arc::new(Inner {
                address: endpoint.address.clone(),
                authority: endpoint.authority.clone(),
                tls: TlsTarget::new(endpoint, config),
                connect_timeout: config.connect_timeout,
                idle_timeout: config.pool_idle_timeout,
                max_idle: config.pool_max_idle_per_host,
                idle: Mutex::new(Vec::new()),
                opened,
                open: Arc::new(AtomicUsize::new(0)),
                reaper: Once::new(),
                configured: config.protocol,
                protocol: AtomicU8::new(protocol_code(config.protocol)),
                h2: Mutex::new(Vec::new()),
                h2_max: config.max_connections,
                h2_next: AtomicUsize::new(0),
                h2_connecting: tokio::sync::Mutex::new(()),
                h2_failed: Mutex::new(None),
            }),
        }
    }

    /// Connections open now (HTTP/1.1 and HTTP/2; a tunnel after a 101 no
    /// longer counts), and of those, HTTP/1.1 ones idle in the pool.
    pub fn connections(&self) -> (usize, usize) {
        let idle = self.inner.idle.lock().expect("pool lock").len();
        (self.inner.open.load(Relaxed), idle)
    }

    /// Whether requests go over HTTP/2 (for an `auto` upstream: whether its
    /// latest new connection negotiated it).
    pub fn speaks_h2(&self) -> bool {
        self.inner.protocol.load(Relaxed) == protocol_code(Protocol::H2c)
    }

    /// Whether every connection speaks HTTP/2 without asking (`h2c`).
    pub fn h2_prior_knowledge(&self) -> bool {
        self.inner.configured == Protocol::H2c
    }

    /// The HTTP/2 connection to send on: `None` while fewer than
    /// `max_connections` are open (the caller opens one), else the live ones
    /// in turn. Each multiplexes; a request beyond the upstream's
    /// concurrent-stream limit waits inside hyper for a stream to free.
    pub fn h2_sender(&self) -> Option<http2::SendRequest<SendBody>> {
        let mut conns = self.inner.h2.lock().expect("pool lock");
        conns.retain(|c| !c.is_closed());
        if conns.len() < self.inner.h2_max {
            return None;
        }
        let next = self.inner.h2_next.fetch_add(1, Relaxed) % conns.len();
        Some(conns[next].clone())
    }

    /// The endpoint's own authority.
    pub fn authority(&self) -> &http::uri::Authority {
        &self.inner.authority
    }

    /// The `:scheme` of requests over HTTP/2.
    pub fn scheme(&self) -> http::uri::Scheme {
        if self.inner.tls.is_some() { http::uri::Scheme::HTTPS } else { http::uri::Scheme::HTTP }
    }

    /// Waits while another request opens an HTTP/2 connection; then the
    /// caller looks again ([`Pool::h2_sender`]) or opens one itself, holding
    /// the guard until it is kept.
    pub async fn h2_opening(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.inner.h2_connecting.lock().await
    }

    /// Notes that opening an HTTP/2 connection failed.
    pub fn h2_connect_failed(&self, e: &ConnectError) {
        *self.inner.h2_failed.lock().expect("pool lock") = Some((Instant::now(), e.to_string()));
    }

    /// Why opening an HTTP/2 connection failed after `since`, if it did.
    pub fn h2_failed_since(&self, since: Instant) -> Option<String> {
        let failed = self.inner.h2_failed.lock().expect("pool lock");
        failed.as_ref().filter(|(at, _)| *at >= since).map(|(_, why)| why.clone())
    }

    /// Keeps a new HTTP/2 connection for later requests, if there is room.
    fn keep_h2(&self, sender: &http2::SendRequest<SendBody>) {
        let mut conns = self.inner.h2.lock().expect("pool lock");
        if conns.len() < self.inner.h2_max {
            conns.push(sender.clone());
        }
    }

    /// The most recently used idle connection that is still open and has
    /// not been idle too long.
    pub fn take_idle(&self) -> Option<Conn> {
        loop {
            let mut i = self.inner.idle.lock().expect("pool lock").pop()?;
            // Readable while idle means the upstream closed it or sent
            // bytes nobody asked for: either way it cannot carry a request.
            if i.since.elapsed() < self.inner.idle_timeout && !i.conn.io.is_stale() {
                return Some(i.conn);
            }
        }
    }

    /// Opens a new connection. Any HTTP/1.1 connection can switch protocols
    /// after a 101: the response hands it to the tunnel (see `h1`).
    pub async fn connect(&self) -> Result<Connected, ConnectError> {
        self.start_reaper();
        let inner = &self.inner;
        let stream = connect_stream(&inner.address, inner.tls.as_ref(), inner.connect_timeout).await?;
        let auto = inner.configured == Protocol::Auto;
        let h2 = if auto { stream.alpn_h2() } else { self.h2_prior_knowledge() };
        // An HTTP/2 connection is shared: requests end with their own
        // stream's reset, and the connection closes cleanly.
        let upstream_io = UpstreamIo::new(stream, h2);
        if h2 {
            let (sender, connection) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                // A small window per stream against a large one for the
                // connection: hyper's defaults (2 MiB and 5 MiB) let three
                // clients that stop reading fill the shared connection's
                // window and stall every other request on it.
                .initial_stream_window_size(H2_STREAM_WINDOW)
                .initial_connection_window_size(H2_CONNECTION_WINDOW)
                // A connection that went silently dead (a lost peer, a NAT
                // entry dropped) is noticed and dropped, not kept forever.
                .keep_alive_interval(H2_PING_EVERY)
                .keep_alive_timeout(H2_PING_TIMEOUT)
                .keep_alive_while_idle(true)
                .handshake(TokioIo::new(upstream_io))
                .await?;
            let open = Open::new(&inner.open);
            tokio::spawn(async move {
                let _open = open;
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "upstream HTTP/2 connection ended with an error");
                }
            });
            inner.opened.increment(1);
            inner.protocol.store(protocol_code(Protocol::H2c), Relaxed);
            self.keep_h2(&sender);
            return Ok(Connected::Http2(sender));
        }
        if auto {
            inner.protocol.store(protocol_code(Protocol::Http1), Relaxed);
        }
        inner.opened.increment(1);
        let open = Some(Open::new(&inner.open));
        Ok(Connected::Http1(Conn { io: upstream_io, pool: Arc::downgrade(inner), _open: open }))
    }

    /// Starts, once, the task that closes connections idle for longer than
    /// the idle timeout. It ends when the pool is dropped.
    fn start_reaper(&self) {
        self.inner.reaper.call_once(|| {
            let pool = Arc::downgrade(&self.inner);
            let every = (self.inner.idle_timeout / 2).max(Duration::from_millis(50));
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(every).await;
                    let Some(inner) = pool.upgrade() else { return };
                    let mut idle = inner.idle.lock().expect("pool lock");
                    idle.retain_mut(|i| i.since.elapsed() < inner.idle_timeout && !i.conn.io.is_stale());
                }
            });
        });
    }
}

impl Conn {
    /// A connection of no pool (a health check's): [`Conn::release`]
    /// closes it.
    pub fn unpooled(io: UpstreamIo) -> Conn {
        Conn { io, pool: Weak::new(), _open: None }
    }

    /// Starts an exchange: writes fail after `send_timeout` without
    /// progress (the route's body timeout), the request body may be large
    /// (see [`UpstreamIo::begin`]), and a drop from now on is a reset.
    pub fn prepare(&mut self, send_timeout: Duration, large_request: bool) {
        self.io.begin(send_timeout, large_request);
    }

    /// The socket, for the exchange.
    pub fn io_mut(&mut self) -> &mut UpstreamIo {
        &mut self.io
    }

    /// Returns the connection to its pool, unless the pool is full (then
    /// it is closed cleanly).
    pub fn release(mut self) {
        self.io.finish();
        let Some(inner) = self.pool.upgrade() else { return };
        let mut idle = inner.idle.lock().expect("pool lock");
        if idle.len() < inner.max_idle {
            idle.push(Idle { conn: self, since: Instant::now() });
        }
    }

    /// The upstream switched protocols: the socket becomes a tunnel's, and
    /// no longer counts as a pooled connection.
    pub fn into_io(self) -> UpstreamIo {
        self.io
    }

    /// Closes the connection cleanly after a complete exchange, instead of
    /// pooling it (its framing could not be trusted).
    pub fn close(mut self) {
        self.io.finish();
    }
}
