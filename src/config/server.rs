//! Small `[server]` settings of their own type.

/// `server.http1`: hyper's HTTP/1.1 server connection, or the gateway's own
/// (`listener::h1`). HTTP/2 is hyper's either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Http1Server {
    Hyper,
    Gateway,
}

/// How access log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// One event with a field per item (JSON with `--log-format json`).
    Json,
    /// Apache/nginx combined format, plus the request time.
    Combined,
}
