//! Optional request and response behaviour, composed as tower layers.
//!
//! - Server-wide, around every request ([`crate::server::App::handle`]):
//!   request IDs (`request_id`), panic isolation (`panic`) and trace context
//!   (`trace`). They are always on (unless switched off), so they are done
//!   in place: see `App::handle` for why not tower-http's layers.
//! - Per route ([`RouteLayers`]): header rules (`crate::headers::rules`)
//!   and compression (`compress`). A route that enables none has no `RouteLayers` and calls
//!   its target directly, so it pays nothing for them.
//!
//! The layers are configured once at load; a stack is put together around
//! the request's own handler future, borrowing what it needs, so nothing is
//! boxed but what tower-http boxes itself.

pub mod compress;
pub mod panic;
pub mod request_id;
pub mod trace;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use crate::body::Incoming;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, Version};
use tower::ServiceBuilder;
use tower::ServiceExt;
use tower::util::{MapRequestLayer, MapResponseLayer};
use tower_http::compression::CompressionLayer;

use crate::body::Body;
use crate::config::{RouteConfig, Target};
use crate::headers;
use crate::headers::rules::{ForInterims, HeaderRules};
use compress::Compressible;

/// One route's layers, built at load.
pub struct RouteLayers {
    request: Option<Arc<HeaderRules>>,
    response: Option<Arc<HeaderRules>>,
    compress: bool,
    /// The route tunnels upgrades: the request rules keep a request's
    /// upgrade headers for the proxy to see.
    upgrades: bool,
    /// Debug builds only (refused at load otherwise): every request panics
    /// with this message, for the panic tests.
    panic: Option<Arc<str>>,
}

impl RouteLayers {
    /// `None` when the route enables nothing.
    pub fn new(route: &RouteConfig) -> Option<RouteLayers> {
        let nonempty = |r: &HeaderRules| (!r.is_empty()).then(|| Arc::new(r.clone()));
        let layers = RouteLayers {
            request: nonempty(&route.request_headers),
            response: nonempty(&route.response_headers),
            compress: route.compress,
            upgrades: matches!(&route.target, Target::Proxy(p) if p.upgrade.is_some()),
            panic: route.panic.as_deref().map(Arc::from),
        };
        let any = layers.request.is_some() || layers.response.is_some() || layers.compress || layers.panic.is_some();
        any.then_some(layers)
    }

    /// Runs `inner` (the route's target) inside the route's layers.
    pub async fn call<F, Fut>(&self, mut req: Request<Incoming>, inner: F) -> Response<Body>
    where
        F: FnOnce(Request<Incoming>) -> Fut,
        Fut: Future<Output = Response<Body>>,
    {
        // tower's `service_fn` wants `FnMut`; `oneshot` calls it once.
        let mut inner = Some(inner);
        let target = tower::service_fn(move |req| {
            let call = inner.take().expect("called once");
            async move { Ok::<_, Infallible>(call(req).await) }
        });
        let head = req.method() == Method::HEAD;
        let compression = self.compress.then(|| {
            let held = compress::Held::of(req.headers());
            let pinned = compress::pins_a_form(req.headers());
            ServiceBuilder::new()
                .layer(MapResponseLayer::new(move |r: Response<_>| {
                    let r = compress::settle_validators(r, held.as_ref()).map(Body::compressed);
                    // A HEAD answers the GET's headers, coding included, and
                    // no body (what the encoder made of nothing is dropped).
                    if head { compress::head_of(r) } else { r }
                }))
                .layer(CompressionLayer::new().compress_when(Compressible))
                .layer(MapResponseLayer::new(move |mut r: Response<Body>| {
                    if head {
                        r.extensions_mut().insert(compress::ForHead);
                    }
                    if pinned {
                        r.extensions_mut().insert(compress::Pinned);
                    }
                    compress::mark_encoded(r)
                }))
        });
        let upgrades = self.upgrades;
        let request = self.request.clone().map(|rules| {
            MapRequestLayer::new(move |mut req: Request<Incoming>| {
                // Stripped first, or a header the rules set and the client
                // named in Connection would be stripped after them; an
                // upgrade the route tunnels keeps its two headers.
                let upgrade = (upgrades && req.version() == Version::HTTP_11)
                    .then(|| headers::upgrade_requested(req.headers()))
                    .flatten();
                headers::strip_hop_by_hop(req.headers_mut());
                if let Some(protocol) = upgrade {
                    req.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
                    req.headers_mut().insert(header::UPGRADE, protocol);
                }
                rules.apply(req.headers_mut());
                req
            })
        });
        if let Some(rules) = &self.response {
            // For the upstream's 1xx heads, which pass outside these layers.
            req.extensions_mut().insert(ForInterims(rules.clone()));
        }
        let response = self.response.clone().map(|rules| {
            MapResponseLayer::new(move |mut resp: Response<Body>| {
                rules.apply(resp.headers_mut());
                resp
            })
        });
        let panic = self.panic.clone().map(|message| {
            MapRequestLayer::new(move |_: Request<Incoming>| -> Request<Incoming> { panic!("{message}") })
        });
        let service = ServiceBuilder::new()
            .option_layer(response)
            .option_layer(request)
            .option_layer(compression)
            .option_layer(panic)
            .service(target);
        match service.oneshot(req).await {
            Ok(response) => response,
            Err(never) => match never {},
        }
    }
}
