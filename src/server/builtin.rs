//! The built-in endpoints: `/healthz`, `/readyz` and the metrics path
//! (answered before routes, on the main listener unless an admin listener
//! is configured), and the admin listener's own `POST /-/reload` and
//! status endpoints (`status`).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::body::Incoming;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};

use super::{App, Peer, Trigger, error_response};
use crate::body::Body;
use crate::error::GatewayError;
use crate::layers::request_id::RequestId;

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
            Err(crate::config::ConfigError::new(
                self.config.source_name.clone(),
                "",
                format!("the reload did not finish: {e}"),
            ))
        })
    }

    /// The admin listener's service: the built-ins, `POST /-/reload`
    /// (the configuration loaded again, as on SIGHUP: 200, or 500 with the
    /// reason and nothing changed), else 404. With `metrics.allow`, a
    /// client outside it gets 403 and nothing else. Every answer carries
    /// an `X-Request-Id` by the main listener's rule (`server.request_id`).
    pub async fn admin(self: &Arc<Self>, req: &Request<Incoming>, peer: &Peer) -> Response<Body> {
        let id = self.config.server.request_id.then(|| RequestId::for_request(req.headers()));
        let mut response = self.admin_answer(req, peer).await;
        if let Some(id) = id {
            response.headers_mut().insert(crate::headers::X_REQUEST_ID, id.header_value());
        }
        response
    }

    async fn admin_answer(self: &Arc<Self>, req: &Request<Incoming>, peer: &Peer) -> Response<Body> {
        if let Some(list) = &self.admin_allow {
            let trusted = &self.config.server.trusted_proxies;
            let client = peer.client(req.headers(), trusted).addr();
            if !list.admits(client) {
                crate::metrics::auth("admin", "address", "denied").increment(1);
                tracing::debug!(client = ?client, "admin request refused by metrics.allow");
                return error_response(&GatewayError::AdminRefused("outside metrics.allow".into()));
            }
        }
        let hosts = req.headers().get_all(header::HOST);
        let host_fields = if req.version() >= http::Version::HTTP_2 {
            crate::limits::h2_host(hosts.iter().count(), hosts.iter().next(), req.uri())
        } else {
            h1_host_fields(req.version(), hosts.iter().count())
        };
        if let Err(e) = host_fields {
            return error_response(&e);
        }
        if let Err(why) = admin_request_allowed(req, &self.config.metrics.hosts) {
            crate::metrics::auth("admin", "host", "denied").increment(1);
            let e = GatewayError::AdminRefused(why);
            tracing::debug!(error = %e, "admin request refused");
            return error_response(&e);
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
            let mut text = self.metrics_exporter.render();
            // Not the recorder's: they go when their endpoint does.
            text.push_str(&crate::upstream::series::render(&self.table.load().upstreams));
            (StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", text)
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

/// Whether an admin request may be answered, by the names it carries
/// rather than its address. A browser that loads a page from a name which
/// its owner then rebinds to the admin address sends that name as `Host`,
/// so only IP addresses, `localhost` and `metrics.hosts` are answered; and
/// a page on another origin can make a browser POST to the admin listener
/// (a form needs no CORS), so a request carrying a different `Origin` does
/// not reload. Clients that send no `Host` (HTTP/1.0) are not browsers.
fn admin_request_allowed<B>(req: &Request<B>, hosts: &[String]) -> Result<(), String> {
    let authority = match req.uri().authority() {
        Some(a) => Some(a.as_str()),
        None => match req.headers().get(header::HOST) {
            Some(v) => Some(v.to_str().map_err(|_| "Host is not text".to_owned())?),
            None => None,
        },
    };
    let Some(authority) = authority else { return Ok(()) };
    let host = host_of(authority).ok_or_else(|| format!("Host {authority:?} is not a host"))?;
    if !admin_host_known(&host, hosts) {
        return Err(format!("Host {host:?} is not an address, localhost or in metrics.hosts"));
    }
    let safe = req.method() == Method::GET || req.method() == Method::HEAD;
    if let Some(origin) = req.headers().get(header::ORIGIN).filter(|_| !safe) {
        let same = origin
            .to_str()
            .ok()
            .and_then(|o| o.parse::<http::Uri>().ok())
            .and_then(|o| o.authority().map(|a| a.as_str().eq_ignore_ascii_case(authority)))
            .unwrap_or(false);
        if !same {
            return Err(format!("{} from another origin", req.method()));
        }
    }
    Ok(())
}

/// An HTTP/1 admin request's `Host` fields: two are refused, and none in
/// HTTP/1.1 (RFC 9112 §3.2: 400), as on the main listener. HTTP/1.0 may
/// leave it out: probes that speak it send none, and are no browser.
fn h1_host_fields(version: http::Version, hosts: usize) -> Result<(), GatewayError> {
    match hosts {
        0 if version == http::Version::HTTP_11 => Err(GatewayError::BadRequest("missing Host header")),
        0 | 1 => Ok(()),
        _ => Err(GatewayError::BadRequest("more than one Host header")),
    }
}

/// The host of an authority (`host[:port]`), lower case, brackets and a
/// trailing dot removed; `None` when it is not one.
fn host_of(authority: &str) -> Option<String> {
    let parsed: http::uri::Authority = authority.parse().ok()?;
    let host = parsed.host().trim_start_matches('[').trim_end_matches(']').trim_end_matches('.');
    (!host.is_empty() && !authority.contains('@')).then(|| host.to_ascii_lowercase())
}

fn admin_host_known(host: &str, hosts: &[String]) -> bool {
    host.parse::<std::net::IpAddr>().is_ok()
        || host == "localhost"
        || host.ends_with(".localhost")
        || hosts.iter().any(|h| h == host)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, host: Option<&str>, origin: Option<&str>) -> Request<()> {
        let mut b = Request::builder().method(method).uri("/-/reload");
        if let Some(h) = host {
            b = b.header(header::HOST, h);
        }
        if let Some(o) = origin {
            b = b.header(header::ORIGIN, o);
        }
        b.body(()).unwrap()
    }

    #[test]
    fn admin_requests_are_answered_by_address_localhost_or_listed_name() {
        let hosts = vec!["gw-admin.internal".to_owned()];
        let cases: &[(&str, Option<&str>, Option<&str>, bool)] = &[
            ("GET", None, None, true),
            ("GET", Some("127.0.0.1:9090"), None, true),
            ("GET", Some("10.1.2.3"), None, true),
            ("GET", Some("[::1]:9090"), None, true),
            ("GET", Some("localhost:9090"), None, true),
            ("GET", Some("LocalHost."), None, true),
            ("GET", Some("app.localhost:9090"), None, true),
            ("GET", Some("GW-Admin.internal:9090"), None, true),
            ("GET", Some("gw-admin.internal."), None, true),
            // A rebound name, or one that only looks like an address.
            ("GET", Some("evil.example:9090"), None, false),
            ("GET", Some("127.0.0.1.evil.example"), None, false),
            ("GET", Some("localhost.evil.example"), None, false),
            ("GET", Some("user@127.0.0.1"), None, false),
            ("GET", Some(""), None, false),
            ("GET", Some("a b"), None, false),
            // A GET reads nothing a cross-origin page could see (CORS).
            ("GET", Some("127.0.0.1:9090"), Some("http://evil.example"), true),
            ("POST", Some("127.0.0.1:9090"), None, true),
            ("POST", Some("127.0.0.1:9090"), Some("http://127.0.0.1:9090"), true),
            ("POST", Some("127.0.0.1:9090"), Some("http://evil.example"), false),
            ("POST", Some("127.0.0.1:9090"), Some("http://127.0.0.1:9091"), false),
            ("POST", Some("127.0.0.1:9090"), Some("null"), false),
        ];
        for &(method, host, origin, want) in cases {
            let got = admin_request_allowed(&req(method, host, origin), &hosts);
            assert_eq!(got.is_ok(), want, "{method} Host {host:?} Origin {origin:?}: {got:?}");
        }
    }

    #[test]
    fn http1_admin_requests_carry_one_host() {
        use http::Version;
        let cases = [
            (Version::HTTP_11, 1, true),
            (Version::HTTP_11, 0, false),
            (Version::HTTP_11, 2, false),
            (Version::HTTP_10, 0, true),
            (Version::HTTP_10, 1, true),
            (Version::HTTP_10, 2, false),
        ];
        for (version, hosts, want) in cases {
            assert_eq!(h1_host_fields(version, hosts).is_ok(), want, "{version:?} with {hosts} Host fields");
        }
    }
}
