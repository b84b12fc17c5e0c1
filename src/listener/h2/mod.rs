//! The gateway's own client-facing HTTP/2 connection (`server.http2 =
//! "gateway"`) on the h2 crate, in place of hyper's server connection;
//! h2 does the framing, HPACK and flow control, as it does under hyper.
//!
//! Why: hyper's server cannot send a 1xx answer (hyperium/hyper#4114), and
//! a proxy forwards the 1xx answers it did not ask for (RFC 9110 §15.2):
//! here an upstream's `103 Early Hints` (with its `Link` fields) and `102`
//! reach the client before the final answer, and `Expect: 100-continue`
//! is answered when the body is first asked for, as on the own HTTP/1.1
//! connection.
//!
//! How its parts fit, after hyper's `proto::h2::server`: this file takes
//! the handshake and accepts streams beside the connection's watchdog (as
//! `listener` runs hyper's connection), each stream in a task of its own;
//! `stream` makes the request (its body an h2 receive stream,
//! `crate::body::H2Body`), waits for the app's answer while forwarding
//! 1xx heads and watching for the client's reset; `send` writes the answer
//! and its body through flow control, trailers included.
//!
//! The connection takes hyper's settings (see [`Settings`], applied to
//! both). Where it decides differently from hyper's:
//! - A TLS connection without ALPN, and a plain one whose first bytes are
//!   not the whole HTTP/2 preface at once, go to hyper-util's `auto`
//!   connection as before, so they are served by hyper.
//! - A `CONNECT` request gets an empty body whatever it declares (hyper
//!   resets one that declares a body); the app refuses `CONNECT` either way.
//! - A response's connection-specific fields are dropped quietly where
//!   hyper logs a warning for each.
//! - An upstream's 1xx answers (which hyper's cannot send) go out at most
//!   `stream::MAX_INTERIMS` to a stream, the rest dropped: each is a
//!   HEADERS frame queued outside flow control.

mod send;
mod stream;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::server::{Connection as H2Connection, Handshake};
use tokio::io::{AsyncRead, AsyncWrite};

use super::conn::ConnState;
use super::{Connection, Driven, Kind};
use crate::config::ServerConfig;
use crate::server::App;

/// The HTTP/2 settings a client connection takes, hyper's server's own
/// defaults but the header list bound; given to hyper's builder and to the
/// h2 crate's alike, so the two connections cannot drift apart.
pub(super) struct Settings {
    pub stream_window: u32,
    pub connection_window: u32,
    pub max_frame_size: u32,
    pub max_concurrent_streams: u32,
    pub max_send_buffer: usize,
    pub max_local_error_resets: usize,
    pub max_header_list_size: u32,
}

impl Settings {
    pub fn of(server: &ServerConfig) -> Self {
        Settings {
            stream_window: 1024 * 1024,
            connection_window: 1024 * 1024,
            max_frame_size: 16 * 1024,
            max_concurrent_streams: 200,
            max_send_buffer: 400 * 1024,
            max_local_error_resets: 1024,
            max_header_list_size: server.max_header_size.min(u64::from(u32::MAX)) as u32,
        }
    }

    /// The h2 crate's server builder with these settings.
    pub fn builder(&self) -> h2::server::Builder {
        let mut b = h2::server::Builder::new();
        b.initial_window_size(self.stream_window)
            .initial_connection_window_size(self.connection_window)
            .max_frame_size(self.max_frame_size)
            .max_concurrent_streams(self.max_concurrent_streams)
            .max_send_buffer_size(self.max_send_buffer)
            .max_local_error_reset_streams(Some(self.max_local_error_resets))
            .max_header_list_size(self.max_header_list_size);
        b
    }
}

/// What every stream of a connection needs to be answered.
#[derive(Clone)]
struct Streams {
    app: Arc<App>,
    kind: Kind,
    state: Arc<ConnState>,
}

/// Serves HTTP/2 on `io` until the connection ends.
pub(super) async fn serve<I>(io: I, c: Connection)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Connection { builders, addr, app, kind, stops, state, mut watchdog } = c;
    let timeouts = watchdog.timeouts();
    let handshake = builders.h2.handshake(io);
    let streams = Streams { app, kind, state };
    // Boxed, as hyper's `auto` connection is: the h2 connection's state is
    // large, and only HTTP/2 connections take it.
    let mut conn = Box::pin(Served { state: State::Handshaking(handshake), streams, close_pending: false });
    let shutdown = |c: Pin<&mut Served<I>>| c.get_mut().graceful_shutdown();
    let driven = super::drive(conn.as_mut(), shutdown, &mut watchdog, &stops, timeouts, addr).await;
    if let Driven::Ended(Some(e)) = driven {
        tracing::debug!(client = %addr, error = %e, "connection ended with an error");
    }
}

enum State<I> {
    Handshaking(Handshake<I, Bytes>),
    Serving(H2Connection<I, Bytes>),
}

/// The connection's future: the handshake, then streams accepted until the
/// client or a graceful shutdown ends it.
struct Served<I> {
    state: State<I>,
    streams: Streams,
    /// A graceful shutdown was asked for during the handshake.
    close_pending: bool,
}

impl<I> Served<I>
where
    I: AsyncRead + AsyncWrite + Unpin,
{
    /// Sends GOAWAY: the streams already begun are served, no new ones.
    fn graceful_shutdown(&mut self) {
        match &mut self.state {
            State::Handshaking(_) => self.close_pending = true,
            State::Serving(conn) => conn.graceful_shutdown(),
        }
    }
}

impl<I> Future for Served<I>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = Result<(), h2::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let me = self.get_mut();
        loop {
            match &mut me.state {
                State::Handshaking(hs) => {
                    let conn = ready!(Pin::new(hs).poll(cx))?;
                    me.state = State::Serving(conn);
                }
                State::Serving(conn) => {
                    if std::mem::take(&mut me.close_pending) {
                        conn.graceful_shutdown();
                    }
                    while let Some(accepted) = ready!(conn.poll_accept(cx)) {
                        let (req, respond) = accepted?;
                        // A task per stream, as hyper's connection spawns
                        // its streams: one slow answer holds no other.
                        tokio::spawn(stream::serve(me.streams.clone(), req, respond));
                    }
                    return Poll::Ready(Ok(()));
                }
            }
        }
    }
}
