//! Keep-alive connections to one HTTP/1 upstream.
//!
//! Hand-written on hyper's connection-level client rather than taken from
//! hyper-util's legacy `Client`: profiled with callgrind on the proxy path,
//! the legacy client's pool (checkout, return, hashing its pool key, its
//! connect race and the large futures those move) cost about 8,500
//! instructions per proxied request, a fifth of the gateway's whole
//! per-request cost. A sidecar needs much less: a last-in-first-out stack of
//! idle connections per upstream, a cap on how many are kept, an idle timeout
//! that a reaper task enforces (so idle connections really close), and a count
//! of connections opened. Keep the idle timeout below the upstream's own
//! keep-alive timeout.

use std::sync::{Arc, Mutex, Once, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Empty};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use metrics::Counter;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::body::RequestBody;
use crate::config::UpstreamConfig;

/// The body sent upstream: the client's, streamed, or nothing.
pub type SendBody = Either<RequestBody, Empty<Bytes>>;

/// Why a new connection could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connect timed out after {}", humantime::format_duration(*.0))]
    Timeout(Duration),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("handshake: {0}")]
    Handshake(#[from] hyper::Error),
}

/// The idle connections of one upstream.
pub struct Pool {
    inner: Arc<Inner>,
}

struct Inner {
    /// `host:port` to connect to.
    addr: String,
    connect_timeout: Duration,
    idle_timeout: Duration,
    max_idle: usize,
    idle: Mutex<Vec<Idle>>,
    /// `gateway_upstream_connections_opened_total`.
    opened: Counter,
    reaper: Once,
}

struct Idle {
    sender: SendRequest<SendBody>,
    since: Instant,
}

/// A connection taken from the pool or newly made. Give it back with
/// [`Conn::release`] once its response body is complete; dropping it
/// instead closes the connection.
pub struct Conn {
    pub sender: SendRequest<SendBody>,
    /// Whether it came from the pool (and so may have gone stale).
    pub reused: bool,
    pool: Weak<Inner>,
}

impl Pool {
    pub fn new(config: &UpstreamConfig, opened: Counter) -> Pool {
        let port = config.authority.port_u16().unwrap_or(80);
        Pool {
            inner: Arc::new(Inner {
                addr: format!("{}:{port}", config.authority.host()),
                connect_timeout: config.connect_timeout,
                idle_timeout: config.pool_idle_timeout,
                max_idle: config.pool_max_idle_per_host,
                idle: Mutex::new(Vec::new()),
                opened,
                reaper: Once::new(),
            }),
        }
    }

    /// The most recently used idle connection that is still open and has
    /// not been idle too long.
    pub fn take_idle(&self) -> Option<Conn> {
        let mut idle = self.inner.idle.lock().expect("pool lock");
        while let Some(i) = idle.pop() {
            // Not ready means the previous exchange is still sending its
            // request body (the upstream answered early); waiting for it
            // could hold this request up indefinitely, so the connection is
            // dropped instead.
            if i.since.elapsed() < self.inner.idle_timeout && i.sender.is_ready() {
                return Some(Conn { sender: i.sender, reused: true, pool: Arc::downgrade(&self.inner) });
            }
        }
        None
    }

    /// Opens a new connection.
    pub async fn connect(&self) -> Result<Conn, ConnectError> {
        self.start_reaper();
        let inner = &self.inner;
        let stream = tokio::time::timeout(inner.connect_timeout, TcpStream::connect(inner.addr.as_str()))
            .await
            .map_err(|_| ConnectError::Timeout(inner.connect_timeout))??;
        stream.set_nodelay(true)?;
        let (sender, connection) = http1::Builder::new().writev(false).handshake(TokioIo::new(stream)).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        inner.opened.increment(1);
        Ok(Conn { sender, reused: false, pool: Arc::downgrade(inner) })
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
                    idle.retain(|i| i.since.elapsed() < inner.idle_timeout && !i.sender.is_closed());
                }
            });
        });
    }
}

impl Conn {
    /// Returns the connection to its pool, unless it closed or the pool is
    /// full (then it is dropped, which closes it).
    pub fn release(self) {
        let Some(inner) = self.pool.upgrade() else { return };
        if self.sender.is_closed() {
            return;
        }
        let mut idle = inner.idle.lock().expect("pool lock");
        if idle.len() < inner.max_idle {
            idle.push(Idle { sender: self.sender, since: Instant::now() });
        }
    }
}
