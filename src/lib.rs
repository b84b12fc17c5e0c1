//! `gateway`: a reverse-proxy gateway that runs as a sidecar in front of a
//! slow service. It forwards requests to configured upstreams through a
//! pooled keep-alive client, serves files with async reads, bounds each route
//! with its own timeout, and exposes Prometheus metrics.
//!
//! The data path is [`server::App::handle`]; [`Gateway`] wires a validated
//! [`config::Config`] to listeners and signals.
// Denied, not forbidden: two measured exceptions, `listener::detach` and
// `headers::parsed` (see benches/README.md, Decisions).
#![deny(unsafe_code)]

pub mod access;
pub mod auth;
pub mod block;
pub mod body;
pub mod cache;
pub mod cli;
pub mod clock;
pub mod config;
mod demo;
pub mod discovery;
pub mod error;
pub mod files;
pub mod headers;
pub mod layers;
pub mod limits;
pub mod listener;
pub mod metrics;
pub mod net;
pub mod otel;
pub mod path;
pub mod ratelimit;
pub mod request;
pub mod router;
pub mod server;
pub mod timer;
pub mod tls;
pub mod upstream;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::listener::Kind;
use crate::server::App;

/// A gateway with its listeners bound, ready to serve.
pub struct Gateway {
    app: Arc<App>,
    listener: TcpListener,
    admin: Option<TcpListener>,
}

impl Gateway {
    /// Binds the main listener (and the admin listener, if configured); an
    /// error names the address and its key.
    pub async fn bind(config: Config) -> std::io::Result<Gateway> {
        let listener = crate::net::bind_for("server.listen", config.server.listen, config.server.tcp_keepalive).await?;
        let admin = match config.metrics.listen {
            Some(addr) => Some(crate::net::bind_for("metrics.listen", addr, config.server.tcp_keepalive).await?),
            None => None,
        };
        let app = Arc::new(App::new(config));
        tokio::spawn(crate::server::follow_discovery(Arc::downgrade(&app), app.discovery_changes()));
        if app.config().server.watch_config {
            match &app.config().source {
                Some(crate::config::Source::File(path)) => {
                    tokio::spawn(crate::server::watch::watch(Arc::downgrade(&app), path.clone()));
                }
                _ => tracing::warn!("watch_config: the configuration is not from a file; nothing to watch"),
            }
        }
        Ok(Gateway { app, listener, admin })
    }

    /// The application, to reload its configuration ([`App::reload`]).
    pub fn app(&self) -> Arc<App> {
        self.app.clone()
    }

    /// The main listener's address (useful with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener has an address")
    }

    /// The admin listener's address, if there is one.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().map(|l| l.local_addr().expect("bound listener has an address"))
    }

    /// Serves until `shutdown` resolves. Then `/readyz` answers 503 at once
    /// (where it is answered: the admin listener when there is one) while
    /// the gateway keeps accepting and serving for
    /// `shutdown_delay` (so load balancers stop sending before anything is
    /// refused); then the main listener stops accepting and drains its
    /// connections (see [`listener::serve`]), and the admin listener after it.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) {
        crate::metrics::install().spawn_upkeep();
        let (stop_main, stop_admin) = (CancellationToken::new(), CancellationToken::new());
        let admin =
            self.admin.map(|l| tokio::spawn(listener::serve(l, self.app.clone(), Kind::Admin, stop_admin.clone())));
        let app = self.app.clone();
        let signal = async {
            shutdown.await;
            app.start_draining();
            let delay = app.config().server.shutdown_delay;
            if !delay.is_zero() {
                tracing::info!(delay = %humantime::format_duration(delay), "shutting down: /readyz answers 503; still serving for shutdown_delay");
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = app.drain_cut_short() => {}
                }
            }
            tracing::info!("shutting down: no longer accepting; waiting for in-flight requests");
            stop_main.cancel();
        };
        tokio::join!(listener::serve(self.listener, self.app.clone(), Kind::Main, stop_main.clone()), signal);
        stop_admin.cancel();
        if let Some(admin) = admin {
            let _ = admin.await;
        }
        app.flush_spans().await;
    }
}
