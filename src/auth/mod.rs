//! Who may come in on a route: its address lists (`allow`, `deny`), then
//! its credentials (`auth`: Basic against an htpasswd file, or a JWT). The
//! server checks the lists first, then the route's rate limit (so that
//! guessed credentials are limited), then the credentials, before the rest
//! of the route's behaviour.
//!
//! - `address`: the address lists, over the client's address as
//!   [`Peer::client`] tells it (the peer, or the right-most untrusted
//!   `X-Forwarded-For` item behind a trusted proxy);
//! - `basic`: Basic credentials, verified on the blocking pool with a
//!   process-wide bound and a short memory of successes;
//! - `jwt`: bearer tokens checked against a JWKS (`jwks`: from a file or
//!   a URL kept fresh), claims forwarded as headers, verified tokens
//!   remembered until they expire or the keys change (`jwt_cache`);
//! - `forward`: an auth service asked about each request.
//!
//! A [`Guard`] is built once per route at load from its
//! [`AccessConfig`]; a route without access keys has none and pays one
//! branch. A refusal is a [`GatewayError`], so the server's one error path
//! gives it its status, challenge header, metric and log line; nothing
//! here logs a credential.

pub mod address;
pub mod basic;
pub mod forward;
pub mod jwks;
pub mod jwt;
pub mod jwt_cache;

use std::sync::Arc;

use http::header;
use http::{HeaderMap, HeaderName, Request};
use ipnet::IpNet;
use metrics::Counter;

use crate::config::access::{AccessConfig, AuthConfig};
use crate::error::GatewayError;
use crate::layers::request_id::RequestId;
use crate::request::Peer;
use address::AddressList;
use basic::Basic;
use forward::Forward;
use jwt::Jwt;

/// A route's access control, built at load.
pub struct Guard {
    addresses: Option<(AddressList, Counter)>,
    auth: Option<(Auth, Counter)>,
    /// `server.trusted_proxies`, to read `X-Forwarded-For`.
    trusted: Arc<[IpNet]>,
    forward_credentials: bool,
}

enum Auth {
    Basic(Basic),
    Jwt(Jwt),
    /// Boxed: its client is larger than the other kinds.
    Forward(Box<Forward>),
}

impl Guard {
    /// `previous`: the running route's guard, if any, whose `jwks_url` keys
    /// a reload keeps while the URL is the same.
    pub fn new(route: &str, c: &AccessConfig, trusted: &[IpNet], previous: Option<&Guard>) -> Guard {
        let addresses =
            AddressList::new(&c.allow, &c.deny).map(|l| (l, crate::metrics::auth(route, "address", "allowed")));
        let previous_jwt = match previous.and_then(|p| p.auth.as_ref()) {
            Some((Auth::Jwt(j), _)) => Some(j),
            _ => None,
        };
        let auth = c.auth.as_ref().map(|a| match a {
            AuthConfig::Basic(b) => (Auth::Basic(Basic::new(b)), crate::metrics::auth(route, "basic", "allowed")),
            AuthConfig::Jwt(j) => (Auth::Jwt(Jwt::new(j, previous_jwt)), crate::metrics::auth(route, "jwt", "allowed")),
            AuthConfig::Forward(f) => {
                (Auth::Forward(Box::new(Forward::new(route, f))), crate::metrics::auth(route, "forward", "allowed"))
            }
        });
        Guard { addresses, auth, trusted: trusted.into(), forward_credentials: c.forward_credentials }
    }

    /// The address lists' verdict on the request (none set: admitted).
    pub fn admit(&self, peer: &Peer, headers: &HeaderMap) -> Result<(), GatewayError> {
        let Some((list, allowed)) = &self.addresses else { return Ok(()) };
        let client = peer.client(headers, &self.trusted).addr();
        if !list.admits(client) {
            return Err(GatewayError::AddressDenied { client });
        }
        allowed.increment(1);
        Ok(())
    }

    /// Whether the credentials, once accepted, set request header `name`
    /// (in either spelling of `-` and `_`): a JWT's `forward_claims`, a
    /// forward auth service's `response_headers`.
    pub fn sets_header(&self, name: &HeaderName) -> bool {
        let same = |n: &HeaderName| n == name || crate::headers::same_cgi_name(n.as_str(), name.as_str());
        match &self.auth {
            Some((Auth::Jwt(j), _)) => j.forward_claims.iter().any(|(n, _)| same(n)),
            Some((Auth::Forward(f), _)) => f.sets().iter().any(same),
            _ => false,
        }
    }

    /// Whether the route asks for credentials (see [`Guard::authenticate`]).
    pub fn authenticates(&self) -> bool {
        self.auth.is_some()
    }

    /// Checks the request's credentials (or asks the forward auth service)
    /// and readies it for the upstream:
    /// `Authorization` removed once consumed (unless `forward_credentials`),
    /// and a JWT's `forward_claims` set after every client copy of those
    /// headers (in any spelling of `-` and `_`) is removed. The user's name,
    /// when one is known, for the access log. `id`: the request's ID, sent
    /// to a forward auth service, whose log lines can then be matched with
    /// the gateway's and the upstream's.
    pub async fn authenticate<B>(
        &self,
        req: &mut Request<B>,
        peer: &Peer,
        id: Option<&RequestId>,
    ) -> Result<Option<Arc<str>>, GatewayError> {
        let Some((auth, allowed)) = &self.auth else { return Ok(None) };
        let headers = req.headers_mut();
        let (user, consumed) = match auth {
            Auth::Basic(b) => (Some(b.verify(headers).await?), true),
            Auth::Jwt(j) => {
                let claims = j.verify(headers).await?;
                forward_claims(headers, &j.forward_claims, &claims);
                let sub = claims.get("sub").and_then(|s| s.as_str()).map(Arc::from);
                (sub, j.from_authorization())
            }
            // The service's answer decides what the upstream gets.
            Auth::Forward(f) => (f.check(req, peer, id).await.map(|()| None)?, false),
        };
        if consumed && !self.forward_credentials {
            req.headers_mut().remove(header::AUTHORIZATION);
        }
        allowed.increment(1);
        Ok(user)
    }
}

/// Replaces the client's copies of the claim headers with the token's.
fn forward_claims(headers: &mut HeaderMap, names: &[(HeaderName, String)], claims: &jwt::Claims) {
    if names.is_empty() {
        return;
    }
    crate::headers::remove_other_spellings(headers, names.iter().map(|(n, _)| n), false);
    for (name, claim) in names {
        headers.remove(name);
        if let Some(value) = claims.get(claim).and_then(jwt::claim_value) {
            headers.insert(name.clone(), value);
        }
    }
}
