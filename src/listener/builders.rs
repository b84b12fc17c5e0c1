//! The HTTP settings a listener's connections are built with, one set per
//! listener: hyper's builders and the h2 crate's.

use hyper::server::conn::http1;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;

use super::h2;
use crate::server::App;

/// The HTTP settings every connection of a listener shares: hyper's HTTP/1
/// builder for connections known to speak HTTP/1 (see [`Http`]),
/// hyper-util's `auto` builder, with the same HTTP/1 settings, for the
/// rest, and the h2 crate's for the own HTTP/2 connection ([`h2`]), with
/// the HTTP/2 settings `auto` has.
pub(super) struct Builders {
    pub http1: http1::Builder,
    pub auto: auto::Builder<TokioExecutor>,
    /// `auto` for connections known to speak HTTP/2 (`h2` by ALPN, or the
    /// whole preface seen): anything else on them is a connection error
    /// (RFC 9113 §3.3), not HTTP/1.1 served after all.
    pub http2_only: auto::Builder<TokioExecutor>,
    pub h2: ::h2::server::Builder,
}

/// The HTTP/1 settings, applied alike to hyper's builder and to `auto`'s
/// (two types with the same setters), so the two paths cannot drift apart.
macro_rules! http1_settings {
    ($builder:expr, $server:expr) => {
        $builder
            // The watchdog times request heads instead: hyper's timer would
            // also cut idle keep-alive connections at the header timeout.
            .header_read_timeout(None)
            // Bounds the request head: past it hyper answers 431 and closes.
            .max_buf_size($server.max_header_size as usize)
            // One write of head and body copied together beats a two-part
            // writev for the small responses a sidecar mostly sends.
            .writev(false)
            .keep_alive(true)
    };
}

pub(super) fn builders(app: &App) -> Builders {
    let server = &app.config().server;
    let mut http1 = http1::Builder::new();
    http1_settings!(http1, server);
    let mut auto = auto::Builder::new(TokioExecutor::new());
    http1_settings!(auto.http1(), server);
    let h2 = h2::Settings::of(server);
    auto.http2()
        .timer(TokioTimer::new())
        .initial_stream_window_size(h2.stream_window)
        .initial_connection_window_size(h2.connection_window)
        .max_frame_size(h2.max_frame_size)
        .max_concurrent_streams(h2.max_concurrent_streams)
        .max_send_buf_size(h2.max_send_buffer)
        .max_local_error_reset_streams(h2.max_local_error_resets)
        .max_header_list_size(h2.max_header_list_size);
    let http2_only = auto.clone().http2_only();
    Builders { http1, auto, http2_only, h2: h2.builder() }
}
