//! The built-in endpoints: `/healthz`, `/readyz` and the metrics path
//! (answered before routes, on the main listener unless an admin listener
//! is configured), and the admin listener's own `POST /-/reload` and
//! status endpoints (`status`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::{App, Peer, Trigger, error_response};
use crate::body::Body;
use crate::error::GatewayError;

impl App {
    /// [`App::reload`] on the blocking pool: it reads files and waits for a
    /// lock, which on a runtime worker (with `worker_threads = 1`, the only
    /// one) would hold up every connection meanwhile.
    pub async fn reload_off_runtime(
        self: &Arc<Self>,
        trigger: Trigger,
    ) -> Result<Vec<&'static str>, crate::config::ConfigError> {
        let app = self.clone();
        tokio::task::spawn_blocking(move || app.reload_by(trigger)).await.unwrap_or_else(|e| {
            Err(crate::config::ConfigError {
                source_name: self.config.source_name.clone(),
                key: "-".into(),
                message: format!("the reload did not finish: {e}"),
            })
        })
    }

    /// The admin listener's service: the built-ins, `POST /-/reload`
    /// (the configuration loaded again, as on SIGHUP: 200, or 500 with the
    /// reason and nothing changed), else 404. With `metrics.allow`, a
    /// client outside it gets 403 and nothing else.
    pub async fn admin(self: &Arc<Self>, req: &Request<Incoming>, peer: &Peer) -> Response<Body> {
        if let Some(list) = &self.admin_allow {
            let trusted = &self.config.server.trusted_proxies;
            let client = crate::auth::address::client_ip(peer.ip, peer.trusted, req.headers(), trusted);
            if !list.admits(client) {
                crate::metrics::auth("admin", "address", "denied").increment(1);
                tracing::debug!(client = ?client, "admin request refused by metrics.allow");
                return error_response(&GatewayError::AddressDenied { client });
            }
        }
        if req.uri().path() == "/-/reload" {
            if req.method() != Method::POST {
                return error_response(&GatewayError::MethodNotAllowed { allow: "POST".into() });
            }
            let (status, body) = match self.reload_off_runtime(Trigger::Admin).await {
                Ok(kept) if kept.is_empty() => (StatusCode::OK, "reloaded\n".to_owned()),
                Ok(kept) => {
                    let sections = kept.join(", ");
                    (StatusCode::OK, format!("reloaded; changes in {sections} need a restart and were not applied\n"))
                }
                Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("reload failed, nothing changed: {e}\n")),
            };
            let mut response = Response::new(Body::full(body));
            *response.status_mut() = status;
            response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
            return response;
        }
        if let Some(response) = self.status(req.uri().path()) {
            if req.method() != Method::GET && req.method() != Method::HEAD {
                return error_response(&GatewayError::MethodNotAllowed { allow: "GET, HEAD".into() });
            }
            return response;
        }
        self.builtin(req.uri().path()).unwrap_or_else(|| error_response(&GatewayError::NotFound))
    }

    /// `/healthz`, `/readyz` and the metrics path.
    pub(super) fn builtin(&self, path: &str) -> Option<Response<Body>> {
        let (status, content_type, body) = if path == "/healthz" {
            (StatusCode::OK, "text/plain; charset=utf-8", "ok\n".to_owned())
        } else if path == "/readyz" {
            let table = self.table.load();
            let down: Vec<&str> =
                table.upstreams.iter().filter(|u| !u.ready()).map(|u| u.config.name.as_str()).collect();
            if self.draining.load(Ordering::Relaxed) {
                (StatusCode::SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", "draining\n".to_owned())
            } else if !down.is_empty() {
                let body = format!("not ready: no healthy endpoint in upstream {}\n", down.join(", "));
                (StatusCode::SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", body)
            } else {
                (StatusCode::OK, "text/plain; charset=utf-8", "ready\n".to_owned())
            }
        } else if path == self.config.metrics.path {
            self.publish_endpoint_states();
            (StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", self.metrics_exporter.render())
        } else {
            return None;
        };
        Some(
            Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, content_type)
                .header(header::CACHE_CONTROL, "no-store")
                .body(Body::full(body))
                .expect("valid response"),
        )
    }
}
