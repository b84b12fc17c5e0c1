//! A new connection, from accept to the connection that serves its
//! protocol: its state and watchdog made as it is accepted, then its task's
//! future, kept small because an idle connection's task holds it.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;

use super::conn::{ConnState, Timeouts, Watchdog};
use super::io::{ClientIo, Rewind, first_bytes};
use super::{Builders, Connection, Held, Kind, Own, Stops, h1, h2, secure_connection, serve_connection};
use crate::metrics;
use crate::request::Peer;
use crate::server::App;

/// What the accept loop hands a new connection.
pub(super) struct Accepted {
    pub stream: TcpStream,
    pub addr: SocketAddr,
    pub kind: Kind,
    pub timeouts: Arc<Timeouts>,
    pub stops: Stops,
    pub tls: Option<TlsAcceptor>,
    pub permit: OwnedSemaphorePermit,
}

/// One connection, from accept to close: its state and watchdog made here,
/// then [`serve_accepted`].
///
/// Not `async`: what is made here is moved into the task's future once. An
/// `async fn` keeps its arguments for its whole life beside whatever they
/// are moved into, and this future is what every connection's task holds,
/// idle or not.
pub(super) fn connection(builders: Arc<Builders>, app: Arc<App>, a: Accepted) -> impl Future<Output = ()> + Send {
    let open = (a.kind == Kind::Main).then(metrics::connection_opened);
    // A dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d: trust and
    // X-Forwarded-For use the plain IPv4 address.
    let ip = a.addr.ip().to_canonical();
    // Known before the protocol is: either own connection may forward 1xx
    // (hyper's connection, with one of them chosen, looks for a queue in vain).
    let server = &app.config().server;
    let own =
        server.http1 == crate::config::Http1Server::Gateway || server.http2 == crate::config::Http2Server::Gateway;
    let peer = Peer::new(ip, app.trusts(ip), a.tls.is_some()).forwarding_1xx(own);
    let state = Arc::new(ConnState::new(peer, a.addr.port(), a.timeouts));
    let io = ClientIo::new(a.stream, state.clone());
    let watchdog = Watchdog::new(state.clone());
    let (addr, kind, stops) = (a.addr, a.kind, a.stops);
    let c = Connection { builders, addr, app, kind, stops, state, watchdog };
    serve_accepted(c, io, a.tls, (a.permit, open))
}

/// [`connection`]'s future: the TLS handshake first, if the listener has
/// TLS (within the header read timeout, which runs from accept), then the
/// connection that serves the protocol. `held` (the connection's slot and
/// its count in the metrics) is let go when it ends. (An `async` block,
/// not an `async fn`: that would copy its arguments into its own locals
/// and keep both.)
#[allow(clippy::manual_async_fn)]
fn serve_accepted(
    mut c: Connection,
    mut io: ClientIo,
    tls: Option<TlsAcceptor>,
    held: Held,
) -> impl Future<Output = ()> + Send {
    async move {
        // Held, not used: let go when the connection ends (or handed to it
        // when it parks).
        let mut held = Some(held);
        let addr = c.addr;
        let Some(acceptor) = tls else {
            // Within the header read timeout, which runs from accept.
            let first = tokio::select! {
                first = first_bytes(&mut io) => first,
                _ = &mut c.watchdog => {
                    metrics::rejected("", "header_timeout");
                    tracing::debug!(client = %addr, "no request head within the header read timeout");
                    return;
                }
                _ = c.stops.graceful.cancelled() => return,
            };
            // Closed (or failed) before a byte told the protocol.
            let Some((http, first)) = first else { return };
            match c.served_by(http) {
                // Not boxed, and borrowing the connection: this future is what
                // an idle own HTTP/1.1 connection's task holds (see `h1`).
                Own::Http1 => return h1::serve(h1::ClientStream::Plain(io), first, &mut c, &mut held).await,
                // Boxed: every connection's task would reserve their space.
                Own::Http2 => return Box::pin(h2::serve(Rewind::new(first.freeze(), io), c)).await,
                Own::No => return Box::pin(serve_connection(Rewind::new(first.freeze(), io), c, http)).await,
            }
        };
        // Boxed: a TLS connection's future (rustls' state, the TLS stream) is
        // several KiB larger, and every plain connection's task would reserve
        // that space too.
        Box::pin(secure_connection(acceptor, io, c)).await
    }
}
