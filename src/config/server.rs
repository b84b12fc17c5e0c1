//! Small `[server]` settings of their own type.

/// How access log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// One event with a field per item (JSON with `--log-format json`).
    Json,
    /// Apache/nginx combined format, plus the request time.
    Combined,
}
