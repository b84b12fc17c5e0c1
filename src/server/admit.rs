//! What the gateway decides about a request before anything else it does:
//! its path's normal form, its screen, then the route's address lists,
//! rate limit and credentials, in the order `App::admit` gives.

use std::borrow::Cow;

use crate::body::Incoming;
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Uri, Version};

use super::table::{Route, Table};
use super::{App, Peer, RequestLog};
use crate::error::GatewayError;
use crate::limits::{Declared, screen};
use crate::path;

impl App {
    /// What the gateway makes of a request before it chooses its route: a
    /// peer that is not a trusted proxy loses the fields only a proxy may
    /// send (so that no route's `headers` condition reads a value the
    /// upstream never gets, and the route's credentials and header rules
    /// set theirs after); the path takes its normal form (see [`path`]),
    /// so the route is chosen on it and the upstream receives it.
    pub(super) fn normalize(&self, req: &mut Request<Incoming>, peer: &Peer) -> Result<(), GatewayError> {
        if !peer.trusted {
            crate::headers::drop_proxy_only(req.headers_mut());
        }
        if req.version() >= Version::HTTP_2 {
            one_content_length(req.headers_mut())?;
        }
        let normal = match path::normalize(req.uri().path(), self.path_options) {
            Ok(Cow::Borrowed(_)) => return Ok(()),
            Ok(Cow::Owned(normal)) => normal,
            Err(e) => return Err(GatewayError::BadPath(e.reason())),
        };
        let target = match req.uri().query() {
            Some(q) => format!("{normal}?{q}"),
            None => normal,
        };
        let mut parts = req.uri().clone().into_parts();
        parts.path_and_query =
            Some(PathAndQuery::try_from(target).map_err(|_| GatewayError::BadPath("normalised path is invalid"))?);
        *req.uri_mut() = Uri::from_parts(parts).map_err(|_| GatewayError::BadPath("normalised path is invalid"))?;
        Ok(())
    }

    /// The index of the request's route: chosen on its path as an upstream
    /// that splits at `%2F` or drops `;` parameters reads it (see
    /// [`path::routing_view`]), and refused (400) when its path does not
    /// carry the chosen route's prefix as it is (`/admin%2Fpanel` under
    /// `/admin/panel`): what follows the prefix could not be told apart.
    pub(super) fn route_index(&self, table: &Table, req: &Request<Incoming>) -> Result<Option<usize>, GatewayError> {
        let Some(view) = path::routing_view(req.uri().path()) else {
            return Ok(table.router.find(req.uri(), req.headers()));
        };
        let view = view.map_err(|e| GatewayError::BadPath(e.reason()))?;
        let found = table.router.find_on(&view, req.uri(), req.headers());
        match found {
            Some(i) if !path::carries(req.uri().path(), &table.routes[i].config.prefix) => {
                Err(GatewayError::BadPath("encoded slash or parameter inside the route's prefix"))
            }
            found => Ok(found),
        }
    }

    pub(super) fn screen(&self, req: &Request<Incoming>) -> Result<Declared, GatewayError> {
        screen(req.method(), req.uri(), req.version(), req.headers(), self.config.server.max_uri_length)
    }

    /// What a route decides before anything else it does: the address
    /// lists, then the declared body length against `max_body` (after the
    /// lists, so that a refused client gets 403 and learns nothing of the
    /// limit; before the rest, so that a request too large takes no token
    /// and costs no verification), then the credentials (boxed, as only
    /// routes with `auth` take them; the user goes to the access log) and
    /// the rate limit. The limit
    /// comes before the credentials, in nginx's order (`limit_req` before
    /// `auth_basic`), so that guessed credentials are limited like any
    /// other request and a refused guess costs no verification; but one
    /// keyed by a header the credentials set (a JWT claim forwarded as a
    /// header) comes after them, as before them that header is the
    /// client's own copy, a new bucket at will. `rate_state` gets the
    /// `RateLimit` fields for the answer, when the limit sends them.
    pub(super) async fn admit(
        &self,
        route: &Route,
        declared: Declared,
        req: &mut Request<Incoming>,
        peer: &Peer,
        cx: &mut RequestLog<'_>,
        rate_state: &mut Option<crate::ratelimit::Fields>,
    ) -> Result<(), GatewayError> {
        if let Some(guard) = &route.guard {
            guard.admit(peer, req.headers())?;
        }
        declared.within(route.config.max_body)?;
        // Before the concurrency slot and the upstream's queue too: a
        // refused request takes neither.
        let trusted = &self.config.server.trusted_proxies;
        let (before, after) = match &route.rate_limit {
            Some(rl) if route.limit_after_auth => (None, Some(rl)),
            rl => (rl.as_ref(), None),
        };
        if let Some(rl) = before {
            *rate_state = rl.admit(req, peer, trusted).await?;
        }
        if let Some(guard) = route.guard.as_deref().filter(|g| g.authenticates()) {
            // The client's Connection list applies to the client's headers,
            // not to the ones authentication sets.
            crate::headers::drop_nominated(req.headers_mut());
            let user = Box::pin(guard.authenticate(req, peer, cx.id)).await?;
            cx.set_user(user);
            req.extensions_mut().insert(crate::request::Authenticated);
        }
        if let Some(rl) = after {
            *rate_state = rl.admit(req, peer, trusted).await?;
        }
        Ok(())
    }
}

/// An HTTP/2 request's `Content-Length` fields made one, as the own
/// HTTP/1.1 connection makes a head's (RFC 9110 §8.6): an HTTP/1.1
/// upstream would otherwise get them all, and many refuse that. Values that
/// differ are refused (400): the h2 crate checks the body against the first.
fn one_content_length(headers: &mut HeaderMap) -> Result<(), GatewayError> {
    if headers.get_all(header::CONTENT_LENGTH).iter().nth(1).is_none() {
        return Ok(());
    }
    match crate::upstream::h1::content_length(headers) {
        Ok(Some(n)) => {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(n));
            Ok(())
        }
        _ => Err(GatewayError::BadRequest("conflicting Content-Length values")),
    }
}
