//! Forward auth (nginx `auth_request`, Traefik `ForwardAuth`): the gateway
//! asks an auth service, with a bodiless `GET` carrying the client's listed
//! headers and what the request was (`X-Forwarded-Method`, `-Proto`,
//! `-Host`, `-Uri`, `-For`). A 2xx lets the request through with the
//! service's listed headers on it; any other answer goes to the client as
//! it is (a login redirect, a cookie, a challenge), and the service
//! unreachable or too slow is 503: it fails closed.
//!
//! The service is asked through a pooled keep-alive client of the route's
//! own (hyper-util's, with its pool timer set: without it the idle timeout
//! does nothing), rebuilt by a reload.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use metrics::Histogram;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::config::access::ForwardConfig;
use crate::error::{GatewayError, RelayedAnswer};
use crate::headers::{X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO, X_REQUEST_ID};
use crate::layers::request_id::RequestId;
use crate::request::Peer;

const KIND: &str = "forward";
/// The most of an auth service's answer body that is read (and relayed).
const MAX_BODY: usize = 64 * 1024;
/// Idle connections to the auth service close after this.
const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// The headers of a refusal that reach the client (besides none other:
/// the service's framing and hop-by-hop headers are its own).
const RELAYED: [HeaderName; 5] =
    [header::CONTENT_TYPE, header::LOCATION, header::WWW_AUTHENTICATE, header::SET_COOKIE, header::CACHE_CONTROL];

/// Credential fields that are no list: a request with two lines of one is
/// refused rather than asked about.
const SINGLE: [HeaderName; 2] = [header::AUTHORIZATION, header::PROXY_AUTHORIZATION];

const X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
const X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");

/// A route's forward auth, built at load.
pub struct Forward {
    client: Client<HttpConnector, Empty<Bytes>>,
    config: ForwardConfig,
    duration: Histogram,
    /// Turns to ask (`max_concurrent`): the client's pool opens a connection
    /// for each ask while none is idle, with no bound of its own.
    turns: Semaphore,
}

impl Forward {
    /// The headers the service's answer sets on the request.
    pub fn sets(&self) -> &[http::HeaderName] {
        &self.config.response_headers
    }

    pub fn new(route: &str, config: &ForwardConfig) -> Forward {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(POOL_IDLE_TIMEOUT)
            .build(connector);
        Forward {
            client,
            config: config.clone(),
            duration: crate::metrics::auth_forward_duration(route),
            turns: Semaphore::new(config.max_concurrent),
        }
    }

    /// Asks the service about `req`; on a 2xx, sets its listed headers on
    /// `req` after removing the client's own (in any spelling of `-`/`_`).
    pub async fn check<B>(
        &self,
        req: &mut Request<B>,
        peer: &Peer,
        id: Option<&RequestId>,
    ) -> Result<(), GatewayError> {
        // The service would read one copy, the upstream maybe another.
        for name in SINGLE.iter().filter(|n| self.config.request_headers.contains(n)) {
            if req.headers().get_all(name).iter().nth(1).is_some() {
                return Err(GatewayError::BadRequest("more than one Authorization or Proxy-Authorization field"));
            }
        }
        // What the upstream reads of a listed field is what the service
        // saw: its other spellings of `-` and `_` (one CGI variable to a
        // WSGI upstream) go, not on unasked.
        crate::headers::remove_other_spellings(req.headers_mut(), self.config.request_headers.iter(), false);
        let ask = self.ask(req, peer, id);
        let start = Instant::now();
        let deadline = start + self.config.timeout;
        // A turn is waited for half the timeout at most, so an ask starts
        // with half of it left: one started with a few milliseconds left
        // would be cut at once, its turn passed on while the service still
        // works on it, and under a slow service every waiter would ask so.
        let wait = self.config.timeout / 2;
        let Ok(Ok(_turn)) = tokio::time::timeout_at(start + wait, self.turns.acquire()).await else {
            let (n, after) = (self.config.max_concurrent, humantime::format_duration(wait));
            let detail = format!("{n} asks under way already (max_concurrent), no turn within {after}");
            return Err(GatewayError::AuthError { kind: KIND, detail });
        };
        let answer = tokio::time::timeout_at(deadline, async {
            let response = self.client.request(ask).await.map_err(|e| e.to_string())?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, MAX_BODY).collect().await.map_err(|e| e.to_string())?.to_bytes();
            Ok::<_, String>((parts, body))
        })
        .await;
        self.duration.record(start.elapsed().as_secs_f64());
        let (parts, body) = match answer {
            Ok(Ok(answer)) => answer,
            Ok(Err(detail)) => return Err(GatewayError::AuthError { kind: KIND, detail }),
            Err(_) => {
                let after = humantime::format_duration(self.config.timeout);
                return Err(GatewayError::AuthError { kind: KIND, detail: format!("no answer within {after}") });
            }
        };
        // A failing service (a 5xx) fails closed as an unreachable one does:
        // its answer, perhaps an error page with internals, is not the
        // client's (nginx's `auth_request` answers 500 for it).
        if parts.status.is_server_error() {
            let detail = format!("answered {}", parts.status.as_u16());
            return Err(GatewayError::AuthError { kind: KIND, detail });
        }
        if !parts.status.is_success() {
            let mut headers = HeaderMap::new();
            for name in RELAYED {
                for value in parts.headers.get_all(&name) {
                    headers.append(name.clone(), value.clone());
                }
            }
            let status = relayable(parts.status);
            return Err(GatewayError::ForwardRefused(Box::new(RelayedAnswer { status, headers, body })));
        }
        let names = &self.config.response_headers;
        crate::headers::remove_other_spellings(req.headers_mut(), names.iter(), false);
        for name in names {
            req.headers_mut().remove(name);
            for value in parts.headers.get_all(name) {
                req.headers_mut().append(name.clone(), value.clone());
            }
        }
        Ok(())
    }

    /// The bodiless request to the auth service, with the request's ID (the
    /// gateway's, not a client copy the service was configured to get).
    fn ask<B>(&self, req: &Request<B>, peer: &Peer, id: Option<&RequestId>) -> Request<Empty<Bytes>> {
        let mut ask = Request::new(Empty::new());
        *ask.uri_mut() = self.config.url.clone();
        let headers = ask.headers_mut();
        for name in &self.config.request_headers {
            for value in req.headers().get_all(name) {
                headers.append(name.clone(), value.clone());
            }
        }
        // Cookie lines (HTTP/2 crumbs, HTTP/1 lines) are joined as for the
        // upstream, so that the service sees the header the upstream gets.
        crate::headers::join_cookies(headers);
        if let Ok(method) = HeaderValue::from_str(req.method().as_str()) {
            headers.insert(X_FORWARDED_METHOD, method);
        }
        headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static(if peer.tls { "https" } else { "http" }));
        let host = req.headers().get(header::HOST).cloned();
        let host = host.or_else(|| req.uri().authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()));
        if let Some(host) = host {
            headers.insert(X_FORWARDED_HOST, host);
        }
        let target = req.uri().path_and_query().map_or("/", |pq| pq.as_str());
        if let Ok(target) = HeaderValue::from_str(target) {
            headers.insert(X_FORWARDED_URI, target);
        }
        headers.insert(X_FORWARDED_FOR, forwarded_for(req.headers(), peer));
        if let Some(id) = id {
            headers.insert(X_REQUEST_ID, id.header_value());
        }
        ask
    }
}

/// The chain as the upstream would get it: a trusted peer's
/// `X-Forwarded-For` with the peer appended, else the peer alone.
fn forwarded_for(headers: &HeaderMap, peer: &Peer) -> HeaderValue {
    if !peer.trusted {
        return peer.forwarded_for.clone();
    }
    let mut chain: Vec<&[u8]> = headers.get_all(X_FORWARDED_FOR).iter().map(HeaderValue::as_bytes).collect();
    chain.push(peer.forwarded_for.as_bytes());
    HeaderValue::from_bytes(&chain.join(&b", "[..])).unwrap_or_else(|_| peer.forwarded_for.clone())
}

/// A 2xx is never relayed as a refusal; an informational answer becomes a
/// 502-like refusal the client can be sent (hyper will not send a 1xx as a
/// final answer).
fn relayable(status: StatusCode) -> StatusCode {
    if status.is_informational() { StatusCode::BAD_GATEWAY } else { status }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forwarded_chain_is_read_only_from_a_trusted_peer() {
        let mut headers = HeaderMap::new();
        headers.insert(X_FORWARDED_FOR, "203.0.113.7".parse().unwrap());
        let untrusted = Peer::new([127, 0, 0, 1].into(), false, false);
        let trusted = Peer::new([127, 0, 0, 1].into(), true, false);
        assert_eq!(forwarded_for(&headers, &untrusted), "127.0.0.1");
        assert_eq!(forwarded_for(&headers, &trusted), "203.0.113.7, 127.0.0.1");
        assert_eq!(forwarded_for(&HeaderMap::new(), &trusted), "127.0.0.1");
        assert_eq!(relayable(StatusCode::CONTINUE), StatusCode::BAD_GATEWAY);
        assert_eq!(relayable(StatusCode::FOUND), StatusCode::FOUND);
    }
}
