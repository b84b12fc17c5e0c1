//! The application: [`App::handle`], the whole data path in one function,
//! and the one place where an outcome becomes a status, a metric and a log
//! line. The listeners in [`crate::listener`] call it.
//!
//! - `builtin`: `/healthz`, `/readyz`, the metrics path and the admin
//!   listener's `POST /-/reload`;
//! - `unanswered`: the guard that records a request dropped before its
//!   answer;
//! - `table`: the routes and upstreams built from a config, and the reload
//!   that replaces them while requests keep flowing.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::body::Incoming;
use arc_swap::{ArcSwap, ArcSwapOption};
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use tokio::time::Instant;

use crate::body::{Body, ReadAhead};
use crate::cache::Looked;
use crate::config::{AccessLogFormat, Config, Target};
use crate::discovery::Discovery;
use crate::error::GatewayError::{self, NoRoute};
use crate::files::FileServer;
use crate::layers::panic::{CatchUnwindRef, panic_response};
use crate::layers::request_id::{self, RequestId};
use crate::limits::ConcurrencyLimit;
use crate::metrics::{self, RouteMetrics};
use crate::otel::{Exporter, RequestSpan};
use crate::path;
use crate::router::strip_prefix;
use crate::upstream::Upstream;
use crate::upstream::tunnel::PendingTunnel;

mod admit;
mod builtin;
mod mirror;
mod responses;
mod status;
mod table;
mod unanswered;
pub mod watch;

use responses::{close_delimited_for_http10, error_response};

pub use crate::request::{Peer, Recording, RequestLog};
use table::{Route, Table};
pub use table::{Trigger, follow_discovery};
use unanswered::Unanswered;

/// Everything a request needs, shared by all connections.
pub struct App {
    /// As started: `[server]`, `[metrics]` and `[tracing]` hold until a
    /// restart (a reload warns when they changed).
    config: Config,
    table: ArcSwap<Table>,
    /// The listener's TLS config, replaced by a reload (certificate files
    /// are read again).
    tls: ArcSwapOption<rustls::ServerConfig>,
    /// Held by a reload, and by a rebuild after discovery changed an
    /// upstream's addresses: the configuration the table was last built
    /// from (routes and upstreams as last loaded).
    reloading: std::sync::Mutex<Config>,
    /// The lookups of discovered upstreams.
    discovery: Discovery,
    unmatched: RouteMetrics,
    files: FileServer,
    metrics_exporter: &'static metrics::Exporter,
    draining: AtomicBool,
    /// See [`App::abandon_requests`].
    abandoning: AtomicBool,
    /// Cancelled to end a drain at once (see [`App::cut_drain_short`]).
    cut_short: tokio_util::sync::CancellationToken,
    /// Span export, when `[tracing] otlp_endpoint` is set.
    exporter: Option<Exporter>,
    /// What is recorded of each request besides its metrics.
    recording: Recording,
    /// The bound on request body bytes read ahead (`request_buffer_total`).
    read_ahead: Arc<ReadAhead>,
    /// Whether /metrics, /healthz and /readyz answer on the main listener.
    builtins_on_main: bool,
    /// The admin listener's `metrics.allow`, if set.
    admin_allow: Option<crate::auth::address::AddressList>,
    path_options: path::Options,
}

impl App {
    /// Builds the runtime state from a validated config. Installs the metrics
    /// recorder if it is not installed yet.
    pub fn new(config: Config) -> Self {
        let exporter = metrics::install();
        metrics::config_loaded();
        let path_options = path::Options {
            merge_slashes: config.server.merge_slashes,
            reject_encoded_slash: config.server.reject_encoded_slash,
        };
        let exporter_spans = Exporter::start(&config.tracing);
        let read_ahead =
            Arc::new(ReadAhead::new(usize::try_from(config.server.request_buffer_total).unwrap_or(usize::MAX)));
        let recording = Recording {
            trace_context: config.server.trace_context,
            spans: exporter_spans.is_some(),
            access: config.server.access_log.then(|| config.server.access_log_format.unwrap_or(AccessLogFormat::Json)),
        };
        // The start does not wait for DNS: a discovered upstream has no
        // endpoint until its name first resolves.
        let discovery = Discovery::default();
        discovery.sync(&config);
        App {
            recording,
            path_options,
            builtins_on_main: config.metrics.listen.is_none(),
            admin_allow: crate::auth::address::AddressList::new(&config.metrics.allow, &[]),
            table: ArcSwap::from_pointee(Table::new(&config, None, &read_ahead, &discovery, false)),
            discovery,
            read_ahead,
            tls: ArcSwapOption::new(config.server.tls.as_ref().map(|t| t.config.clone())),
            reloading: std::sync::Mutex::new(config.clone()),
            unmatched: RouteMetrics::new("unmatched"),
            files: FileServer::new(config.server.request_id),
            metrics_exporter: exporter,
            draining: AtomicBool::new(false),
            abandoning: AtomicBool::new(false),
            cut_short: tokio_util::sync::CancellationToken::new(),
            exporter: exporter_spans,
            config,
        }
    }
}

impl App {
    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether `ip` is one of `server.trusted_proxies`.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.config.server.trusted_proxies.iter().any(|net| net.contains(&ip))
    }

    /// Posts the spans still waiting for export (at shutdown).
    pub async fn flush_spans(&self) {
        if let Some(exporter) = &self.exporter {
            exporter.flush().await;
        }
    }

    /// The shutdown timeout passed: requests still unanswered are being
    /// cut off by the gateway (logged and counted as 503, not 499).
    pub fn abandon_requests(&self) {
        self.abandoning.store(true, Ordering::Relaxed);
    }

    /// Ends a shutdown's drain (and its `shutdown_delay`) at once, as its
    /// `shutdown_timeout` passing would: a second SIGTERM or SIGINT.
    pub fn cut_drain_short(&self) {
        self.cut_short.cancel();
    }

    /// Resolves once [`App::cut_drain_short`] is called.
    pub async fn drain_cut_short(&self) {
        self.cut_short.cancelled().await;
    }

    /// Turns `/readyz` to 503.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// A request's way through the gateway: its request ID (see
    /// [`request_id`]), panic isolation (a panic answers 500, is counted and
    /// logged, and the connection keeps serving), and [`App::serve`].
    ///
    /// Both are done here in place rather than with tower-http's
    /// `SetRequestIdLayer`/`PropagateRequestIdLayer` and `CatchPanicLayer`:
    /// they nearly doubled a fixed response's cost (see benches/README.md,
    /// Decisions). They keep the ID in request and response extensions (two
    /// allocations), the panic layer boxes every response body, and each
    /// layer copies the data-path future it wraps. Per-route behaviour,
    /// which is optional, does use tower layers
    /// ([`crate::layers::RouteLayers`]).
    ///
    /// [`App::handle_with`], [`App::serve`] and `dispatch` are `async move` blocks rather
    /// than `async fn`s: an `async fn` moves each argument into a local of
    /// its own on its first poll, which for the request is a copy (`memcpy`)
    /// at each level; a block uses what it captured in place.
    /// `Upstream::forward` is done the same way (see benches/README.md,
    /// Decisions).
    pub fn handle<'a>(&'a self, req: Request<Incoming>, peer: &'a Peer) -> impl Future<Output = Response<Body>> + 'a {
        futures_util::FutureExt::map(self.handle_with(req, peer, false), |(response, _)| response)
    }

    /// [`App::handle`]; when `id_by_caller`, the request ID's value is
    /// returned for the caller to write with the head, rather than set on
    /// the response: an insert hashes the name and probes the map, and the
    /// own HTTP/1.1 connection writes the head from the map anyway (see
    /// `listener::h1::encode::head`).
    #[allow(clippy::manual_async_fn)] // See `handle`: not an `async fn` on purpose.
    pub fn handle_with<'a>(
        &'a self,
        req: Request<Incoming>,
        peer: &'a Peer,
        id_by_caller: bool,
    ) -> impl Future<Output = (Response<Body>, Option<HeaderValue>)> + 'a {
        async move {
            let id = self.config.server.request_id.then(|| RequestId::for_request(req.headers()));
            let http10 = req.version() == http::Version::HTTP_10;
            let serve = std::pin::pin!(self.serve(req, peer, id.as_ref()));
            let mut response = match CatchUnwindRef(serve).await {
                Ok(response) => response,
                Err(panic) => panic_response(panic, id.as_ref().map(RequestId::as_str)),
            };
            // Exactly one: the upstream's own, if any, is replaced.
            let id = match id.as_ref().map(RequestId::header_value) {
                Some(id) if !id_by_caller => {
                    response.headers_mut().insert(request_id::X_REQUEST_ID, id);
                    None
                }
                id => id,
            };
            if http10 {
                close_delimited_for_http10(&mut response);
            }
            (response, id)
        }
    }

    /// The data path: path normalisation, built-ins, route match,
    /// screening, the route's address lists, rate limit and credentials,
    /// its layers around the method check, load shedding, proxy / file / fixed response; then the one place where the outcome becomes a
    /// status, a metric and a log line.
    #[allow(clippy::manual_async_fn)] // See `handle`: not an `async fn` on purpose.
    pub fn serve<'a>(
        &'a self,
        mut req: Request<Incoming>,
        peer: &'a Peer,
        id: Option<&'a RequestId>,
    ) -> impl Future<Output = Response<Body>> + 'a {
        async move {
            let start = Instant::now();
            let method = req.method().clone();
            let mut cx = RequestLog::new(&req, id, self.recording);
            let normalized = self.normalize(&mut req, peer);
            cx.describe(&req, peer, start);
            if let Err(e) = normalized {
                let response = self.fail(&self.unmatched, None, &cx, e);
                return self.finish(&self.unmatched, None, &method, start, cx, response);
            }
            if self.builtins_on_main
                && let Some(resp) = self.builtin(req.uri().path())
            {
                return resp;
            }
            // The routes as of now; a reload during the request does not touch it.
            let table = self.table.load_full();
            let route = match self.route_index(&table, &req) {
                Ok(found) => found.map(|i| &table.routes[i]),
                Err(e) => {
                    let response = self.fail(&self.unmatched, None, &cx, e);
                    return self.finish(&self.unmatched, None, &method, start, cx, response);
                }
            };
            let route_metrics = route.map_or(&self.unmatched, |r| &r.metrics);
            let _active = route_metrics.start();
            // A refused request of a proxy route is traced as one too.
            cx.route_found(&req, route.is_some_and(|r| matches!(r.config.target, Target::Proxy(_))));
            let mut pending =
                Unanswered { app: self, route: route_metrics, upstream: None, method: &method, start, cx: Some(cx) };
            let mut rate_state = None;
            let refused = match route {
                // Screened first: a request refused as malformed or too
                // large takes no token of the rate limit and no ask of
                // the auth service (its length after the address lists).
                Some(route) => match self.screen(&req) {
                    Err(e) => Some(e),
                    Ok(declared) if route.guard.is_some() || route.rate_limit.is_some() => {
                        let cx = pending.cx.as_mut().expect("just set");
                        self.admit(route, declared, &mut req, peer, cx, &mut rate_state).await.err()
                    }
                    Ok(declared) => declared.within(route.config.max_body).err(),
                },
                None => None,
            };
            // Chosen once admitted: a split's sticky key may read a header
            // the route's auth has just set in place of the client's own.
            let upstream = match refused {
                None => route.and_then(|r| r.upstream(&table.upstreams, &mut req, peer.tls)),
                Some(_) => None,
            };
            pending.upstream = upstream;
            let cx = pending.cx.as_ref().expect("just set");
            let respond = |result: Result<Response<Body>, GatewayError>| {
                result.unwrap_or_else(|e| self.fail(route_metrics, upstream, cx, e))
            };
            let mut response = match route {
                _ if refused.is_some() => respond(Err(refused.expect("checked"))),
                Some(route) => match &route.layers {
                    None => respond(self.dispatch(route, upstream, req, peer, start, cx).await),
                    Some(layers) => {
                        let dispatch =
                            |req| async { respond(self.dispatch(route, upstream, req, peer, start, cx).await) };
                        // Boxed: only routes with layers take this way, and its
                        // future (the layers' around the data path's) would
                        // otherwise make every request's future larger (see
                        // benches/README.md, Decisions).
                        Box::pin(layers.call(req, dispatch)).await
                    }
                },
                None => {
                    respond(self.screen(&req).and_then(|d| d.within(self.config.server.max_body)).and(Err(NoRoute)))
                }
            };
            if let Some(fields) = rate_state {
                fields.append_to(response.headers_mut());
            }
            let cx = pending.cx.take().expect("taken once");
            self.finish(route_metrics, upstream, &method, start, cx, response)
        }
    }

    /// Hands the (screened) request to the route's target.
    #[allow(clippy::manual_async_fn)] // See `handle`: not an `async fn` on purpose.
    fn dispatch<'a>(
        &'a self,
        route: &'a Route,
        upstream: Option<&'a Upstream>,
        mut req: Request<Incoming>,
        peer: &'a Peer,
        start: Instant,
        cx: &'a RequestLog<'_>,
    ) -> impl Future<Output = Result<Response<Body>, GatewayError>> + 'a {
        async move {
            if !route.allows(req.method()) {
                let allow = route.methods.as_ref().map(|(_, allow)| allow.clone()).unwrap_or_default();
                return Err(GatewayError::MethodNotAllowed { allow });
            }
            let _slot = route.limit.as_deref().map(ConcurrencyLimit::try_acquire).transpose()?;
            let prefix = &route.config.prefix;
            match &route.config.target {
                Target::Proxy(p) => {
                    let upstream = upstream.expect("a proxy route has its upstream");
                    let new_cookie = route.before_proxy(p, &mut req, peer, cx);
                    let deadline = start + p.timeout;
                    // Not boxed: boxing it made the fixed and file paths' future
                    // smaller but cost the proxy path a copy of its state and an
                    // allocation on every request (see benches/README.md,
                    // Decisions).
                    let mut response = match &route.cache {
                        None => upstream.forward(p, prefix, route.config.max_body, req, peer, cx, deadline).await?,
                        Some(cache) => {
                            let served = match cache.lookup(req, peer, cx, deadline) {
                                Looked::Answered(response) => Ok(response),
                                Looked::Failed(e) => Err(e),
                                // Boxed: only a cache route's misses pay for its future.
                                Looked::Go(req, miss) => Box::pin(cache.serve(req, miss, peer, cx, deadline)).await,
                            };
                            // Its own error answers say Cache-Status too (RFC 9211).
                            served.unwrap_or_else(|e| {
                                let status = crate::cache::error_status(&e);
                                let mut response = self.fail(&route.metrics, Some(upstream), cx, e);
                                response.headers_mut().insert(crate::cache::CACHE_STATUS, status);
                                response
                            })
                        }
                    };
                    if let Some(cookie) = new_cookie {
                        response.headers_mut().append(http::header::SET_COOKIE, cookie);
                    }
                    if response.status() == StatusCode::SWITCHING_PROTOCOLS
                        && let Some(tunnel) = response.extensions_mut().get_mut::<PendingTunnel>()
                    {
                        tunnel.set_route(route.metrics.name());
                    }
                    Ok(response)
                }
                Target::File(file) => match strip_prefix(req.uri().path(), prefix) {
                    "" | "/" => self.files.serve_file(file, req.method(), req.headers(), route.config.compress).await,
                    _ => Err(GatewayError::NotFound),
                },
                Target::Dir { root, dotfiles } => {
                    let rest = strip_prefix(req.uri().path(), prefix);
                    let dir = crate::files::Dir { root, dotfiles: *dotfiles };
                    self.files.serve_dir(dir, rest, req.uri(), req.method(), req.headers(), route.config.compress).await
                }
                Target::Redirect(redirect) => {
                    let location = redirect
                        .location(req.uri(), req.headers(), peer.tls)
                        .ok_or(GatewayError::BadRequest("the host cannot be written into a redirect"))?;
                    let mut response = Response::new(Body::empty());
                    *response.status_mut() = redirect.status;
                    response.headers_mut().insert(header::LOCATION, location);
                    Ok(response)
                }
                Target::Respond { status, body } => {
                    let body = if req.method() == Method::HEAD { Body::empty() } else { Body::full(body.clone()) };
                    // The request's header map, emptied, carries the answer's
                    // headers. hyper parses the connection's next request into
                    // the map of the response it wrote, so this one map serves
                    // request after request; a new map each time cost two
                    // allocations and two frees (the request's map dropped).
                    // Swapped, not taken and assigned: that made and dropped
                    // an empty map more.
                    let mut response = Response::new(body);
                    std::mem::swap(response.headers_mut(), req.headers_mut());
                    let headers = response.headers_mut();
                    headers.clear();
                    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
                    *response.status_mut() = *status;
                    Ok(response)
                }
            }
        }
    }

    /// An error becomes its response, counted and logged: with
    /// [`App::finish`], the one place where an outcome becomes a status, a
    /// metric and a log line.
    fn fail(
        &self,
        route: &RouteMetrics,
        upstream: Option<&Upstream>,
        cx: &RequestLog<'_>,
        e: GatewayError,
    ) -> Response<Body> {
        let request_id = cx.request_id();
        if let (Some(kind), Some(up)) = (e.upstream_kind(), upstream) {
            up.metrics.errors(kind).increment(1);
            // "unavailable" is logged once per change of state, by the
            // upstream, not once per request.
            if kind != "unavailable" {
                tracing::warn!(route = route.name(), request_id, error = %e, "upstream request failed");
            }
        } else if let Some(reason) = e.rejection_reason() {
            metrics::rejected(route.name(), reason);
            if let GatewayError::RateLimited { .. } = e {
                crate::ratelimit::metrics::rate_limited(route.name());
            }
            tracing::debug!(route = route.name(), request_id, error = %e, "request rejected");
        } else if let Some((kind, result)) = e.auth_outcome() {
            metrics::auth(route.name(), kind, result).increment(1);
            // The reason only: never the credential or token itself.
            tracing::debug!(route = route.name(), request_id, error = %e, "request refused by access control");
        } else if let GatewayError::Io(_) = e {
            tracing::error!(route = route.name(), request_id, error = %e, "request failed");
        }
        error_response(&e)
    }

    /// Records the response in the route's metrics and the access log.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        route: &RouteMetrics,
        upstream: Option<&Upstream>,
        method: &Method,
        start: Instant,
        cx: RequestLog<'_>,
        mut response: Response<Body>,
    ) -> Response<Body> {
        let elapsed = start.elapsed();
        let status = response.status().as_u16();
        route.record(method, status, elapsed);
        if let (Some(exporter), Some(trace), Some(span)) = (&self.exporter, &cx.trace, &cx.span)
            && trace.sampled()
        {
            let end = std::time::SystemTime::now();
            exporter.record(RequestSpan {
                trace,
                start: end - elapsed,
                end,
                method,
                route: route.name(),
                path: &span.path,
                status,
                host: span.host.as_deref(),
                client: &span.client,
                request_id: cx.id.map(RequestId::as_str),
                upstream: upstream.map(|u| u.config.name.as_str()),
            });
        }
        if let Some(mut line) = cx.access {
            // Written by the connection once the body has gone out.
            line.route = route.name().to_owned();
            line.status = status;
            line.duration = elapsed;
            line.upstream = upstream.map(|u| u.config.name.clone());
            response.extensions_mut().insert(line);
        }
        response
    }
}
