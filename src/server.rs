//! The server: the accept loop, connection limits, graceful shutdown, and
//! [`App::handle`], the whole data path in one function.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::body::Body;
use crate::config::{Config, RouteConfig, Target};
use crate::error::GatewayError;
use crate::files::FileServer;
use crate::limits::{ConcurrencyLimit, Limits, screen};
use crate::metrics::{self, Exporter, RouteMetrics};
use crate::proxy::Upstream;
use crate::router::{Router, strip_prefix};

/// Who is on the other end of a client connection.
pub struct Peer {
    /// The client's IP as an `X-Forwarded-For` item, formatted once per
    /// connection.
    pub forwarded_for: HeaderValue,
}

impl Peer {
    pub fn new(addr: SocketAddr) -> Self {
        Peer { forwarded_for: crate::headers::forwarded_for(addr.ip()) }
    }
}

/// A route with its runtime state.
struct Route {
    config: RouteConfig,
    metrics: RouteMetrics,
    /// The methods the route answers, with the `Allow` value for a 405;
    /// `None` answers every method.
    methods: Option<(Vec<Method>, String)>,
    /// The route's `max_concurrent`, if set.
    limit: Option<ConcurrencyLimit>,
}

impl Route {
    fn allows(&self, method: &Method) -> bool {
        self.methods.as_ref().is_none_or(|(ms, _)| ms.contains(method))
    }
}

/// Everything a request needs, shared by all connections.
pub struct App {
    config: Config,
    router: Router,
    routes: Vec<Route>,
    upstreams: Vec<Upstream>,
    unmatched: RouteMetrics,
    files: FileServer,
    exporter: &'static Exporter,
    draining: AtomicBool,
    /// Whether /metrics, /healthz and /readyz answer on the main listener.
    builtins_on_main: bool,
}

/// Methods file routes answer unless the route says otherwise.
const FILE_METHODS: [Method; 2] = [Method::GET, Method::HEAD];

impl App {
    /// Builds the runtime state from a validated config. Installs the metrics
    /// recorder if it is not installed yet.
    pub fn new(config: Config) -> Self {
        let exporter = metrics::install();
        let upstreams: Vec<Upstream> = config.upstreams.iter().cloned().map(Upstream::new).collect();
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
                    config: r.clone(),
                    metrics: RouteMetrics::new(&r.name),
                    methods,
                    limit: r.max_concurrent.map(ConcurrencyLimit::new),
                }
            })
            .collect();
        let router = Router::new(config.routes.iter().map(|r| r.prefix.as_str()));
        App {
            builtins_on_main: config.metrics.listen.is_none(),
            router,
            routes,
            upstreams,
            unmatched: RouteMetrics::new("unmatched"),
            files: FileServer::default(),
            exporter,
            draining: AtomicBool::new(false),
            config,
        }
    }

    /// Turns `/readyz` to 503.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// The data path: built-ins, route match, screening, method check,
    /// load shedding, proxy / file / fixed response, then the one place where
    /// the outcome becomes a status, a metric and a log line.
    pub async fn handle(&self, req: Request<Incoming>, peer: &Peer) -> Response<Body> {
        let start = Instant::now();
        if self.builtins_on_main
            && let Some(resp) = self.builtin(req.uri().path())
        {
            return resp;
        }
        let method = req.method().clone();
        let path = self.config.server.access_log.then(|| req.uri().path().to_owned());
        let route = self.router.find(req.uri().path()).map(|i| &self.routes[i]);
        let route_metrics = route.map_or(&self.unmatched, |r| &r.metrics);
        let _active = route_metrics.start();
        let upstream = route.and_then(|r| match &r.config.target {
            Target::Proxy(p) => Some(&self.upstreams[p.upstream]),
            _ => None,
        });
        let result = match route {
            Some(route) => self.dispatch(route, req, peer, start).await,
            None => self.screen(&req, self.config.server.max_body).and(Err(GatewayError::NoRoute)),
        };
        self.finish(route_metrics, upstream, &method, path, start, result)
    }

    /// Screens the request, then hands it to the route's target.
    async fn dispatch(
        &self,
        route: &Route,
        req: Request<Incoming>,
        peer: &Peer,
        start: Instant,
    ) -> Result<Response<Body>, GatewayError> {
        self.screen(&req, route.config.max_body)?;
        if !route.allows(req.method()) {
            let allow = route.methods.as_ref().map(|(_, allow)| allow.clone()).unwrap_or_default();
            return Err(GatewayError::MethodNotAllowed { allow });
        }
        let _slot = route.limit.as_ref().map(ConcurrencyLimit::try_acquire).transpose()?;
        let prefix = &route.config.prefix;
        match &route.config.target {
            Target::Proxy(p) => {
                let upstream = &self.upstreams[p.upstream];
                upstream.forward(p, prefix, route.config.max_body, req, &peer.forwarded_for, start + p.timeout).await
            }
            Target::File(file) => match strip_prefix(req.uri().path(), prefix) {
                "" | "/" => self.files.serve_file(file, req.method(), req.headers()).await,
                _ => Err(GatewayError::NotFound),
            },
            Target::Dir(root) => {
                let rest = strip_prefix(req.uri().path(), prefix);
                self.files.serve_dir(root, rest, req.method(), req.headers()).await
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

    fn screen(&self, req: &Request<Incoming>, max_body: u64) -> Result<(), GatewayError> {
        let limits = Limits { max_uri_length: self.config.server.max_uri_length, max_body };
        screen(req.method(), req.uri(), req.version(), req.headers(), limits)
    }

    /// The only place where an outcome becomes a status code, a metric and a
    /// log line.
    fn finish(
        &self,
        route: &RouteMetrics,
        upstream: Option<&Upstream>,
        method: &Method,
        path: Option<String>,
        start: Instant,
        result: Result<Response<Body>, GatewayError>,
    ) -> Response<Body> {
        let response = match result {
            Ok(r) => r,
            Err(e) => {
                if let (Some(kind), Some(up)) = (e.upstream_kind(), upstream) {
                    up.metrics.errors(kind).increment(1);
                    tracing::warn!(route = route.name(), error = %e, "upstream request failed");
                } else if let Some(reason) = e.rejection_reason() {
                    metrics::rejected(route.name(), reason);
                    tracing::debug!(route = route.name(), error = %e, "request rejected");
                } else if let GatewayError::Io(_) = e {
                    tracing::error!(route = route.name(), error = %e, "request failed");
                }
                error_response(&e)
            }
        };
        let elapsed = start.elapsed();
        let status = response.status().as_u16();
        route.record(method, status, elapsed);
        if let Some(path) = path {
            tracing::info!(
                target: "access",
                route = route.name(),
                method = %method,
                path,
                status,
                upstream = upstream.map(|u| u.config.name.as_str()),
                duration_ms = elapsed.as_secs_f64() * 1000.0,
            );
        }
        response
    }

    /// `/healthz`, `/readyz` and the metrics path.
    fn builtin(&self, path: &str) -> Option<Response<Body>> {
        let (status, content_type, body) = if path == "/healthz" {
            (StatusCode::OK, "text/plain; charset=utf-8", "ok\n".to_owned())
        } else if path == "/readyz" {
            if self.draining.load(Ordering::Relaxed) {
                (StatusCode::SERVICE_UNAVAILABLE, "text/plain; charset=utf-8", "draining\n".to_owned())
            } else {
                (StatusCode::OK, "text/plain; charset=utf-8", "ready\n".to_owned())
            }
        } else if path == self.config.metrics.path {
            (StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", self.exporter.render())
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

/// The `reason` for a connection that hyper ended because of what the client
/// sent (or did not send), before any request reached [`App::handle`].
fn connection_error_reason(e: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let h = crate::error::find_source::<hyper::Error>(e)?;
    if h.is_timeout() {
        Some("header_timeout")
    } else if h.is_parse_too_large() {
        Some("header_too_large")
    } else if h.is_parse() || h.is_parse_status() {
        Some("malformed")
    } else {
        None
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
    if let GatewayError::Overloaded { .. } = e {
        builder = builder.header(header::RETRY_AFTER, "1");
    }
    if e.closes_connection() {
        builder = builder.header(header::CONNECTION, "close");
    }
    builder.body(Body::full(e.body())).expect("valid response")
}

/// Serves `listener` with `app` until `shutdown` resolves; then stops
/// accepting (closing the listener, so new connections are refused), turns
/// `/readyz` to 503, and lets open connections finish their requests for up
/// to `shutdown_timeout`.
pub async fn serve(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    let server = &app.config.server;
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(server.header_read_timeout)
        // Bounds the request head: past it hyper answers 431 and closes.
        .max_buf_size(server.max_header_size as usize)
        // One write of head and body copied together beats a two-part
        // writev for the small responses a sidecar mostly sends.
        .writev(false)
        .keep_alive(true);
    builder.http2().timer(TokioTimer::new()).max_header_list_size(server.max_header_size.min(u32::MAX as u64) as u32);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let limit = Arc::new(Semaphore::new(server.max_connections));
    let shutdown_timeout = server.shutdown_timeout;
    tokio::pin!(shutdown);

    loop {
        // Past max_connections, stop accepting: new connections wait in the
        // kernel's backlog until a slot frees.
        if limit.available_permits() == 0 {
            metrics::rejected("", "max_connections");
            tracing::warn!(max_connections = server.max_connections, "connection limit reached; new connections wait");
        }
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => p.expect("semaphore is never closed"),
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = crate::accept(&listener) => accepted,
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let (stream, unanswered) = WatchedStream::new(stream);
        let app = app.clone();
        let client = Arc::new(Peer::new(peer));
        let service = service_fn(move |req| {
            let (app, client) = (app.clone(), client.clone());
            async move { Ok::<_, Infallible>(app.handle(req, &client).await) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _permit = permit;
            let _open = metrics::connection_opened();
            if let Err(e) = conn.await {
                match connection_error_reason(&*e) {
                    // hyper's header-read timer also runs while a keep-alive
                    // connection waits for its next request; closing an idle
                    // one is housekeeping, not a rejection.
                    Some("header_timeout") if !unanswered.load(Ordering::Relaxed) => {}
                    Some(reason) => metrics::rejected("", reason),
                    None => {}
                }
                tracing::debug!(client = %peer, error = %e, "connection ended with an error");
            }
        });
    }

    drop(listener);
    app.start_draining();
    tracing::info!("shutting down: no longer accepting; waiting for in-flight requests");
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections closed"),
        _ = tokio::time::sleep(shutdown_timeout) => tracing::warn!("shutdown timeout passed; closing remaining connections"),
    }
}

/// Serves only `/metrics`, `/healthz` and `/readyz` (the optional admin
/// listener) until `shutdown` resolves.
pub async fn serve_admin(listener: TcpListener, app: Arc<App>, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = tokio::select! {
            accepted = crate::accept(&listener) => accepted,
            _ = &mut shutdown => return,
        };
        let app = app.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            let resp = app.builtin(req.uri().path()).unwrap_or_else(|| error_response(&GatewayError::NotFound));
            async move { Ok::<_, Infallible>(resp) }
        });
        let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
        tokio::spawn(conn);
    }
}

/// A client connection that remembers whether the client has sent bytes the
/// gateway has not answered yet. That tells the two cases of hyper's
/// header-read timeout apart: a trickled request head (slowloris, counted) and
/// a keep-alive connection that stayed idle (closed quietly).
struct WatchedStream {
    inner: tokio::net::TcpStream,
    unanswered: Arc<AtomicBool>,
}

impl WatchedStream {
    fn new(inner: tokio::net::TcpStream) -> (Self, Arc<AtomicBool>) {
        let unanswered = Arc::new(AtomicBool::new(false));
        (WatchedStream { inner, unanswered: unanswered.clone() }, unanswered)
    }
}

impl tokio::io::AsyncRead for WatchedStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let poll = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.unanswered.store(true, Ordering::Relaxed);
        }
        poll
    }
}

impl tokio::io::AsyncWrite for WatchedStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if let std::task::Poll::Ready(Ok(n)) = poll
            && n > 0
        {
            self.unanswered.store(false, Ordering::Relaxed);
        }
        poll
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let poll = std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let std::task::Poll::Ready(Ok(n)) = poll
            && n > 0
        {
            self.unanswered.store(false, Ordering::Relaxed);
        }
        poll
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
