//! Listeners: the accept loop with its connection cap, and each connection's
//! task.
//!
//! - [`serve`] accepts until told to stop, holding at most `max_connections`
//!   at once (the rest wait in the kernel's backlog), then drains.
//! - Each connection runs hyper's HTTP/1 connection, or hyper-util's `auto`
//!   one where it may be HTTP/2 (h2c, or `h2` by ALPN), or the gateway's
//!   own ([`h1`], [`h2`]) where `server.http1` or `server.http2` asks, beside a
//!   [`conn::Watchdog`] that enforces the header-read, idle and send
//!   timeouts from what [`io::ClientIo`] and the requests report to the
//!   connection's [`conn::ConnState`].
//! - The main listener serves [`App::handle`]; the optional admin listener
//!   serves only the built-ins, with the same timeouts and its own small cap.

mod accepted;
mod builders;
pub mod conn;
mod detach;
pub mod h1;
mod h2;
pub mod io;
mod stops;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use crate::body::Incoming;
use bytes::BytesMut;
use futures_util::FutureExt;
use http::{Request, Response, StatusCode, Version};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::AccessLine;
use crate::metrics;
use crate::server::App;
use crate::upstream::tunnel::PendingTunnel;
use accepted::{Accepted, connection};
use builders::{Builders, builders};
use conn::{ConnBody, ConnState, Expired, Timeouts, Watchdog};
use io::ClientIo;
use stops::{Said, Stops, relay};

/// Which service a listener runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Routes and (without an admin listener) the built-ins.
    Main,
    /// `/metrics`, `/healthz` and `/readyz` only.
    Admin,
}

impl Kind {
    /// The `reason` counted for a connection that had to wait for a slot.
    fn waited_reason(self) -> &'static str {
        match self {
            Kind::Main => "max_connections",
            Kind::Admin => "admin_max_connections",
        }
    }
}

/// How often, at most, the "connection limit reached" warning is logged.
const LIMIT_WARNING_EVERY: Duration = Duration::from_secs(10);

/// Serves `listener` until `stop` is cancelled; then stops accepting (closing
/// the listener, so new connections are refused), shuts every connection
/// down gracefully and waits up to `shutdown_timeout` for them to finish.
pub async fn serve(listener: TcpListener, app: Arc<App>, kind: Kind, stop: CancellationToken) {
    let server = &app.config().server;
    let max_connections = match kind {
        Kind::Main => server.max_connections,
        Kind::Admin => app.config().metrics.max_connections,
    };
    let timeouts = Arc::new(Timeouts {
        header_read: server.header_read_timeout,
        idle: server.idle_timeout,
        send: server.send_timeout,
    });
    let tcp_keepalive = server.tcp_keepalive;
    // A listener bound with its connections' options gives them to each
    // (Linux): none is set again, five calls on every connection (see
    // benches/README.md, "A new connection's cost").
    let inherited = crate::net::configured(&listener, tcp_keepalive);
    let builders = Arc::new(builders(&app));
    let limit = Arc::new(Semaphore::new(max_connections));
    let tracker = TaskTracker::new();
    let kill = CancellationToken::new();
    // The connections' graceful stop is `stop` passed on once `said` says
    // so (see `Said`).
    let said = Arc::new(Said::default());
    let graceful = CancellationToken::new();
    tokio::spawn(relay(stop.clone(), graceful.clone(), said.clone()));
    let shared = h1::Listener { builders: builders.clone(), app: app.clone(), kind, graceful, now: kill.clone(), said };
    let parking = Arc::new(h1::Parking::new(shared, tracker.clone(), server.park_after));
    tokio::spawn(parking.clone().run(stop.clone()));
    let mut waits = LimitWarning::default();
    // Set when the cap was reached, until the backlog is found empty: every
    // connection accepted at once meanwhile was waiting in it.
    let mut draining_backlog = false;
    loop {
        // Past the cap, stop accepting: new connections wait in the kernel's
        // backlog until a slot frees.
        let permit = match limit.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                draining_backlog = true;
                tokio::select! {
                    p = limit.clone().acquire_owned() => p.expect("semaphore is never closed"),
                    _ = stop.cancelled() => break,
                }
            }
        };
        let ready = if draining_backlog { crate::net::accept(&listener).now_or_never() } else { None };
        draining_backlog = ready.is_some();
        let (stream, addr) = match ready {
            Some(accepted) => {
                metrics::rejected("", kind.waited_reason());
                waits.waited(max_connections);
                accepted
            }
            None => tokio::select! {
                accepted = crate::net::accept(&listener) => accepted,
                _ = stop.cancelled() => break,
            },
        };
        if !inherited {
            crate::net::configure(&stream, tcp_keepalive);
        }
        let stops = parking.stops();
        // Per connection: a reload may have replaced the certificate.
        let tls = match kind {
            Kind::Main => app.tls_config().map(TlsAcceptor::from),
            Kind::Admin => None,
        };
        let accepted = Accepted { stream, addr, kind, timeouts: timeouts.clone(), stops, tls, permit };
        // The task's future is the connection's own, not one wrapping it:
        // a wrapper keeps its captures beside the copies moved into it (see
        // benches/README.md, Decisions).
        tracker.spawn(connection(builders.clone(), app.clone(), accepted));
    }
    drop(listener);
    tracker.close();
    let why = tokio::select! {
        _ = tracker.wait() => return tracing::info!(listener = ?kind, "all connections closed"),
        _ = tokio::time::sleep(server.shutdown_timeout) => "shutdown timeout passed",
        _ = app.drain_cut_short() => "asked again to stop",
    };
    tracing::warn!(listener = ?kind, "{why}; closing remaining connections");
    // Closed here, not by the runtime as the process exits: the requests
    // cut off are logged, counted and their spans queued (as the gateway's
    // 503, not as clients that left) before the spans are flushed.
    app.abandon_requests();
    parking.said().say_now();
    kill.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), tracker.wait()).await;
}

/// What a connection holds until it ends: its slot under the listener's
/// cap and its count in the metrics.
type Held = (tokio::sync::OwnedSemaphorePermit, Option<metrics::ConnectionGuard>);

/// Rate-limits the warning for connections that waited for a slot.
#[derive(Default)]
struct LimitWarning {
    last: Option<Instant>,
    since_last: u64,
}

impl LimitWarning {
    fn waited(&mut self, max_connections: usize) {
        self.since_last += 1;
        if self.last.is_none_or(|t| t.elapsed() >= LIMIT_WARNING_EVERY) {
            tracing::warn!(
                max_connections,
                waited = self.since_last,
                "connection limit reached; new connections wait in the backlog"
            );
            self.last = Some(Instant::now());
            self.since_last = 0;
        }
    }
}

/// Which hyper connection serves a connection.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Http {
    /// Known to be HTTP/1 (its first bytes, or `http/1.1` by ALPN): served
    /// by hyper's HTTP/1 connection directly, or by the own one ([`h1`]).
    One,
    /// HTTP/1 or HTTP/2 (TLS without ALPN): hyper-util's `auto` connection
    /// reads the first bytes and chooses.
    Auto,
    /// Known to be HTTP/2 (its whole preface read, or `h2` by ALPN): served
    /// as [`Http::Auto`], or by the own HTTP/2 connection ([`h2`]).
    Two,
}

/// What a connection's task carries besides its byte stream.
struct Connection {
    builders: Arc<Builders>,
    addr: SocketAddr,
    app: Arc<App>,
    kind: Kind,
    stops: Stops,
    state: Arc<ConnState>,
    watchdog: Watchdog,
}

impl Connection {
    /// Which of the gateway's own connections serves `http`, if one does.
    fn served_by(&self, http: Http) -> Own {
        let server = &self.app.config().server;
        match http {
            Http::One if server.http1 == crate::config::Http1Server::Gateway => Own::Http1,
            Http::Two if server.http2 == crate::config::Http2Server::Gateway => Own::Http2,
            _ => Own::No,
        }
    }
}

/// Which of the gateway's own connections serves a connection.
enum Own {
    Http1,
    Http2,
    /// None: hyper's does.
    No,
}

/// [`connection`] on a TLS listener: the handshake, then [`serve_connection`].
async fn secure_connection(acceptor: TlsAcceptor, io: ClientIo, mut c: Connection) {
    let (addr, state) = (c.addr, c.state.clone());
    let secured = tokio::select! {
        accepted = acceptor.accept(io) => match accepted {
            Ok(secured) => secured,
            Err(e) => {
                // A connect-and-close (a TCP health probe) sent nothing: no
                // handshake was tried, so none failed.
                if state.has_sent() {
                    metrics::rejected("", "tls_handshake");
                }
                tracing::debug!(client = %addr, error = %crate::tls::describe_failure(&e), "TLS handshake failed");
                return;
            }
        },
        _ = &mut c.watchdog => {
            metrics::rejected("", "header_timeout");
            tracing::debug!(client = %addr, "no TLS handshake within the header read timeout");
            return;
        }
        _ = c.stops.graceful.cancelled() => return,
    };
    // ALPN's `http/1.1` is HTTP/1 for sure, and `h2` HTTP/2; no ALPN goes
    // to `auto`, which also takes HTTP/2 with prior knowledge.
    let http = match secured.get_ref().1.alpn_protocol() {
        Some(b"http/1.1") => Http::One,
        Some(b"h2") => Http::Two,
        _ => Http::Auto,
    };
    match c.served_by(http) {
        // Not parked: its slot is held by the task that runs this.
        Own::Http1 => h1::serve(h1::ClientStream::Tls(Box::new(secured)), BytesMut::new(), &mut c, &mut None).await,
        Own::Http2 => h2::serve(secured, c).await,
        Own::No => serve_connection(secured, c, http).await,
    }
}

/// Serves HTTP on a connection's (plain or TLS) byte stream until it ends,
/// then runs its tunnel if it switched protocols.
async fn serve_connection<I>(io: I, c: Connection, http: Http)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Connection { builders, addr, app, kind, stops, state, mut watchdog } = c;
    let timeouts = watchdog.timeouts();
    let io = TokioIo::new(io);
    let requests = state.clone();
    let service = service_fn(move |mut req: Request<hyper::body::Incoming>| {
        // Here, before hyper reads the connection again (see `detach`).
        detach::detach(&mut req);
        let bodiless = http_body::Body::is_end_stream(req.body());
        let in_flight = requests.request_started(req.version() == Version::HTTP_2, bodiless);
        let app = app.clone();
        // The app's future awaited here, not through [`answer`]'s, and the
        // body made the gateway's inside: a nested future, or a request
        // rebuilt outside, made every move hyper makes of the service's
        // future copy more of its (large) state (see benches/README.md,
        // Decisions).
        async move {
            let req = req.map(Incoming::Hyper);
            let response = match kind {
                Kind::Main => app.handle(req, in_flight.peer()).await,
                Kind::Admin => app.admin(&req, in_flight.peer()).await,
            };
            Ok::<_, Infallible>(answered(&app, kind, response, in_flight))
        }
    });
    let driven = match http {
        Http::One => {
            let conn = pin!(builders.http1.serve_connection(io, service).with_upgrades());
            drive(conn, |c| c.graceful_shutdown(), &mut watchdog, &stops, timeouts, addr).await
        }
        // Boxed: `auto`'s connection, able to hold either protocol's state,
        // is larger, and only HTTP/2 and undecided connections take it.
        Http::Auto => {
            let mut conn = Box::pin(builders.auto.serve_connection_with_upgrades(io, service));
            drive(conn.as_mut(), |c| c.graceful_shutdown(), &mut watchdog, &stops, timeouts, addr).await
        }
        // HTTP/2 has no upgrades; `http2_only` holds only with the plain
        // `serve_connection`.
        Http::Two => {
            let mut conn = Box::pin(builders.http2_only.serve_connection(io, service));
            drive(conn.as_mut(), |c| c.graceful_shutdown(), &mut watchdog, &stops, timeouts, addr).await
        }
    };
    let Driven::Ended(ended) = driven else { return };
    if let Some(e) = ended {
        if let Some(reason) = connection_error_reason(&*e) {
            metrics::rejected("", reason);
        }
        tracing::debug!(client = %addr, error = %e, "connection ended with an error");
    } else if let Some(tunnel) = state.take_tunnel() {
        // hyper handed the connection over after a 101: the tunnel runs
        // here, in the connection's task and slot, until it ends or the
        // shutdown timeout cuts it.
        // Boxed: the tunnel's future is several KiB, and every connection's
        // task would reserve that space for it.
        tokio::select! {
            _ = Box::pin(tunnel.run(timeouts.send)) => {}
            _ = stops.now.cancelled() => {}
        }
    }
}

/// The service's answer to one request: the app's response, with the
/// tunnel a 101 opened kept for the connection and the access log line
/// written once the body is done. `id_by_caller`: the request ID goes in
/// the body's `id`, for the own HTTP/1.1 connection to write with the head
/// (see [`App::handle_with`]), not into the response's map.
///
/// An `async move` block, not an `async fn`, as `App::handle_with` is: an
/// `async fn` copies the request into a local of its own on its first poll.
#[allow(clippy::manual_async_fn)] // See above: not an `async fn` on purpose.
fn answer(
    app: Arc<App>,
    kind: Kind,
    req: Request<Incoming>,
    in_flight: conn::InFlight,
    id_by_caller: bool,
) -> impl Future<Output = Response<ConnBody>> {
    async move {
        let (response, id) = match kind {
            Kind::Main => app.handle_with(req, in_flight.peer(), id_by_caller).await,
            Kind::Admin => (app.admin(&req, in_flight.peer()).await, None),
        };
        let mut response = answered(&app, kind, response, in_flight);
        response.body_mut().id = id;
        response
    }
}

/// The app's `response` made the connection's: see [`answer`].
fn answered(
    app: &App,
    kind: Kind,
    mut response: Response<crate::body::Body>,
    in_flight: conn::InFlight,
) -> Response<ConnBody> {
    // A refused admin client's answer says `close` (see `GatewayError::closes_connection`).
    if kind == Kind::Admin && response.headers().contains_key(http::header::CONNECTION) {
        in_flight.close_http2();
    }
    if response.status() == StatusCode::SWITCHING_PROTOCOLS
        && let Some(tunnel) = response.extensions_mut().remove::<PendingTunnel>().and_then(|t| t.take())
    {
        in_flight.upgraded(tunnel);
    }
    let access = match app.config().server.access_log {
        true => response.extensions_mut().remove::<Box<AccessLine>>(),
        false => None,
    };
    response.map(|body| ConnBody::new(body, in_flight, access))
}

/// How long a connection an answer asked to end (see
/// `conn::InFlight::close_http2`) may take to close once told.
const ASKED_GRACE: Duration = Duration::from_secs(1);

/// How [`drive`] returned.
enum Driven {
    /// hyper's connection ended, with its error if it failed.
    Ended(Option<Box<dyn std::error::Error + Send + Sync>>),
    /// The watchdog or the shutdown timeout cut the connection.
    Cut,
}

/// Runs hyper's connection `conn` beside the watchdog and the shutdown
/// signals until one of them ends it. `shutdown` is the connection's
/// graceful shutdown (HTTP/1 closes once idle; HTTP/2 sends GOAWAY).
async fn drive<C, E>(
    mut conn: Pin<&mut C>,
    shutdown: impl Fn(Pin<&mut C>),
    watchdog: &mut Watchdog,
    stops: &Stops,
    timeouts: Timeouts,
    addr: SocketAddr,
) -> Driven
where
    C: Future<Output = Result<(), E>>,
    E: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut stopping = pin!(stops.graceful.cancelled());
    let mut killed = pin!(stops.now.cancelled());
    let mut shutting_down = false;
    loop {
        tokio::select! {
            biased;
            ended = conn.as_mut() => return Driven::Ended(ended.err().map(Into::into)),
            expired = &mut *watchdog => match expired {
                Expired::Idle | Expired::Resets => {
                    shutdown(conn.as_mut());
                    watchdog.closing(timeouts.header_read);
                }
                Expired::Asked => {
                    shutdown(conn.as_mut());
                    watchdog.cut_after(timeouts.header_read.min(ASKED_GRACE));
                }
                Expired::HeaderTimeout => {
                    metrics::rejected("", "header_timeout");
                    tracing::debug!(client = %addr, "no request head within the header read timeout");
                    return Driven::Cut;
                }
                Expired::SendTimeout => {
                    metrics::rejected("", "send_timeout");
                    tracing::debug!(client = %addr, "client accepted no bytes within the send timeout");
                    return Driven::Cut;
                }
                Expired::GraceOver => return Driven::Cut,
            },
            // Only once shutdown has begun: a cancellation future takes a
            // lock on each poll, and every wakeup polls every branch.
            _ = &mut killed, if shutting_down => return Driven::Cut,
            _ = &mut stopping, if !shutting_down => {
                shutting_down = true;
                shutdown(conn.as_mut());
            }
        }
    }
}

/// The `reason` for a connection that hyper ended because of what the client
/// sent, before any request reached the service.
fn connection_error_reason(e: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let h = crate::error::find_source::<hyper::Error>(e)?;
    if h.is_parse_too_large() {
        Some("header_too_large")
    } else if h.is_parse() || h.is_parse_status() {
        Some("malformed")
    } else {
        None
    }
}
