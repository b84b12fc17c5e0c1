//! Request errors and the one mapping from an error to a status code, a
//! metric `kind` and a response body.
//!
//! Errors know their source, which picks the status: upstream failure → 502,
//! upstream too slow → 504, the client's fault → 4xx, ours → 500.

use std::time::Duration;

use http::StatusCode;

/// Why a request could not be answered normally.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// No route matches the path.
    #[error("no route matches the path")]
    NoRoute,
    /// The route does not allow the method; `allow` lists what it does.
    #[error("method not allowed")]
    MethodNotAllowed { allow: String },
    /// The request path is malformed (bad percent-encoding, encoded slash,
    /// NUL, backslash, dot segments).
    #[error("bad request path: {0}")]
    BadPath(&'static str),
    /// Nothing to serve at that path.
    #[error("not found")]
    NotFound,
    /// A local I/O error other than not-found.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The upstream could not be reached (refused, unreachable, connect timeout).
    #[error("upstream {upstream}: connect {authority}: {detail}")]
    UpstreamConnect {
        upstream: String,
        authority: String,
        detail: String,
    },
    /// The route's timeout passed before the upstream's response head.
    #[error("upstream {upstream}: no response head within {}", humantime::format_duration(*.after))]
    UpstreamTimeout { upstream: String, after: Duration },
    /// The upstream closed or reset the connection before the response head.
    #[error("upstream {upstream}: connection closed before the response head: {detail}")]
    UpstreamReset { upstream: String, detail: String },
    /// The upstream answered something that is not valid HTTP.
    #[error("upstream {upstream}: invalid response: {detail}")]
    UpstreamProtocol { upstream: String, detail: String },
}

impl GatewayError {
    /// The status code the client gets.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::NoRoute | GatewayError::NotFound => StatusCode::NOT_FOUND,
            GatewayError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::BadPath(_) => StatusCode::BAD_REQUEST,
            GatewayError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
            GatewayError::UpstreamConnect { .. }
            | GatewayError::UpstreamReset { .. }
            | GatewayError::UpstreamProtocol { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The `kind` label of `gateway_upstream_errors_total`, for upstream errors.
    pub fn upstream_kind(&self) -> Option<&'static str> {
        match self {
            GatewayError::UpstreamConnect { .. } => Some("connect"),
            GatewayError::UpstreamTimeout { .. } => Some("timeout"),
            GatewayError::UpstreamReset { .. } => Some("reset"),
            GatewayError::UpstreamProtocol { .. } => Some("protocol"),
            _ => None,
        }
    }

    /// The short text body the client gets. Upstream details stay in the
    /// log; the client learns only what kind of failure it was.
    pub fn body(&self) -> &'static str {
        match self {
            GatewayError::NoRoute | GatewayError::NotFound => "not found\n",
            GatewayError::MethodNotAllowed { .. } => "method not allowed\n",
            GatewayError::BadPath(_) => "bad request path\n",
            GatewayError::Io(_) => "internal error\n",
            GatewayError::UpstreamConnect { .. } => "bad gateway: upstream unreachable\n",
            GatewayError::UpstreamReset { .. } => "bad gateway: upstream closed the connection\n",
            GatewayError::UpstreamProtocol { .. } => "bad gateway: invalid upstream response\n",
            GatewayError::UpstreamTimeout { .. } => {
                "gateway timeout: upstream did not answer in time\n"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_and_kind_per_error() {
        let up = || "a".to_owned();
        let cases: Vec<(GatewayError, u16, Option<&str>)> = vec![
            (GatewayError::NoRoute, 404, None),
            (GatewayError::NotFound, 404, None),
            (
                GatewayError::MethodNotAllowed {
                    allow: "GET".into(),
                },
                405,
                None,
            ),
            (GatewayError::BadPath("x"), 400, None),
            (GatewayError::Io(std::io::Error::other("x")), 500, None),
            (
                GatewayError::UpstreamConnect {
                    upstream: up(),
                    authority: "h:1".into(),
                    detail: "refused".into(),
                },
                502,
                Some("connect"),
            ),
            (
                GatewayError::UpstreamReset {
                    upstream: up(),
                    detail: "x".into(),
                },
                502,
                Some("reset"),
            ),
            (
                GatewayError::UpstreamProtocol {
                    upstream: up(),
                    detail: "x".into(),
                },
                502,
                Some("protocol"),
            ),
            (
                GatewayError::UpstreamTimeout {
                    upstream: up(),
                    after: Duration::from_millis(250),
                },
                504,
                Some("timeout"),
            ),
        ];
        for (err, status, kind) in cases {
            assert_eq!(err.status().as_u16(), status, "{err}");
            assert_eq!(err.upstream_kind(), kind, "{err}");
            assert!(!err.body().is_empty());
        }
    }

    #[test]
    fn messages_carry_context() {
        let e = GatewayError::UpstreamConnect {
            upstream: "service_a".into(),
            authority: "127.0.0.1:8000".into(),
            detail: "connection refused".into(),
        };
        assert_eq!(
            e.to_string(),
            "upstream service_a: connect 127.0.0.1:8000: connection refused"
        );
        let t = GatewayError::UpstreamTimeout {
            upstream: "a".into(),
            after: Duration::from_millis(250),
        };
        assert_eq!(t.to_string(), "upstream a: no response head within 250ms");
    }
}
