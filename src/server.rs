//! The application: [`App::handle`], the whole data path in one function,
//! and the one place where an outcome becomes a status, a metric and a log
//! line. The listeners in [`crate::listener`] call it.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::access::{AccessLine, UpstreamTiming};
use crate::body::Body;
use crate::config::{AccessLogFormat, Config, ConfigError, RouteConfig, Target};
use crate::error::GatewayError;
use crate::files::FileServer;
use crate::layers::RouteLayers;
use crate::layers::panic::{CatchUnwindRef, panic_response};
use crate::layers::request_id::{self, RequestId};
use crate::layers::trace::TraceContext;
use crate::limits::{ConcurrencyLimit, Limits, screen};
use crate::metrics::{self, RouteMetrics};
use crate::otel::{Exporter, RequestSpan};
use crate::path::{self, PathError};
use crate::router::{Router, strip_prefix};
use crate::tunnel::PendingTunnel;
use crate::upstream::Upstream;

/// Who is on the other end of a client connection.
pub struct Peer {
    /// The client's IP as an `X-Forwarded-For` item, formatted once per
    /// connection.
    pub forwarded_for: HeaderValue,
    /// The client is a trusted proxy (`server.trusted_proxies`).
    pub trusted: bool,
    /// The client connected over TLS (`X-Forwarded-Proto: https`).
    pub tls: bool,
}

impl Peer {
    pub fn new(ip: IpAddr, trusted: bool, tls: bool) -> Self {
        Peer { forwarded_for: crate::headers::forwarded_for(ip), trusted, tls }
    }
}

/// What the upstream and the logs of one request need to know about it.
pub struct RequestLog<'a> {
    /// Its ID, when request IDs are on.
    pub id: Option<&'a RequestId>,
    /// Its trace, when trace context is on or spans are exported.
    pub trace: Option<TraceContext>,
    /// Whether the upstream gets the trace (trace context is on).
    pub propagate_trace: bool,
    /// What the proxy learns of the upstream, when the access log is on.
    pub timing: Option<Arc<UpstreamTiming>>,
    /// The access log line, when the access log is on.
    access: Option<Box<AccessLine>>,
    /// What the exported span needs, when spans are exported.
    span: Option<Box<SpanStart>>,
}

/// The parts of a request its span needs, taken at its start.
struct SpanStart {
    path: String,
    host: Option<String>,
    client: String,
}

/// A request on its way to a response head. Dropped before it got one
/// (the client left, the handling panicked, or the shutdown timeout cut it
/// off), it still reaches the metrics, the access log and the exported
/// span, as 499 (nginx's "client closed request"), 500 or 503; else a
/// request that ends that way would leave no trace at all.
struct Unanswered<'a> {
    app: &'a App,
    route: &'a RouteMetrics,
    upstream: Option<&'a Upstream>,
    method: &'a Method,
    start: Instant,
    /// Taken when the response is ready.
    cx: Option<RequestLog<'a>>,
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let Some(cx) = self.cx.take() else { return };
        // A panic drops the data path's locals as it unwinds, this one too.
        let status = if std::thread::panicking() {
            StatusCode::INTERNAL_SERVER_ERROR
        } else if self.app.abandoning.load(Ordering::Relaxed) {
            StatusCode::SERVICE_UNAVAILABLE
        } else {
            CLIENT_CLOSED
        };
        let mut stub = Response::new(Body::empty());
        *stub.status_mut() = status;
        let mut stub = self.app.finish(self.route, self.upstream, self.method, self.start, cx, stub);
        // No body will be sent: the line is written now.
        if let Some(line) = stub.extensions_mut().remove::<Box<AccessLine>>() {
            line.write();
        }
    }
}

/// 499, nginx's status for a request whose client closed the connection
/// before it was answered. It is never sent; logs and metrics use it.
pub const CLIENT_CLOSED: StatusCode = match StatusCode::from_u16(499) {
    Ok(s) => s,
    Err(_) => unreachable!(),
};

impl<'a> RequestLog<'a> {
    /// `trace_context`: continue the caller's trace and pass it on;
    /// `exporting`: spans are exported (a new trace per request, when trace
    /// context is off). The trace is read from the request as the client
    /// sent it, before hop-by-hop stripping and the route's header rules.
    fn new(req: &Request<Incoming>, id: Option<&'a RequestId>, trace_context: bool, exporting: bool) -> Self {
        let trace = if trace_context {
            Some(TraceContext::from_headers(req.headers()))
        } else {
            exporting.then(TraceContext::root)
        };
        RequestLog { id, trace, propagate_trace: trace_context, timing: None, access: None, span: None }
    }

    /// The request ID for a log line (`-` without one).
    pub fn request_id(&self) -> &str {
        self.id.map_or("-", RequestId::as_str)
    }
}

/// A route with its runtime state.
struct Route {
    config: RouteConfig,
    /// The route's layers; `None` when it enables none.
    layers: Option<RouteLayers>,
    metrics: RouteMetrics,
    /// The methods the route answers, with the `Allow` value for a 405;
    /// `None` answers every method.
    methods: Option<(Vec<Method>, String)>,
    /// The route's `max_concurrent`, if set (shared with the route of the
    /// same name after a reload).
    limit: Option<Arc<ConcurrencyLimit>>,
}

impl Route {
    fn allows(&self, method: &Method) -> bool {
        self.methods.as_ref().is_none_or(|(ms, _)| ms.contains(method))
    }
}

/// The routes and upstreams requests are served by: replaced as a whole
/// by a reload, while requests already under way finish on the one they
/// started with.
struct Table {
    router: Router,
    routes: Vec<Route>,
    upstreams: Vec<Arc<Upstream>>,
}

/// Everything a request needs, shared by all connections.
pub struct App {
    /// As started: `[server]`, `[metrics]` and `[tracing]` hold until a
    /// restart (a reload warns when they changed).
    config: Config,
    table: ArcSwap<Table>,
    /// The listener's TLS config, replaced by a reload (certificate files
    /// are read again).
    tls: ArcSwapOption<rustls::ServerConfig>,
    /// Held by a reload.
    reloading: std::sync::Mutex<()>,
    unmatched: RouteMetrics,
    files: FileServer,
    metrics_exporter: &'static metrics::Exporter,
    draining: AtomicBool,
    /// See [`App::abandon_requests`].
    abandoning: AtomicBool,
    /// Span export, when `[tracing] otlp_endpoint` is set.
    exporter: Option<Exporter>,
    /// Whether /metrics, /healthz and /readyz answer on the main listener.
    builtins_on_main: bool,
    path_options: path::Options,
}

/// Methods file routes answer unless the route says otherwise.
const FILE_METHODS: [Method; 2] = [Method::GET, Method::HEAD];

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
        App {
            path_options,
            builtins_on_main: config.metrics.listen.is_none(),
            table: ArcSwap::from_pointee(Table::new(&config, None)),
            tls: ArcSwapOption::new(config.server.tls.as_ref().map(|t| t.config.clone())),
            reloading: std::sync::Mutex::new(()),
            unmatched: RouteMetrics::new("unmatched"),
            files: FileServer::default(),
            metrics_exporter: exporter,
            draining: AtomicBool::new(false),
            abandoning: AtomicBool::new(false),
            exporter: Exporter::start(&config.tracing),
            config,
        }
    }

    /// Loads the configuration again from where it came from and, if it is
    /// valid, serves new requests with its routes and upstreams at once
    /// (requests under way finish on the old ones). Upstreams whose settings
    /// did not change keep their pools; removed ones close their idle
    /// connections once their last request is done. `[server]` (but for its
    /// `tls` files), `[metrics]` and `[tracing]` need a restart: a change
    /// there is logged and not applied. An invalid file changes nothing.
    pub fn reload(&self) -> Result<Vec<&'static str>, ConfigError> {
        // One at a time: two at once could store the older file last.
        let _one = self.reloading.lock().unwrap_or_else(|e| e.into_inner());
        let loaded = match &self.config.source {
            Some(source) => crate::config::load(source),
            None => Err(ConfigError {
                source_name: self.config.source_name.clone(),
                key: "-".into(),
                message: "no file to load again".into(),
            }),
        };
        let mut new = match loaded {
            Ok(new) => new,
            Err(e) => {
                metrics::config_reloaded(false);
                tracing::error!(error = %e, "config reload failed; nothing changed");
                return Err(e);
            }
        };
        // Unset in the file, the access log format followed --log-format at
        // start (see `cli`); the same holds now.
        if new.server.access_log_format.is_none() {
            new.server.access_log_format = self.config.server.access_log_format;
        }
        let old = self.table.load();
        let table = Table::new(&new, Some(&old));
        let kept = table.upstreams.iter().filter(|u| old.upstreams.iter().any(|o| Arc::ptr_eq(o, u))).count();
        self.table.store(Arc::new(table));
        let mut needs_restart = restart_sections(&self.config, &new);
        match (&self.config.server.tls, &new.server.tls) {
            // Renewed files: served from the next connection on.
            (Some(old), Some(new)) if old.client_ca.is_some() == new.client_ca.is_some() => {
                self.tls.store(Some(new.config.clone()));
            }
            (None, None) => {}
            // Turning TLS or client certificates on or off changes what the
            // listener is: not silently.
            _ => needs_restart.push("server.tls (on/off, client_ca)"),
        }
        if !needs_restart.is_empty() {
            tracing::warn!(
                sections = needs_restart.join(", "),
                "config reload: these sections changed and need a restart; running on with their old values"
            );
        }
        metrics::config_reloaded(true);
        tracing::info!(
            routes = new.routes.len(),
            upstreams = new.upstreams.len(),
            upstreams_kept = kept,
            "config reloaded"
        );
        Ok(needs_restart)
    }

    /// The listener's TLS config as of now (a reload may replace it).
    pub fn tls_config(&self) -> Option<Arc<rustls::ServerConfig>> {
        self.tls.load_full()
    }
}

/// Which of the sections a reload cannot apply changed.
fn restart_sections(old: &Config, new: &Config) -> Vec<&'static str> {
    let server = |c: &Config| {
        let mut s = c.server.clone();
        s.tls = None;
        format!("{s:?}")
    };
    let mut changed = Vec::new();
    if server(old) != server(new) {
        changed.push("server");
    }
    if format!("{:?}", old.metrics) != format!("{:?}", new.metrics) {
        changed.push("metrics");
    }
    if format!("{:?}", old.tracing) != format!("{:?}", new.tracing) {
        changed.push("tracing");
    }
    changed
}

impl Table {
    /// Builds the routes and upstreams of `config`, taking over from
    /// `running` every upstream whose settings are unchanged (with its pools
    /// and health state). An upstream with TLS is always built anew, so its
    /// certificate files are read again.
    fn new(config: &Config, running: Option<&Table>) -> Table {
        let running_upstreams = running.map_or(&[][..], |t| &t.upstreams[..]);
        let retried = |i: usize| {
            config.routes.iter().any(|r| matches!(&r.target, Target::Proxy(p) if p.upstream == i && p.retries > 0))
        };
        let upstreams: Vec<Arc<Upstream>> = config
            .upstreams
            .iter()
            .enumerate()
            .map(|(i, u)| {
                let same = |o: &&Arc<Upstream>| u.tls.is_none() && o.same_settings(u, retried(i));
                match running_upstreams.iter().find(same) {
                    Some(kept) => kept.clone(),
                    None => Arc::new(Upstream::new(u.clone(), retried(i))),
                }
            })
            .collect();
        let routes: Vec<Route> = config
            .routes
            .iter()
            .map(|r| {
                if let Target::Proxy(p) = &r.target {
                    metrics::set_route_timeout(&r.name, p.timeout);
                }
                let methods = match (&r.target, &r.methods) {
                    (_, Some(ms)) => Some(ms.clone()),
                    (Target::File(_) | Target::Dir(_), None) => Some(FILE_METHODS.to_vec()),
                    _ => None,
                };
                let methods = methods.map(|ms| {
                    let allow = ms.iter().map(Method::as_str).collect::<Vec<_>>().join(", ");
                    (ms, allow)
                });
                Route {
                    layers: RouteLayers::new(r),
                    config: r.clone(),
                    metrics: RouteMetrics::new(&r.name),
                    methods,
                    // The same limit on a route of the same name goes on
                    // counting the requests it already admitted.
                    limit: r.max_concurrent.map(|max| {
                        let old = running.and_then(|t| t.routes.iter().find(|o| o.config.name == r.name));
                        match old.and_then(|o| o.limit.as_ref()) {
                            Some(limit) if limit.max() == max => limit.clone(),
                            _ => Arc::new(ConcurrencyLimit::new(max)),
                        }
                    }),
                }
            })
            .collect();
        let router = Router::new(config.routes.iter().map(|r| r.prefix.as_str()));
        Table { router, routes, upstreams }
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

    /// Turns `/readyz` to 503.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// A request's way through the gateway: its request ID (see
    /// [`request_id`]), panic isolation (a panic answers 500, is counted and
    /// logged, and the connection keeps serving), and [`App::serve`].
    ///
    /// Both are done here in place rather than with tower-http's
    /// `SetRequestIdLayer`/`PropagateRequestIdLayer` and `CatchPanicLayer`,
    /// which were tried first: with them a fixed response cost 19,295
    /// instructions instead of 10,146 (`benches/callgrind /hello`). They keep
    /// the ID in request and response extensions (two allocations), the
    /// panic layer boxes every response body, and the 5 KiB data-path future
    /// was copied at each layer it passed. Per-route behaviour, which is
    /// optional, does use tower layers ([`crate::layers::RouteLayers`]).
    pub async fn handle(&self, req: Request<Incoming>, peer: &Peer) -> Response<Body> {
        let id = self.config.server.request_id.then(|| RequestId::for_request(req.headers()));
        let serve = std::pin::pin!(self.serve(req, peer, id.as_ref()));
        let mut response = match CatchUnwindRef(serve).await {
            Ok(response) => response,
            Err(panic) => panic_response(panic, id.as_ref().map(RequestId::as_str)),
        };
        if let Some(id) = &id {
            // Exactly one: the upstream's own, if any, is replaced.
            response.headers_mut().insert(request_id::X_REQUEST_ID, id.header_value());
        }
        response
    }

    /// The data path: path normalisation, built-ins, route match, the
    /// route's layers around screening, method check, load shedding, proxy /
    /// file / fixed response; then the one place where the outcome becomes a
    /// status, a metric and a log line.
    pub async fn serve(&self, mut req: Request<Incoming>, peer: &Peer, id: Option<&RequestId>) -> Response<Body> {
        let start = Instant::now();
        let method = req.method().clone();
        let mut cx = RequestLog::new(&req, id, self.config.server.trace_context, self.exporter.is_some());
        let normalized = self.normalize(&mut req);
        if self.exporter.is_some() {
            let host = req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).map(str::to_owned);
            let host = host.or_else(|| req.uri().authority().map(|a| a.as_str().to_owned()));
            let path = req.uri().path().to_owned();
            cx.span =
                Some(Box::new(SpanStart { path, host, client: peer.forwarded_for.to_str().unwrap_or("-").to_owned() }));
        }
        if self.config.server.access_log {
            cx.timing = Some(Arc::default());
            cx.access = Some(self.access_line(&req, peer, &cx, start));
        }
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
        let route = table.router.find(req.uri().path()).map(|i| &table.routes[i]);
        let route_metrics = route.map_or(&self.unmatched, |r| &r.metrics);
        let _active = route_metrics.start();
        let upstream = route.and_then(|r| match &r.config.target {
            Target::Proxy(p) => Some(&*table.upstreams[p.upstream]),
            _ => None,
        });
        let mut pending =
            Unanswered { app: self, route: route_metrics, upstream, method: &method, start, cx: Some(cx) };
        let cx = pending.cx.as_ref().expect("just set");
        let respond = |result: Result<Response<Body>, GatewayError>| {
            result.unwrap_or_else(|e| self.fail(route_metrics, upstream, cx, e))
        };
        let response = match route {
            Some(route) => match &route.layers {
                None => respond(self.dispatch(route, upstream, req, peer, start, cx).await),
                Some(layers) => {
                    let dispatch = |req| async { respond(self.dispatch(route, upstream, req, peer, start, cx).await) };
                    layers.call(req, dispatch).await
                }
            },
            None => respond(self.screen(&req, self.config.server.max_body).and(Err(GatewayError::NoRoute))),
        };
        let cx = pending.cx.take().expect("taken once");
        self.finish(route_metrics, upstream, &method, start, cx, response)
    }

    /// The access log line of a request, all but what its outcome tells.
    fn access_line(
        &self,
        req: &Request<Incoming>,
        peer: &Peer,
        cx: &RequestLog<'_>,
        start: Instant,
    ) -> Box<AccessLine> {
        // Lossy, not `to_str`: a value with bytes beyond ASCII is logged
        // (escaped), not dropped.
        let header =
            |name| req.headers().get(name).map(|v: &HeaderValue| String::from_utf8_lossy(v.as_bytes()).into_owned());
        Box::new(AccessLine {
            format: self.config.server.access_log_format.unwrap_or(AccessLogFormat::Json),
            time: std::time::SystemTime::now(),
            client: peer.forwarded_for.to_str().unwrap_or("-").to_owned(),
            method: req.method().clone(),
            path: req.uri().path_and_query().map_or("/", |pq| pq.as_str()).to_owned(),
            version: req.version(),
            route: String::new(),
            status: 0,
            upstream: None,
            request_id: cx.id.map(|id| id.as_str().to_owned()),
            trace_id: cx.trace.map(|t| t.trace_id_hex()),
            user_agent: header(header::USER_AGENT),
            referer: header(header::REFERER),
            duration: Duration::ZERO,
            timing: cx.timing.clone(),
            bytes_out: 0,
            started: start,
        })
    }

    /// Screens the request, then hands it to the route's target.
    async fn dispatch(
        &self,
        route: &Route,
        upstream: Option<&Upstream>,
        req: Request<Incoming>,
        peer: &Peer,
        start: Instant,
        cx: &RequestLog<'_>,
    ) -> Result<Response<Body>, GatewayError> {
        self.screen(&req, route.config.max_body)?;
        if !route.allows(req.method()) {
            let allow = route.methods.as_ref().map(|(_, allow)| allow.clone()).unwrap_or_default();
            return Err(GatewayError::MethodNotAllowed { allow });
        }
        let _slot = route.limit.as_deref().map(ConcurrencyLimit::try_acquire).transpose()?;
        if let Some(message) = &route.config.panic {
            // Debug builds only (refused at load otherwise): the panic tests.
            panic!("{message}");
        }
        let prefix = &route.config.prefix;
        match &route.config.target {
            Target::Proxy(p) => {
                let upstream = upstream.expect("a proxy route has its upstream");
                let deadline = start + p.timeout;
                // Not boxed: boxing it made the fixed and file paths' future
                // smaller but cost the proxy path a copy of its state and an
                // allocation, 790 instructions a request (benches/callgrind).
                let mut response = upstream.forward(p, prefix, route.config.max_body, req, peer, cx, deadline).await?;
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
            Target::Dir(root) => {
                let rest = strip_prefix(req.uri().path(), prefix);
                self.files.serve_dir(root, rest, req.uri(), req.method(), req.headers(), route.config.compress).await
            }
            Target::Respond { status, body } => {
                let body = if req.method() == Method::HEAD { Body::empty() } else { Body::full(body.clone()) };
                let mut response = Response::new(body);
                *response.status_mut() = *status;
                response
                    .headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
                Ok(response)
            }
        }
    }

    /// Replaces the request's path with its normal form (see [`path`]), so
    /// the route is chosen on it and the upstream receives it.
    fn normalize(&self, req: &mut Request<Incoming>) -> Result<(), GatewayError> {
        let normal = match path::normalize(req.uri().path(), self.path_options) {
            Ok(Cow::Borrowed(_)) => return Ok(()),
            Ok(Cow::Owned(normal)) => normal,
            Err(PathError::AboveRoot) => return Err(GatewayError::BadPath("path climbs above the root")),
            Err(PathError::EncodedSlash) => return Err(GatewayError::BadPath("encoded slash or backslash")),
            Err(PathError::Backslash) => return Err(GatewayError::BadPath("backslash in path")),
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

    fn screen(&self, req: &Request<Incoming>, max_body: u64) -> Result<(), GatewayError> {
        let limits = Limits { max_uri_length: self.config.server.max_uri_length, max_body };
        screen(req.method(), req.uri(), req.version(), req.headers(), limits)
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
            tracing::debug!(route = route.name(), request_id, error = %e, "request rejected");
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

    /// The admin listener's service: the built-ins, `POST /-/reload`
    /// (the configuration loaded again, as on SIGHUP: 200, or 500 with the
    /// reason and nothing changed), else 404.
    pub fn admin(&self, req: &Request<Incoming>) -> Response<Body> {
        if req.uri().path() == "/-/reload" {
            if req.method() != Method::POST {
                return error_response(&GatewayError::MethodNotAllowed { allow: "POST".into() });
            }
            let (status, body) = match self.reload() {
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
        self.builtin(req.uri().path()).unwrap_or_else(|| error_response(&GatewayError::NotFound))
    }

    /// `/healthz`, `/readyz` and the metrics path.
    fn builtin(&self, path: &str) -> Option<Response<Body>> {
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

/// The client's view of an error.
fn error_response(e: &GatewayError) -> Response<Body> {
    let mut builder = Response::builder().status(e.status()).header(header::CONTENT_TYPE, "text/plain; charset=utf-8");
    if let GatewayError::MethodNotAllowed { allow } = e
        && let Ok(v) = HeaderValue::from_str(allow)
    {
        builder = builder.header(header::ALLOW, v);
    }
    if let Some(seconds) = e.retry_after() {
        builder = builder.header(header::RETRY_AFTER, seconds);
    }
    if e.closes_connection() {
        builder = builder.header(header::CONNECTION, "close");
    }
    builder.body(Body::full(e.body())).expect("valid response")
}
